"""Which Redis node serves a key of a log: one node, or the master of the key's slot in a Redis
Cluster (#60). The logs' readers and writers dial `node_for(key)`; on an error that says the
key's node changed or is changing, they treat it as an outage (close, invalidate, back off) and
the next dial routes afresh.

The map comes from CLUSTER SLOTS, asked of the URL's nodes (seeds) in turn and then of the
masters learned last time, so a seed that died does not stop a refresh. A node that answers
"cluster support disabled" is a plain Redis: a one-node URL then names the node every key lives
on (the single-node case, as before clusters), and a URL of several such nodes is refused, since
a client could not know which of them holds a log.

The errors that re-route (`reroutes`):
  MOVED        the slot has a new master for good (a reshard, a failover seen by this node)
  ASK          the slot is being migrated; the key may be on the target already. Treated as an
               outage: the link retries the owner until the migration ends, rather than talking
               to the target with ASKING for a few moments
  CLUSTERDOWN  the cluster serves no key now (a master died, its replica not yet elected)
  TRYAGAIN     a multi-key command during a migration
  READONLY     the node was a master and is a replica now (its replica took over after it
               came back)
  MASTERDOWN   a replica that lost its master
  UNBLOCKED    on a cluster only (Router.reroutes): a blocked XREADGROUP whose stream was
               migrated away (MIGRATE deletes it at the source). On a plain node it means the
               stream was deleted, which stays an error
  and a lost connection, a timeout or a refused dial (redis-py's ConnectionError, which
  includes LOADING, and OSError).

Example:
    >>> router = Router([("127.0.0.1", 7000), ("127.0.0.1", 7001)])  # doctest: +SKIP
    >>> router.node_for("{rec:events:0:10}")                          # doctest: +SKIP
    ('127.0.0.1', 7001)
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence

from rec.contract.partitions import key_slot

Node = tuple[str, int]
DISABLED = "cluster support disabled"
"""What a Redis that is not a cluster node answers to CLUSTER SLOTS."""
_CODES = ("MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "MASTERDOWN")


class RouteError(ConnectionError):
    """No node could say who serves a key (every seed unreachable, or the key's slot unserved):
    an outage, retried like a lost connection (it is an OSError)."""


class RouteConfigError(ValueError):
    """The URL's nodes cannot be a log's home: several nodes that are not a cluster."""


def _routing_errors() -> tuple[type[BaseException], ...]:
    import redis.exceptions as e

    return (e.AskError, e.TryAgainError, e.ClusterDownError, e.ReadOnlyError)  # MOVED is an ASK


def redirected(error: BaseException) -> bool:
    """Whether `error` is a cluster's answer that the key is served elsewhere or not now
    (MOVED, ASK, CLUSTERDOWN, TRYAGAIN, READONLY, MASTERDOWN), not a lost connection."""
    import redis

    if isinstance(error, _routing_errors()):
        return True
    # A parser that does not map the code to a class keeps it in the message.
    return isinstance(error, redis.ResponseError) and str(error).startswith(_CODES)


def reroutes(error: BaseException) -> bool:
    """Whether `error` means the key's node changed, is changing or is away: the link closes,
    invalidates its router and backs off (module docstring)."""
    import redis

    return redirected(error) or isinstance(error, (redis.ConnectionError, redis.TimeoutError,
                                                   OSError))  # fmt: skip


def describe(error: BaseException) -> str:
    """An error as a person reads it: redis-py drops a redirection's code from its message
    ("3999 127.0.0.1:7002"), so put it back ("MOVED 3999 127.0.0.1:7002")."""
    import redis.exceptions as e

    text = str(error)
    for cls, code in ((e.MovedError, "MOVED"), (e.AskError, "ASK"), (e.TryAgainError, "TRYAGAIN"),
                      (e.MasterDownError, "MASTERDOWN"), (e.ClusterDownError, "CLUSTERDOWN"),
                      (e.ReadOnlyError, "READONLY")):  # fmt: skip
        if isinstance(error, cls):
            return text if text.startswith(code) else f"{code} {text}"
    return text


class Router:
    """The node of each key, for a log URL's `nodes` (rec.contract.urls.StreamUrl.nodes). Safe
    to share between threads: a reader's reading and acknowledging links use one."""

    def __init__(self, nodes: Sequence[Node], timeout_s: float = 2.0) -> None:
        if not nodes:
            raise RouteConfigError("a log URL names at least one node")
        self.seeds: tuple[Node, ...] = tuple((h, int(p)) for h, p in nodes)
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._lows: list[int] = []  # span starts, sorted
        self._spans: list[tuple[int, int, Node]] = []  # (low, high inclusive, master)
        self._single: Node | None = None
        self._stale = True
        self.refreshes = 0
        """Maps fetched so far (a test's and a log line's view of how often routing changed)."""

    @property
    def cluster(self) -> bool | None:
        """True on a Redis Cluster, False on one plain node, None before the first refresh."""
        if self._single is None and not self._spans:
            return None
        return self._single is None

    def masters(self) -> list[Node]:
        """The nodes that serve slots (the one node of a plain Redis), as last fetched."""
        with self._lock:
            if self._single is not None:
                return [self._single]
            return list(dict.fromkeys(node for _, _, node in self._spans))

    def moved(self, error: BaseException) -> bool:
        """redirected(error), and on a cluster a blocked read unblocked by its key's migration:
        the key is served elsewhere or not now (the node itself answered)."""
        return redirected(error) or (self.cluster is True and str(error).startswith("UNBLOCKED"))

    def reroutes(self, error: BaseException) -> bool:
        """reroutes(error), and on a cluster a blocked read unblocked by its key's migration."""
        return reroutes(error) or self.moved(error)

    def invalidate(self) -> None:
        """The map may be wrong (a redirection, a lost node): the next node_for refreshes."""
        self._stale = True

    def node_for(self, key: str | bytes) -> Node:
        """The node serving `key` now: the plain node, or its slot's master. Refreshes first when
        the map is stale; RouteError when no node answers or none serves the slot."""
        with self._lock:
            if self._stale:
                self._refresh_locked()
            if self._single is not None:
                return self._single
            slot = key_slot(key)
            i = bisect.bisect_right(self._lows, slot) - 1
            if i >= 0 and self._spans[i][0] <= slot <= self._spans[i][1]:
                return self._spans[i][2]
            self._stale = True
        raise RouteError(f"no node of {self._named()} serves slot {slot} (of {key!r})")

    def refresh(self) -> None:
        """Fetches the map now (CLUSTER SLOTS); RouteError if no node answers."""
        with self._lock:
            self._refresh_locked()

    def _refresh_locked(self) -> None:
        import redis

        self._stale = True
        known = [node for _, _, node in self._spans]
        errors = []
        for node in dict.fromkeys([*self.seeds, *known]):
            try:
                spans = self._ask(node)
            except redis.ResponseError as e:
                if DISABLED not in str(e):
                    errors.append(f"{node[0]}:{node[1]}: {describe(e)}")
                    continue
                if len(self.seeds) > 1:
                    raise RouteConfigError(
                        f"{self._named()}: {node[0]}:{node[1]} is a plain Redis ({DISABLED}); "
                        "a URL of several nodes names a Redis Cluster's"
                    ) from None
                self._single, self._spans, self._lows = node, [], []
                break
            except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
                errors.append(f"{node[0]}:{node[1]}: {e}")
                continue
            if not spans:  # a cluster node before `--cluster create` gave it slots
                errors.append(f"{node[0]}:{node[1]}: serves no slots yet")
                continue
            self._single, self._spans = None, spans
            self._lows = [low for low, _, _ in spans]
            break
        else:
            raise RouteError(f"no node of {self._named()} says who serves what: "
                             + "; ".join(errors))  # fmt: skip
        self._stale = False
        self.refreshes += 1

    def _ask(self, node: Node) -> list[tuple[int, int, Node]]:
        """CLUSTER SLOTS of `node`: its spans sorted, each (low, high, master). An empty host (or
        "?", an unknown one) is "the node you asked": a node that never learned its address."""
        import redis

        client = redis.Redis(host=node[0], port=node[1], socket_timeout=self.timeout_s,
                             socket_connect_timeout=self.timeout_s)  # fmt: skip
        try:
            reply = client.execute_command("CLUSTER", "SLOTS")
        finally:
            client.close()
        spans = []
        for entry in reply:
            low, high, master = int(entry[0]), int(entry[1]), entry[2]
            host = master[0].decode() if isinstance(master[0], bytes) else str(master[0])
            spans.append((low, high, (node[0] if host in ("", "?") else host, int(master[1]))))
        return sorted(spans)

    def _named(self) -> str:
        return "redis://" + ",".join(f"{h}:{p}" for h, p in self.seeds)
