"""rec.warnings_filter hides exactly the third-party messages it lists (by their start, category
and module, or logger), shows them again with REC_VERBOSE, and its reason for hiding FBGEMM's
"silently incorrect behavior" warning holds: the gradient is right."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest
import torch

from rec import warnings_filter
from rec.warnings_filter import KNOWN, VERBOSE_ENV, Known
from tests.helpers import rec_in_process

WARNED = [k for k in KNOWN if k.category is not None]
LOGGED = [k for k in KNOWN if k.category is None]


def _shown(known: Known, message: str, module: str, show: bool | None = None) -> bool:
    """Whether `message`, warned as `known`'s category from `module`, gets through install()."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings_filter.install(show)
        warnings.warn_explicit(message, known.category, "lib.py", 1, module=module)
    return bool(caught)


@pytest.mark.parametrize("known", WARNED, ids=lambda k: f"{k.module}:{k.message[:30]}")
def test_a_known_warning_is_hidden_only_from_its_module_and_by_its_start(known):
    assert not _shown(known, known.message + " More words.", known.module)
    assert _shown(known, known.message, known.module, show=True)  # rec --verbose
    assert _shown(known, known.message, known.module + "_other")
    assert _shown(known, known.message, "rec.train.trainer")
    assert _shown(known, "Note: " + known.message, known.module)


@pytest.mark.parametrize("known", LOGGED, ids=lambda k: f"{k.module}:{k.message[:30]}")
def test_a_known_log_record_is_dropped_from_its_logger_only(known):
    def passes(logger: str, message: str) -> bool:
        record = logging.LogRecord(logger, logging.WARNING, "lib.py", 1, message, None, None)
        return logging.getLogger(logger).filter(record)

    try:
        warnings_filter.install(show=False)
        assert not passes(known.module, known.message + " [0, 1]")
        assert passes(known.module, "Something else happened: " + known.message)
        assert passes("rec", known.message)
        warnings_filter.install(show=True)
        assert passes(known.module, known.message)
    finally:
        warnings_filter.install(show=True)  # leave this process's loggers as they were


def test_every_entry_says_why():
    assert all(len(k.why) > 20 for k in KNOWN)
    assert len({(k.message, k.module) for k in KNOWN}) == len(KNOWN)


def test_rec_verbose_reaches_the_processes_it_starts():
    """`rec --verbose` sets REC_VERBOSE, which a worker's own install() reads."""
    known = WARNED[0]
    code = (
        "import warnings; from rec import warnings_filter; warnings_filter.install(); "
        f"warnings.warn_explicit({known.message!r}, {known.category.__name__}, 'lib.py', 1, "
        f"module={known.module!r})"
    )
    for verbose, shown in (("1", True), ("", False)):
        env = {**os.environ, VERBOSE_ENV: verbose}
        err = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stderr  # fmt: skip
        assert (known.message in err) == shown, err


def test_rec_verbose_is_passed_on_in_the_environment(monkeypatch):
    monkeypatch.setenv(VERBOSE_ENV, "")  # restored (unset) after the test
    rec_in_process("plan", "--world-size", "1", check=True)
    assert not warnings_filter.verbose()
    rec_in_process("--verbose", "plan", "--world-size", "1", check=True)
    assert os.environ[VERBOSE_ENV] == "1"


def test_fbgemms_dense_table_gradient_is_embedding_bags_despite_the_warning():
    """data_parallel tables run FBGEMM's dense kernel, whose backward makes torch warn "This
    may lead to silently incorrect behavior". Its gradient is torch.nn.EmbeddingBag's, exactly,
    for repeated ids, empty bags and several tables."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        DenseTableBatchedEmbeddingBagsCodegen,
    )

    torch.manual_seed(0)
    shapes = [(50, 8), (30, 4)]
    tbe = DenseTableBatchedEmbeddingBagsCodegen(shapes, use_cpu=True)
    bags = [torch.nn.EmbeddingBag(rows, dim, mode="sum") for rows, dim in shapes]
    with torch.no_grad():
        for t, bag in enumerate(bags):
            bag.weight.copy_(tbe.split_embedding_weights()[t])
    batch = 6
    # Per table, bag lengths 0..3 (an empty bag included), 10 or 11 ids among the first 6 rows
    # (so ids repeat, within a bag and across bags).
    lengths = [torch.tensor([0, 1, 3, 2, 3, 1]), torch.tensor([2, 0, 1, 3, 3, 2])]
    ids = [torch.randint(0, 6, (int(n.sum()),)) for n in lengths]
    offsets = torch.cat([torch.tensor([0]), torch.cumsum(torch.cat(lengths), 0)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pooled = tbe(torch.cat(ids), offsets)  # [B, sum of dims]
        upstream = torch.randn_like(pooled)
        (pooled * upstream).sum().backward()
    # The warning the table lists is this one (once FBGEMM registers its autograd kernel
    # properly, the entry can go).
    (fbgemm,) = [k for k in WARNED if k.message.startswith("fbgemm::dense_embedding")]
    assert any(str(w.message).startswith(fbgemm.message) for w in caught), caught
    expected_out, at = [], 0
    for t, bag in enumerate(bags):
        bag_offsets = torch.cat([torch.tensor([0]), torch.cumsum(lengths[t], 0)[:-1]])
        out = bag(ids[t], bag_offsets)
        dim = shapes[t][1]
        (out * upstream[:, at : at + dim]).sum().backward()
        expected_out.append(out)
        at += dim
    assert pooled.shape == (batch, at)
    torch.testing.assert_close(pooled, torch.cat(expected_out, 1), rtol=0, atol=1e-6)
    grads = tbe.weights.grad.split([rows * dim for rows, dim in shapes])
    for t, bag in enumerate(bags):
        torch.testing.assert_close(grads[t].view(shapes[t]), bag.weight.grad, rtol=0, atol=1e-6)
        assert bag.weight.grad.abs().sum() > 0
