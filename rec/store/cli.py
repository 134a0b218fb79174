"""Click commands of the embedding store: `rec store cluster`, `rec store follow` and
`rec store delete`.

`cluster` starts a local Redis Cluster to try the store with. `follow` and `delete` name a
version of a model repository (its rec.json's `store` section says where its rows are); a
StoreError (no store section, an unreachable cluster, an unfinished export) becomes one
`error:` line and exit code 2 (rec.cli).
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from rec.contract import Manifest, ManifestError, ModelDir
from rec.contract.store import StoreError

_PATH = click.Path(path_type=Path, exists=True, file_okay=False)


def version_manifest(repo: Path, model: str, version: int | None) -> tuple[int, Manifest]:
    """(version, its rec.json) of `model` in `repo`: `version`, or the newest with a store."""
    root = ModelDir.of(repo, model)
    for v in reversed(root.versions()) if version is None else [version]:
        if not root.version_manifest(v).is_file():
            continue
        try:
            manifest = root.read_manifest(v)
        except ManifestError as e:
            raise StoreError(str(e)) from None
        if manifest.has("store") or version is not None:
            return v, manifest
    which = f"version {version}" if version is not None else "version exported with --store"
    raise StoreError(f"{root.path}: no {which} (a version directory with its own rec.json)")


@click.group("store")
def store() -> None:
    """The embedding store of versions exported with `rec export --store` (docs/store.md)."""


@store.command("cluster")
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False))
@click.option("--masters", type=click.IntRange(3), default=3, show_default=True)
@click.option("--replicas", type=click.IntRange(0), default=1, show_default=True,
              help="Replicas per master.")  # fmt: skip
def cluster(folder, masters, replicas) -> None:
    """Run a local Redis Cluster until Ctrl-C, to try `rec export --store` with: Debian's
    redis-server on free ports of 127.0.0.1, data and logs in FOLDER, nothing persisted to disk
    (a restart empties it: export again). Prints the URL to pass to --store.

    A node that exits is named, with its role and exit status; the others keep running, and
    when a replica takes over a dead master's slots, that is printed too. The command exits
    once no node is left."""
    from rec.store.cluster import ClusterError, RedisCluster, Watch

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with RedisCluster(folder, masters=masters, replicas=replicas) as running:
            click.echo(f"Redis Cluster up: {masters} masters, {replicas} replica(s) each, data in "
                       f"{folder}; Ctrl-C stops it", err=True)  # fmt: skip
            click.echo(running.url())
            watch = Watch(running)
            while not stop.wait(1.0):
                lines = watch.poll()
                if stop.is_set():  # Ctrl-C reaches the nodes too: their exits are no news
                    break
                for line in lines:
                    click.echo(line, err=True)
                if not watch.alive:
                    raise StoreError(f"every node of the cluster exited; their logs: {folder}")
    except ClusterError as e:
        raise StoreError(str(e)) from e
    click.echo("stopped", err=True)


@store.command("follow")
@click.argument("repo", type=_PATH)
@click.option("--model", default="rec", show_default=True)
@click.option("--version", type=click.IntRange(1), help="Default: the newest stored version.")
@click.option("--updates", "updates_url", help="The update log (default: rec.json's updates.url).")
@click.option("--idle-exit-s", type=click.FloatRange(0), help="Exit once the log is this idle.")
def follow(repo, model, version, updates_url, idle_exit_s) -> None:
    """Write the update log's rows of the stored tables into the store, as they arrive."""
    from rec.store.follow import StoreFollower

    version, manifest = version_manifest(repo, model, version)
    follower = StoreFollower(manifest, updates_url, log=lambda line: click.echo(line, err=True))
    click.echo(f"following {follower.url} into {manifest.store.url} for model '{model}' "
               f"version {version}, from entry {follower.cursor}", err=True)  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        follower.run(stop, idle_exit_s)
    finally:
        follower.close()


@store.command("delete")
@click.argument("repo", type=_PATH)
@click.option("--model", default="rec", show_default=True)
@click.option("--version", type=click.IntRange(1), required=True)
def delete(repo, model, version) -> None:
    """Delete a version's rows from the store (a server still serving it then fails its lookups)."""
    from rec.store.writer import delete_prefix

    version, manifest = version_manifest(repo, model, version)
    section = manifest.store
    if section is None:
        raise StoreError(f"model '{model}' version {version} has no tables in a store")
    n = delete_prefix(section.url, section.prefix, section.to_dict()["tables"])
    click.echo(f"deleted {n} keys under {section.prefix!r} from {section.url}")


COMMANDS = [store]
