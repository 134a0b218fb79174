"""The feature spec (rec.features): golden hash values, encodings, transforms, the spec itself."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rec.config import ConfigError, config_from_dict, default_config, load_config
from rec.features import (
    HASH,
    DenseTransform,
    FeatureSpec,
    TokenError,
    encode_tokens,
    feature_spec,
    hash_id,
    hex_id,
    negative_ints,
    string_id,
)

GOLDEN = json.loads((Path(__file__).parent / "hash_golden.json").read_text())


def test_hash_matches_the_golden_file():
    # Pinned: a library or code change that moves one id fails here (and in the C++ test).
    assert GOLDEN["hash"] == HASH
    for token, expected in GOLDEN["hash_id"]:
        assert hash_id(token) == expected, token
    for token, expected in GOLDEN["int_or_hash"]:
        assert string_id(token) == expected, token
    for token, expected in GOLDEN["hex"]:
        assert hex_id(token) == expected, token
    for token in GOLDEN["hex_invalid"]:
        with pytest.raises(TokenError, match="is not hex"):
            hex_id(token)


def test_negative_integers_match_the_golden_file():
    """Which tokens are negative values (features.negative), as rec-server's C++ tells too."""
    negative, other = GOLDEN["negative_int"], GOLDEN["not_negative_int"]
    assert negative_ints(negative).tolist() == [True] * len(negative)
    assert negative_ints(other).tolist() == [False] * len(other)
    assert negative_ints([]).tolist() == []


def test_negative_counts_per_feature():
    spec = feature_spec(config_from_dict({
        "tables": [{"name": "t", "rows": 10, "dim": 4, "features": ["a", "b"]}],
        "features": {"dense": 1},
        "model": {"dense_arch": [4], "over_arch": [4, 1]},
        "data": {"source": "csv", "train_paths": ["x.csv"]},
    }))  # fmt: skip
    # sample 0: a = ["-3", "x"], b = ["-0"]; sample 1: a = [], b = ["-1", "-2", "7"]
    lengths = np.array([[2, 1], [0, 3]])
    tokens = ["-3", "x", "-0", "-1", "-2", "7"]
    assert spec.negative_counts(lengths, tokens) == {"a": 1, "b": 2}


def test_bytes_that_are_not_utf8_hash_as_the_bytes():
    """What Triton's model gets from a BYTES token that is not UTF-8 (surrogateescape-decoded)
    hashes as the raw bytes, as rec-server's C++ BLAKE2b does, instead of failing."""
    raw = b"\xff\xfeitem-1"
    token = raw.decode("utf-8", errors="surrogateescape")
    digest = hashlib.blake2b(raw, digest_size=8).digest()
    assert hash_id(token) == int.from_bytes(digest, "little", signed=True)
    assert string_id(token) == hash_id(token)
    assert encode_tokens([token, "7"], "int_or_hash").tolist() == [hash_id(token), 7]


def test_vectorised_encoding_equals_the_scalar_one():
    tokens = [t for t, _ in GOLDEN["int_or_hash"]]
    assert encode_tokens(tokens, "int_or_hash").tolist() == [string_id(t) for t in tokens]
    ints = ["0", "-5", "123", "9223372036854775807"]
    assert encode_tokens(ints, "int_or_hash").tolist() == [0, -5, 123, 2**63 - 1]
    # numpy would read these as integers; the encoding hashes them (not canonical decimals)
    for odd in (["+5"], [" 7"], ["1_000"], ["7 "]):
        assert encode_tokens(odd, "int_or_hash").tolist() == [hash_id(odd[0])]
    hexes = [t for t, _ in GOLDEN["hex"]]
    assert encode_tokens(hexes, "hex").tolist() == [v for _, v in GOLDEN["hex"]]
    with pytest.raises(TokenError, match="'g1' is not hex"):
        encode_tokens(["a", "g1"], "hex")


def test_log1p_transform_clamps_and_rounds_once():
    raw = torch.tensor([[-3.0, 0.0, 1.0, 1e6, 7.5]])
    out = DenseTransform(["log1p", "log1p", "identity", "log1p", "log1p"])(raw)
    expected = np.log1p(np.maximum(raw.double().numpy(), 0)).astype(np.float32)
    expected[0, 2] = 1.0
    assert out.dtype == torch.float32
    assert np.array_equal(out.numpy(), expected)
    same = DenseTransform(["identity"] * 5)(raw)
    assert same is raw  # nothing to do: no copy, no op in the served graph


def test_spec_from_configs_and_back():
    cfg = default_config()
    spec = feature_spec(cfg)
    assert spec.format == "synthetic" and spec.transforms == ["identity"] * cfg.features.dense
    assert FeatureSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec

    tsv = load_config(
        Path(__file__).parents[2] / "examples" / "criteo.yaml",
        overrides={"features": {"transforms": {"int_3": "identity"}}},
    )
    spec = feature_spec(tsv)
    assert [d.column for d in spec.dense][:2] == ["I1", "I2"]
    assert spec.transforms[3] == "identity" and spec.transforms[0] == "log1p"
    assert {s.encoding for s in spec.sparse} == {"hex"} and spec.sparse[0].column == "C1"

    bad = spec.to_dict()
    bad["hash"]["version"] = 2
    with pytest.raises(ValueError, match="hash version 2"):
        FeatureSpec.from_dict(bad)


def test_transforms_must_name_dense_features():
    with pytest.raises(ConfigError, match="not a dense feature"):
        load_config(None, overrides={"features": {"transforms": {"price": "log1p"}}})
    with pytest.raises(ConfigError, match="features.transforms.dense_0"):
        load_config(None, overrides={"features": {"transforms": {"dense_0": "sqrt"}}})


def test_raw_file_that_is_not_utf8_is_named(tmp_path):
    """rec predict's reader: a file with bytes that are not UTF-8 is a DataError naming the
    file and the byte, not a UnicodeDecodeError traceback."""
    from rec.data import DataError
    from rec.data.raw import read_raw

    spec = feature_spec(default_config())
    header = ",".join(["label", *[d.column for d in spec.dense], *[s.column for s in spec.sparse]])
    row = ",".join(["1"] + ["0.5"] * len(spec.dense) + ["7"] * len(spec.sparse))
    bad = row.replace("7", "\xff", 1).encode("latin-1")
    path = tmp_path / "rows.csv"
    path.write_bytes(f"{header}\n{row}\n".encode() + bad + b"\n")
    with pytest.raises(DataError, match=r"rows.csv: not UTF-8 text \(byte 0xff"):
        read_raw(path, spec)
