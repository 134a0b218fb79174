"""Click commands of the event stream: `rec stream replay` (docs/stream.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.group("stream")
def stream() -> None:
    """The event stream that training reads (format rec.events/1, docs/stream.md)."""


@stream.command("replay")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False), required=False)
@click.option(
    "--to",
    "url",
    required=True,
    help="The stream: redis://HOST:PORT[/STREAM] (default stream rec:events).",
)
@click.option(
    "--config",
    "-c",
    type=click.Path(path_type=Path),
    default=None,
    help="YAML config: its data.source says FILE's format, its features and "
    "data.columns which cells an event carries (default: the embedded config).",
)
@click.option(
    "--synthetic",
    "synthetic",
    type=click.IntRange(min=1),
    default=None,
    help="Send N events of the config's synthetic train split instead of a FILE.",
)
@click.option(
    "--start",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="With --synthetic: the first position sent.",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Events per second (default: as fast as the broker takes them).",
)
@click.option(
    "--speed",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Replay the file's own clock X times faster (needs --time-column).",
)
@click.option(
    "--time-column",
    default="",
    help="The CSV or Parquet column holding each event's time: seconds, or ISO 8601.",
)
@click.option(
    "--per-entry",
    type=click.IntRange(1, 4096),
    default=64,
    show_default=True,
    help="Events per stream entry at most.",
)
@click.option(
    "--partitions",
    type=click.IntRange(1, 1024),
    default=None,
    help="Partition the stream in P (creates its layout record {STREAM}:layout, or checks "
    "the one there); without it, a stream already partitioned is followed.",
)
@click.option(
    "--key",
    "key_column",
    default="",
    help="With --partitions: the event column partitions are chosen by "
    "(crc32 of its text mod P); default: round robin per entry.",
)
@click.option(
    "--wait-replicas",
    default="auto",
    show_default=True,
    callback=lambda ctx, param, value: _replicas(value),
    help="Each round trip ends in WAIT N (1 s timeout) and counts as sent only once answered, "
    "so a failover cannot lose it; a timeout is counted unreplicated and warned about. auto: "
    "1 when the partition's master has a replica, else 0.",
)
def replay_command(file, url, config, synthetic, start, rate, speed, time_column,
                   per_entry, partitions, key_column, wait_replicas) -> None:  # fmt: skip
    """Feed the stream at --to from FILE (a time-ordered CSV, Parquet or Criteo TSV file, in
    the config's data.source format) or from the synthetic generator (--synthetic N), printing
    events/s and the ETA about once a second. While the broker is away it waits and retries
    as training's reader does (the config's data.stream.retry_s and max_retry_s).

    \b
    An application's own producer does what this one does:
      1. GET {STREAM}:layout once: absent, XADD to STREAM itself; else JSON
         {"partitions": P, "key": COLUMN or "", "keys": [...]}.
      2. Per event, k = crc32(utf-8 of str(event[COLUMN])) mod P (zlib.crc32; a
         missing column is ""); no key column: entries in turn over the keys.
      3. XADD keys[k] * format rec.events/1 events '<JSON list of events>' on the
         master of that key's slot (a cluster client routes it).
      4. End each pipeline with WAIT 1 <ms> on the same connection; count the events
         sent only when it answers 1. Without it a failover can lose acknowledged
         events; on a lost connection, resend what the stream (XRANGE) lacks."""
    from rec.config import load_config
    from rec.contract.events import parse_url
    from rec.data.replay import file_events, progress_line, replay, synthetic_events

    if (file is None) == (synthetic is None):
        raise click.UsageError("give a FILE or --synthetic N, not both and not neither")
    if rate is not None and speed is not None:
        raise click.UsageError("give --rate or --speed, not both")
    if speed is not None and not time_column:
        raise click.UsageError("--speed replays the file's clock: name its --time-column")
    if key_column and partitions is None:
        raise click.UsageError("--key chooses partitions: give --partitions P with it")
    try:
        parse_url(url)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--to") from None
    cfg = load_config(config)
    if synthetic is not None:
        total, chunks = synthetic_events(cfg, synthetic, start)
    else:
        total, chunks = file_events(cfg, file, time_column)

    def show(stats) -> None:
        click.echo(f"replay: {progress_line(stats, total)}", err=True)

    import redis

    try:
        stats = replay(chunks, url, rate=rate, speed=speed, per_entry=per_entry, progress=show,
                       retry_s=cfg.data.stream.retry_s, max_retry_s=cfg.data.stream.max_retry_s,
                       log=lambda line: click.echo(f"replay: {line}", err=True),
                       partitions=partitions or 0, key=key_column,
                       wait_replicas=wait_replicas)  # fmt: skip
    except redis.RedisError as e:
        click.echo(f"error: the stream {url} failed: {e}", err=True)
        sys.exit(1)
    except ValueError as e:  # a layout that differs from --partitions/--key
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    unreplicated = (f"; {stats.unreplicated:,} entries unreplicated (WAIT timed out)"
                    if stats.unreplicated else "")  # fmt: skip
    click.echo(f"sent {stats.events:,} events in {stats.entries:,} entries to {url} "
               f"in {stats.seconds:.1f} s ({stats.rate:,.0f} events/s){unreplicated}")  # fmt: skip


def _replicas(value: str) -> int | None:
    """--wait-replicas: a count, or None for auto."""
    if value == "auto":
        return None
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise click.BadParameter(f"{value!r}: give a replica count (0, 1, ...) or auto")
    return n


COMMANDS = [stream]
