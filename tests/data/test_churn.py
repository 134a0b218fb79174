"""The synthetic generator's churn and drift: ids born and retired over time, popularity and
teacher drift, and the collision measure the row-budget comparison of modulo tables uses."""

from __future__ import annotations

import numpy as np
import pytest

from rec.config import ConfigError
from rec.data import make_source, synthetic, teacher_auc
from rec.data.churn import (
    IdSpace,
    colliding_share,
    expected_colliding_share,
    live_collisions,
    modulo_collisions,
)

EPOCH = 40_000


def churned(util, tables_rows=(300, 50, 1000, 7), **syn):
    """small_config's shape with churn/drift settings and a 40,000-position epoch."""
    tables = [{"name": f"t{i}", "rows": r, "dim": 8, "features": [f"cat_{i}"]}
              for i, r in enumerate(tables_rows)]  # fmt: skip
    data = {"synthetic": {"train_samples": EPOCH, "eval_samples": 8192, **syn}}
    return util.small_config(data, tables=tables)


def table_ids(src, lo, hi, feature=2):
    """(distinct ids, counts) of one feature over positions [lo, hi)."""
    rows = src.take(lo, hi).rows
    num_f = rows.lengths.shape[1]
    feat = np.repeat(np.tile(np.arange(num_f), len(rows)), rows.lengths.ravel())
    return np.unique(rows.values[feat == feature], return_counts=True)


def vanished(src, early, late, min_count=5):
    """Share of the ids seen >= min_count times in window `early` that `late` never shows."""
    ids, counts = table_ids(src, *early)
    popular = ids[counts >= min_count]
    assert popular.size > 30
    return 1 - np.isin(popular, table_ids(src, *late)[0]).mean()


def test_live_set_turns_over_by_the_configured_share():
    space = IdSpace(seed=3, feature_tables=[0], live=[20_000], epoch=10_000, churn=0.4)
    start = space.live_set(0, 0)
    assert np.unique(start).size == 20_000  # exactly `live` distinct ids at any time
    for later, share in [(2_500, 0.1), (5_000, 0.2), (25_000, 1.0)]:
        replaced = 1 - np.isin(start, space.live_set(0, later)).mean()
        assert abs(replaced - share) < 0.01, (later, replaced)


def test_stream_ids_are_born_and_retired(util):
    src = make_source(churned(util, churn=0.5), "train")
    # 20,000 positions apart, with a lifetime of 80,000: a quarter of the live ids replaced,
    # plus up to a window's worth (4,096 / 80,000) more.
    share = vanished(src, (0, 4096), (20_000, 24_096))
    assert 0.17 < share < 0.35, share
    still = make_source(churned(util, live_ids={"t2": 1000}), "train")
    assert vanished(still, (0, 4096), (20_000, 24_096)) < 0.03  # no churn: the ids stay


def test_ids_are_large_and_independent_of_rows(util):
    syn = {"live_ids": {"t0": 300, "t1": 50, "t2": 1000, "t3": 7}, "churn": 1.0}
    few, many = churned(util, **syn), churned(util, (1200, 200, 4000, 28), **syn)
    a, b = make_source(few, "train").take(0, 5000), make_source(many, "train").take(0, 5000)
    values = a.rows.values
    assert (values >= 0).all() and (values > 2**40).mean() > 0.99  # not 0..rows-1
    # Same live ids, four times the rows: the very same samples, so only `id % rows` differs.
    for name in ("values", "lengths", "dense", "labels"):
        np.testing.assert_array_equal(getattr(a.rows, name), getattr(b.rows, name))


@pytest.mark.parametrize("syn", [{"churn": 2.0}, {"popularity_drift": 3.0, "teacher_drift": 2.0}])
def test_a_sample_is_a_function_of_its_position(util, syn):
    cfg = churned(util, **syn)
    synthetic._TEACHERS.clear()
    src = make_source(cfg, "train")
    big = next(src.batches(9000, 0, 1, start=30_000))  # crosses chunk boundaries
    synthetic._TEACHERS.clear()
    again = make_source(cfg, "train")  # a fresh teacher and id space, chunks in another order
    for start, size in [(38_900, 100), (30_000, 7), (34_000, 5000)]:
        part = next(again.batches(size, 0, 1, start=start))
        util.assert_same(part, util.slice_batch(big, start - 30_000, start - 30_000 + size))


def test_eval_after_training_meets_the_next_ids(util):
    after = churned(util, churn=1.0)
    train, ev = make_source(after, "train"), make_source(after, "eval")
    np.testing.assert_array_equal(ev.time(np.array([0, 10])), [EPOCH, EPOCH + 10])
    # Eval starts where training's epoch ends, a lifetime after its start: the ids are new
    # but for a few whose lives span both windows' (4,096 / 40,000 positions: 5 % at most).
    assert np.isin(table_ids(ev, 0, 4096)[0], table_ids(train, 0, 4096)[0]).mean() < 0.06
    ids, counts = table_ids(ev, 0, 4096)
    last = table_ids(train, EPOCH - 4096, EPOCH)[0]  # training's last window: the same time
    assert np.isin(ids[counts >= 5], last).mean() > 0.85
    during = make_source(churned(util, churn=1.0, eval_time="during"), "eval")
    np.testing.assert_allclose(during.time(np.array([0, 8192])), [0, EPOCH])


def test_popularity_drifts(util):
    def top(src, lo):
        ids, counts = table_ids(src, lo, lo + 8192)
        return ids[np.argsort(counts)[-20:]]

    still = make_source(churned(util, live_ids={"t2": 1000}), "train")
    drift = make_source(churned(util, popularity_drift=1.0), "train")
    assert np.isin(top(still, 0), top(still, 30_000)).mean() > 0.6
    # A period later the ranking is an independent one: top ids of before are rarely on top.
    assert np.isin(top(drift, 0), top(drift, EPOCH)).mean() < 0.3


def test_teacher_drift_turns_the_rule_and_keeps_the_signal(util):
    cfg = churned(util, teacher_drift=1.0)
    src = make_source(cfg, "train")
    teacher, rows = src.teacher, src.take(0, 4096).rows
    lengths, values, dense = rows.lengths, rows.values, rows.dense
    feat = np.repeat(np.tile(np.arange(4), len(rows)), lengths.ravel())
    at = {t: teacher.probs(lengths, values, feat, dense, np.full(len(lengths), t))[:, 0]
          for t in (0, 2_000, EPOCH)}  # fmt: skip
    plain = make_source(util.small_config(), "train").teacher
    np.testing.assert_array_equal(at[0], plain.probs(lengths, values, feat, dense)[:, 0])
    assert np.corrcoef(at[0], at[2_000])[0, 1] > 0.95  # slowly
    assert abs(np.corrcoef(at[0], at[EPOCH])[0, 1]) < 0.4  # a period on: another rule
    assert 0.15 < at[EPOCH].mean() < 0.35  # the click rate stays put
    (auc,) = teacher_auc(cfg, num_samples=4096)
    assert 0.75 < auc < 0.92


def test_modulo_collisions_follow_the_hashing_law(util):
    space = IdSpace(seed=0, feature_tables=[0], live=[20_000], epoch=1, churn=1.0)
    live = space.live_set(0, 0.5)
    for rows, expected in [(40_000, 0.393), (20_000, 0.632), (10_000, 0.865)]:
        assert abs(colliding_share(live, rows) - expected) < 0.01
        assert abs(expected_colliding_share(20_000, rows) - expected) < 0.001
    # Ids 0..rows-1 never collide, in the live set or the stream; hashed live ids do, at the law.
    plain = util.small_config()
    rows = make_source(plain, "train").take(0, 8192).rows
    assert all(c.colliding == 0 for c in modulo_collisions(plain, rows) + live_collisions(plain))
    cfg = churned(util, (2000, 50, 500, 7), live_ids={"t0": 1000, "t2": 1000})
    t0, _, t2, _ = live_collisions(cfg, time=EPOCH / 2)
    assert (t0.ids, t2.ids) == (1000, 1000)
    assert abs(t0.colliding - 0.393) < 0.04 and abs(t2.colliding - 0.865) < 0.04  # 2x, 0.5x
    stream = synthetic.stream_collisions(cfg, num_samples=8192)
    assert stream == modulo_collisions(cfg, make_source(cfg, "train").take(0, 8192).rows)
    for c in stream[::2]:  # the ids the stream shows: fewer than live, and they collide so
        assert c.ids < 1000 and abs(c.colliding - c.expected) < 0.05
        assert 0.2 < c.lookups_colliding < 0.95


def test_bad_churn_settings(util):
    with pytest.raises(ConfigError, match="live_ids names \\['nope'\\]"):
        make_source(churned(util, live_ids={"nope": 10}), "train")
    with pytest.raises(ConfigError, match="live_ids.t0=0"):
        churned(util, live_ids={"t0": 0})
    with pytest.raises(ConfigError, match="churn=-1"):
        churned(util, churn=-1)
    with pytest.raises(ConfigError, match="eval_time='later'"):
        churned(util, eval_time="later")
