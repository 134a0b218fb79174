"""The one random-request maker: requests in the I/O table's layout, for clients, load
generators, benchmarks and tests. numpy only (tritonclient's arrays), seeded, so a request can
be made again from its seed.

Example:
    >>> r = random_request(num_dense=2, num_sparse=3, batch=4, seed=1)
    >>> [(name, a.dtype.name, a.shape[0]) for name, a in r.items()][:2]
    [('dense_features', 'float32', 4), ('sparse_lengths', 'int32', 4)]
    >>> int(r["sparse_lengths"].sum()) == len(r["sparse_values"])
    True
    >>> random_request(0, 3, 2, hotness=[(1, 1), (0, 0), (5, 5)])["sparse_lengths"].tolist()
    [[1, 0, 5], [1, 0, 5]]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rec.contract.io import DENSE, DTYPES, LENGTHS, NUMPY_DTYPES, VALUES

# The default ids cover all of int64's range but the extremes: negative and huge ids are valid
# (the model maps every id into its table), so a request that only used small ones would test less.
ANY_ID = (-(2**62), 2**62)


def random_request(
    num_dense: int,
    num_sparse: int,
    batch: int,
    seed: int = 0,
    ids_per_bag: tuple[int, int] = (0, 3),
    id_range: tuple[int, int] = ANY_ID,
    hotness: Sequence[tuple[int, int]] | None = None,
) -> dict[str, np.ndarray]:
    """{input name: array}: N(0, 1) dense values, `ids_per_bag` (inclusive) ids per sample per
    sparse feature (0 allows empty bags), ids drawn uniformly from [id_range[0], id_range[1]).
    `hotness`, one (low, high) per sparse feature, gives each feature its own bag sizes (a
    user's history of 20 beside an item's one id) in place of `ids_per_bag`."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((batch, num_dense)).astype(NUMPY_DTYPES[DTYPES[DENSE]])
    low, high = ids_per_bag
    if hotness is not None:
        if len(hotness) != num_sparse:
            raise ValueError(f"hotness has {len(hotness)} (low, high) pairs for {num_sparse} "
                             "sparse features")  # fmt: skip
        low, high = (np.array([h[i] for h in hotness]) for i in (0, 1))
    lengths = rng.integers(low, high + 1, size=(batch, num_sparse))
    lengths = lengths.astype(NUMPY_DTYPES[DTYPES[LENGTHS]])
    n = int(lengths.sum())
    values = rng.integers(*id_range, size=n, dtype=NUMPY_DTYPES[DTYPES[VALUES]])
    return {DENSE: dense, LENGTHS: lengths, VALUES: values}
