"""`rec stream replay` (rec.data.replay) into a real redis-server: a CSV file and the synthetic
generator arrive in the stream as the events the file readers read, number for number, paced
by --rate or by the file's clock with --speed."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis

from rec.broker import RedisBroker, redis_server_path
from rec.config import config_from_dict
from rec.data import make_source, write_criteo_tsv, write_csv
from rec.data.errors import DataError
from rec.data.replay import file_events, progress_line, replay, synthetic_events
from rec.data.stream import StreamConfig
from rec.data.stream_redis import RedisEventReader
from rec.data.synthetic import SyntheticSource
from rec.features import feature_spec, transform_dense
from tests.data.conftest import assert_same, criteo_config, small_config
from tests.helpers import rec_in_process, write_config

pytestmark = pytest.mark.skipif(
    redis_server_path() is None, reason="redis-server is not installed (make setup installs it)"
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with RedisBroker(tmp_path_factory.mktemp("redis")) as b:
        yield b


def _read_all(cfg, url: str, n: int):
    """Every event of the stream, as one batch read by a fresh group."""
    reader = RedisEventReader(StreamConfig(url=url, wait_s=0.2), feature_spec(cfg), 0)
    batch = reader.next_batch(n + 1).batch
    reader.close()
    return batch


def _csv_config(tmp_path, n: int):
    data = {"source": "csv", "train_paths": [str(tmp_path / "train.csv")],
            "eval_paths": [str(tmp_path / "train.csv")]}  # fmt: skip
    synthetic = small_config()
    write_csv(synthetic, tmp_path / "train.csv", n=n)
    raw = {
        "tables": [{"name": f"t{i}", "rows": r, "dim": 8, "features": [f"cat_{i}"]}
                   for i, r in enumerate([300, 50, 1000, 7])],
        "features": {"dense": 3},
        "model": {"dense_arch": [16, 8], "over_arch": [16, 1]},
        "data": data,
    }  # fmt: skip
    return raw, config_from_dict(raw)


def test_a_csv_file_replays_into_the_events_the_csv_reader_reads(broker, tmp_path):
    raw, cfg = _csv_config(tmp_path, n=300)
    url = broker.url("csv")
    config = str(write_config(tmp_path / "c.yaml", raw))
    out = rec_in_process("stream", "replay", str(tmp_path / "train.csv"), "--to", url,
                         "--config", config, check=True)  # fmt: skip
    assert "sent 300 events in 5 entries" in out.stdout
    from_file = next(make_source(cfg, "train").batches(300, 0, 1, drop_last=False))
    assert_same(_read_all(cfg, url, 300), from_file)


def test_a_criteo_file_replays_into_the_events_the_tsv_reader_reads(broker, tmp_path):
    path = tmp_path / "day.tsv"
    cfg = criteo_config({"source": "criteo_tsv", "train_paths": [str(path)],
                         "eval_paths": [str(path)]})  # fmt: skip
    write_criteo_tsv(cfg, path, n=200)
    url = broker.url("criteo")
    total, chunks = file_events(cfg, path)
    assert replay(chunks, url).events == total == 200
    from_file = next(make_source(cfg, "train").batches(200, 0, 1, drop_last=False))
    assert_same(_read_all(cfg, url, 200), from_file)  # hex ids, empty fields, log1p: the same


@pytest.mark.parametrize("transforms", [{}, {"dense_0": "log1p"}])
def test_the_synthetic_generator_replays_number_for_number(broker, tmp_path, transforms):
    # A transform is applied once, by the reader, as to a file's raw cells.
    cfg = small_config(features={"dense": 3, "transforms": transforms})
    url = broker.url(f"synthetic{len(transforms)}")
    total, chunks = synthetic_events(cfg, 500, start=100)
    stats = replay(chunks, url, per_entry=100)
    assert (total, stats.events, stats.entries) == (500, 500, 5)
    rows = SyntheticSource(cfg, "train", raw_dense=True).take(100, 600).rows
    rows.dense = transform_dense(feature_spec(cfg), rows.dense)
    got = _read_all(cfg, url, 500)
    assert got.values.tolist() == rows.values.tolist()
    assert got.lengths.tolist() == rows.lengths.tolist()
    assert got.dense.tolist() == rows.dense.tolist() and got.labels.tolist() == rows.labels.tolist()


def test_rate_paces_events_and_speed_follows_the_files_clock(broker, tmp_path):
    cfg = small_config()
    t0 = time.monotonic()
    replay(synthetic_events(cfg, 100)[1], broker.url("rate"), rate=400.0)
    assert 0.2 <= time.monotonic() - t0 < 2.0  # 100 events at 400/s: 0.25 s less one entry's

    raw, cfg = _csv_config(tmp_path, n=20)
    lines = (tmp_path / "train.csv").read_text().splitlines()
    timed = [lines[0] + ",ts"] + [f"{line},{1000 + 0.05 * i}" for i, line in enumerate(lines[1:])]
    (tmp_path / "timed.csv").write_text("\n".join(timed) + "\n")
    total, chunks = file_events(cfg, tmp_path / "timed.csv", time_column="ts")
    t0 = time.monotonic()
    seen = []
    stats = replay(chunks, broker.url("speed"), speed=2.0, progress=seen.append)
    # 20 events 0.05 s apart, twice as fast: the last is due 19 * 0.025 s after the first.
    assert 0.45 <= time.monotonic() - t0 < 2.5 and stats.events == total == 20
    assert progress_line(seen[-1], total).startswith("20/20 events") and stats.entries > 1


def test_replay_refuses_what_it_cannot_do(broker, tmp_path):
    raw, cfg = _csv_config(tmp_path, n=5)
    path = str(write_config(tmp_path / "c.yaml", raw))
    both = rec_in_process("stream", "replay", str(tmp_path / "train.csv"), "--synthetic", "5",
                          "--to", broker.url("x"), "--config", path)  # fmt: skip
    assert both.returncode == 2 and "not both" in both.stdout
    speed = rec_in_process("stream", "replay", str(tmp_path / "train.csv"), "--speed", "2",
                           "--to", broker.url("x"), "--config", path)  # fmt: skip
    assert speed.returncode == 2 and "--time-column" in speed.stdout
    url = rec_in_process("stream", "replay", "--synthetic", "5", "--to", "redis://h:1/0")
    assert url.returncode == 2 and "database number" in url.stdout
    column = rec_in_process("stream", "replay", str(tmp_path / "train.csv"), "--time-column",
                            "when", "--to", broker.url("x"), "--config", path)  # fmt: skip
    assert column.returncode == 2 and "no column 'when'" in column.stdout


def test_the_time_column_takes_seconds_or_iso_8601_and_names_a_bad_cell(tmp_path):
    raw, cfg = _csv_config(tmp_path, n=3)
    lines = (tmp_path / "train.csv").read_text().splitlines()
    times = ["2026-11-01T00:00:08.5", "2026-11-01 00:00:09+00:00", "1793491210"]
    timed = [lines[0] + ",ts"] + [f"{line},{t}" for line, t in zip(lines[1:], times, strict=True)]
    (tmp_path / "timed.csv").write_text("\n".join(timed) + "\n")
    _, chunks = file_events(cfg, tmp_path / "timed.csv", time_column="ts")
    seconds = [t for _, ts in chunks for t in ts]
    assert [s - seconds[0] for s in seconds] == [0.0, 0.5, 1793491210 - seconds[0]]
    (tmp_path / "bad.csv").write_text(f"{lines[0]},ts\n{lines[1]},yesterday\n")
    with pytest.raises(DataError, match=r"event 1: time 'yesterday' is neither a number"):
        list(file_events(cfg, tmp_path / "bad.csv", time_column="ts")[1])


def test_replay_waits_out_a_broker_restart_and_sends_every_event_once(tmp_path):
    """redis-server killed mid-replay and started again on its port and folder (its append-only
    file keeps what it acknowledged): the replay says it is waiting, reconnects with the
    reader's backoff and goes on; the stream then holds every event once, in order."""
    cfg = small_config()
    lines: list[str] = []
    result: dict = {}
    with RedisBroker(tmp_path / "redis") as broker:
        url = broker.url("restart")
        client = redis.Redis(port=broker.port)

        def run() -> None:
            try:
                # 600 events at 300/s in entries of 10: a round trip every 33 ms for 2 s.
                result["stats"] = replay(synthetic_events(cfg, 600)[1], url, rate=300.0,
                                         per_entry=10, retry_s=0.05, max_retry_s=0.4,
                                         log=lines.append)  # fmt: skip
            except Exception as e:  # the assertion below shows it
                result["error"] = e

        thread = threading.Thread(target=run)
        thread.start()
        _until(lambda: client.xlen("restart") >= 5, "the first entries")
        broker.stop(kill=True)
        _until(lambda: any("unreachable" in line for line in lines), "the replay's waiting line")
        broker.start()
        thread.join(timeout=60)
        assert not thread.is_alive() and "error" not in result, result
        assert result["stats"].events == 600 and result["stats"].entries == 60
        assert client.xlen("restart") == 60  # no entry sent twice
        client.close()
        got = _read_all(cfg, url, 600)
    (waiting,) = [line for line in lines if "unreachable" in line]  # one line an outage
    assert "waiting for it, retrying every 0.05 s doubling to 0.4 s" in waiting
    assert lines[-1].endswith("is back; replay goes on")
    rows = SyntheticSource(cfg, "train", raw_dense=True).take(0, 600).rows
    assert got.values.tolist() == rows.values.tolist()
    assert got.lengths.tolist() == rows.lengths.tolist()
    assert got.labels.tolist() == rows.labels.tolist()


def test_entries_the_broker_took_before_it_went_away_are_not_sent_again(broker):
    """A round trip cut off after the broker appended some of its entries: on reconnecting,
    the sender finds them (past another producer's entry) and sends only the rest."""
    from rec.contract.events import encode
    from rec.data.backoff import Backoff
    from rec.data.replay import _Sender

    url, lines = broker.url("cut"), []
    sender = _Sender(url, Backoff(0.05, 0.1), lines.append)
    entries = [encode([{"n": i}]) for i in range(5)]
    sender.add(entries[0])
    sender.flush()  # connected, entry 0 acknowledged
    for fields in entries[1:]:
        sender.add(fields)
    other = redis.Redis(port=broker.port)
    other.xadd("cut", entries[1])  # what the broker took of the round trip...
    other.xadd("cut", encode([{"other": 1}]))  # ...another producer's entry...
    other.xadd("cut", entries[2])  # ...and then the connection broke
    sender.close()
    sender.flush()
    sender.close()
    got = [json.loads(f[b"events"]) for _, f in other.xrange("cut")]
    other.close()
    assert got == [[{"n": 0}], [{"n": 1}], [{"other": 1}], [{"n": 2}], [{"n": 3}], [{"n": 4}]]
    assert lines == ["the stream had taken 2 of the 4 entries in flight; sending the rest"]


def _until(ready, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.02)
