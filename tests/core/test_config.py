import pytest

from rec.config import ConfigError, config_from_dict, default_config, load_config


def test_default_config_is_valid_and_consistent():
    cfg = default_config()
    assert cfg.features.sparse == [f for t in cfg.tables for f in t.features]
    assert cfg.model.dense_arch[-1] == cfg.embedding_dim
    assert len(cfg.features.dense_names) == cfg.features.dense


def test_topology_defaults_are_torchrecs():
    """The planner's defaults, in the config's units (GiB, GiB/s; TorchRec: bytes, bytes/ms)."""
    from torchrec.distributed.planner import constants

    topo = default_config().sharding.topology
    gib = 1024**3
    assert topo.device_memory_gib * gib == constants.HBM_CAP
    assert topo.host_memory_gib * gib == constants.DDR_CAP
    assert topo.intra_host_bandwidth_gib_s * gib / 1000 == constants.INTRA_NODE_BANDWIDTH
    assert topo.cross_host_bandwidth_gib_s * gib / 1000 == constants.CROSS_NODE_BANDWIDTH
    assert topo.storage_reserve_percent == 15  # EmbeddingShardingPlanner's default reservation


def test_yaml_round_trip(tmp_path):
    cfg = config_from_dict({"training": {"batch_size": 32}})
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(path) == cfg


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"training": {"batch_size": -1}}, "training.batch_size=-1"),
        ({"training": {"optimiser": "adam"}}, "unknown key(s) ['optimiser'] in training"),
        ({"training": {"batch_sise": 8}}, "did you mean 'batch_size' for 'batch_sise'?"),
        ({"trainin": {}}, "in the top level (did you mean 'training' for 'trainin'?)"),
        ({"model": {"arch": "transformer"}}, "model.arch='transformer' is not allowed"),
        ({"sharding": {"constraints": {"nope": {}}}}, "unknown table 'nope'"),
        (
            {"sharding": {"constraints": {"t0": {"sharding_types": ["diagonal"]}}}},
            "'diagonal' is not allowed",
        ),
        ({"export": {"table_dtypes": {"t0": "int3"}}}, "export.table_dtypes.t0='int3'"),
        ({"model": {"dense_arch": [64, 32]}}, "must end in the embedding dim 16"),
        ({"training": {"steps": "many"}}, "training.steps='many' must be of type int"),
        ({"data": {"source": "csv"}}, "needs data.train_paths"),
        (
            {"sharding": {"topology": {"cross_host_bandwidth_gib_s": 0}}},
            "sharding.topology.cross_host_bandwidth_gib_s=0.0 must be a positive number",
        ),
        (
            {"sharding": {"topology": {"host_memory_gib": -2}}},
            "sharding.topology.host_memory_gib=-2.0 must be a positive number",
        ),
        (
            {"sharding": {"topology": {"storage_reserve_percent": 100}}},
            "storage_reserve_percent=100.0 must be in [0, 100)",
        ),
        (
            {"sharding": {"topology": {"local_world_size": -1}}},
            "sharding.topology.local_world_size=-1 must be >= 0",
        ),
        ({"sharding": {"topology": {"hbm_cap_gb": 8}}}, "unknown key(s) ['hbm_cap_gb']"),
    ],
)
def test_bad_values_are_named(data, needle):
    with pytest.raises(ConfigError) as e:
        config_from_dict(data)
    assert needle in str(e.value)


def test_feature_in_two_tables_is_rejected():
    tables = [
        {"name": "a", "rows": 10, "dim": 16, "features": ["f"]},
        {"name": "b", "rows": 10, "dim": 16, "features": ["f"]},
    ]
    with pytest.raises(ConfigError, match="feature 'f' is in tables 'a' and 'b'"):
        config_from_dict({"tables": tables})


@pytest.mark.parametrize(
    ("name", "needle"),
    [("items", "is taken by torch.nn.ModuleDict"), ("train", "is taken by"), ("a.b", "identifier")],
)
def test_table_names_that_would_break_the_model_are_refused(name, needle):
    tables = [{"name": name, "rows": 10, "dim": 16, "features": ["f"]}]
    with pytest.raises(ConfigError, match=needle):
        config_from_dict({"tables": tables, "features": {"sparse": ["f"]}})


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("training: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


@pytest.mark.parametrize(
    ("dim", "export", "refused"),
    [
        (
            7,
            {},
            "has dim 7, and export stores it as int8, which needs a dim that is a multiple of 2",
        ),
        (6, {"quantize": "int4"}, "stores it as int4, which needs a dim that is a multiple of 4"),
        (6, {}, None),
        (8, {"quantize": "int4"}, None),
        (7, {"table_dtypes": {"t": "fp16"}}, None),
        (5, {"quantize": "fp32"}, None),
    ],
)
def test_a_table_dim_export_cannot_quantize_is_refused_before_training(dim, export, refused):
    data = {
        "tables": [{"name": "t", "rows": 10, "dim": dim, "features": ["f"]}],
        "features": {"sparse": ["f"]},
        "model": {"dense_arch": [16, dim]},
        "export": export,
    }
    if refused is None:
        assert config_from_dict(data).tables[0].dim == dim
        return
    with pytest.raises(ConfigError, match="export.table_dtypes.t: fp16") as e:
        config_from_dict(data)
    assert refused in str(e.value)
