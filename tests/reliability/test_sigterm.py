"""SIGTERM in the middle of concurrent load: every request the server accepted is answered, and
requests that arrive after shutdown began are refused cleanly (no hang, no torn response); the
exit code is 0."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from live_server import Server, batch, infer_inputs
from tritonclient.utils import InferenceServerException

CLIENTS = 16  # 8 HTTP, 8 gRPC


def _client(server, manifest, k, stop, results):
    use_grpc = k % 2 == 1
    module = grpcclient if use_grpc else httpclient
    url = server.grpc if use_grpc else server.http
    i = 0
    try:
        c = module.InferenceServerClient(url)
    except Exception as e:  # connection refused at construction: shutdown already began
        results.append(("refused", time.monotonic(), repr(e)))
        return
    while not stop.is_set():
        arrays = batch(manifest, 1 + i % 4, seed=1000 * k + i)
        i += 1
        sent = time.monotonic()
        try:
            r = c.infer("rec", infer_inputs(module, arrays))
            scores = r.as_numpy("scores")
            ok = scores.shape[0] == arrays["dense_features"].shape[0] and np.isfinite(scores).all()
            results.append(("ok" if ok else "bad", sent, ""))
        except InferenceServerException as e:
            results.append(("error", sent, str(e)))
        except Exception as e:  # connection refused / reset after the listener closed
            results.append(("refused", sent, repr(e)))
            return
    c.close()


def test_sigterm_under_load_answers_every_accepted_request(exported_repo, manifest):
    s = Server(exported_repo, "--executor-threads", "2", "--http-threads", "2")
    stop, results = threading.Event(), []
    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        futures = [pool.submit(_client, s, manifest, k, stop, results) for k in range(CLIENTS)]
        # Load, by the server's own count, before SIGTERM: no client clock decides this.
        answered_before = s.wait_for_metric("nv_inference_request_success", 40)
        code = s.stop(timeout=30)
        stop.set()
        for f in futures:
            f.result(timeout=60)  # every client returned: nothing hung on an accepted request
    kinds = {k: sum(1 for r in results if r[0] == k) for k in ("ok", "bad", "error", "refused")}
    server = s.shutdown_counts()
    print(f"sigterm under load: client {kinds}, server {server}, {answered_before:.0f} before")
    assert code == 0, s.stderr()
    assert kinds["bad"] == 0, kinds
    # Judged by the server: every request it accepted was answered (nothing left pending after the
    # drain), and every answer it counted as a success reached its client whole. A request the
    # server dropped or tore would be missing from the client's "ok" count.
    assert server["pending"] == 0, server
    assert kinds["ok"] == server["succeeded"], (kinds, server)
    # Its failures are refusals ("server is shutting down"), each delivered to a client as an error.
    assert server["failed"] <= kinds["error"], (kinds, server)
    # Later requests may be refused: the server's "shutting down" answer, gRPC's CANCELLED for
    # calls arriving after Shutdown(), a refused connection.
    clean = ("shut", "cancelled", "unavailable", "connection", "refused", "reset", "closed")
    unexpected = [r for r in results if r[0] != "ok" and not any(w in r[2].lower() for w in clean)]
    assert not unexpected, unexpected[:5]
