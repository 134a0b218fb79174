"""The stream reader (rec.data.stream) against a real redis-server of the test's own: ranks of
one consumer group share the events exactly once, an acknowledgement waits for a checkpoint, a
resume from a checkpoint's position re-delivers only what it does not hold, refused events go to
the dead-letter stream, a dry rank returns by its deadline, a broker restart loses nothing, and
what the read-ahead thread read past a checkpoint is trained once after a crash. The readers
read ahead (the trainer's default) unless a test counts pending entries read inside next_batch."""

from __future__ import annotations

import time

import pytest
import redis

from rec.broker import RedisBroker, redis_server_path
from rec.contract.events import encode
from rec.data.stream import StreamConfig, StreamPosition, events_everywhere, open_reader
from rec.data.stream_redis import RedisEventReader
from tests.data.conftest import STREAM_SPEC as SPEC

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)


def _event(n: int) -> dict:
    return {"clicked": n % 2, "n": n, "item": f"{n}|{n + 1}"}


def _produce(url_or_port, stream: str, entries: int, per_entry: int, first: int = 0) -> list[int]:
    client = redis.Redis(port=url_or_port)
    numbers = []
    for e in range(entries):
        batch = [_event(first + e * per_entry + i) for i in range(per_entry)]
        client.xadd(stream, encode(batch))
        numbers += [ev["n"] for ev in batch]
    client.close()
    return numbers


def _reader(broker, stream: str, rank: int = 0, start=None, read_ahead=2, **kw):
    cfg = StreamConfig(url=broker.url(stream), retry_s=0.05, max_retry_s=0.2, **kw)
    position = StreamPosition.from_dict(start) if start else None
    return RedisEventReader(cfg, SPEC, rank, position, read_ahead=read_ahead)


def _numbers(batch) -> list[int]:
    return [int(x) for x in batch.batch.dense[:, 0].tolist()]


def test_two_ranks_of_a_group_share_every_event_exactly_once(broker):
    sent = _produce(broker.port, "share", entries=40, per_entry=10)
    ranks = [_reader(broker, "share", r) for r in (0, 1)]
    assert ranks[0].lag() == 40, "entries no rank has read yet: the head's lead"
    got: list[list[int]] = [[], []]
    while True:
        batches = [r.next_batch(32, wait_s=0.1) for r in ranks]
        for r, b in enumerate(batches):
            got[r] += _numbers(b)
            assert b.batch.values.tolist()[::2] == _numbers(b)  # ids travel with their event
        if not any(len(b) for b in batches):
            break
    assert sorted(got[0] + got[1]) == sent, "every event once, none twice"
    assert got[0] and got[1], "both ranks read a share"
    for r in ranks:
        r.ack(r.position())
    assert redis.Redis(port=broker.port).xpending("share", "rec")["pending"] == 0


def test_only_a_checkpointed_position_is_acked_and_a_resume_trains_the_rest_once(broker):
    sent = _produce(broker.port, "crash", entries=8, per_entry=10)
    first = _reader(broker, "crash", read_ahead=0)  # the pending count below: no read-ahead
    trained = _numbers(first.next_batch(16)) + _numbers(first.next_batch(16))
    checkpoint = first.position()  # 32 events: entries 0-2 whole, 2 events of entry 3
    assert (checkpoint["events"], checkpoint["size"]) == (2, 10)
    assert first.ack(checkpoint) == 3, "entries 0 to 2; entry 3 is only partly trained"
    _numbers(first.next_batch(16))  # trained after the checkpoint, then the rank dies
    first.close()
    client = redis.Redis(port=broker.port)
    assert client.xpending("crash", "rec")["pending"] == 2  # entries 3 and 4 were read

    # Without a position (at least once): the same consumer gets every unacked entry again.
    again = _reader(broker, "crash")
    assert _numbers(again.next_batch(200, wait_s=0.1)) == sent[30:]
    again.close()

    resumed = _reader(broker, "crash", start=checkpoint)
    rest = _numbers(resumed.next_batch(200, wait_s=0.1))
    assert rest == sent[32:], "the resume starts inside entry 3, after its 2 trained events"
    assert sorted(trained + rest) == sent, "every event trained exactly once"
    resumed.ack(resumed.position())
    assert client.xpending("crash", "rec")["pending"] == 0


def test_entries_read_ahead_past_a_checkpoint_are_trained_once_after_a_crash(broker):
    sent = _produce(broker.port, "ahead", entries=12, per_entry=10)
    first = _reader(broker, "ahead", read_ahead=2)  # holds up to 2 x 16 events decoded
    trained = _numbers(first.next_batch(16)) + _numbers(first.next_batch(16))
    checkpoint = first.position()
    assert checkpoint == {"entry": checkpoint["entry"], "events": 2, "size": 10}, checkpoint
    assert first.ack(checkpoint) == 3, "only what was trained, not what was read ahead"
    deadline = time.monotonic() + 5
    client = redis.Redis(port=broker.port)
    while client.xpending("ahead", "rec")["pending"] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # the thread reads on while nothing trains
    time.sleep(0.3)
    pending = client.xpending("ahead", "rec")["pending"]
    # Entry 3 (partly trained), then over 32 - 16 events (2 entries) up to about 32: it refills
    # once a batch of room is free.
    assert 3 <= pending <= 5, "read ahead beyond the trained events, and within its bound"
    first.close()  # dies with them untrained

    resumed = _reader(broker, "ahead", start=checkpoint, read_ahead=2)
    rest = []
    while len(trained) + len(rest) < len(sent):
        got = _numbers(resumed.next_batch(16, wait_s=0.5))
        assert got, "the stream ran dry early"
        rest += got
    assert rest == sent[32:], "the resume starts after the trained events, in order"
    assert len(resumed.next_batch(16, wait_s=0.2)) == 0, "nothing delivered twice"
    resumed.ack(resumed.position())
    resumed.close()
    assert client.xpending("ahead", "rec")["pending"] == 0
    client.close()


def test_an_error_in_the_read_ahead_thread_is_raised_by_next_batch(broker):
    _produce(broker.port, "gone", entries=1, per_entry=3)
    reader = _reader(broker, "gone", read_ahead=2)
    assert len(reader.next_batch(3, wait_s=0.5)) == 3
    redis.Redis(port=broker.port).xgroup_destroy("gone", "rec")  # the thread's XREADGROUP fails
    t0 = time.monotonic()
    with pytest.raises(redis.ResponseError, match="NOGROUP"):
        reader.next_batch(3, wait_s=60.0)
    # Far below the deadline (the thread's error is raised within a READ_BLOCK_S read), with
    # room for a busy machine.
    assert time.monotonic() - t0 < 30.0, "raised when it happened, not at the deadline"
    reader.close()


def test_refused_events_are_counted_parked_with_their_reason_and_never_trained(broker):
    client = redis.Redis(port=broker.port, decode_responses=True)
    client.xadd("bad", encode([_event(1), {"clicked": 3, "n": 2, "item": ""}, _event(3)]))
    client.xadd("bad", {"format": "rec.events/1", "events": "not json"})
    client.xadd("bad", encode([{"clicked": 1, "item": "4"}, {"clicked": 0, "n": "x", "item": ""}]))
    client.xadd("bad", encode([_event(5)]))
    reader = _reader(broker, "bad")
    batch = reader.next_batch(10, wait_s=0.1)
    assert _numbers(batch) == [1, 3, 5]
    assert dict(reader.refused) == {"label_not_binary": 1, "malformed_entry": 1,
                                    "missing_field": 1, "dense_not_numeric": 1}  # fmt: skip
    dead = [fields for _, fields in client.xrange("bad:dead")]
    assert [(d["reason"], d["index"]) for d in dead] == [
        ("label_not_binary", "1"), ("malformed_entry", "-1"), ("missing_field", "0"),
        ("dense_not_numeric", "1")]  # fmt: skip
    assert dead[1]["field:events"] == "not json" and dead[0]["stream"] == "bad"
    assert dead[0]["event"] == '{"clicked":3,"n":2,"item":""}'
    assert reader.ack(batch.position) == 4, "the refused entry is consumed like the others"


def test_a_pending_entry_deleted_before_it_was_trained_is_parked_not_a_crash(broker):
    client = redis.Redis(port=broker.port, decode_responses=True)
    ids = [client.xadd("trim", encode([_event(n)])) for n in range(3)]
    first = _reader(broker, "trim")
    assert _numbers(first.next_batch(3, wait_s=0.1)) == [0, 1, 2]
    first.close()  # died before its checkpoint
    client.xdel("trim", ids[1])
    again = _reader(broker, "trim")
    assert _numbers(again.next_batch(3, wait_s=0.1)) == [0, 2]
    assert dict(again.refused) == {"malformed_entry": 1}
    assert "deleted" in client.xrange("trim:dead")[0][1]["message"]


def test_a_dry_rank_returns_an_empty_batch_by_its_deadline(broker):
    _produce(broker.port, "dry", entries=1, per_entry=3)
    ranks = [_reader(broker, "dry", r) for r in (0, 1)]
    assert len(ranks[0].next_batch(8, wait_s=0.1)) == 3  # a short batch: all there is
    t0 = time.monotonic()
    empty = ranks[1].next_batch(8, wait_s=0.3)
    waited = time.monotonic() - t0
    assert len(empty) == 0 and tuple(empty.batch.dense.shape) == (0, 1)
    assert 0.25 <= waited < 2.0, waited
    assert empty.position == StreamPosition().to_dict()
    assert events_everywhere(len(empty)) == 0  # no process group: this rank's count
    assert ranks[1].lag() == 0


def test_a_broker_restart_mid_read_loses_and_repeats_nothing(tmp_path):
    with RedisBroker(tmp_path / "redis") as broker:
        sent = _produce(broker.port, "ev", entries=20, per_entry=8)
        events = []
        reader = _reader(broker, "ev")
        events += _numbers(reader.next_batch(50, wait_s=0.1))
        broker.stop(kill=True)  # SIGKILL: the append-only file has every acknowledged write
        t0 = time.monotonic()
        events += _numbers(reader.next_batch(50, wait_s=0.3))  # what it holds, by the deadline
        assert time.monotonic() - t0 < 3.0
        broker.start()
        sent += _produce(broker.port, "ev", entries=5, per_entry=8, first=len(sent))
        deadline = time.monotonic() + 20
        while len(events) < len(sent) and time.monotonic() < deadline:
            events += _numbers(reader.next_batch(50, wait_s=0.2))
        assert events == sent, "in order, nothing lost, nothing twice"
        assert reader.counts["outages"] >= 1


def test_open_reader_picks_the_reader_by_scheme(broker):
    cfg = StreamConfig(url=broker.url("scheme"))
    assert isinstance(open_reader(cfg, SPEC, 0), RedisEventReader)
    with pytest.raises(ValueError, match="redis://"):
        open_reader(StreamConfig(url=""), SPEC, 0)
    with pytest.raises(ValueError, match="start"):
        StreamConfig(start="now")


def test_hiredis_parses_the_readers_replies_as_redis_pys_own_parser(broker):
    """make setup installs hiredis, which redis-py then uses for every reply: the reader's
    commands must get the same values and types (bytes ids, fields and values) as from
    redis-py's pure-Python parser."""
    from redis._parsers import _HiredisParser, _RESP2Parser
    from redis.utils import HIREDIS_AVAILABLE

    assert HIREDIS_AVAILABLE, "hiredis is in requirements.txt: redis-py should find it"
    _produce(broker.port, "parsers", entries=3, per_entry=4)
    redis.Redis(port=broker.port).xadd("parsers", {"format": "x", "events": b"\xff\x00\xc3\xa9"})

    def replies(parser) -> list:
        client = redis.Redis(connection_pool=redis.ConnectionPool(port=broker.port,
                                                                  parser_class=parser))  # fmt: skip
        group = parser.__name__
        client.xgroup_create("parsers", group, id="0")
        new = client.xreadgroup(group, "c", {"parsers": ">"}, count=4)
        pending = client.xreadgroup(group, "c", {"parsers": "0"}, count=10)
        empty = client.xreadgroup(group, "c", {"parsers": ">"}, count=3, block=10)
        out = [new, pending, empty, client.xrange("parsers"), client.xack("parsers", group, "0-1")]
        client.close()
        return out

    fast, pure = replies(_HiredisParser), replies(_RESP2Parser)
    assert fast == pure and repr(fast) == repr(pure), "same values, same types"
    assert isinstance(fast[0][0][1][0][0], bytes) and fast[1][0][1][-1][1][b"events"][0] == 0xFF
    assert redis.connection.DefaultParser is _HiredisParser, "what the reader's client gets"
