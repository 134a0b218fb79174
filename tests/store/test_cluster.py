"""`rec store cluster` outlives a node's death (#49 item 8): SIGKILL a master's redis-server and
the command names it, keeps the other nodes running, prints the failover when its replica takes
over, and the cluster serves on. Real redis-server processes; Ctrl-C/SIGTERM still stops all."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

from rec.contract import store as contract
from rec.store.cluster import NodeView, exit_status, parse_cluster_nodes
from rec.store.writer import connect
from tests.helpers import REC


def redis_cli(port: int, *args: str) -> str:
    out = subprocess.run(["redis-cli", "-p", str(port), *args],
                         capture_output=True, text=True, timeout=10, check=True)  # fmt: skip
    return out.stdout


class Lines:
    """A pipe's lines, read by a thread, so that a test waits for one with a deadline."""

    def __init__(self, pipe) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe) -> None:
        for line in pipe:
            self._queue.put(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if match := re.search(pattern, line):
                return match
        raise AssertionError(f"no line matching {pattern!r} in {timeout:.0f} s; got {self.seen}")


def synced_pair(port: int, timeout: float) -> tuple[NodeView, NodeView]:
    """A master and its replica once the replica has its data (a replica that never synced
    may not stand for election), as the node on `port` sees them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = parse_cluster_nodes(redis_cli(port, "CLUSTER", "NODES"))
        for replica in (v for v in view.values() if v.role == "replica"):
            master = next((v for v in view.values() if v.id == replica.master_id), None)
            info = redis_cli(int(replica.address.rsplit(":", 1)[1]), "INFO", "replication")
            if master is not None and "master_link_status:up" in info:
                return master, replica
        time.sleep(0.2)
    raise AssertionError(f"no replica in sync with its master in {timeout:.0f} s: {view}")


def test_a_killed_master_fails_over_and_the_rest_keep_running(tmp_path):
    proc = subprocess.Popen([REC, "store", "cluster", str(tmp_path / "c")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    err = Lines(proc.stderr)
    url = ""
    try:
        url = proc.stdout.readline().strip()  # "" if it exited first
        assert url.startswith("redis://"), err.wait_for("error", 5)
        nodes = contract.parse_store_url(url).nodes
        master, replica = synced_pair(nodes[0][1], timeout=30)
        port = int(master.address.rsplit(":", 1)[1])
        pid = int(re.search(r"process_id:(\d+)", redis_cli(port, "INFO", "server")).group(1))
        os.kill(pid, signal.SIGKILL)

        # A node found dead within about a second; Redis promotes the replica after its
        # cluster-node-timeout (2 s) and an election.
        dead, heir = re.escape(master.address), re.escape(replica.address)
        err.wait_for(rf"^node {dead} \(master\) exited \(signal 9, SIGKILL\); its log: ", 10)
        took = err.wait_for(
            rf"^replica {heir} took over the slots of {dead} \(.+\) after ([\d.]+) s$", 30
        )
        assert float(took.group(1)) < 30
        assert proc.poll() is None, "the command exited with a node"

        live = [p for _, p in nodes if p != port]
        assert "cluster_state:ok" in redis_cli(live[0], "CLUSTER", "INFO")
        client = connect("redis://" + ",".join(f"127.0.0.1:{p}" for p in live))
        for i in range(50):  # keys on every master's slots, the promoted replica's among them
            client.hset(f"{{t{i}}}:0", "1", f"row{i}".encode())
        assert [client.hget(f"{{t{i}}}:0", "1") for i in range(50)] == [
            f"row{i}".encode() for i in range(50)
        ]
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, err.seen
    for host, port in contract.parse_store_url(url).nodes:
        with pytest.raises(OSError), socket.create_connection((host, port), timeout=2):
            pass


def test_exit_status_names_the_signal():
    assert exit_status(0) == "exit code 0"
    assert exit_status(1) == "exit code 1"
    assert exit_status(-9) == "signal 9, SIGKILL"
    assert exit_status(-15) == "signal 15, SIGTERM"
