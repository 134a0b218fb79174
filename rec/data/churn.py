"""Ids that are born, retire and change popularity over time, and what `id % rows` does to them.

The synthetic generator (rec.data.synthetic) draws a popularity rank r in [0, L) for each id it
emits, L being the table's live ids. `IdSpace` turns (feature, r, time) into a raw id, where
time is the sample's position in the stream:

  - lanes: a table has L lanes, each holding one live id at any time, so exactly L ids are
    live. Features that share a table share its lanes and ids (an item id is the same item as
    candidate and in a history).
  - popularity: rank r reads lane (r * m + a) mod L, with m coprime to L, a bijection per
    feature. With `popularity_drift` d, time is cut into periods of train_samples / d
    positions, each with its own bijection, and a draw at fraction x into period k uses the
    bijection of period k + 1 with probability x: an id's popularity moves smoothly from its
    rank in one period to its (independent) rank in the next.
  - churn: with `churn` c, an id lives train_samples / c positions, then its lane takes a new
    id. Lane j's id of generation g = floor(time / lifetime + phase_j) lives over
    [(g - phase_j) * lifetime, (g + 1 - phase_j) * lifetime), with phase_j uniform in [0, 1),
    so births and retirements are spread evenly: any window of w positions replaces a
    min(1, w / lifetime) share of the live set, c per train_samples.
  - ids: a hash of (seed, table, lane, generation), a non-negative int64 spread over
    [0, 2^63): unrelated to any table's rows, so `id % rows` acts like the hash a real
    system applies. Two ids of a table coincide with probability about L^2 / 2^64.

Every step is a hash or closed-form arithmetic of its inputs: no per-id table is kept, a draw
costs O(1) whatever L, and an id depends only on (seed, table, lane, generation).

`modulo_collisions` measures, on the ids a stream actually emits (any source's rows;
rec.data.synthetic.stream_collisions for the synthetic stream), the share of distinct ids
that share their row under `id % rows` with another one, and the share of lookups that read
such a row; `live_collisions` does the same over a whole live set. Hashing n ids into m rows
makes about 1 - e^(-n/m) of them collide: 39 % at n = m/2, 63 % at n = m.

Example:
    >>> space = IdSpace(seed=0, feature_tables=[0], live=[1000], epoch=10_000, churn=1.0)
    >>> early, late = space.live_set(0, 0), space.live_set(0, 5_000)
    >>> round(1 - len(np.intersect1d(early, late)) / 1000, 1)   # half an epoch: half replaced
    0.5
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rec.config import ConfigError, RecConfig
from rec.data.source import Rows

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_GEN_KEY = np.uint64(0xD1B54A32D192ED03)
_PHASE_KEY = np.uint64(0x8CB92BA72F3D8DD7)
MAX_LIVE_IDS = 2**31
"""Live ids per table at most: rank * multiplier stays inside int64."""


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a fast, well-mixed hash of uint64 [n] (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def coprime(rng: np.random.Generator, n: int) -> int:
    """A multiplier in [n // 3, n) coprime to n (1 for n <= 2): (r * m + a) mod n is a bijection."""
    if n <= 2:
        return 1
    while True:
        m = int(rng.integers(n // 3, n))
        if math.gcd(m, n) == 1:
            return m


class IdSpace:
    """Raw ids of the tables' live sets over time (see the module docstring).

    Args:
        seed: data.synthetic.seed.
        feature_tables: [F] the table index of each sparse feature.
        live: live ids per table.
        epoch: positions per time unit (data.synthetic.train_samples).
        churn: share of the live set replaced per epoch (0: ids live forever).
        popularity_drift: popularity reshuffles per epoch (0: ranks never move).
    """

    def __init__(
        self,
        seed: int,
        feature_tables: list[int],
        live: list[int],
        epoch: int,
        churn: float = 0.0,
        popularity_drift: float = 0.0,
    ) -> None:
        self.seed = seed
        self.table = np.asarray(feature_tables, dtype=np.int64)
        self.live = np.asarray(live, dtype=np.int64)
        if (self.live < 1).any() or (self.live > MAX_LIVE_IDS).any():
            raise ValueError(f"live ids per table {self.live.tolist()} must be in [1, 2^31]")
        self.lifetime = epoch / churn if churn > 0 else math.inf
        self.period = epoch / popularity_drift if popularity_drift > 0 else math.inf
        rng = np.random.default_rng([seed, 300])
        self.table_keys = rng.integers(0, 2**64, len(self.live), dtype=np.uint64)
        self._bijections: dict[tuple[int, int], tuple[int, int]] = {}

    def live_per_feature(self) -> np.ndarray:
        """[F] live ids of each feature's table."""
        return self.live[self.table]

    def ids(
        self, ranks: np.ndarray, feat: np.ndarray, time: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        """Raw ids i64 [N] for popularity ranks [N] of features feat [N] at positions time [N].

        `rng` decides, under popularity drift, which period's ranking each draw follows."""
        lanes = self._lanes(ranks, feat, time, rng)
        return self._ids(self.table[feat], lanes, time)

    def live_set(self, table: int, time: float) -> np.ndarray:
        """i64 [L]: the ids of `table` live at position `time`, lane by lane."""
        lanes = np.arange(self.live[table], dtype=np.int64)
        tables = np.full(lanes.size, table, dtype=np.int64)
        return self._ids(tables, lanes, np.full(lanes.size, float(time)))

    def _lanes(self, ranks, feat, time, rng) -> np.ndarray:
        if math.isinf(self.period):
            period = np.zeros(feat.size, dtype=np.int64)
        else:
            x = np.asarray(time, dtype=np.float64) / self.period
            period = np.floor(x).astype(np.int64)
            period += rng.random(feat.size) < x - period
        # One bijection per (feature, period): a chunk touches a few periods per feature.
        key = period * len(self.table) + feat
        uniq, inverse = np.unique(key, return_inverse=True)
        pairs = [self._bijection(int(k % len(self.table)), int(k // len(self.table))) for k in uniq]
        mult, add = np.array(pairs, dtype=np.int64).reshape(-1, 2).T
        live = self.live[self.table[feat]]
        return (ranks * mult[inverse] + add[inverse]) % live

    def _bijection(self, feature: int, period: int) -> tuple[int, int]:
        if (feature, period) not in self._bijections:
            live = int(self.live[self.table[feature]])
            rng = np.random.default_rng([self.seed, 301, feature, period])
            self._bijections[(feature, period)] = (coprime(rng, live), int(rng.integers(0, live)))
        return self._bijections[(feature, period)]

    def _ids(self, tables: np.ndarray, lanes: np.ndarray, time: np.ndarray) -> np.ndarray:
        lane_hash = mix64(self.table_keys[tables] + lanes.astype(np.uint64) * _GOLDEN)
        if math.isinf(self.lifetime):
            generation = np.zeros(lanes.size, dtype=np.uint64)
        else:
            phase = (mix64(lane_hash ^ _PHASE_KEY) >> np.uint64(11)).astype(np.float64) / 2.0**53
            age = np.asarray(time, dtype=np.float64) / self.lifetime + phase
            generation = np.floor(age).astype(np.int64).astype(np.uint64)
        raw = mix64(lane_hash + (generation + np.uint64(1)) * _GEN_KEY)
        return (raw >> np.uint64(1)).astype(np.int64)  # non-negative: [0, 2^63)


def id_space(cfg: RecConfig) -> IdSpace | None:
    """The churning id space of data.synthetic, or None for ids over each table's rows."""
    syn = cfg.data.synthetic
    if not (syn.live_ids or syn.churn or syn.popularity_drift):
        return None
    names = [t.name for t in cfg.tables]
    unknown = sorted(set(syn.live_ids) - set(names))
    if unknown:
        raise ConfigError(
            f"data.synthetic.live_ids names {unknown}, not tables; tables are {names}"
        )
    owner = cfg.feature_to_table()
    return IdSpace(
        seed=syn.seed,
        feature_tables=[names.index(owner[f]) for f in cfg.features.sparse],
        live=[syn.live_ids.get(t.name, t.rows) for t in cfg.tables],
        epoch=syn.train_samples,
        churn=syn.churn,
        popularity_drift=syn.popularity_drift,
    )


def colliding_share(ids: np.ndarray, rows: int) -> float:
    """Share of the distinct `ids` whose row `id % rows` holds another of them too."""
    distinct = np.unique(np.asarray(ids, dtype=np.int64))
    if distinct.size == 0:
        return 0.0
    _, inverse, counts = np.unique(np.remainder(distinct, rows), return_inverse=True,
                                   return_counts=True)  # fmt: skip
    return float((counts[inverse] > 1).mean())


def expected_colliding_share(n: int, rows: int) -> float:
    """1 - (1 - 1/rows)^(n - 1), about 1 - e^(-n/rows): the share of n ids hashed uniformly
    into `rows` rows that share their row with another."""
    return 1.0 - (1.0 - 1.0 / rows) ** max(n - 1, 0) if rows > 0 else 1.0


@dataclass(frozen=True)
class TableCollisions:
    """How `id % rows` treats one table's ids in a stretch of samples."""

    table: str
    rows: int
    ids: int
    """Distinct ids the samples hold (all the table's features together)."""
    colliding: float
    """Share of those ids that share their row with another of them."""
    lookups_colliding: float
    """Share of the lookups (id occurrences) whose id shares its row."""
    expected: float
    """expected_colliding_share(ids, rows): what uniform hashing would give."""


def modulo_collisions(cfg: RecConfig, rows: Rows) -> list[TableCollisions]:
    """Per table, the collisions under `id % rows` among the ids of `rows` (rec.data.source.Rows
    of any source, e.g. `SyntheticSource(cfg, "train").take(0, n).rows`), as cfg's tables map
    them. Features that share a table share its rows, so their ids are counted together."""
    features = list(cfg.features.sparse)
    owner = cfg.feature_to_table()
    lengths = np.asarray(rows.lengths)
    feat = np.repeat(np.tile(np.arange(len(features)), len(lengths)), lengths.ravel())
    values = np.asarray(rows.values, dtype=np.int64)
    out = []
    for table in cfg.tables:
        mine = [f for f, name in enumerate(features) if owner[name] == table.name]
        ids = values[np.isin(feat, mine)]
        distinct, inverse = np.unique(ids, return_inverse=True)
        _, row_of, per_row = np.unique(np.remainder(distinct, table.rows), return_inverse=True,
                                       return_counts=True)  # fmt: skip
        shared = per_row[row_of] > 1  # [distinct]
        out.append(TableCollisions(
            table=table.name,
            rows=table.rows,
            ids=int(distinct.size),
            colliding=float(shared.mean()) if distinct.size else 0.0,
            lookups_colliding=float(shared[inverse].mean()) if ids.size else 0.0,
            expected=expected_colliding_share(int(distinct.size), table.rows),
        ))  # fmt: skip
    return out


def live_collisions(cfg: RecConfig, time: float = 0.0) -> list[TableCollisions]:
    """Per table, what `id % rows` does to the whole live set at position `time`: every live
    id counted once, however rarely the stream shows it. lookups_colliding is nan here (the
    stream's measure, modulo_collisions, weighs ids by how often they come). Ids 0..rows-1
    (no live_ids, churn or popularity_drift) never collide."""
    space = id_space(cfg)
    out = []
    for index, table in enumerate(cfg.tables):
        ids = space.live_set(index, time) if space else np.arange(table.rows)
        n = int(ids.size)
        expected = expected_colliding_share(n, table.rows)
        share = colliding_share(ids, table.rows)
        out.append(TableCollisions(table.name, table.rows, n, share, math.nan, expected))
    return out
