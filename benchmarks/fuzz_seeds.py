"""Writes the seed corpora of the C++ decoder fuzz targets (cpp/fuzz/) from tritonclient's own
request builders, so the seeds are what the stock client sends.

Usage: python benchmarks/fuzz_seeds.py OUT_DIR
Writes OUT_DIR/{fuzz_http_request,fuzz_infer_body,fuzz_grpc_infer,fuzz_settings_body}/seed_*.
"""

import gzip
import json
import sys
import zlib
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc._utils as grpc_utils
import tritonclient.http as httpclient
import tritonclient.http._utils as http_utils

from rec.contract import random_request

# The fuzz targets' model spec (cpp/tests/test_util.h): dense [B, 2], lengths [B, 3], values ragged.
NUM_DENSE, NUM_SPARSE = 2, 3
# fuzz_settings_body: first byte 0 = a logging body, 1 = global trace settings, 3 = a model's; the
# bodies are what the stock client's update_log_settings / update_trace_settings send (json.dumps).
SETTINGS = [
    (0, {"log_verbose_level": 1}),
    (0, {"log_info": False, "log_warning": True, "log_format": "ISO8601"}),
    (0, {"log_file": ""}),
    (1, {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "10",
         "log_frequency": "2"}),
    (1, {"trace_level": ["OFF"], "trace_mode": "triton"}),
    (3, {"trace_rate": None, "trace_count": "-1"}),
]  # fmt: skip


def _batch(rows: int, seed: int) -> dict[str, np.ndarray]:
    return random_request(NUM_DENSE, NUM_SPARSE, rows, seed, (0, 2), (-(2**40), 2**40))


def _http_body(arrays: dict[str, np.ndarray], binary: bool) -> tuple[bytes, int | None]:
    inputs = []
    for name, a in arrays.items():
        t = httpclient.InferInput(
            name, list(a.shape), {np.float32: "FP32", np.int32: "INT32"}.get(a.dtype.type, "INT64")
        )
        t.set_data_from_numpy(a, binary_data=binary)
        inputs.append(t)
    outputs = [httpclient.InferRequestedOutput("scores", binary_data=binary)]
    body, header_length = http_utils._get_inference_request(
        inputs, "req-1", outputs, 0, False, False, 0, None, None
    )
    return body if isinstance(body, bytes) else body.encode(), header_length


def _http_request(body: bytes, header_length: int | None, encoding: str = "") -> bytes:
    headers = ["POST /v2/models/m/infer HTTP/1.1", "Host: 127.0.0.1"]
    if header_length is not None:
        headers.append(f"Inference-Header-Content-Length: {header_length}")
    if encoding:
        headers.append(f"Content-Encoding: {encoding}")
        body = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    headers.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


def _grpc_request(arrays: dict[str, np.ndarray]) -> bytes:
    inputs = []
    for name, a in arrays.items():
        t = grpcclient.InferInput(
            name, list(a.shape), {np.float32: "FP32", np.int32: "INT32"}.get(a.dtype.type, "INT64")
        )
        t.set_data_from_numpy(a)
        inputs.append(t)
    outputs = [grpcclient.InferRequestedOutput("scores")]
    request = grpc_utils._get_inference_request(
        "m", inputs, "", "req-1", outputs, 0, False, False, 0, None, None
    )
    return request.SerializeToString()


def main(out: Path) -> None:
    dirs = {
        name: out / name
        for name in (
            "fuzz_http_request",
            "fuzz_infer_body",
            "fuzz_grpc_infer",
            "fuzz_settings_body",
        )
    }
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    n = 0
    for rows in (1, 2, 5):
        arrays = _batch(rows, seed=rows)
        for binary in (False, True):
            body, header_length = _http_body(arrays, binary)
            # fuzz_infer_body: first byte 0 = no header length, 2 = length in the next two bytes.
            if header_length is None:
                prefix = bytes([0, 0, 0])
            else:
                prefix = bytes([2, header_length & 0xFF, header_length >> 8])
            (dirs["fuzz_infer_body"] / f"seed_{n}").write_bytes(prefix + body)
            for encoding in ("", "gzip", "deflate"):
                request = _http_request(body, header_length, encoding)
                (dirs["fuzz_http_request"] / f"seed_{n}_{encoding or 'plain'}").write_bytes(request)
            n += 1
        (dirs["fuzz_grpc_infer"] / f"seed_{rows}").write_bytes(_grpc_request(arrays))
    # Two pipelined requests on one connection.
    body, header_length = _http_body(_batch(2, seed=9), True)
    (dirs["fuzz_http_request"] / "seed_pipelined").write_bytes(
        _http_request(body, header_length) * 2
    )
    for i, (kind, settings) in enumerate(SETTINGS):
        body = json.dumps(settings).encode()
        (dirs["fuzz_settings_body"] / f"seed_{i}").write_bytes(bytes([kind]) + body)
    print(f"seeds written under {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
