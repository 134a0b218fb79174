"""Soak test of rec-server (loopback only, bounded in time and count): concurrent clients mix valid
inference requests with malformed ones and slow clients, and the script reports valid requests
lost (target 0), answers by class and status, p99 latency of valid requests, and the server's RSS
after warm-up vs at the end (target: flat within 5 %).

    python benchmarks/soak.py --minutes 10 [--repo artifacts/demo/model_repository]

All clients are asyncio connections of one process speaking HTTP/1.1 by hand (keep-alive), so
malformed bytes reach the server exactly as written. Valid bodies are built by tritonclient's own
request builder (JSON header + binary tensor data). Writes benchmarks/results/soak.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
import tritonclient.http._utils as http_utils

from rec.contract import ModelDir
from rec.cpu import cpu_info, describe
from rec.serve.cpp import launch_cpp
from rec.serve.process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
MAX_BODY = 1 << 20  # --max-body-bytes of the soaked server; "oversize" requests claim twice this
DATATYPES = {"dense_features": "FP32", "sparse_lengths": "INT32", "sparse_values": "INT64"}
# Weights of each request kind; "slow" dribbles a valid request a few bytes at a time.
MIX = {
    "valid": 60,
    "bad_json": 5,
    "wrong_dtype": 5,
    "shape_mismatch": 5,
    "lengths_values": 5,
    "oversize_body": 5,
    "truncated_binary": 5,
    "unknown_model": 5,
    "slow": 5,
}
VALID_KINDS = ("valid", "slow")


def _arrays(rng, n_dense: int, n_sparse: int, rows: int) -> dict[str, np.ndarray]:
    lengths = rng.integers(0, 4, size=(rows, n_sparse)).astype(np.int32)
    return {
        "dense_features": rng.standard_normal((rows, n_dense)).astype(np.float32),
        "sparse_lengths": lengths,
        "sparse_values": rng.integers(-(2**62), 2**62, size=int(lengths.sum()), dtype=np.int64),
    }


def _body(arrays: dict[str, np.ndarray], dtypes: dict[str, str] | None = None) -> tuple[bytes, int]:
    inputs = []
    for name, a in arrays.items():
        i = httpclient.InferInput(name, list(a.shape), (dtypes or DATATYPES)[name])
        i._raw_data = a.tobytes()  # the builder's binary path, without its dtype check
        i._parameters["binary_data_size"] = len(i._raw_data)
        inputs.append(i)
    body, header_length = http_utils._get_inference_request(
        inputs, None, None, 0, False, False, 0, None, None
    )
    return body, header_length


def _request(model: str, body: bytes, header_length: int | None, content_length=None) -> bytes:
    head = [f"POST /v2/models/{model}/infer HTTP/1.1", "Host: 127.0.0.1"]
    if header_length is not None:
        head.append(f"Inference-Header-Content-Length: {header_length}")
    head.append(f"Content-Length: {len(body) if content_length is None else content_length}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def build_request(kind: str, rng, shape: tuple[int, int]) -> bytes:
    """The bytes of one request of `kind` (see MIX)."""
    n_dense, n_sparse = shape
    rows = int(rng.integers(1, 5))
    a = _arrays(rng, n_dense, n_sparse, rows)
    if kind in VALID_KINDS:
        return _request("rec", *_body(a))
    if kind == "bad_json":
        return _request("rec", b'{"inputs": [ {"name": "dense_features", "shape": [1,', None)
    if kind == "wrong_dtype":
        a["dense_features"] = a["dense_features"].astype(np.int32)
        return _request("rec", *_body(a, {**DATATYPES, "dense_features": "INT32"}))
    if kind == "shape_mismatch":
        a["dense_features"] = rng.standard_normal((rows, n_dense + 1)).astype(np.float32)
        return _request("rec", *_body(a))
    if kind == "lengths_values":
        a["sparse_values"] = np.append(a["sparse_values"], np.int64(7))
        return _request("rec", *_body(a))
    if kind == "oversize_body":
        return _request("rec", b"", None, content_length=2 * MAX_BODY)
    if kind == "truncated_binary":
        body, header_length = _body(a)
        return _request("rec", body[: header_length + 3], header_length)
    if kind == "unknown_model":
        return _request("no_such_model", *_body(a))
    raise ValueError(kind)


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, server_closes) of one HTTP/1.1 response with Content-Length."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, body, headers.get("connection", "").lower() == "close"


class Client:
    """One keep-alive connection; reconnects after the server closes it (413, bad request)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.conn = None

    async def send(self, data: bytes, slow: bool) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.conn
        try:
            if slow:  # a slow client: 64-byte pieces, 10 ms apart
                for i in range(0, len(data), 64):
                    writer.write(data[i : i + 64])
                    await writer.drain()
                    await asyncio.sleep(0.01)
            else:
                writer.write(data)
                await writer.drain()
            status, body, closes = await asyncio.wait_for(_read_response(reader), 30)
        except BaseException:
            self.close()
            raise
        if closes:
            self.close()
        return status, body

    def close(self) -> None:
        if self.conn is not None:
            self.conn[1].close()
            self.conn = None


async def _worker(k, addr, shape, deadline, budget, stats, kinds, weights):
    rng = np.random.default_rng(k)
    pick = random.Random(k)
    client = Client(*addr)
    while time.monotonic() < deadline and budget[0] > 0:
        budget[0] -= 1
        kind = pick.choices(kinds, weights)[0]
        data = build_request(kind, rng, shape)
        t0 = time.perf_counter()
        try:
            status, body = await client.send(data, slow=kind == "slow")
        except Exception as e:  # no answer at all: for a valid request, that is a lost request
            stats["answers"][f"{kind}:no_answer:{type(e).__name__}"] += 1
            if kind in VALID_KINDS:
                stats["lost"] += 1
            continue
        stats["answers"][f"{kind}:{status}"] += 1
        if kind in VALID_KINDS:
            if status == 200 and b'"scores"' in body:
                ms = (time.perf_counter() - t0) * 1e3
                stats["latency_ms" if kind == "valid" else "slow_latency_ms"].append(ms)
                stats["valid_ok"] += 1
            else:
                stats["lost"] += 1
    client.close()


def start_server(repo: Path, extra: list[str]) -> ServerProcess:
    # $REC_SERVER (the sanitized build under scripts/test_sanitized.sh), else build/cpp.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return launch_cpp(repo, "--max-body-bytes", str(MAX_BODY), *extra, host="127.0.0.1", env=env)


async def soak(args) -> dict:
    manifest = ModelDir.of(args.repo, "rec").read_manifest().data
    shape = (len(manifest["features"]["dense"]), len(manifest["features"]["sparse"]))
    server = start_server(args.repo, ["--http-threads", "2", "--executor-threads", "2"])
    host, port = server.endpoints.http.rsplit(":", 1)
    addr = (host, int(port))
    kinds, weights = list(MIX), list(MIX.values())
    try:
        # Warm-up: the first requests size the allocator's arenas and the model's buffers.
        warm = {
            "answers": Counter(),
            "lost": 0,
            "latency_ms": [],
            "slow_latency_ms": [],
            "valid_ok": 0,
        }
        warm_deadline = time.monotonic() + args.warmup_s
        await asyncio.gather(
            *(
                _worker(10_000 + k, addr, shape, warm_deadline, [10**9], warm, kinds, weights)
                for k in range(args.concurrency)
            )
        )
        rss_start = server.rss_bytes() // 1024
        stats = {
            "answers": Counter(),
            "lost": 0,
            "latency_ms": [],
            "slow_latency_ms": [],
            "valid_ok": 0,
        }
        t0 = time.monotonic()
        deadline = t0 + args.minutes * 60
        budget = [args.max_requests]
        rss_samples = []

        async def sample_rss():
            while time.monotonic() < deadline and budget[0] > 0:
                rss_samples.append(server.rss_bytes() // 1024)
                await asyncio.sleep(5)

        sampler = asyncio.create_task(sample_rss())
        await asyncio.gather(
            *(
                _worker(k, addr, shape, deadline, budget, stats, kinds, weights)
                for k in range(args.concurrency)
            )
        )
        sampler.cancel()
        elapsed = time.monotonic() - t0
        rss_end = server.rss_bytes() // 1024
        alive = server.alive()
    finally:
        exit_code = server.stop(timeout=60)
    lat = np.array(stats["latency_ms"]) if stats["latency_ms"] else np.array([np.nan])
    by_class = Counter()
    for key, n in stats["answers"].items():
        by_class[key.split(":")[0]] += n
    return {
        "seconds": round(elapsed, 1),
        "warmup_s": args.warmup_s,
        "concurrency": args.concurrency,
        "client_processes": 1,
        "requests": sum(stats["answers"].values()),
        "requests_by_class": dict(sorted(by_class.items())),
        "answers_by_class_and_status": dict(sorted(stats["answers"].items())),
        "valid_sent": sum(by_class[k] for k in VALID_KINDS),
        "valid_ok": stats["valid_ok"],
        "valid_lost": stats["lost"],
        "valid_p50_ms": round(float(np.percentile(lat, 50)), 2),
        "valid_p99_ms": round(float(np.percentile(lat, 99)), 2),
        "slow_client_p50_ms": round(float(np.median(stats["slow_latency_ms"] or [np.nan])), 2),
        "rss_kib_after_warmup": rss_start,
        "rss_kib_end": rss_end,
        "rss_kib_max": max(rss_samples + [rss_end]),
        # A server that died (a crash, a sanitizer abort) has no RSS; alive/exit code say so.
        "rss_growth_pct": round(100.0 * (rss_end - rss_start) / rss_start, 2)
        if rss_start
        else None,
        "server_alive_at_end": alive,
        "server_exit_code": exit_code,
        "cpu": describe(cpu_info()),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--max-requests", type=int, default=5_000_000, help="stop after this many")
    p.add_argument("--warmup-s", type=float, default=15.0)
    p.add_argument("--repo", type=Path, default=ROOT / "artifacts/demo/model_repository")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/soak.json")
    args = p.parse_args(argv)
    result = asyncio.run(soak(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    ok = result["valid_lost"] == 0 and result["server_alive_at_end"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
