"""The synthetic source: determinism, position semantics, the planted signal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rec.batch import RecBatch
from rec.config import ConfigError
from rec.data import make_source, synthetic, teacher_auc


def fresh(cfg, split="train"):
    """A source with no shared teacher cache, so determinism is tested from scratch."""
    synthetic._TEACHERS.clear()
    return make_source(cfg, split)


def test_same_seed_same_batches(util):
    cfg = util.small_config()
    a = list(fresh(cfg).batches(500, 0, 1))
    b = list(fresh(cfg).batches(500, 0, 1))
    assert len(a) == len(b) == 20
    for x, y in zip(a, b, strict=True):
        util.assert_same(x, y)


def test_different_seed_differs(util):
    a = next(fresh(util.small_config()).batches(256, 0, 1))
    b = next(fresh(util.small_config({"synthetic": {"seed": 1}})).batches(256, 0, 1))
    assert not torch.equal(a.values[:100], b.values[:100])
    assert not torch.equal(a.dense, b.dense)


def test_start_equals_slice_of_bigger_range(util):
    src = make_source(util.small_config(), "train")
    big = next(src.batches(6000, 0, 1))  # crosses the 4096-sample chunk boundary
    for start, size in [(37, 100), (4090, 20), (4096, 7), (3000, 2500)]:
        part = next(src.batches(size, 0, 1, start=start))
        util.assert_same(part, util.slice_batch(big, start, start + size))


@pytest.mark.parametrize("start", [0, 5, 4095])
def test_world_size_independent(util, start):
    src = make_source(util.small_config(), "train")
    one = util.collect(src, 12, 1, start=start)
    for world in (2, 3):
        ranks = util.collect(src, 12 // world, world, start=start)
        assert all(len(r) == len(one[0]) for r in ranks)
        for k, single in enumerate(one[0]):
            util.assert_same(RecBatch.concat([r[k] for r in ranks]), single)


def test_drop_last_semantics(util):
    src = make_source(util.small_config({"synthetic": {"train_samples": 1000}}), "train")
    kept = util.collect(src, 64, 3)  # windows of 192: 5 full ones (960), tail of 40
    assert [len(r) for r in kept] == [5, 5, 5]
    assert all(len(b) == 64 for r in kept for b in r)
    tail = util.collect(src, 64, 3, drop_last=False)
    assert [len(r) for r in tail] == [6, 5, 5]
    assert len(tail[0][-1]) == 40
    assert sum(len(b) for r in tail for b in r) == 1000
    assert src.num_steps(64, 3) == 5
    # Resuming past the end yields nothing; a start in the last window yields only the tail.
    assert util.collect(src, 64, 3, start=1000) == [[], [], []]
    assert [len(b) for b in src.batches(64, 0, 3, start=990, drop_last=False)] == [10]


def test_eval_is_another_stream(util):
    cfg = util.small_config()
    train = next(make_source(cfg, "train").batches(512, 0, 1))
    evals = make_source(cfg, "eval")
    assert evals.num_samples() == 3000
    ev = next(evals.batches(512, 0, 1))
    assert not torch.equal(train.values[:200], ev.values[:200])
    assert not torch.equal(train.dense, ev.dense)


def test_bad_arguments(util):
    src = make_source(util.small_config(), "train")
    with pytest.raises(ValueError, match="rank=2"):
        next(src.batches(8, 2, 2))
    with pytest.raises(ValueError, match="start=-1"):
        next(src.batches(8, 0, 1, start=-1))
    with pytest.raises(ValueError, match="split='test'"):
        make_source(util.small_config(), "test")


def test_shapes_ids_and_lengths(util):
    cfg = util.small_config()
    src = make_source(cfg, "train")
    b = next(src.batches(4096, 0, 1))
    assert b.dense.dtype == torch.float32 and b.dense.shape == (4096, 3)
    assert b.lengths.dtype == torch.int32 and b.lengths.shape == (4096, 4)
    assert b.values.dtype == torch.int64 and b.values.numel() == int(b.lengths.sum())
    assert b.labels.shape == (4096, 1) and set(b.labels.unique().tolist()) == {0.0, 1.0}
    multi = src.world.multi_hot
    assert multi.sum() == 2  # multi_hot_fraction 0.5 of 4 features
    assert (b.lengths[:, ~multi] == 1).all()
    hot = b.lengths[:, multi]
    assert hot.max() == 3 and (hot == 0).any() and (hot > 1).any()
    # Every id lies inside its table: the feature of each value, batch-major.
    feat = np.repeat(np.tile(np.arange(4), 4096), b.lengths.reshape(-1).numpy())
    rows = np.array([300, 50, 1000, 7])
    assert (b.values.numpy() >= 0).all() and (b.values.numpy() < rows[feat]).all()


def test_zipf_popular_ids_are_scrambled(util):
    src = make_source(util.small_config(), "train")
    b = next(src.batches(8192, 0, 1))
    feat = np.repeat(np.tile(np.arange(4), 8192), b.lengths.reshape(-1).numpy())
    ids = b.values.numpy()[feat == 2]  # the 1000-row table
    counts = np.bincount(ids, minlength=1000)
    top = np.sort(counts)[::-1]
    assert top[:100].sum() > 0.5 * counts.sum()  # skewed: 10% of ids carry most samples
    assert np.argmax(counts) != 0 and set(np.argsort(counts)[-3:]) != {0, 1, 2}


def test_dense_is_log1p_of_counts(util):
    src = make_source(util.small_config(), "train")
    chunk = src.take(0, 1000)
    assert (chunk.counts >= 0).all() and (chunk.counts == 0).any()
    np.testing.assert_array_equal(chunk.rows.dense, np.log1p(chunk.counts).astype(np.float32))


def test_teacher_auc_and_ctr(util):
    cfg = util.small_config()
    (auc,) = teacher_auc(cfg)
    assert 0.75 < auc < 0.92
    labels = make_source(cfg, "eval").take(0, 3000).rows.labels
    assert 0.15 < labels.mean() < 0.35
    weak = util.small_config({"synthetic": {"signal": 0.0}})
    assert abs(teacher_auc(weak)[0] - 0.5) < 0.05  # no signal: nothing to learn


def test_tasks_have_their_own_teachers(util):
    cfg = util.small_config(model={"dense_arch": [16, 8], "over_arch": [16, 2]})
    chunk = make_source(cfg, "train").take(0, 4096)
    assert chunk.rows.labels.shape == (4096, 2)
    assert np.corrcoef(chunk.probs.T)[0, 1] < 0.5
    assert (chunk.rows.labels[:, 0] != chunk.rows.labels[:, 1]).mean() > 0.1
    assert all(a > 0.75 for a in teacher_auc(cfg))


def test_one_hot_config_and_validation(util):
    src = make_source(util.small_config({"synthetic": {"max_hotness": 1}}), "train")
    lengths = next(src.batches(2000, 0, 1)).lengths
    assert lengths.max() == 1 and (lengths == 0).any()
    with pytest.raises(ConfigError, match="max_hotness"):
        util.small_config({"synthetic": {"max_hotness": 0}})
    with pytest.raises(ConfigError, match="multi_hot_fraction"):
        util.small_config({"synthetic": {"multi_hot_fraction": 1.5}})


def test_din_history_plants_the_candidate_match():
    """model.arch din: one candidate id, 0..history_length history ids, a match_rate share of
    candidates copied from the history, and a matched candidate clicked far more often."""
    from rec.config import config_from_dict

    cfg = config_from_dict({
        "tables": [
            {"name": "item", "rows": 5000, "dim": 8, "pooling": "none",
             "features": ["cand", "hist"]},
            {"name": "t0", "rows": 100, "dim": 8, "features": ["a"]},
        ],
        "model": {"arch": "din", "candidate": "cand", "history": "hist", "dense_arch": [8]},
        "data": {"synthetic": {"history_length": 6, "match_rate": 0.5}},
    })  # fmt: skip
    src = synthetic.SyntheticSource(cfg, "eval")
    rows = src.chunk(0).rows
    lengths, values = np.asarray(rows.lengths), np.asarray(rows.values)
    assert (lengths[:, 0] == 1).all() and lengths[:, 1].min() == 0 and lengths[:, 1].max() == 6
    feat = np.repeat(np.tile(np.arange(3), len(lengths)), lengths.ravel())
    match = src.world.matches(lengths, values, feat) > 0
    with_history = lengths[:, 1] > 0
    assert 0.45 < match[with_history].mean() < 0.6  # planted, plus a few by chance
    labels = np.asarray(rows.labels)[:, 0]
    assert labels[match].mean() > 3 * labels[~match].mean()


# sha256 (first 16 hex) of the dense, lengths, values and labels bytes of positions [0, 5000),
# computed before data.synthetic.hotness existed: an empty hotness must keep every byte.
_DIN = {
    "tables": [
        {"name": "item", "rows": 5000, "dim": 8, "pooling": "none", "features": ["cand", "hist"]},
        {"name": "t0", "rows": 100, "dim": 8, "features": ["a"]},
    ],
    "model": {"arch": "din", "candidate": "cand", "history": "hist", "dense_arch": [8]},
}
_CHURN = {"data": {"synthetic": {"live_ids": {"t0": 30000}, "churn": 0.5, "teacher_drift": 1.0}}}
_DIGESTS = [
    ({}, "train", "fbffc2c24a69be80"),
    ({}, "eval", "095e34fba39fd348"),
    (_DIN, "train", "874621f71969d52d"),
    (_DIN, "eval", "984d1a2004cccd77"),
    (_CHURN, "train", "54febb403a84e477"),
    (_CHURN, "eval", "0496ed8b6c50a94a"),
]


def _digest(rows) -> str:
    import hashlib

    h = hashlib.sha256()
    for a in (rows.dense, rows.lengths, rows.values, rows.labels):
        h.update(np.ascontiguousarray(np.asarray(a)).tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize(("data", "split", "digest"), _DIGESTS)
def test_without_hotness_the_bytes_are_unchanged(data, split, digest):
    from rec.config import config_from_dict

    rows = fresh(config_from_dict(data), split).take(0, 5000).rows
    assert _digest(rows) == digest


def test_hotness_fixes_ids_per_sample():
    """data.synthetic.hotness: the named features hold exactly their count in every sample
    (never an empty bag); the other features' lengths are as without it."""
    from rec.config import config_from_dict

    hot = {"cat_0": 7, "cat_3": 1, "cat_5": 100}
    plain = fresh(config_from_dict({}), "train").take(0, 5000).rows
    rows = fresh(config_from_dict({"data": {"synthetic": {"hotness": hot}}}), "train")
    rows = rows.take(0, 5000).rows
    lengths, before = np.asarray(rows.lengths), np.asarray(plain.lengths)
    for f, count in [(0, 7), (3, 1), (5, 100)]:
        assert (lengths[:, f] == count).all()
    others = [1, 2, 4, 6, 7]
    np.testing.assert_array_equal(lengths[:, others], before[:, others])
    assert len(rows.values) == lengths.sum()
    assert 0.15 < np.asarray(rows.labels).mean() < 0.35  # the teacher calibrates on it too


def test_hotness_is_checked():
    from rec.config import config_from_dict

    with pytest.raises(ConfigError, match=r"hotness names 'cat_9', which is not a sparse"):
        config_from_dict({"data": {"synthetic": {"hotness": {"cat_9": 2}}}})
    with pytest.raises(ConfigError, match=r"hotness.cat_0=0 must be an integer >= 1"):
        config_from_dict({"data": {"synthetic": {"hotness": {"cat_0": 0}}}})
    with pytest.raises(ConfigError, match=r"hotness.cat_0=2.5 must be of type int"):
        config_from_dict({"data": {"synthetic": {"hotness": {"cat_0": 2.5}}}})
    din = {**_DIN, "data": {"synthetic": {"hotness": {"hist": 5}}}}
    with pytest.raises(ConfigError, match=r"hotness names 'hist', din's model.candidate"):
        config_from_dict(din)
