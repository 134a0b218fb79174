import torch

from rec.batch import RecBatch, feature_major, map_ids


def _reference_feature_major(lengths, values):
    """Slow, obviously right: walk samples and features."""
    num_samples, num_features = lengths.shape
    bags = {}
    pos = 0
    for b in range(num_samples):
        for f in range(num_features):
            n = int(lengths[b, f])
            bags[(f, b)] = values[pos : pos + n]
            pos += n
    order = [(f, b) for f in range(num_features) for b in range(num_samples)]
    return (
        torch.tensor([len(bags[k]) for k in order]),
        torch.cat([bags[k] for k in order]) if values.numel() else values,
    )


def test_feature_major_matches_reference():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        num_samples, num_features = torch.randint(1, 7, (2,), generator=g).tolist()
        lengths = torch.randint(0, 4, (num_samples, num_features), generator=g, dtype=torch.int32)
        values = torch.randint(-50, 50, (int(lengths.sum()),), generator=g)
        got_l, got_v = feature_major(lengths, values)
        want_l, want_v = _reference_feature_major(lengths, values)
        assert torch.equal(got_l, want_l)
        assert torch.equal(got_v, want_v)


def test_feature_major_is_scriptable():
    scripted = torch.jit.script(feature_major)
    lengths = torch.tensor([[1, 2], [0, 3]], dtype=torch.int32)
    values = torch.arange(6)
    assert torch.equal(scripted(lengths, values)[1], feature_major(lengths, values)[1])
    assert feature_major(lengths, values)[1].tolist() == [0, 1, 2, 3, 4, 5]
    lengths = torch.tensor([[2, 1], [1, 0]], dtype=torch.int32)
    assert feature_major(lengths, values[:4])[1].tolist() == [0, 1, 3, 2]


def test_map_ids_is_non_negative_modulo_per_feature():
    lengths_fm = torch.tensor([2, 1, 1, 2])  # F=2, B=2
    values = torch.tensor([-1, 12, 7, 3, 104, -205])
    rows = torch.tensor([10, 100])
    assert map_ids(lengths_fm, values, rows).tolist() == [9, 2, 7, 3, 4, 95]


def test_concatenated_batches_are_a_valid_batch():
    a = RecBatch(torch.ones(2, 3), torch.tensor([[1], [2]], dtype=torch.int32),
                 torch.tensor([1, 2, 3]), torch.zeros(2, 1))  # fmt: skip
    b = RecBatch(torch.zeros(1, 3), torch.tensor([[1]], dtype=torch.int32),
                 torch.tensor([9]), torch.ones(1, 1))  # fmt: skip
    c = RecBatch.concat([a, b])
    assert len(c) == 3
    lengths_fm, values_fm = feature_major(c.lengths, c.values)
    assert lengths_fm.tolist() == [1, 2, 1]
    assert values_fm.tolist() == [1, 2, 3, 9]
