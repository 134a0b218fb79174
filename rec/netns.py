"""Hosts on this machine for real: network namespaces joined by a bridge, each with its own
address, for the tests and benchmarks that need several hosts (a Redis Cluster whose master
can be killed, the store read from 1, 2 or 3 hosts). Needs root (ip netns).

The bridge sits in a namespace of its own (a switch): this namespace's firewall (Docker sets the
FORWARD policy to DROP, and bridged frames pass through it) never sees the hosts' traffic. This
process's namespace joins the switch with an address of the same subnet, so the test process is
one more host: it reaches the namespaces' addresses and nothing else new. Everything is named
after this process and removed by close().

Example:
    >>> with Hosts(3) as hosts:  # doctest: +SKIP
    ...     subprocess.run([*hosts.prefix(0), "redis-server", "--bind", hosts.address(0)])
"""

from __future__ import annotations

import os
import shutil
import subprocess


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns); this session is not root"
    if shutil.which("ip") is None:
        return "iproute2's ip command is not installed"
    probe = f"recprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False)
    return None


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


class Hosts:
    """`count` namespaces r<pid>h<i>, addresses 10.<a>.<b>.(i + 1)/24; this process .254."""

    def __init__(self, count: int) -> None:
        pid = os.getpid()
        self.tag = f"r{pid % 100000}"
        # A /24 per process: two test sessions on one machine do not share a subnet.
        self.subnet = f"10.{200 + pid % 50}.{(pid // 50) % 250}"
        self.names = [f"{self.tag}h{i}" for i in range(count)]
        self.switch = f"{self.tag}sw"
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "name", "sw0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "sw0", "up")
            # This namespace's port on the switch: the test process as a host (.254).
            here, port = f"{self.tag}r", f"{self.tag}p"
            _ip("link", "add", here, "type", "veth", "peer", "name", port)
            self._plug(port)
            _ip("addr", "add", f"{self.subnet}.254/24", "dev", here)
            _ip("link", "set", here, "up")
            for i, ns in enumerate(self.names):
                inner, outer = f"{self.tag}v{i}", f"{self.tag}b{i}"
                _ip("netns", "add", ns)
                _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
                _ip("link", "set", inner, "netns", ns)
                self._plug(outer)
                _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def _plug(self, link: str) -> None:
        """Moves `link` into the switch namespace and onto its bridge."""
        _ip("link", "set", link, "netns", self.switch)
        _ip("-n", self.switch, "link", "set", link, "master", "sw0")
        _ip("-n", self.switch, "link", "set", link, "up")

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def prefix(self, i: int) -> list[str]:
        """The command prefix that runs a process on host i."""
        return ["ip", "netns", "exec", self.names[i]]

    def close(self) -> None:
        # Deleting a namespace deletes its end of each veth pair, and so the pair.
        for ns in [*self.names, self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", f"{self.tag}r"], capture_output=True, check=False)

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
