"""The demo's fresh-embeddings step: a server that keeps answering while training goes on, its
embedding watermark advancing and its scores changing, with no export and no restart.

    .venv/bin/python scripts/demo_fresh.py --run RUN --repo REPO   # make demo: artifacts/demo/...

Starts our own redis-server, rec-server on the exported repository with `--updates` on it, then
`rec train --resume RUN --steps N --publish URL` (N: `--steps`), and prints once a second what
the server answers for one fixed request: the watermark it was scored at and its scores.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=300, help="steps trained while serving")
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()

    import tritonclient.http as httpclient

    from rec import run_dir
    from rec.broker import RedisBroker
    from rec.contract import DTYPES, ModelDir
    from rec.contract.requests import random_request
    from rec.serve.cpp import launch_cpp

    broker = RedisBroker(args.run.parent / "redis")
    url = broker.url("rec:updates")
    start_step = run_dir.read_meta(run_dir.latest_checkpoint(args.run))["step"]
    server = launch_cpp(args.repo, "--updates", url)
    manifest = ModelDir.of(args.repo, "rec").read_manifest()
    request = random_request(len(manifest.dense_names), len(manifest.sparse_names), 3, seed=5,
                             ids_per_bag=(1, 3), id_range=(0, 1000))  # fmt: skip
    inputs = []
    for name, arr in request.items():
        i = httpclient.InferInput(name, list(arr.shape), DTYPES[name])
        i.set_data_from_numpy(arr)
        inputs.append(i)
    print(f"rec-server on {args.repo} (exported at step {start_step}) reads {url}; training "
          f"{args.steps} more steps with --publish {url}", flush=True)  # fmt: skip
    train = subprocess.Popen([str(ROOT / ".venv/bin/rec"), "train", "--resume", str(args.run),
                              "--nproc", str(args.nproc), "--steps", str(args.steps),
                              "--publish", url],
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # fmt: skip
    t0, last, changes, ended = time.time(), None, 0, 0.0
    final = start_step + args.steps
    try:
        with httpclient.InferenceServerClient(server.endpoints.http) as client:
            while True:
                result = client.infer("rec", inputs)
                params = result.get_response().get("parameters", {})
                step = params.get("embedding_watermark_step", -1)
                wall = params.get("embedding_watermark_wall_ns", 0)
                scores = result.as_numpy("scores")[:, 0]
                lag = f"{time.time() - wall / 1e9:5.2f} s behind training" if wall else "export"
                shown = " ".join(f"{s:.4f}" for s in scores)
                changes += last is not None and shown != last
                print(f"t={time.time() - t0:5.1f} s  watermark step {step:5d} ({lag})  "
                      f"scores of 3 samples: {shown}", flush=True)  # fmt: skip
                last = shown
                code = train.poll()
                if step >= final or (code is not None and code != 0):
                    break  # a failed resume is reported at once, not after a wait
                # Training has ended: its last publish reaches the server within seconds.
                if code is not None and not ended:
                    ended = time.time()
                if ended and time.time() - ended > 30:
                    break
                time.sleep(1.0)
    finally:
        server.stop()
        broker.stop()
        code = train.wait()
    if code != 0:
        print(f"rec train --resume exited {code}", file=sys.stderr)
        return 1
    print(f"the server followed training from step {start_step} to {final} while answering; "
          f"its scores changed {changes} times, without an export or a restart")  # fmt: skip
    return 0 if changes > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
