"""Criteo-shaped synthetic data with a planted signal, so that AUC measures learning.

A sample is a function of (seed, split, position) only. Samples are made in chunks of
`CHUNK` positions, each from its own generator seeded by (seed, split, chunk index), with
vectorised numpy; any position range costs only the chunks it touches.

What a sample holds:
  - sparse features: ids drawn from a Zipf-like law over the rows of the feature's table,
    mapped through a seeded bijection so that the popular ids are not 0, 1, 2, ...;
    a `multi_hot_fraction` of the features are multi-hot (1..max_hotness ids, sometimes none),
    the others one-hot; a feature named in `hotness` has exactly that many ids in every sample
    (drawn after the others' lengths, so the features it leaves out are as without it);
  - dense features: log-normal counts (sometimes missing, i.e. 0) turned into log1p(count),
    Criteo's usual preprocessing;
  - labels, one per task, Bernoulli(sigmoid(logit_t)) from a hidden teacher (`Teacher`).

The eval split is a second stream of the same distribution and the same teacher.

Churn and drift (all off by default, and then nothing below applies): a sample's position
is its time, and `data.synthetic` can make the world change with it (rec.data.churn):
  - live_ids: each table's ids are drawn from its own live set of that many large int64 ids
    (any value in [0, 2^63), as a real system's hashed ids), independent of its rows, so that
    `id % rows` collides as it would in production (a table left out: as many as its rows);
  - churn: the share of the live ids replaced by new ones per train_samples positions;
  - popularity_drift: how many times per train_samples positions the ids' popularity ranks
    are reshuffled, smoothly (an id's rank moves from one period's to the next's);
  - teacher_drift: how many times per train_samples positions the teacher's rule turns into
    an independent one, smoothly; new ids always get new per-id weights.
Any of live_ids, churn or popularity_drift switches every table to the live-id space. There
nothing depends on a table's rows but its live ids' default, so with live_ids given for
every table, tables of any size see exactly the same samples: what comparing row budgets
needs (`stream_collisions` and rec.data.churn.live_collisions measure what `id % rows` then
does). Teacher drift scores each chunk with two rules, about doubling the teacher's cost.
The training stream's position p is time p; a second epoch replays the same times. The eval
stream (`eval_time`) is either the time just `after` training's epoch (position p is time
train_samples + p: the next events, what a deployed model meets; ids born after training
are new to it), or spread `during` it (position p is time p * train_samples / eval_samples:
the same ids and rules as training, held-out samples only).

Example:
    >>> from rec.config import default_config
    >>> src = SyntheticSource(default_config(), "train")
    >>> batch = next(src.batches(batch_size=4, rank=0, world_size=1))
    >>> batch.dense.shape, batch.lengths.shape
    (torch.Size([4, 13]), torch.Size([4, 8]))
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rec.batch import RecBatch
from rec.config import RecConfig
from rec.data.churn import TableCollisions, coprime, id_space, mix64, modulo_collisions
from rec.data.parse import log1p_dense
from rec.data.source import DataSource, Plan, Rows
from rec.features import feature_spec, transform_dense

CHUNK = 4096
"""Positions per generated chunk. Changing it changes every sample: it is part of the format."""

_STREAM = {"train": 0, "eval": 1}
_CALIBRATION_STREAM = 2  # samples used only to standardise the teacher's logit
_CALIBRATION_SAMPLES = 16_384
_EMPTY_BAG_P = 0.1  # chance that a multi-hot feature has no id, like Criteo's missing fields
_TARGET_CTR = 0.25
_LATENT = 4  # dimension of the teacher's per-id vectors for pairwise interactions
# Share of the teacher's logit variance: per-id weights, pairwise interactions, dense term,
# and (din only; 0 elsewhere) the candidate-in-history match, as strong as the other three.
_MIX = (0.5, 0.3, 0.2, 1.0)
# Without a history the logit's standard deviation is signal * _LOGIT_SCALE; 0.65 puts the
# Bayes AUC of the default signal (2.5) near 0.83, high enough to learn in minutes, far from
# trivially 1. With din's match part it is sqrt(2) times that (Bayes AUC 0.89 on din.yaml).
_LOGIT_SCALE = 0.65


@dataclass
class Chunk:
    """Samples [first, first + n) of a stream, plus what the writers and the AUC need.

    rows: the samples (rows.pos = positions); counts [n, D] i64: the raw counts whose log1p
    is rows.dense; probs [n, T] f64: the teacher's true click probabilities.
    """

    rows: Rows
    counts: np.ndarray
    probs: np.ndarray

    def take(self, i: int, j: int) -> Chunk:
        return Chunk(self.rows.take(i, j), self.counts[i:j], self.probs[i:j])

    @staticmethod
    def concat(parts: list[Chunk]) -> Chunk:
        if len(parts) == 1:
            return parts[0]
        return Chunk(
            Rows.concat([p.rows for p in parts]),
            np.concatenate([p.counts for p in parts]),
            np.concatenate([p.probs for p in parts]),
        )


def _id_hash(ids: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """uint64 [N] hash of (id, key): the teacher's per-id parameters without per-id tables."""
    return mix64(ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + keys)


def _uniform_pm(bits: np.ndarray, width: int) -> np.ndarray:
    """Unsigned `width`-bit integers -> floats uniform on [-sqrt(3), sqrt(3)] (unit variance)."""
    return (bits.astype(np.float64) / float(1 << width) - 0.5) * math.sqrt(12.0)


class World:
    """The data-generating law apart from labels: ids, bag lengths and dense values."""

    def __init__(self, cfg: RecConfig) -> None:
        syn = cfg.data.synthetic
        tables = {t.name: t for t in cfg.tables}
        owner = cfg.feature_to_table()
        self.seed = syn.seed
        self.features = list(cfg.features.sparse)
        self.rows = np.array([tables[owner[f]].rows for f in self.features], dtype=np.int64)
        self.mean_pooled = np.array([tables[owner[f]].pooling == "mean" for f in self.features])
        self.num_dense = cfg.features.dense
        self.max_hotness = syn.max_hotness
        self.alpha = syn.zipf_alpha
        rng = np.random.default_rng([syn.seed, 100])
        num_f = len(self.features)
        self.multi_hot = np.zeros(num_f, dtype=bool)
        self.multi_hot[rng.permutation(num_f)[: round(syn.multi_hot_fraction * num_f)]] = True
        # Fixed ids per sample: feature indices and their counts (data.synthetic.hotness).
        self.fixed = np.array([self.features.index(f) for f in syn.hotness], dtype=np.int64)
        self.fixed_count = np.array(list(syn.hotness.values()), dtype=np.int32)
        self.ids = id_space(cfg)
        if self.ids is None:
            # id = (rank * mult + add) mod rows, mult coprime to rows: a bijection of [0, rows).
            self.mult = np.array([coprime(rng, int(r)) for r in self.rows], dtype=np.int64)
            self.add = np.array([rng.integers(0, r) for r in self.rows], dtype=np.int64)
        self.dense_mu = rng.uniform(0.0, 3.5, self.num_dense)
        self.dense_sigma = rng.uniform(0.5, 1.5, self.num_dense)
        self.dense_missing = rng.uniform(0.0, 0.3, self.num_dense)
        # din: the candidate (one id) and the history (0..history_length ids) features.
        din = cfg.model.arch == "din"
        self.candidate = self.features.index(cfg.model.candidate) if din else -1
        self.history = self.features.index(cfg.model.history) if din else -1
        self.history_length = syn.history_length
        self.match_rate = syn.match_rate

    def zipf_ranks(self, u: np.ndarray, feat: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Popularity ranks in [0, size[f]) for uniforms u [N] of features feat [N].

        The inverse CDF of a continuous power law on [1, size + 1) with exponent alpha,
        floored: P(rank = k) ~ (k + 1.5)^-alpha, a Zipf law, with O(1) memory per table.
        """
        top = (size + 1).astype(np.float64)[feat]
        if abs(self.alpha - 1.0) < 1e-9:
            x = np.exp(u * np.log(top))
        else:
            e = 1.0 - self.alpha
            x = (1.0 - u * (1.0 - top**e)) ** (1.0 / e)
        return np.minimum(x.astype(np.int64) - 1, size[feat] - 1)

    def sample(
        self, rng: np.random.Generator, n: int, time: np.ndarray | None = None
    ) -> tuple[np.ndarray, ...]:
        """n samples at positions `time` [n] (read only when ids churn or drift): lengths
        [n, F] i32, values [N] i64 (batch-major), feat [N], counts [n, D]."""
        num_f = len(self.features)
        lengths = np.ones((n, num_f), dtype=np.int32)
        n_multi = int(self.multi_hot.sum())
        if n_multi:
            multi = rng.integers(1, self.max_hotness + 1, size=(n, n_multi), dtype=np.int32)
            multi[rng.random((n, n_multi)) < _EMPTY_BAG_P] = 0
            lengths[:, self.multi_hot] = multi
        # After the draws above, which stay as they are without hotness: same bytes then.
        lengths[:, self.fixed] = self.fixed_count
        if self.history >= 0:
            lengths[:, self.candidate] = 1
            lengths[:, self.history] = rng.integers(0, self.history_length + 1, n)
        # Feature of each id, batch-major: sample by sample, feature by feature.
        feat = np.repeat(np.tile(np.arange(num_f), n), lengths.ravel())
        if self.ids is None:
            ranks = self.zipf_ranks(rng.random(feat.size), feat, self.rows)
            values = (ranks * self.mult[feat] + self.add[feat]) % self.rows[feat]
        else:
            ranks = self.zipf_ranks(rng.random(feat.size), feat, self.ids.live_per_feature())
            at = np.repeat(np.zeros(n) if time is None else time, lengths.sum(axis=1))
            values = self.ids.ids(ranks, feat, at, rng)
        if self.history >= 0:
            self._plant_matches(rng, lengths, values)
        normal = rng.standard_normal((n, self.num_dense))
        counts = np.floor(np.exp(np.minimum(self.dense_mu + self.dense_sigma * normal, 20.0)))
        counts[rng.random((n, self.num_dense)) < self.dense_missing] = 0
        return lengths, values, feat, counts.astype(np.int64)

    def _plant_matches(self, rng: np.random.Generator, lengths, values) -> None:
        """A match_rate share of the samples with a history get one of its ids as candidate."""
        starts = (np.cumsum(lengths.ravel()) - lengths.ravel()).reshape(lengths.shape)
        hist_len = lengths[:, self.history]
        picked = np.nonzero((hist_len > 0) & (rng.random(len(lengths)) < self.match_rate))[0]
        which = (rng.random(picked.size) * hist_len[picked]).astype(np.int64)
        values[starts[picked, self.candidate]] = values[starts[picked, self.history] + which]

    def matches(self, lengths, values, feat) -> np.ndarray:
        """[n] 1.0 where the sample's candidate is among its history's ids (din), else 0."""
        n = lengths.shape[0]
        if self.history < 0:
            return np.zeros(n)
        sample = np.repeat(np.arange(n), lengths.sum(axis=1))
        candidate = np.zeros(n, dtype=values.dtype)
        is_candidate = feat == self.candidate
        candidate[sample[is_candidate]] = values[is_candidate]
        in_history = feat == self.history
        equal = values[in_history] == candidate[sample[in_history]]
        return (np.bincount(sample[in_history], weights=equal, minlength=n) > 0).astype(float)


def _pool(x: np.ndarray, lengths: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Per-bag sums (or means) of x [N, ...] over bags lengths [n, F] -> [n, F, ...]."""
    flat = lengths.ravel().astype(np.int64)
    ends = np.cumsum(flat)
    csum = np.concatenate([np.zeros((1,) + x.shape[1:]), np.cumsum(x, axis=0)])
    pooled = (csum[ends] - csum[ends - flat]).reshape(lengths.shape + x.shape[1:])
    if mean.any():
        div = np.where(mean[None, :], np.maximum(lengths, 1), 1).astype(np.float64)
        pooled = pooled / div.reshape(div.shape + (1,) * (x.ndim - 1))
    return pooled


@dataclass
class _Rule:
    """One draw of the teacher's parameters, per task, with its standardisation."""

    importance: list[np.ndarray]
    dense_coef: list[np.ndarray]
    keys_w: list[np.ndarray]
    keys_u: list[np.ndarray]
    center: np.ndarray | None = None  # [T, 4]
    weight: np.ndarray | None = None  # [T, 4]


class Teacher:
    """The hidden rule behind the labels; one independent head per task.

    For task t, with pooling as the feature's table pools (sum or mean):
        lin   = sum_f a_tf * pool(w_tf[id])                  per-id weights, per feature
        inter = sum_(f,g) <pool(u_tf[id]), pool(u_tg[id])>  pairs (0,1), (2,3), ...; u in R^4
        dn    = v_t . dense                                  linear in the log1p'd dense values
        match = 1 if the candidate is one of the history's ids (model.arch din), else 0
        logit = signal * _LOGIT_SCALE * (sum of the four parts, each standardised and
                weighted by sqrt(_MIX)) + bias_t
    w and u come from hashing (id, task, feature), so no per-id table is stored, and an id
    born later (data.synthetic.churn) has weights of its own; bias_t puts the mean click rate
    near 0.25. Standardisation and bias are fitted once on a calibration stream, so train and
    eval share the teacher exactly.

    Drift (data.synthetic.teacher_drift d): time is cut into periods of train_samples / d
    positions, period k with its own independent draw of (a, w, u, v), rule k, standardised
    on the same calibration samples. At fraction x into period k the first three parts are
    cos(pi x / 2) * rule k's + sin(pi x / 2) * rule k+1's: unit variance all along, so the
    click rate and the Bayes AUC stay put while what predicts a click moves. Rule 0 is the
    rule without drift, so d = 0 gives the same labels as before drift existed.
    """

    def __init__(self, world: World, num_tasks: int, signal: float, drift: float = 0.0,
                 epoch: int = 1) -> None:  # fmt: skip
        num_f = len(world.features)
        self.world = world
        self.num_tasks = num_tasks
        self.signal = signal * _LOGIT_SCALE
        self.pairs = [(f, f + 1) for f in range(0, num_f - 1, 2)]
        self.period = epoch / drift if drift > 0 else math.inf
        rng = np.random.default_rng([world.seed, _CALIBRATION_STREAM])
        lengths, values, feat, counts = world.sample(rng, _CALIBRATION_SAMPLES)
        self._calibration = (lengths, values, feat, log1p_dense(counts))
        self._rules: dict[int, _Rule] = {}
        z = self._z(self.rule(0), *self._calibration)
        self.bias = np.array([_bias_for_ctr(self.signal * z[:, t]) for t in range(num_tasks)])

    def rule(self, k: int) -> _Rule:
        """Rule k (0: the rule at time 0), drawn and standardised on first use."""
        if k not in self._rules:
            num_f, num_dense = len(self.world.features), self.world.num_dense
            rule = _Rule([], [], [], [])
            for t in range(self.num_tasks):
                rng = np.random.default_rng([self.world.seed, 200, t] + ([k] if k else []))
                rule.importance.append(rng.uniform(0.3, 1.5, num_f))
                rule.dense_coef.append(rng.standard_normal(num_dense))
                rule.keys_w.append(rng.integers(0, 2**64, num_f, dtype=np.uint64))
                rule.keys_u.append(rng.integers(0, 2**64, num_f, dtype=np.uint64))
            parts = self._parts(rule, *self._calibration)
            rule.center = parts.mean(axis=0)
            std = parts.std(axis=0)
            # A part that does not vary (no pairs, no dense features) contributes nothing.
            rule.weight = np.where(std > 1e-12, np.sqrt(_MIX) / np.maximum(std, 1e-12), 0.0)
            self._rules[k] = rule
        return self._rules[k]

    def _parts(self, rule: _Rule, lengths, values, feat, dense) -> np.ndarray:
        """[n, T, 4]: the unscaled lin, inter, dense and history-match (din) parts of every
        task's logit; the match part is 0 without a history, and then weighs nothing."""
        mean = self.world.mean_pooled
        out = np.zeros((lengths.shape[0], self.num_tasks, 4))
        out[:, :, 3] = self.world.matches(lengths, values, feat)[:, None]
        for t, importance in enumerate(rule.importance):
            w = _uniform_pm(_id_hash(values, rule.keys_w[t][feat]) >> np.uint64(11), 53)
            out[:, t, 0] = _pool(w, lengths, mean) @ importance
            h = _id_hash(values, rule.keys_u[t][feat])
            shifts = np.arange(_LATENT, dtype=np.uint64) * np.uint64(16)
            u = _uniform_pm((h[:, None] >> shifts) & np.uint64(0xFFFF), 16)  # [N, 4]
            pooled = _pool(u, lengths, mean)  # [n, F, 4]
            for f, g in self.pairs:
                out[:, t, 1] += (pooled[:, f] * pooled[:, g]).sum(axis=1)
            out[:, t, 2] = dense.astype(np.float64) @ rule.dense_coef[t]
        return out

    def _standard(self, rule: _Rule, lengths, values, feat, dense) -> np.ndarray:
        return (self._parts(rule, lengths, values, feat, dense) - rule.center) * rule.weight

    def _z(self, rule: _Rule, lengths, values, feat, dense) -> np.ndarray:
        return self._standard(rule, lengths, values, feat, dense).sum(axis=2)

    def _drifted_z(self, lengths, values, feat, dense, time: np.ndarray) -> np.ndarray:
        x = np.asarray(time, dtype=np.float64) / self.period
        period = np.floor(x).astype(np.int64)
        turn = (x - period) * (math.pi / 2)
        parts = {k: self._standard(self.rule(k), lengths, values, feat, dense)
                 for k in np.unique(np.concatenate([period, period + 1])).tolist()}  # fmt: skip
        z = np.empty((lengths.shape[0], self.num_tasks))
        for k in np.unique(period).tolist():
            at = period == k
            now, then = parts[k][at], parts[k + 1][at]
            c, s = np.cos(turn[at])[:, None, None], np.sin(turn[at])[:, None, None]
            mixed = now.copy()
            mixed[:, :, :3] = c * now[:, :, :3] + s * then[:, :, :3]  # match (din) stays
            z[at] = mixed.sum(axis=2)
        return z

    def probs(self, lengths, values, feat, dense, time: np.ndarray | None = None) -> np.ndarray:
        """[n, T] f64 click probabilities of samples given as `World.sample` makes them, at
        positions `time` [n] (read only under drift)."""
        if math.isinf(self.period) or time is None:
            z = self._z(self.rule(0), lengths, values, feat, dense)
        else:
            z = self._drifted_z(lengths, values, feat, dense, time)
        logit = self.signal * z + self.bias
        return 1.0 / (1.0 + np.exp(-logit))


def _bias_for_ctr(logit: np.ndarray) -> float:
    """The b with mean(sigmoid(logit + b)) == _TARGET_CTR, by bisection (it is monotone in b)."""
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if np.mean(1.0 / (1.0 + np.exp(-(logit + mid)))) < _TARGET_CTR:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


_TEACHERS: dict[str, tuple[World, Teacher]] = {}


def _world_and_teacher(cfg: RecConfig) -> tuple[World, Teacher]:
    """Both splits (and repeated sources) share one calibrated teacher per configuration."""
    key = repr((cfg.tables, cfg.features, cfg.data.synthetic, cfg.model.num_tasks,
                cfg.model.arch == "din" and (cfg.model.candidate, cfg.model.history)))  # fmt: skip
    if key not in _TEACHERS:
        syn = cfg.data.synthetic
        world = World(cfg)
        teacher = Teacher(world, cfg.model.num_tasks, syn.signal, syn.teacher_drift,
                          syn.train_samples)  # fmt: skip
        _TEACHERS[key] = (world, teacher)
    return _TEACHERS[key]


class SyntheticSource(DataSource):
    """The `train` or `eval` stream of the synthetic data set (see the module docstring)."""

    def __init__(self, cfg: RecConfig, split: str, raw_dense: bool = False) -> None:
        if split not in _STREAM:
            raise ValueError(f"split={split!r} must be 'train' or 'eval'")
        syn = cfg.data.synthetic
        self.split = split
        # The generated dense values are the raw ones; features.transforms (none by default)
        # apply on top, as for files, so the exported model sees what training saw.
        spec = feature_spec(cfg)
        self.transform = None if raw_dense or "log1p" not in spec.transforms else spec
        self.world, self.teacher = _world_and_teacher(cfg)
        self.num_tasks = cfg.model.num_tasks
        self._num = syn.train_samples if split == "train" else syn.eval_samples
        self._stream = [syn.seed, _STREAM[split]]
        # Time only matters when ids churn or drift, or the teacher drifts (module docstring).
        self._timed = self.world.ids is not None or syn.teacher_drift > 0
        self._time_origin, self._time_scale = 0, 1.0
        if split == "eval" and syn.eval_time == "after":
            self._time_origin = syn.train_samples
        elif split == "eval":
            self._time_scale = syn.train_samples / syn.eval_samples
        self._cache: OrderedDict[int, Chunk] = OrderedDict()
        self.skipped_rows = 0

    def num_samples(self) -> int:
        return self._num

    def time(self, pos: np.ndarray) -> np.ndarray:
        """f64 [n]: the time (a train position) at which the samples at positions pos occur."""
        return self._time_origin + np.asarray(pos, dtype=np.float64) * self._time_scale

    def chunk(self, index: int) -> Chunk:
        """Positions [index * CHUNK, (index + 1) * CHUNK); the last few chunks are cached."""
        if index in self._cache:
            self._cache.move_to_end(index)
            return self._cache[index]
        rng = np.random.default_rng(self._stream + [index])
        pos = np.arange(index * CHUNK, (index + 1) * CHUNK, dtype=np.int64)
        time = self.time(pos) if self._timed else None
        lengths, values, feat, counts = self.world.sample(rng, CHUNK, time)
        dense = log1p_dense(counts)
        probs = self.teacher.probs(lengths, values, feat, dense, time)
        labels = (rng.random(probs.shape) < probs).astype(np.float32)
        chunk = Chunk(Rows.build(dense, lengths, values, labels, pos), counts, probs)
        self._cache[index] = chunk
        if len(self._cache) > 4:
            self._cache.popitem(last=False)
        return chunk

    def take(self, lo: int, hi: int) -> Chunk:
        """Positions [lo, hi) of the stream (which goes on past num_samples)."""
        if not 0 <= lo <= hi:
            raise ValueError(f"position range [{lo}, {hi}) is not valid")
        parts = []
        for index in range(lo // CHUNK, (hi - 1) // CHUNK + 1 if hi > lo else lo // CHUNK):
            first = index * CHUNK
            parts.append(self.chunk(index).take(max(lo - first, 0), min(hi - first, CHUNK)))
        if not parts:
            return self.chunk(lo // CHUNK).take(0, 0)
        return Chunk.concat(parts)

    def _batches(self, plan: Plan) -> Iterator[RecBatch]:
        for lo, hi in plan.ranges():
            rows = self.take(lo, hi).rows
            if self.transform is not None:
                rows = dataclasses.replace(rows, dense=transform_dense(self.transform, rows.dense))
            yield rows.to_batch()


def teacher_auc(cfg: RecConfig, split: str = "eval", num_samples: int | None = None) -> list[float]:
    """Bayes AUC per task: the AUC of the teacher's true probabilities against the labels.

    No model can beat it on average; with the default config it is about 0.8.
    """
    from sklearn.metrics import roc_auc_score  # a test/dev dependency, only needed here

    src = SyntheticSource(cfg, split)
    chunk = src.take(0, num_samples or src.num_samples())
    labels = chunk.rows.labels
    return [float(roc_auc_score(labels[:, t], chunk.probs[:, t])) for t in range(src.num_tasks)]


def stream_collisions(
    cfg: RecConfig, split: str = "train", num_samples: int | None = None
) -> list[TableCollisions]:
    """Per table, what `id % rows` does to the ids of the split's first num_samples (default:
    all of them): rec.data.churn.modulo_collisions on the generated stream."""
    src = SyntheticSource(cfg, split)
    return modulo_collisions(cfg, src.take(0, num_samples or src.num_samples()).rows)
