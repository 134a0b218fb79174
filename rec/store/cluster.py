"""A Redis Cluster of our own: masters and their replicas as redis-server processes on free ports,
joined with `redis-cli --cluster create`, for tests, the demo and the benchmarks. Nothing here
uses a Redis that the machine happens to run.

Each node can run under a command prefix (`ip netns exec NS`) and bind its own address, so a
test puts every node on its own network-namespace "host".

Example:
    >>> with RedisCluster(tmp_path, masters=3, replicas=1) as cluster:  # doctest: +SKIP
    ...     url = cluster.url()   # redis://127.0.0.1:PORT,127.0.0.1:PORT,...
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rec.broker import BrokerError, _free_port, redis_server_path


class ClusterError(BrokerError):
    pass


@dataclass
class Node:
    host: str
    port: int
    bus_port: int
    folder: Path
    prefix: Sequence[str] = ()
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def cli(self, *args: str, timeout: float = 30.0) -> str:
        """redis-cli against this node (under its prefix); its stdout."""
        cmd = [*self.prefix, "redis-cli", "-h", self.host, "-p", str(self.port), *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise ClusterError(f"redis-cli {' '.join(args)} on {self.address}: {out.stderr}")
        return out.stdout

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass(frozen=True)
class NodeView:
    """One node as a line of CLUSTER NODES describes it."""

    id: str
    address: str  # host:port
    role: str  # "master" or "replica"
    master_id: str  # a replica's master; "-" for a master
    failed: bool  # flagged fail or fail? (suspected) by the node that answered
    slots: tuple[str, ...]  # spans it serves ("0-5460", "7"); imports and migrations left out


def parse_cluster_nodes(text: str) -> dict[str, NodeView]:
    """CLUSTER NODES' answer, by address. A line is `id host:port@bus[,hostname] flags master
    ping pong epoch link slot...`; a slot span in brackets is an import or migration under way,
    not ownership."""
    out = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        flags = fields[2].split(",")
        address = fields[1].split("@")[0]
        out[address] = NodeView(
            id=fields[0],
            address=address,
            role="master" if "master" in flags else "replica",
            master_id=fields[3],
            failed="fail" in flags or "fail?" in flags,
            slots=tuple(span for span in fields[8:] if not span.startswith("[")),
        )
    return out


class RedisCluster:
    """`masters` masters with `replicas` replicas each, on `hosts` (one per node, cycled; all on
    127.0.0.1 by default), data in `folder`. `prefixes`: a command prefix per host (e.g.
    `ip netns exec h1`), the same length as `hosts`."""

    def __init__(
        self,
        folder: Path,
        masters: int = 3,
        replicas: int = 1,
        hosts: Sequence[str] = ("127.0.0.1",),
        prefixes: Sequence[Sequence[str]] | None = None,
        node_timeout_ms: int = 2000,
        timeout: float = 60.0,
    ) -> None:
        binary = redis_server_path()
        if binary is None:
            raise ClusterError("redis-server is not installed (Debian: apt-get install "
                               "redis-server; `make setup` installs it)")  # fmt: skip
        if masters < 3:
            raise ClusterError(f"Redis Cluster needs at least 3 masters, got {masters}")
        self.binary, self.folder = binary, Path(folder).resolve()
        self.node_timeout_ms = node_timeout_ms
        prefixes = prefixes or [()] * len(hosts)
        self.nodes: list[Node] = []
        for i in range(masters * (1 + replicas)):
            host, prefix = hosts[i % len(hosts)], tuple(prefixes[i % len(hosts)])
            # A namespace's address is free on the host's side too; ports need not differ then,
            # but they do no harm and keep one code path.
            # The cluster bus is not port + 10000 (the default), which may be over 65535.
            ports = [_free_port("127.0.0.1" if not prefix else "0.0.0.0") for _ in "ab"]
            self.nodes.append(Node(host, *ports, self.folder / f"node{i}", prefix))
        try:
            for node in self.nodes:
                self.start_node(node)
            create = ["--cluster", "create", *(n.address for n in self.nodes),
                      "--cluster-replicas", str(replicas), "--cluster-yes"]  # fmt: skip
            self.nodes[0].cli(*create, timeout=timeout)
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise

    def url(self) -> str:
        """redis://host:port,... (every node: a client finds the cluster from any of them)."""
        return "redis://" + ",".join(n.address for n in self.nodes)

    def start_node(self, node: Node, timeout: float = 20.0) -> None:
        node.folder.mkdir(parents=True, exist_ok=True)
        # fmt: off
        args = [*node.prefix, self.binary, "--port", str(node.port), "--bind", node.host,
                "--dir", str(node.folder), "--logfile", str(node.folder / "redis.log"),
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-port", str(node.bus_port),
                "--cluster-node-timeout", str(self.node_timeout_ms),
                "--appendonly", "no", "--save", "", "--daemonize", "no", "--protected-mode", "no"]
        # fmt: on
        node.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if node.proc.poll() is not None:
                raise ClusterError(
                    f"redis-server {node.address} exited with "
                    f"{node.proc.returncode}; log: {self.log_tail(node)}"
                )
            with contextlib.suppress(ClusterError, subprocess.TimeoutExpired):
                if node.cli("PING", timeout=2).strip() == "PONG":
                    return
            time.sleep(0.05)
        raise ClusterError(f"redis-server {node.address} did not answer PING in {timeout:.0f} s")

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Until every live node says cluster_state:ok and every slot is served."""
        deadline = time.monotonic() + timeout
        info = ""
        while time.monotonic() < deadline:
            states = []
            for node in self.nodes:
                if node.alive():
                    with contextlib.suppress(ClusterError, subprocess.TimeoutExpired):
                        info = node.cli("CLUSTER", "INFO", timeout=2)
                        states.append("cluster_state:ok" in info
                                      and "cluster_slots_ok:16384" in info)  # fmt: skip
                        continue
                    states.append(False)
            if states and all(states):
                return
            time.sleep(0.1)
        raise ClusterError(f"the cluster did not reach cluster_state:ok in {timeout:.0f} s: {info}")

    def masters(self) -> list[Node]:
        """The live nodes that are masters now (after a failover, a former replica)."""
        out = []
        for node in self.nodes:
            if node.alive() and "role:master" in node.cli("INFO", "replication", timeout=5):
                out.append(node)
        return out

    def used_memory(self) -> dict[str, int]:
        """used_memory per live node, bytes."""
        out = {}
        for node in self.nodes:
            if node.alive():
                for line in node.cli("INFO", "memory", timeout=5).splitlines():
                    if line.startswith("used_memory:"):
                        out[node.address] = int(line.split(":")[1])
        return out

    def view(self) -> dict[str, NodeView]:
        """CLUSTER NODES as the first live node that answers sees it, by address; {} if none
        answers."""
        for node in self.nodes:
            if node.alive():
                with contextlib.suppress(ClusterError, subprocess.TimeoutExpired):
                    return parse_cluster_nodes(node.cli("CLUSTER", "NODES", timeout=5))
        return {}

    def owner(self, key: str) -> Node:
        """The master that serves `key`'s hash slot now."""
        slot = self.slot(key)
        node = next(n for n in self.nodes if n.alive())
        view = parse_cluster_nodes(node.cli("CLUSTER", "NODES", timeout=5))
        for entry in view.values():
            if entry.role != "master" or entry.failed:
                continue
            for span in entry.slots:
                low, _, high = span.partition("-")
                if int(low) <= slot <= int(high or low):
                    return next(n for n in self.nodes if n.address == entry.address)
        raise ClusterError(f"no master serves slot {slot} (of {key!r})")

    def slot(self, key: str) -> int:
        node = next(n for n in self.nodes if n.alive())
        return int(node.cli("CLUSTER", "KEYSLOT", key, timeout=5))

    def start_moving(self, key: str, to: Node) -> int:
        """Resharding's first half, as `redis-cli --cluster reshard` does it for one slot: `to`
        importing `key`'s slot, its owner migrating it, and every key of the slot moved over.
        The owner then answers ASK for them, until finish_moving. Returns the slot."""
        slot, source = self.slot(key), self.owner(key)
        if source is to:
            raise ClusterError(f"slot {slot} of {key!r} is on {to.address} already")
        to.cli("CLUSTER", "SETSLOT", str(slot), "IMPORTING", self._id(source))
        source.cli("CLUSTER", "SETSLOT", str(slot), "MIGRATING", self._id(to))
        keys = source.cli("CLUSTER", "GETKEYSINSLOT", str(slot), "1000").split()
        out = source.cli("MIGRATE", to.host, str(to.port), "", "0", "10000", "KEYS", *keys)
        if out.strip() != "OK":
            raise ClusterError(f"MIGRATE of slot {slot} to {to.address}: {out.strip()}")
        return slot

    def finish_moving(self, slot: int, to: Node) -> None:
        """Resharding's second half: every master told `to` owns `slot`. Its former owner then
        answers MOVED."""
        to_id = self._id(to)
        for node in [to, *(m for m in self.masters() if m is not to)]:
            node.cli("CLUSTER", "SETSLOT", str(slot), "NODE", to_id)

    @staticmethod
    def _id(node: Node) -> str:
        return node.cli("CLUSTER", "MYID", timeout=5).strip()

    def kill(self, node: Node) -> None:
        """SIGKILL one node (a crash)."""
        if node.alive():
            node.proc.send_signal(signal.SIGKILL)
            node.proc.wait()

    @staticmethod
    def log_tail(node: Node, lines: int = 10) -> str:
        with contextlib.suppress(OSError):
            text = (node.folder / "redis.log").read_text(errors="replace")
            return "".join(text.splitlines(True)[-lines:])
        return ""

    def stop(self) -> None:
        for node in self.nodes:
            if node.alive():
                node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes:
            if node.proc is not None:
                try:
                    node.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait()

    def __enter__(self) -> RedisCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def exit_status(returncode: int) -> str:
    """A process's exit as a person reads it: "exit code 1", "signal 9, SIGKILL"."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"signal {-returncode}, {signal.Signals(-returncode).name}"
    except ValueError:
        return f"signal {-returncode}"


class Watch:
    """What `rec store cluster` tells its user while it runs: which node exited (its address,
    its role then, how it ended) and, for a master, the replica that took over its slots.
    The other nodes keep running: a master's death is what the replicas are there for.

    Each poll looks at the processes and at CLUSTER NODES (as a live node sees it). The view
    from before a death says what the dead node was; Redis only promotes a replica after
    cluster-node-timeout, so a poll a second after the death still has it."""

    def __init__(self, cluster: RedisCluster, give_up_s: float | None = None) -> None:
        self.cluster = cluster
        self.last = cluster.view()
        self.gone: set[str] = set()
        # A dead master's address -> (its last view, when its death was seen).
        self.orphans: dict[str, tuple[NodeView, float]] = {}
        # Redis gives a replica cluster-node-timeout to see its master fail, then elects it in
        # about as long again; far past that, no replica is coming.
        self.give_up_s = give_up_s or max(30.0, 10 * cluster.node_timeout_ms / 1000)

    @property
    def alive(self) -> int:
        return sum(node.alive() for node in self.cluster.nodes)

    def poll(self) -> list[str]:
        """The lines to tell since the last poll: deaths, then failovers."""
        now, lines = time.monotonic(), []
        for node in self.cluster.nodes:
            if node.proc is not None and not node.alive() and node.address not in self.gone:
                self.gone.add(node.address)
                lines += self._exited(node, now)
        view = self.cluster.view()
        if view:
            self.last = view
        for address, (seen, since) in list(self.orphans.items()):
            heirs = (v for v in view.values() if v.role == "master" and not v.failed
                     and v.address != address and set(seen.slots) <= set(v.slots))  # fmt: skip
            heir = next(heirs, None)
            if heir is not None:
                lines.append(f"replica {heir.address} took over the slots of {address} "
                             f"({' '.join(seen.slots)}) after {now - since:.1f} s")  # fmt: skip
            elif now - since > self.give_up_s:
                lines.append(f"no replica took over the slots of {address} in "
                             f"{self.give_up_s:.0f} s: the cluster refuses their keys")  # fmt: skip
            else:
                continue
            del self.orphans[address]
        return lines

    def _exited(self, node: Node, now: float) -> list[str]:
        seen = self.last.get(node.address)
        if seen is None:
            role = "role unknown"
        elif seen.role == "master":
            role = "master"
        else:
            masters = {v.id: v.address for v in self.last.values()}
            role = f"replica of {masters.get(seen.master_id, seen.master_id)}"
        lines = [f"node {node.address} ({role}) exited ({exit_status(node.proc.returncode)}); "
                 f"its log: {node.folder / 'redis.log'}"]  # fmt: skip
        if seen is None or seen.role != "master" or not seen.slots:
            return lines
        standby = [v.address for v in self.last.values()
                   if v.master_id == seen.id and v.address not in self.gone]  # fmt: skip
        if standby:
            self.orphans[node.address] = (seen, now)
            lines.append(f"waiting for a replica ({', '.join(standby)}) to take over its slots")
        else:
            lines.append(f"it has no replica left: its slots ({' '.join(seen.slots)}) go unserved "
                         "and the cluster refuses their keys")  # fmt: skip
        return lines
