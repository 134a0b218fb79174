"""Criteo-shaped synthetic data with a planted signal, so that AUC measures learning.

A sample is a function of (seed, split, position) only. Samples are made in chunks of
`CHUNK` positions, each from its own generator seeded by (seed, split, chunk index), with
vectorised numpy; any position range costs only the chunks it touches.

What a sample holds:
  - sparse features: ids drawn from a Zipf-like law over the rows of the feature's table,
    mapped through a seeded bijection so that the popular ids are not 0, 1, 2, ...;
    a `multi_hot_fraction` of the features are multi-hot (1..max_hotness ids, sometimes none),
    the others one-hot;
  - dense features: log-normal counts (sometimes missing, i.e. 0) turned into log1p(count),
    Criteo's usual preprocessing;
  - labels, one per task, Bernoulli(sigmoid(logit_t)) from a hidden teacher (`Teacher`).

The eval split is a second stream of the same distribution and the same teacher.

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
from rec.data.parse import log1p_dense
from rec.data.source import DataSource, Plan, Rows
from rec.features import feature_spec

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


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a fast, well-mixed hash of uint64 [n] (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _id_hash(ids: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """uint64 [N] hash of (id, key): the teacher's per-id parameters without per-id tables."""
    return _mix64(ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + keys)


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
        # id = (rank * mult + add) mod rows, mult coprime to rows: a bijection of [0, rows).
        self.mult = np.array([_coprime(rng, int(r)) for r in self.rows], dtype=np.int64)
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

    def zipf_ranks(self, u: np.ndarray, feat: np.ndarray) -> np.ndarray:
        """Popularity ranks in [0, rows) for uniforms u [N] of features feat [N].

        The inverse CDF of a continuous power law on [1, rows + 1) with exponent alpha, floored:
        P(rank = k) ~ (k + 1.5)^-alpha, a Zipf law, with O(1) memory per table.
        """
        top = (self.rows + 1).astype(np.float64)[feat]
        if abs(self.alpha - 1.0) < 1e-9:
            x = np.exp(u * np.log(top))
        else:
            e = 1.0 - self.alpha
            x = (1.0 - u * (1.0 - top**e)) ** (1.0 / e)
        return np.minimum(x.astype(np.int64) - 1, self.rows[feat] - 1)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
        """n samples: lengths [n, F] i32, values [N] i64 (batch-major), feat [N], counts [n, D]."""
        num_f = len(self.features)
        lengths = np.ones((n, num_f), dtype=np.int32)
        n_multi = int(self.multi_hot.sum())
        if n_multi:
            multi = rng.integers(1, self.max_hotness + 1, size=(n, n_multi), dtype=np.int32)
            multi[rng.random((n, n_multi)) < _EMPTY_BAG_P] = 0
            lengths[:, self.multi_hot] = multi
        if self.history >= 0:
            lengths[:, self.candidate] = 1
            lengths[:, self.history] = rng.integers(0, self.history_length + 1, n)
        # Feature of each id, batch-major: sample by sample, feature by feature.
        feat = np.repeat(np.tile(np.arange(num_f), n), lengths.ravel())
        ranks = self.zipf_ranks(rng.random(feat.size), feat)
        values = (ranks * self.mult[feat] + self.add[feat]) % self.rows[feat]
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


def _coprime(rng: np.random.Generator, rows: int) -> int:
    if rows <= 2:
        return 1
    while True:
        m = int(rng.integers(rows // 3, rows))
        if math.gcd(m, rows) == 1:
            return m


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


class Teacher:
    """The hidden rule behind the labels; one independent head per task.

    For task t, with pooling as the feature's table pools (sum or mean):
        lin   = sum_f a_tf * pool(w_tf[id])                  per-id weights, per feature
        inter = sum_(f,g) <pool(u_tf[id]), pool(u_tg[id])>  pairs (0,1), (2,3), ...; u in R^4
        dn    = v_t . dense                                  linear in the log1p'd dense values
        match = 1 if the candidate is one of the history's ids (model.arch din), else 0
        logit = signal * _LOGIT_SCALE * (sum of the four parts, each standardised and
                weighted by sqrt(_MIX)) + bias_t
    w and u come from hashing (id, task, feature), so no per-id table is stored; bias_t puts
    the mean click rate near 0.25. Standardisation and bias are fitted once on a calibration
    stream, so train and eval share the teacher exactly.
    """

    def __init__(self, world: World, num_tasks: int, signal: float) -> None:
        num_f = len(world.features)
        self.world = world
        self.signal = signal * _LOGIT_SCALE
        self.pairs = [(f, f + 1) for f in range(0, num_f - 1, 2)]
        self.importance, self.dense_coef, self.keys_w, self.keys_u = [], [], [], []
        for t in range(num_tasks):
            rng = np.random.default_rng([world.seed, 200, t])
            self.importance.append(rng.uniform(0.3, 1.5, num_f))
            self.dense_coef.append(rng.standard_normal(world.num_dense))
            self.keys_w.append(rng.integers(0, 2**64, num_f, dtype=np.uint64))
            self.keys_u.append(rng.integers(0, 2**64, num_f, dtype=np.uint64))
        rng = np.random.default_rng([world.seed, _CALIBRATION_STREAM])
        lengths, values, feat, counts = world.sample(rng, _CALIBRATION_SAMPLES)
        parts = self._parts(lengths, values, feat, log1p_dense(counts))
        self.center = parts.mean(axis=0)  # [T, 4]
        std = parts.std(axis=0)
        # A part that does not vary (no pairs, no dense features) contributes nothing.
        self.weight = np.where(std > 1e-12, np.sqrt(_MIX) / np.maximum(std, 1e-12), 0.0)
        z = self._z(parts)
        self.bias = np.array([_bias_for_ctr(self.signal * z[:, t]) for t in range(num_tasks)])

    def _parts(self, lengths, values, feat, dense) -> np.ndarray:
        """[n, T, 4]: the unscaled lin, inter, dense and history-match (din) parts of every
        task's logit; the match part is 0 without a history, and then weighs nothing."""
        mean = self.world.mean_pooled
        out = np.zeros((lengths.shape[0], len(self.importance), 4))
        out[:, :, 3] = self.world.matches(lengths, values, feat)[:, None]
        for t, importance in enumerate(self.importance):
            w = _uniform_pm(_id_hash(values, self.keys_w[t][feat]) >> np.uint64(11), 53)
            out[:, t, 0] = _pool(w, lengths, mean) @ importance
            h = _id_hash(values, self.keys_u[t][feat])
            shifts = np.arange(_LATENT, dtype=np.uint64) * np.uint64(16)
            u = _uniform_pm((h[:, None] >> shifts) & np.uint64(0xFFFF), 16)  # [N, 4]
            pooled = _pool(u, lengths, mean)  # [n, F, 4]
            for f, g in self.pairs:
                out[:, t, 1] += (pooled[:, f] * pooled[:, g]).sum(axis=1)
            out[:, t, 2] = dense.astype(np.float64) @ self.dense_coef[t]
        return out

    def _z(self, parts: np.ndarray) -> np.ndarray:
        return ((parts - self.center) * self.weight).sum(axis=2)

    def probs(self, lengths, values, feat, dense) -> np.ndarray:
        """[n, T] f64 click probabilities of samples given as `World.sample` makes them."""
        logit = self.signal * self._z(self._parts(lengths, values, feat, dense)) + self.bias
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
        world = World(cfg)
        _TEACHERS[key] = (world, Teacher(world, cfg.model.num_tasks, cfg.data.synthetic.signal))
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
        self._cache: OrderedDict[int, Chunk] = OrderedDict()
        self.skipped_rows = 0

    def num_samples(self) -> int:
        return self._num

    def chunk(self, index: int) -> Chunk:
        """Positions [index * CHUNK, (index + 1) * CHUNK); the last few chunks are cached."""
        if index in self._cache:
            self._cache.move_to_end(index)
            return self._cache[index]
        rng = np.random.default_rng(self._stream + [index])
        lengths, values, feat, counts = self.world.sample(rng, CHUNK)
        dense = log1p_dense(counts)
        probs = self.teacher.probs(lengths, values, feat, dense)
        labels = (rng.random(probs.shape) < probs).astype(np.float32)
        pos = np.arange(index * CHUNK, (index + 1) * CHUNK, dtype=np.int64)
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
                rows = dataclasses.replace(rows, dense=self.transform.transform_dense(rows.dense))
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
