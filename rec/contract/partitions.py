"""A log partitioned over a Redis Cluster: its layout record and its partitions' keys (#60).

A stream S (the event stream or the update log; rec.contract.urls names it) is either one Redis
stream, the key S (the legacy layout: no layout record), or P partitions, each a stream of its
own. The layout record says which:

    key    "{S}:layout"   a JSON string, written once with SET NX by whoever creates the layout
    value  {"format": "rec.partitions/1", "partitions": P, "key": COLUMN or "",
            "keys": [KEY_0, ..., KEY_P-1]}

`key` is the event column a producer partitions by ("" : round robin; the update log has none).
`keys` are the partitions' stream keys, read from the record and never recomputed by a reader,
so a later change of the rule below cannot move an existing log.

Partition k's key is "{S:k:j}", the braces making the whole key its hash tag (one key, one
slot), with j the smallest j >= 0 whose slot lies in band k, [floor(k*16384/P),
floor((k+1)*16384/P)). `redis-cli --cluster create` gives M masters equal contiguous slot
ranges (to a slot at their edges: 0-5460, 5461-10922, 10923-16383 for 3), so with P a multiple
of M each master serves P/M partitions, where a plain hash of "S:k" would put them where it
falls. The search costs about P CRC16s per key, P^2 in all (65k at P=256, 20 ms), once, when
the layout is made. A partition's dead letters are "{S:k:j}:dead", in the partition's slot.

The slot of a key is Redis Cluster's: CRC16/XMODEM of its hash tag (the part between the first
"{" and the next "}", when that is not empty; else the whole key) mod 16384. Computed here
rather than asked of a node (CLUSTER KEYSLOT), so that making a layout needs no cluster.
tests/data/partition_key_golden.json pins slots, bands, keys and layout records for both
languages.

Example:
    >>> partition_key("rec:events", 1, 2)
    '{rec:events:1:0}'
    >>> key_slot("{rec:events:1:0}") >= 8192
    True
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

FORMAT = "rec.partitions/1"
SLOTS = 16384
MAX_PARTITIONS = 1024
"""Partitions of one log at most: the layout's key search costs about P^2 CRC16s of a few bytes
(0.4 s of Python at 1024, growing fourfold per doubling), and a thousand partitions already
give a thousand ranks one each."""
_MAX_TRIES = 1 << 20
"""j's bound in the key search: CRC16 spreads decimal suffixes evenly, so a band of b slots is
hit within about 16384/b tries; far past that, something is wrong."""


class PartitionError(ValueError):
    """A layout record, a partition count or a stream name that cannot be partitioned."""


def _crc_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        crc = i << 8
        for _ in range(8):
            crc = (crc << 1) ^ 0x1021 if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return tuple(table)


_TABLE = _crc_table()


def crc16(data: bytes, crc: int = 0) -> int:
    """CRC16/XMODEM (polynomial 0x1021, initial 0, no reflection), Redis Cluster's; `crc`
    continues an earlier call, so crc16(a + b) == crc16(b, crc16(a))."""
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _TABLE[((crc >> 8) ^ byte) & 0xFF]
    return crc


def hash_tag(key: bytes) -> bytes:
    """What Redis Cluster hashes: the part between the first "{" and the next "}" when there
    is one and it is not empty, else the whole key."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def key_slot(key: str | bytes) -> int:
    """The hash slot of `key` (a str is UTF-8), as CLUSTER KEYSLOT answers."""
    raw = key.encode() if isinstance(key, str) else key
    return crc16(hash_tag(raw)) % SLOTS


def band(k: int, partitions: int) -> tuple[int, int]:
    """Partition k's slots, [low, high): the k-th of `partitions` near-equal contiguous bands."""
    _check_count(partitions)
    if not 0 <= k < partitions:
        raise PartitionError(f"partition {k} is not in [0, {partitions})")
    return k * SLOTS // partitions, (k + 1) * SLOTS // partitions


def partition_key(stream: str, k: int, partitions: int) -> str:
    """Partition k's stream key, "{S:k:j}" with the smallest j whose slot lies in band k."""
    _check_stream(stream)
    low, high = band(k, partitions)
    # The hash tag is "S:k:j": the CRC of "S:k:" once, then each j's digits from there.
    head = crc16(f"{stream}:{k}:".encode())
    for j in range(_MAX_TRIES):
        if low <= crc16(str(j).encode(), head) % SLOTS < high:
            return "{" + f"{stream}:{k}:{j}" + "}"
    raise PartitionError(f"no key of {stream!r} partition {k} falls in slots [{low}, {high})")


def layout_key(stream: str) -> str:
    """The layout record's key, "{S}:layout"."""
    _check_stream(stream)
    return "{" + stream + "}:layout"


def dead_key(key: str) -> str:
    """A partition's dead-letter stream: its key + ":dead", in the same slot."""
    return key + ":dead"


@dataclass(frozen=True)
class Layout:
    """A layout record's fields: P partitions, the producers' key column ("" for round robin),
    and the partitions' stream keys, partition k's at index k."""

    partitions: int
    key: str
    keys: tuple[str, ...]

    def to_json(self) -> str:
        """The record as the layout key holds it."""
        record = {"format": FORMAT, "partitions": self.partitions, "key": self.key,
                  "keys": list(self.keys)}  # fmt: skip
        return json.dumps(record, separators=(",", ":"))


def event_partition(value: Any, partitions: int) -> int:
    """The partition a producer sends an event to, by its key column's value: CRC-32 (zlib's,
    as every language has it) of the value's text, UTF-8, mod P. The text is Python's str() of
    the value as the event holds it (an id 42 and "42" agree; a missing column is "")."""
    text = "" if value is None else str(value)
    return zlib.crc32(text.encode()) % partitions


def make_layout(stream: str, partitions: int, key: str = "") -> Layout:
    """The layout of `stream` in `partitions` partitions, its producers partitioning by column
    `key` ("" : round robin)."""
    _check_count(partitions)
    if not isinstance(key, str):
        raise PartitionError(f"layout of {stream!r}: the key column must be a string, got {key!r}")
    keys = tuple(partition_key(stream, k, partitions) for k in range(partitions))
    return Layout(partitions, key, keys)


def parse_layout(text: str | bytes, where: str) -> Layout:
    """A layout record (the value of `where`, a layout key) -> its fields; a PartitionError
    naming the field that is wrong."""
    try:
        data: Any = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise PartitionError(f"{where}: not a JSON layout record ({e})") from None
    if not isinstance(data, dict):
        raise PartitionError(f"{where}: a layout record must be a JSON object")
    if data.get("format") != FORMAT:
        raise PartitionError(f"{where}: format {data.get('format')!r}, want {FORMAT!r}")
    count = data.get("partitions")
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_PARTITIONS:
        raise PartitionError(f"{where}: partitions must be an integer in [1, {MAX_PARTITIONS}], "
                             f"got {count!r}")  # fmt: skip
    if not isinstance(data.get("key"), str):
        raise PartitionError(f"{where}: key must be a string (a column, or '' for round robin)")
    keys = data.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
        raise PartitionError(f"{where}: keys must be a list of non-empty strings")
    if len(keys) != count or len(set(keys)) != count:
        raise PartitionError(f"{where}: keys must name {count} distinct streams, got {len(keys)} "
                             f"({len(set(keys))} distinct)")  # fmt: skip
    return Layout(count, data["key"], tuple(keys))


def _check_count(partitions: int) -> None:
    if not isinstance(partitions, int) or isinstance(partitions, bool):
        raise PartitionError(f"partitions must be an integer, got {partitions!r}")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise PartitionError(f"partitions {partitions} is not in [1, {MAX_PARTITIONS}]")


def _check_stream(stream: str) -> None:
    # A brace would end or start the hash tag inside the name: every partition in one slot.
    if not isinstance(stream, str) or not stream or "{" in stream or "}" in stream:
        raise PartitionError(f"stream {stream!r} cannot be partitioned: want a non-empty name "
                             "without '{' or '}' (they would cut its keys' hash tag)")  # fmt: skip
