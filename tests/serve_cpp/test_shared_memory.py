"""Triton's system shared memory extension on rec-server, through the stock tritonclient's own
helpers (tritonclient.utils.shared_memory): inputs read from and outputs written into regions,
scores equal to the socket path's bit for bit, every bad region refused, and a region
unregistered while a request that uses it waits in the queue."""

from __future__ import annotations

import itertools
import os
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from clients import assert_same_rows, infer_inputs
from server import Server
from tiny_model import INPUT_NAMES, NUM_TASKS, make_batch, write_model
from tritonclient.utils import InferenceServerException

CLIENTS = {"http": httpclient, "grpc": grpcclient}
CLIENT_ERROR = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}
_keys = itertools.count()


class Regions:
    """Shared memory objects made with tritonclient's helpers; all destroyed at the end."""

    def __init__(self) -> None:
        self.handles: list = []

    def make(self, size: int) -> tuple[str, str, object]:
        n = next(_keys)
        name, key = f"region{n}", f"/rec_test_{os.getpid()}_{n}"
        handle = shm.create_shared_memory_region(name, key, size)
        self.handles.append(handle)
        return name, key, handle

    def close(self) -> None:
        for h in self.handles:
            shm.destroy_shared_memory_region(h)


@pytest.fixture()
def regions():
    r = Regions()
    yield r
    r.close()


def _client(server, protocol: str):
    module = CLIENTS[protocol]
    return module.InferenceServerClient(getattr(server, protocol))


def _shm_request(module, client, regions: Regions, batch: dict[str, np.ndarray], out_rows: int):
    """All inputs in one input region (one after another), scores into an output region."""
    arrays = [np.ascontiguousarray(batch[n]) for n in INPUT_NAMES]
    size = sum(a.nbytes for a in arrays)
    name, key, handle = regions.make(size)
    shm.set_shared_memory_region(handle, arrays)
    client.register_system_shared_memory(name, key, size)
    inputs, offset = [], 0
    for n, a in zip(INPUT_NAMES, arrays, strict=True):
        dtype = {"float32": "FP32", "int32": "INT32", "int64": "INT64"}[a.dtype.name]
        i = module.InferInput(n, list(a.shape), dtype)
        i.set_shared_memory(name, a.nbytes, offset=offset)
        inputs.append(i)
        offset += a.nbytes
    out_size = out_rows * NUM_TASKS * 4
    out_name, out_key, out_handle = regions.make(out_size)
    client.register_system_shared_memory(out_name, out_key, out_size)
    output = module.InferRequestedOutput("scores")
    output.set_shared_memory(out_name, out_size)
    return inputs, output, out_handle


def _assert_in_region(result, protocol: str, size: int) -> None:
    """The response names the region the scores were written into and carries no data."""
    out = result.get_output("scores")
    if protocol == "http":
        assert "data" not in out and out["parameters"]["shared_memory_byte_size"] == size
        assert out["parameters"]["shared_memory_region"].startswith("region")
    else:
        assert out.parameters["shared_memory_byte_size"].int64_param == size
        assert out.parameters["shared_memory_region"].string_param.startswith("region")
        assert len(result.get_response().raw_output_contents) == 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("rows", [1, 64, 512])
def test_shared_memory_scores_equal_the_socket_path(server, reference, regions, protocol, rows):
    module = CLIENTS[protocol]
    batch = make_batch(rows, seed=rows)
    with _client(server, protocol) as c:
        inputs, output, out_handle = _shm_request(module, c, regions, batch, rows)
        result = c.infer("rec", inputs, outputs=[output])
        _assert_in_region(result, protocol, rows * NUM_TASKS * 4)
        got = shm.get_contents_as_numpy(out_handle, np.float32, [rows, NUM_TASKS])
        np.testing.assert_array_equal(got, reference(batch))
        # Inputs from shared memory, the scores in the response: the same numbers.
        plain = c.infer("rec", inputs).as_numpy("scores")
        np.testing.assert_array_equal(plain, reference(batch))
        socket = c.infer("rec", infer_inputs(module, batch)).as_numpy("scores")
        np.testing.assert_array_equal(socket, got)
        c.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_register_status_and_unregister(server, regions, protocol):
    with _client(server, protocol) as c:
        a, key_a, _ = regions.make(4096)
        b, key_b, _ = regions.make(8192)
        c.register_system_shared_memory(a, key_a, 1000, offset=96)
        c.register_system_shared_memory(b, key_b, 8192)
        status = c.get_system_shared_memory_status(
            **({"as_json": True} if protocol == "grpc" else {})
        )
        if protocol == "grpc":
            status = list(status["regions"].values())
        by_name = {s["name"]: s for s in status}
        got = {k: int(v) if k in ("offset", "byte_size") else v for k, v in by_name[a].items()}
        assert got == {"name": a, "key": key_a, "offset": 96, "byte_size": 1000}
        assert int(by_name[b]["byte_size"]) == 8192
        c.unregister_system_shared_memory(a)
        with pytest.raises(InferenceServerException) as e:
            c.get_system_shared_memory_status(a)
        assert f"no shared memory region '{a}' is registered" in e.value.message()
        c.unregister_system_shared_memory()  # all
        status = c.get_system_shared_memory_status(
            **({"as_json": True} if protocol == "grpc" else {})
        )
        assert not (status.get("regions") if protocol == "grpc" else status)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_regions_are_client_errors_naming_them(server, reference, regions, protocol):
    module = CLIENTS[protocol]
    batch = make_batch(4, seed=4)
    with _client(server, protocol) as c:

        def refused(call, expected: str) -> None:
            with pytest.raises(InferenceServerException) as e:
                call()
            assert e.value.status() == CLIENT_ERROR[protocol], e.value.message()
            assert expected in e.value.message()

        name, key, handle = regions.make(256)
        refused(lambda: c.register_system_shared_memory("x", "/rec_no_such_key", 16),
                "shared memory region 'x': cannot open key '/rec_no_such_key'")  # fmt: skip
        refused(lambda: c.register_system_shared_memory(name, key, 200, offset=100),
                f"offset 100 + byte_size 200 runs past the end of '{key}' (256 bytes)")  # fmt: skip
        c.register_system_shared_memory(name, key, 256)
        refused(lambda: c.register_system_shared_memory(name, key, 16),
                f"shared memory region '{name}' is already registered")  # fmt: skip

        def with_input(region: str, size: int, offset: int = 0):
            inputs = infer_inputs(module, batch)
            inputs[0].set_shared_memory(region, size, offset=offset)
            return lambda: c.infer("rec", inputs)

        dense = batch["dense_features"].nbytes  # 4 x 4 x 4 = 64
        refused(with_input("nope", dense), "input 'dense_features': no shared memory region 'nope'")
        refused(with_input(name, dense, offset=250),
                f"input 'dense_features': offset 250 + byte_size 64 runs past the end of shared "
                f"memory region '{name}' (256 bytes)")  # fmt: skip
        refused(with_input(name, dense - 4), "dense_features")  # the shape wants 64 bytes
        out = module.InferRequestedOutput("scores")
        out.set_shared_memory(name, 8)  # 4 rows x 2 tasks x 4 bytes do not fit in 8
        refused(lambda: c.infer("rec", infer_inputs(module, batch), outputs=[out]),
                f"output 'scores' is 32 bytes, more than the 8 bytes given in shared memory "
                f"region '{name}'")  # fmt: skip
        # The client shrinks the object under a registered region: an error, not a SIGBUS.
        os.truncate(f"/dev/shm{key}", 16)
        refused(with_input(name, dense), f"the object '{key}' no longer holds its 256 bytes")
        result = c.infer("rec", infer_inputs(module, batch))  # and the server goes on
        np.testing.assert_array_equal(result.as_numpy("scores"), reference(batch))
        c.unregister_system_shared_memory()


def test_cuda_shared_memory_is_not_supported(server):
    with httpclient.InferenceServerClient(server.http) as c:
        with pytest.raises(InferenceServerException) as e:
            c.get_cuda_shared_memory_status()
        assert e.value.status() == "400"
        assert "CUDA shared memory is not supported on this server" in e.value.message()
    with grpcclient.InferenceServerClient(server.grpc) as c:
        with pytest.raises(InferenceServerException) as e:
            c.get_cuda_shared_memory_status()
        assert e.value.status() == "StatusCode.UNIMPLEMENTED"
        assert "CUDA shared memory is not supported on this server" in e.value.message()


def test_unregistered_while_queued_and_mixed_in_a_batch(tmp_path, reference, regions):
    """A 0.5 s batching window keeps requests queued: the region is unregistered (and its object
    unlinked) under a queued request, which still answers into it; requests through shared memory
    and through the socket share batches and all score right."""
    write_model(tmp_path, delay_us=500_000)
    s = Server(tmp_path, "--batch-window", "fixed")
    try:
        batch = make_batch(8, seed=8)
        with httpclient.InferenceServerClient(s.http, concurrency=4) as c:
            inputs, output, _ = _shm_request(httpclient, c, regions, batch, 8)
            pending = c.async_infer("rec", inputs, outputs=[output])
            others = [c.async_infer("rec", infer_inputs(httpclient, make_batch(3, seed=i)))
                      for i in range(3)]  # fmt: skip
            time.sleep(0.1)
            c.unregister_system_shared_memory()
            for h in regions.handles:
                shm.destroy_shared_memory_region(h)  # the client's mapping goes too
            regions.handles.clear()
            _assert_in_region(pending.get_result(), "http", 8 * NUM_TASKS * 4)
            for i, other in enumerate(others):
                scores = other.get_result().as_numpy("scores")
                assert_same_rows(scores, reference(make_batch(3, seed=i)))  # batched
            stats = c.get_inference_statistics("rec")["model_stats"][0]
            assert stats["execution_count"] < stats["inference_count"]  # batched together
    finally:
        assert s.stop() == 0, s.stderr()


def test_shared_memory_and_socket_requests_share_batches(server, reference, regions):
    """Concurrent clients, half through shared memory: every answer is its own batch's."""
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            batch = make_batch(5 + i, seed=100 + i)
            with httpclient.InferenceServerClient(server.http) as c:
                if i % 2:
                    scores = c.infer("rec", infer_inputs(httpclient, batch)).as_numpy("scores")
                else:
                    inputs, output, handle = _shm_request(httpclient, c, regions, batch, 5 + i)
                    c.infer("rec", inputs, outputs=[output])
                    scores = shm.get_contents_as_numpy(handle, np.float32, [5 + i, NUM_TASKS])
                assert_same_rows(scores, reference(batch))  # batched with the others
        except BaseException as e:  # noqa: BLE001  (re-raised below, in the test's thread)
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    with httpclient.InferenceServerClient(server.http) as c:
        c.unregister_system_shared_memory()
