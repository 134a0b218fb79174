"""Typed configuration for every stage, loaded from one YAML file.

Each component has a dataclass with a docstring per field; `__post_init__` rejects bad values
with a message that quotes the value and says what is allowed. `load_config(path)` reads a
YAML file over the embedded default, `default_config()` needs no file at all.

Example:
    >>> cfg = default_config()
    >>> cfg.training.batch_size
    256
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rec.contract import EMBEDDING_DTYPES
from rec.contract import formats as contract_formats
from rec.contract.events import parse_url as parse_event_url
from rec.contract.features import TRANSFORMS as DENSE_TRANSFORMS
from rec.contract.partitions import MAX_PARTITIONS
from rec.contract.updates import UpdateError
from rec.contract.updates import parse_url as parse_update_url


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range."""


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def _one_of(name: str, value: Any, allowed: typing.Iterable[Any]) -> None:
    allowed = list(allowed)
    _check(value in allowed, f"{name}={value!r} is not allowed; choose one of {allowed}")


def export_formats() -> list[str]:
    """export.format's choices: the formats of the contract's table, `both` and `all`."""
    return contract_formats.choices()


def _not_keyed_jagged(export_format: str) -> tuple[str, str] | None:
    """None when every format `export_format` means takes model.factory and din models; else
    the titles of those that do and of those that don't, for the error."""
    meant = [contract_formats.FORMATS[name] for name in contract_formats.resolve(export_format)]
    if all(f.keyed_jagged for f in meant):
        return None
    table = contract_formats.FORMATS.values()
    able = " and ".join(f.title for f in table if f.keyed_jagged)
    return able, " or ".join(f.title for f in meant if not f.keyed_jagged)


def _positive(name: str, value: Any) -> None:
    _check(
        isinstance(value, int | float) and not isinstance(value, bool) and value > 0,
        f"{name}={value!r} must be a positive number",
    )


SHARDING_TYPES = (
    "data_parallel",
    "table_wise",
    "column_wise",
    "row_wise",
    "table_row_wise",
    "table_column_wise",
    "grid_shard",
)
SEQUENCE_SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "row_wise")
"""What TorchRec's EmbeddingCollectionSharder offers a sequence table on CPU."""
COMPUTE_KERNELS = ("dense", "fused", "fused_uvm", "fused_uvm_caching", "quant")
QUANT_DTYPES = tuple(EMBEDDING_DTYPES)
EXPORT_CPU_ISAS = ("avx2", "avx512")


ZCH_EVICTIONS = ("lfu", "lru", "ttl")
"""How a full ZCH window picks the id that leaves (rec.zch)."""


@dataclass
class ZchConfig:
    """A collision-free ("zero-collision") table: every admitted id its own row, read through
    an id map that training keeps, checkpoints and exports (rec.zch, docs/zch.md).

    The table's `rows` are `slots` rows for admitted ids plus one default row, its last, which
    every id reads that is not admitted: one seen fewer than `admit_after` times, or one met
    when the slots its id could take are all held by ids the eviction policy keeps."""

    slots: int = 0
    """Rows for admitted ids; 0 means `rows - 1`. Given, it must be `rows - 1`.

    Example: 99999"""
    eviction: str = "lfu"
    """Which id leaves when a new one needs its place: lfu (the least often seen, counts
    halving at every admission round so that a once-popular id does not stay forever), lru
    (the longest unseen) or ttl (any id unseen for `ttl_hours`, evicted at the next round
    even without a newcomer)."""
    ttl_hours: float = 24.0
    """eviction ttl: an id unseen this long (wall-clock hours of training) is evicted."""
    admit_after: int = 1
    """Sightings in training before an id gets a row of its own (Monolith's occurrence
    threshold); until then it reads the default row."""
    every_steps: int = 25
    """Steps between admission rounds. The ranks agree on admissions and evictions at each
    round (a collective), so each round costs one pipeline drain. Until the next round a new
    id reads the default row, so this should be a small share of an id's life: at 100, ZCH
    lost to modulo on churning ids (benchmarks/zch_quality.py); at 25 it won at every budget."""
    probes: int = 16
    """Slots an id may take: `probes` consecutive slots from its hash. Lookups read exactly
    these, so a lookup costs `probes` comparisons whatever the load."""

    def __post_init__(self) -> None:
        _check(
            isinstance(self.slots, int) and self.slots >= 0,
            f"ids.zch.slots={self.slots!r} must be an integer >= 0 (0: rows - 1)",
        )
        _one_of("ids.zch.eviction", self.eviction, ZCH_EVICTIONS)
        _positive("ids.zch.ttl_hours", self.ttl_hours)
        for name in ("admit_after", "every_steps", "probes"):
            value = getattr(self, name)
            _check(
                isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                f"ids.zch.{name}={value!r} must be an integer >= 1",
            )


@dataclass
class IdsConfig:
    """How a table maps raw ids to rows. `ids: modulo` (the default) is `id mod rows`: ids
    that share a remainder share a row. `ids: {zch: {...}}` gives every admitted id its own
    row (ZchConfig)."""

    zch: ZchConfig | None = None
    """The collision-free map's settings; absent (or `ids: modulo`) for modulo.

    Example: {slots: 99999, eviction: lru, admit_after: 2}"""

    @staticmethod
    def from_scalar(value: Any, where: str) -> dict[str, Any]:
        """`ids: modulo` is the same as `ids: {}`."""
        _check(value == "modulo", f"{where}={value!r} must be modulo or a mapping {{zch: {{...}}}}")
        return {}


@dataclass
class TableConfig:
    """One embedding table; several features may share it."""

    name: str
    """Table name; also its key in checkpoints and plans. A Python identifier.

    Example: user"""
    rows: int
    """Number of embedding rows. Raw ids are mapped into [0, rows) with a non-negative modulo,
    or, with `ids: {zch: ...}`, each admitted id to a row of its own and the rest to the last.

    Example: 100000"""
    dim: int
    """Embedding dimension. The DLRMs need every table at one dim; dcn_v2, mmoe and din take
    any (din's sequence tables share one).

    Example: 16"""
    features: list[str]
    """Sparse features looked up in this table: one table may serve several features (an
    item id and a user's recent items), each feature is in exactly one table.

    Example: [item_id, recent_items]"""
    pooling: str = "sum"
    """How a bag of ids is pooled: sum, mean, or none (a sequence table). A sequence table's
    features are sequences (a user's history, the candidate item), each id's embedding kept
    in order (TorchRec's EmbeddingCollection); they need model.arch din."""
    ids: IdsConfig = field(default_factory=IdsConfig)
    """How raw ids become rows: `modulo` (the default), or `{zch: {...}}`, a collision-free
    map (tables[].ids.zch).

    Example: {zch: {eviction: lru, admit_after: 2}}"""

    def __post_init__(self) -> None:
        _check(bool(self.name) and isinstance(self.name, str), f"table name {self.name!r} is empty")
        _check(
            self.name.isidentifier(),
            f"table name {self.name!r} must be a Python identifier (letters, digits, _): it names "
            "a submodule and the checkpoint's keys",
        )
        _check(
            not _is_module_attribute(self.name),
            f"table name {self.name!r} is taken by torch.nn.ModuleDict, which holds the tables "
            f"(TorchRec would fail with \"attribute '{self.name}' already exists\"); rename it",
        )
        _positive(f"tables[{self.name}].rows", self.rows)
        _positive(f"tables[{self.name}].dim", self.dim)
        _one_of(f"tables[{self.name}].pooling", self.pooling, ("sum", "mean", "none"))
        _check(
            isinstance(self.features, list) and len(self.features) > 0,
            f"tables[{self.name}].features={self.features!r} must list at least one feature",
        )
        zch = self.ids.zch
        if zch is not None:
            _check(
                self.rows >= 2,
                f"tables[{self.name}].rows={self.rows}: a ZCH table needs at least one slot "
                "and its default row (rows >= 2)",
            )
            _check(
                zch.slots in (0, self.rows - 1),
                f"tables[{self.name}]: rows={self.rows} but ids.zch.slots={zch.slots}; a ZCH "
                f"table has slots + 1 rows (the last is the default row): set rows: "
                f"{zch.slots + 1}, or leave slots out",
            )
            zch.slots = self.rows - 1
            _check(
                zch.probes <= zch.slots,
                f"tables[{self.name}].ids.zch.probes={zch.probes} exceeds its {zch.slots} slots",
            )

    @property
    def zch(self) -> ZchConfig | None:
        """The table's collision-free map settings, or None for a modulo table."""
        return self.ids.zch


def _is_module_attribute(name: str) -> bool:
    """True for names nn.ModuleDict already uses (items, keys, train, ...).

    torch is imported here, not at the top, so the CLI can read a config without it."""
    import torch.nn

    return hasattr(torch.nn.ModuleDict(), name)


NEGATIVE_POLICIES = ("modulo", "error")
"""features.negative: what training does with a negative integer id."""


@dataclass
class FeaturesConfig:
    """The model's inputs: dense features by count (or names) and sparse features by name."""

    dense: int = 13
    """Number of dense (float) features."""
    sparse: list[str] = field(default_factory=list)
    """Sparse feature names, in the order of the `sparse_lengths` columns of the served model.
    Empty means: every feature of every table, in table order. Given, it lists each table's
    features exactly once.

    Example: [user_id, item_id, recent_items, category]"""
    dense_names: list[str] = field(default_factory=list)
    """Optional names of the dense features (default dense_0, dense_1, ...); as many as
    `dense`. They name the dense columns of a CSV or Parquet file unless data.columns.dense
    does, and the keys of `transforms`.

    Example: [price, age_days, ctr_7d]"""
    transforms: dict[str, str] = field(default_factory=dict)
    """How each dense feature's raw value is transformed, inside the exported model too. A
    mapping from dense feature name (see `dense_names`) to identity or log1p
    (log1p(max(x, 0))); a feature left out takes the default: log1p for data.source
    criteo_tsv, identity otherwise. See rec.contract.features.

    Example: {price: log1p, ctr_7d: identity}"""
    negative: str = "modulo"
    """What training does with a negative integer in a categorical column (a cell "-3", or a
    negative Parquet integer): modulo maps it into its table like any id (row = id mod rows,
    never negative); error refuses its row, naming the file, row and column (data.on_bad_row:
    skip drops such rows and counts them instead). A string id is hashed to any int64, negative
    ones too: that is not a negative value, and both policies take it. `rec predict`, and the
    servers for `sparse_strings` requests, count negative values per feature (serve/README.md).

    Example: error"""
    context: list[str] = field(default_factory=list)
    """Features of the request rather than of the item scored (the user, the device, the time):
    names of dense features (`dense_names`) and sparse features. Given, the exported model also
    takes the context form (rec.contract.context): one request carries the context once and N
    candidates, its context bags are looked up once and its scores are bit for bit those of the
    flat batch with the context repeated per candidate. Flat requests still work. Training is
    unchanged, so a run exports with or without it (`rec export -c`). A candidate keeps at
    least one sparse feature of its own; din's `model.candidate` is never context. Not yet with
    model.factory, onnx, or export.store.tables. Empty: the flat form only.

    Example: [user_id, recent_items, dense_0, dense_1]"""

    def __post_init__(self) -> None:
        _one_of("features.negative", self.negative, NEGATIVE_POLICIES)
        _check(
            isinstance(self.dense, int) and self.dense >= 0,
            f"features.dense={self.dense!r} must be a non-negative integer",
        )
        if self.dense_names:
            _check(
                len(self.dense_names) == self.dense,
                f"features.dense_names has {len(self.dense_names)} names for "
                f"features.dense={self.dense}",
            )
        else:
            self.dense_names = [f"dense_{i}" for i in range(self.dense)]
        _check(
            len(set(self.sparse)) == len(self.sparse),
            f"features.sparse={self.sparse!r} lists a feature twice",
        )
        for name, transform in self.transforms.items():
            _check(
                name in self.dense_names,
                f"features.transforms names {name!r}, which is not a dense feature; "
                f"the dense features are {self.dense_names}",
            )
            _one_of(f"features.transforms.{name}", transform, DENSE_TRANSFORMS)


MODEL_ARCHS = ("dlrm", "dlrm_dcn", "dcn_v2", "mmoe", "din")
_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
CONCAT_ARCHS = ("dcn_v2", "mmoe", "din")
"""The architectures over the concatenated embeddings: their tables may have different dims."""


@dataclass
class ModelConfig:
    """DLRM, DLRM-DCN, DCN-v2, MMoE or DIN, built from TorchRec's parts (rec.model)."""

    arch: str = "dlrm"
    """The architecture: dlrm, dlrm_dcn, dcn_v2, mmoe or din. dlrm: dot interaction;
    dlrm_dcn: low-rank cross network interaction; dcn_v2: cross network over the concatenated
    embeddings; mmoe: multi-gate mixture of experts over the concatenated embeddings, one
    tower per task; din: sequence features, a candidate attending to a history. dcn_v2, mmoe
    and din take tables of any dims.

    Example: dcn_v2"""
    dense_arch: list[int] = field(default_factory=lambda: [64, 16])
    """Bottom MLP layer sizes; for dlrm and dlrm_dcn the last must equal the embedding dim."""
    over_arch: list[int] = field(default_factory=lambda: [64, 32, 1])
    """Top MLP layer sizes; the last is the number of tasks (one sigmoid score each). For mmoe:
    each task's tower, ending in 1."""
    tasks: list[str] = field(default_factory=list)
    """Task names, in the order of the score columns. Empty: `label` for one task, `label_0`,
    `label_1`, ... for several. mmoe needs them (one tower each); for the others their number
    must be over_arch[-1].

    Example: [click, purchase]"""
    factory: str = ""
    """Your own model instead of `arch`, as "package.module:function". It is called as
    function(ebc, cfg, **factory_args) and returns an nn.Module whose forward(dense [B, D],
    KeyedJaggedTensor) returns logits [B, T]; the contract is in rec.factory. The module must
    be importable where rec runs (installed, on PYTHONPATH, or under the current directory).

    Example: my_models.wide:build"""
    factory_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the factory, as YAML gives them.

    Example: {hidden: [128, 64], dropout: 0.1}"""
    candidate: str = ""
    """din: the sequence feature holding the item to score (one id; several are summed).

    Example: item_id"""
    history: str = ""
    """din: the sequence feature holding the user's history, which the candidate attends to.

    Example: recent_items"""
    attention_arch: list[int] = field(default_factory=lambda: [32])
    """din: hidden layer sizes of the attention unit (each history item's weight)."""
    num_experts: int = 4
    """mmoe: experts shared by every task."""
    expert_arch: list[int] = field(default_factory=lambda: [64, 32])
    """mmoe: each expert's MLP layer sizes."""
    dcn_num_layers: int = 2
    """dlrm_dcn and dcn_v2: number of cross layers."""
    dcn_low_rank_dim: int = 16
    """dlrm_dcn and dcn_v2: rank of each cross layer's weight."""

    def __post_init__(self) -> None:
        _one_of("model.arch", self.arch, MODEL_ARCHS)
        for name in ("dense_arch", "over_arch", "expert_arch", "attention_arch"):
            sizes = getattr(self, name)
            _check(
                isinstance(sizes, list)
                and len(sizes) > 0
                and all(isinstance(s, int) and s > 0 for s in sizes),
                f"model.{name}={sizes!r} must be a non-empty list of positive integers",
            )
        _check(
            len(self.over_arch) >= 2 or bool(self.factory),
            f"model.over_arch={self.over_arch} needs at least two layers (a hidden layer and "
            "the output): TorchRec's OverArch refuses one",
        )
        _positive("model.dcn_num_layers", self.dcn_num_layers)
        _positive("model.dcn_low_rank_dim", self.dcn_low_rank_dim)
        _positive("model.num_experts", self.num_experts)
        for task in self.tasks:
            _check(
                isinstance(task, str) and task.isidentifier(),
                f"model.tasks has {task!r}; a task name must be a Python identifier (letters, "
                "digits, _): it names metrics and label columns",
            )
        _check(len(set(self.tasks)) == len(self.tasks), f"model.tasks={self.tasks} repeats a name")
        if self.factory:
            _check(
                isinstance(self.factory, str) and _FACTORY.fullmatch(self.factory) is not None,
                f"model.factory={self.factory!r} must be 'package.module:function'",
            )
        elif self.factory_args:
            _check(False, "model.factory_args is set but model.factory is not")
        if self.arch == "mmoe" and not self.factory:
            _check(
                len(self.tasks) > 0,
                "model.arch=mmoe needs model.tasks: the task names, one tower and gate each",
            )
            _check(
                self.over_arch[-1] == 1,
                f"model.over_arch={self.over_arch} is each task's tower for mmoe; it must end in 1",
            )
        elif self.tasks and not self.factory:
            _check(
                len(self.tasks) == self.over_arch[-1],
                f"model.tasks names {len(self.tasks)} tasks but model.over_arch={self.over_arch} "
                f"ends in {self.over_arch[-1]} outputs; they must agree",
            )

    @property
    def num_tasks(self) -> int:
        """Score columns: one per named task; else over_arch[-1] (1 for a factory's model)."""
        if self.tasks:
            return len(self.tasks)
        return 1 if self.factory else self.over_arch[-1]

    @property
    def task_names(self) -> list[str]:
        """One name per score column: `tasks`, or label / label_0, label_1, ..."""
        if self.tasks:
            return list(self.tasks)
        return ["label"] if self.num_tasks == 1 else [f"label_{t}" for t in range(self.num_tasks)]


@dataclass
class SyntheticConfig:
    """Criteo-shaped synthetic data with a planted signal (see rec.data.synthetic)."""

    train_samples: int = 400_000
    """Samples in the training stream (one epoch)."""
    eval_samples: int = 32_768
    """Held-out samples, drawn from a separate stream of the same distribution."""
    seed: int = 0
    """Everything (ids, dense values, the hidden teacher, labels) follows from this seed."""
    zipf_alpha: float = 1.1
    """Skew of id popularity; larger means a few ids dominate."""
    max_hotness: int = 3
    """Multi-hot features draw 1..max_hotness ids per sample; 1 makes every feature one-hot."""
    hotness: dict[str, int] = field(default_factory=dict)
    """Ids per sample, fixed, per sparse feature name: every sample's bag of that feature holds
    exactly that many ids (never none), as MLPerf DLRM-v2's multi-hot Criteo does. A feature
    left out is drawn as above (one-hot, or multi-hot with 0..max_hotness ids); empty changes
    nothing. Not for din's model.candidate or model.history, whose lengths din sets.

    Example: {cat_0: 3, cat_1: 20}"""
    multi_hot_fraction: float = 0.5
    """Fraction of sparse features that are multi-hot; the rest are one-hot."""
    signal: float = 2.5
    """Scale of the teacher's logit; larger means cleaner labels (higher reachable AUC)."""
    history_length: int = 20
    """model.arch din: each sample's history holds 0..history_length ids (its candidate one)."""
    match_rate: float = 0.5
    """model.arch din: share of samples whose candidate is one of their history's items. The
    teacher's logit rises when it is (as strongly as all its other parts together), so a
    model that reads the history beats one that does not."""
    live_ids: dict[str, int] = field(default_factory=dict)
    """Ids live at any time, per table name: drawn from large int64 ids (not 0..rows-1), so
    that `id % rows` collides as hashed ids do, and the same whatever the table's rows. A
    table left out has as many as its rows. Empty (with churn and popularity_drift 0): ids
    are 0..rows-1, each its own row.

    Example: {t0: 20000, t1: 50000}"""
    churn: float = 0.0
    """Share of each table's live ids replaced by newly born ids per train_samples positions
    (a sample's position is its time): an id lives train_samples / churn positions."""
    popularity_drift: float = 0.0
    """Times per train_samples positions that the ids' popularity ranks are reshuffled,
    gradually: an id's rank moves from one period's to the next's."""
    teacher_drift: float = 0.0
    """Times per train_samples positions that the hidden teacher's rule (its per-id weights,
    pairwise and dense parts) turns, gradually, into an independent one."""
    eval_time: str = "after"
    """With churn or drift, when the eval samples happen: after (the positions right after
    training's epoch, what a deployed model meets next) or during (spread over training's
    epoch: the same ids and rule, held-out samples only)."""

    def __post_init__(self) -> None:
        _positive("data.synthetic.train_samples", self.train_samples)
        for table, live in self.live_ids.items():
            _check(
                isinstance(live, int) and not isinstance(live, bool) and 1 <= live <= 2**31,
                f"data.synthetic.live_ids.{table}={live!r} must be an integer in [1, 2^31]",
            )
        for name in ("churn", "popularity_drift", "teacher_drift"):
            value = getattr(self, name)
            _check(value >= 0, f"data.synthetic.{name}={value!r} must be >= 0")
        _one_of("data.synthetic.eval_time", self.eval_time, ("after", "during"))
        _positive("data.synthetic.eval_samples", self.eval_samples)
        _check(
            isinstance(self.seed, int) and self.seed >= 0,
            f"data.synthetic.seed={self.seed!r} must be a non-negative integer",
        )
        _check(self.zipf_alpha >= 0, f"data.synthetic.zipf_alpha={self.zipf_alpha!r} must be >= 0")
        for feature, count in self.hotness.items():
            _check(
                isinstance(count, int) and not isinstance(count, bool) and count >= 1,
                f"data.synthetic.hotness.{feature}={count!r} must be an integer >= 1",
            )
        _check(
            isinstance(self.max_hotness, int) and self.max_hotness >= 1,
            f"data.synthetic.max_hotness={self.max_hotness!r} must be an integer >= 1",
        )
        _check(
            0 <= self.multi_hot_fraction <= 1,
            f"data.synthetic.multi_hot_fraction={self.multi_hot_fraction!r} must be in [0, 1]",
        )
        _check(self.signal >= 0, f"data.synthetic.signal={self.signal!r} must be >= 0")
        _check(
            isinstance(self.history_length, int) and self.history_length >= 0,
            f"data.synthetic.history_length={self.history_length!r} must be an integer >= 0",
        )
        _check(
            0 <= self.match_rate <= 1,
            f"data.synthetic.match_rate={self.match_rate!r} must be in [0, 1]",
        )


@dataclass
class ColumnsConfig:
    """Maps the columns of a CSV or Parquet file onto label, dense and sparse features."""

    label: str = "label"
    """Column holding the 0/1 label.

    Example: clicked"""
    labels: list[str] = field(default_factory=list)
    """Label columns, one per task, for a model with several tasks (empty: [label], or the
    columns named like model.tasks).

    Example: [clicked, bought]"""
    dense: list[str] = field(default_factory=list)
    """Columns of the dense features, in the order of features.dense_names (default: the
    columns named like the dense features).

    Example: [price, age_days, ctr_7d]"""
    sparse: dict[str, str] = field(default_factory=dict)
    """Which column holds each sparse feature: a mapping from feature name (as in the tables'
    `features`) to column name. A feature left out reads the column named like it. A cell
    holds one id or several joined by `separator`; a decimal integer is its own id, any other
    string is hashed to one.

    Example: {user_id: user, item_id: item, recent_items: history}"""
    separator: str = "|"
    """Separator between ids of a multi-valued sparse cell, e.g. "12|7|3"."""

    def __post_init__(self) -> None:
        _check(bool(self.separator), "data.columns.separator is empty; use e.g. '|'")
        _check(
            len(set(self.labels)) == len(self.labels),
            f"data.columns.labels={self.labels!r} lists a column twice",
        )

    @property
    def label_columns(self) -> list[str]:
        """One column per task."""
        return list(self.labels) or [self.label]


@dataclass
class StreamConfig:
    """Where `rec train` reads labelled events from, when it trains from a live stream
    (`rec train --stream URL` sets url; docs/stream.md). Empty url: the files of data.source."""

    url: str = ""
    """The event stream, redis://HOST:PORT[/STREAM] (default stream rec:events).

    Example: redis://127.0.0.1:6379/clicks"""
    group: str = "rec"
    """The consumer group the ranks read in; one group per training job."""
    consumer_prefix: str = "rank"
    """A rank's consumer name is this followed by its rank (rank0, rank1, ...)."""
    dead_letter: str = ""
    """The stream refused events are parked in (empty: `<stream>:dead`).

    Example: clicks:refused"""
    start: str = "0"
    """Where a new group starts: 0 the stream's first entry, $ only entries added from now."""
    trim: bool = True
    """After each checkpoint, delete entries no kept checkpoint or other group needs (XTRIM
    MINID ~) and cap the dead letters at about 10,000. false: keep the stream whole."""
    wait_s: float = 1.0
    """How long a rank waits for a full batch before it returns what it has."""
    retry_s: float = 0.2
    """First wait before reconnecting to a broker that went away; it doubles up to
    max_retry_s while the broker stays away."""
    max_retry_s: float = 5.0
    """The longest wait between reconnection attempts."""
    idle_exit_s: float = 0.0
    """Stop (checkpoint and exit) after this many seconds in which no rank received an event;
    0: run until stopped (SIGTERM or Ctrl-C) or until training.steps.

    Example: 30"""
    max_lag: int = 100_000
    """Entries the stream's head may run ahead of training before the progress line reports it
    (rec does not skip or drop events: what to do is the operator's call); 0: never reported."""
    hold_out_every_nth: int = 10
    """About one event in this many is held out of training, chosen by its entry id and place
    (the same on every rank and resume), for `rec export`'s quality checks; 0: none held out
    (export then skips them)."""
    hold_out_keep: int = 20_000
    """Held-out events a checkpoint keeps (the newest), over all ranks."""

    def __post_init__(self) -> None:
        if self.url:
            try:
                parse_event_url(self.url)
            except ValueError as e:
                raise ConfigError(f"data.stream.url: {e}") from None
        if self.start not in ("0", "$"):
            raise ConfigError(f"data.stream.start={self.start!r} must be '0' or '$'")
        for name in ("wait_s", "retry_s", "max_retry_s", "idle_exit_s", "max_lag",
                     "hold_out_every_nth", "hold_out_keep"):  # fmt: skip
            if not getattr(self, name) >= 0:
                raise ConfigError(f"data.stream.{name}={getattr(self, name)!r} must be >= 0")


@dataclass
class DataConfig:
    """Where samples come from."""

    source: str = "synthetic"
    """Where samples come from: synthetic, criteo_tsv, csv or parquet.

    Example: csv"""
    train_paths: list[str] = field(default_factory=list)
    """Files (or glob patterns) of training samples, for file sources (a stream run needs none).

    Example: [data/clicks/train-*.csv]"""
    eval_paths: list[str] = field(default_factory=list)
    """Held-out files; if empty, every `eval_every_nth_row`-th training row is held out.

    Example: [data/clicks/eval.csv]"""
    eval_every_nth_row: int = 10
    """With no eval_paths: rows whose index is divisible by this form the held-out split."""
    on_bad_row: str = "error"
    """What a bad row does: error stops with the file and row; skip drops the row and counts
    it.

    Example: skip"""
    delimiter: str = ","
    """CSV field delimiter."""
    columns: ColumnsConfig = field(default_factory=ColumnsConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)

    def __post_init__(self) -> None:
        _one_of("data.source", self.source, ("synthetic", "criteo_tsv", "csv", "parquet"))
        _one_of("data.on_bad_row", self.on_bad_row, ("error", "skip"))
        _positive("data.eval_every_nth_row", self.eval_every_nth_row)
        if self.source != "synthetic" and not self.stream.url:  # a stream run reads no file
            _check(
                len(self.train_paths) > 0,
                f"data.source={self.source!r} needs data.train_paths (files or glob patterns)",
            )


@dataclass
class TrainingConfig:
    """Optimisation, evaluation and logging."""

    batch_size: int = 256
    """Samples per rank per step."""
    steps: int = 0
    """Total optimiser steps; 0 means one pass over the training data (`epochs` of them)."""
    epochs: int = 1
    """Passes over the training data when `steps` is 0."""
    embedding_optimizer: str = "rowwise_adagrad"
    """Fused (in-backward, FBGEMM) optimizer of the embedding tables: rowwise_adagrad, adam, sgd."""
    embedding_lr: float = 0.05
    """Learning rate of the embedding optimizer."""
    dense_optimizer: str = "adam"
    """Optimizer of the MLPs: adam, adagrad or sgd."""
    dense_lr: float = 0.002
    """Learning rate of the dense optimizer, reached after `warmup_steps`."""
    warmup_steps: int = 50
    """Linear LR warm-up of the dense optimizer, in steps."""
    lr_schedule: str = "constant"
    """After warm-up: constant, linear (decay to 0 at the last step) or cosine."""
    eval_every: int = 200
    """Evaluate on the held-out split every this many steps and at the end; 0: only at the end."""
    eval_batches: int = 0
    """Cap on held-out batches per evaluation; 0 means the whole held-out split."""
    log_every: int = 50
    """Progress line and metrics.jsonl entry every this many steps."""
    seed: int = 0
    """Seed of model initialisation."""
    pipeline: str = "sparse_dist"
    """sparse_dist (TorchRec's TrainPipelineSparseDist) or base (plain loop)."""
    backend: str = "auto"
    """Process-group backend: auto (nccl with CUDA, else gloo), gloo or nccl."""
    device: str = "auto"
    """auto, cpu or cuda."""
    pg_timeout_s: int = 600
    """Process-group timeout in seconds; a rank stuck longer than this fails the job."""
    profile_steps: int = 10
    """Steps profiled on every rank (after 5 warm-up steps) for the end-of-run step-time split
    into data, forward, backward, optimizer and communication, and bytes sent per collective;
    0: none."""

    def __post_init__(self) -> None:
        _positive("training.batch_size", self.batch_size)
        _check(
            isinstance(self.steps, int) and self.steps >= 0,
            f"training.steps={self.steps!r} must be >= 0",
        )
        _positive("training.epochs", self.epochs)
        _one_of(
            "training.embedding_optimizer",
            self.embedding_optimizer,
            ("rowwise_adagrad", "adam", "sgd"),
        )
        _one_of("training.dense_optimizer", self.dense_optimizer, ("adam", "adagrad", "sgd"))
        _positive("training.embedding_lr", self.embedding_lr)
        _positive("training.dense_lr", self.dense_lr)
        _check(self.warmup_steps >= 0, f"training.warmup_steps={self.warmup_steps!r} must be >= 0")
        _one_of("training.lr_schedule", self.lr_schedule, ("constant", "linear", "cosine"))
        _check(self.eval_every >= 0, f"training.eval_every={self.eval_every!r} must be >= 0")
        _check(self.eval_batches >= 0, f"training.eval_batches={self.eval_batches!r} must be >= 0")
        _positive("training.log_every", self.log_every)
        _one_of("training.pipeline", self.pipeline, ("sparse_dist", "base"))
        _one_of("training.backend", self.backend, ("auto", "gloo", "nccl"))
        _one_of("training.device", self.device, ("auto", "cpu", "cuda"))
        _positive("training.pg_timeout_s", self.pg_timeout_s)
        _check(
            isinstance(self.profile_steps, int) and self.profile_steps >= 0,
            f"training.profile_steps={self.profile_steps!r} must be >= 0",
        )


@dataclass
class TableConstraint:
    """What the sharding planner may choose for one table."""

    sharding_types: list[str] = field(default_factory=list)
    """Allowed sharding types (empty: any the sharder offers): data_parallel, table_wise,
    column_wise, row_wise, table_row_wise, table_column_wise or grid_shard.

    Example: [row_wise, table_row_wise]"""
    compute_kernels: list[str] = field(default_factory=list)
    """Allowed compute kernels (empty: any): dense, fused, fused_uvm, fused_uvm_caching or
    quant.

    Example: [fused]"""
    min_partition: int = 0
    """Smallest column shard for column-wise sharding; 0 leaves TorchRec's default."""
    pooling_factor: float = 0.0
    """Mean ids per sample of each of the table's features, which the planner sizes the ids'
    all-to-all and the lookups with; 0 leaves TorchRec's 1.0."""

    def __post_init__(self) -> None:
        _check(
            isinstance(self.pooling_factor, (int, float)) and self.pooling_factor >= 0,
            f"sharding.constraints.*.pooling_factor={self.pooling_factor!r} must be a number >= 0",
        )
        for t in self.sharding_types:
            _one_of("sharding.constraints.*.sharding_types[]", t, SHARDING_TYPES)
        for k in self.compute_kernels:
            _one_of("sharding.constraints.*.compute_kernels[]", k, COMPUTE_KERNELS)


@dataclass
class TopologyConfig:
    """The planner's view of the hardware, per rank. Defaults are TorchRec's own
    (torchrec.distributed.planner.constants: HBM_CAP, DDR_CAP, INTRA_NODE_BANDWIDTH,
    CROSS_NODE_BANDWIDTH; its planner's 15% storage reservation)."""

    local_world_size: int = 0
    """Ranks per host (0: LOCAL_WORLD_SIZE from the launcher). Smaller than the world size
    simulates several hosts, which is what table_row_wise and grid_shard plan over."""
    device_memory_gib: float = 32
    """Accelerator (HBM) memory per rank in GiB; counted only with a CUDA compute device."""
    host_memory_gib: float = 128
    """Host (DDR) memory per rank in GiB; on a CPU compute device the tables live here."""
    intra_host_bandwidth_gib_s: float = 600
    """Bandwidth between two ranks of one host (NVLink, shared memory), GiB/s."""
    cross_host_bandwidth_gib_s: float = 12.5
    """Bandwidth between ranks of different hosts (the network), GiB/s."""
    storage_reserve_percent: float = 15
    """Share of device memory the planner keeps free for activations and other tensors
    (TorchRec's FixedPercentageStorageReservation, which reserves device memory only)."""

    def __post_init__(self) -> None:
        _check(
            isinstance(self.local_world_size, int) and self.local_world_size >= 0,
            f"sharding.topology.local_world_size={self.local_world_size!r} must be >= 0 "
            "(0: from the launcher)",
        )
        for name in ("device_memory_gib", "host_memory_gib", "intra_host_bandwidth_gib_s",
                     "cross_host_bandwidth_gib_s"):  # fmt: skip
            _positive(f"sharding.topology.{name}", getattr(self, name))
        _check(
            0 <= self.storage_reserve_percent < 100,
            f"sharding.topology.storage_reserve_percent={self.storage_reserve_percent!r} "
            "must be in [0, 100)",
        )


@dataclass
class ShardingConfig:
    """Per-table constraints and topology for TorchRec's EmbeddingShardingPlanner."""

    constraints: dict[str, TableConstraint] = field(default_factory=dict)
    """What the planner may choose per table: a mapping from table name to its constraint
    (the keys under `sharding.constraints.<name>`). A table left out: anything.

    Example:
        item: {sharding_types: [row_wise], pooling_factor: 3.5}
        category: {sharding_types: [data_parallel]}"""
    topology: TopologyConfig = field(default_factory=TopologyConfig)


@dataclass
class CheckpointConfig:
    """torch.distributed.checkpoint snapshots of the whole training state."""

    every_steps: int = 500
    """Save every this many steps (and always at the end); 0: only at the end."""
    keep_last: int = 3
    """Committed checkpoints kept; older ones are deleted after a newer one commits."""
    every_seconds: float = 0.0
    """In a run training from a stream (data.stream), also save when this long has passed
    since the last save: the run acknowledges its events only once a checkpoint holds them.
    0: by steps only.

    Example: 60"""

    def __post_init__(self) -> None:
        _check(self.every_steps >= 0, f"checkpoint.every_steps={self.every_steps!r} must be >= 0")
        _check(self.every_seconds >= 0,
               f"checkpoint.every_seconds={self.every_seconds!r} must be >= 0")  # fmt: skip
        _positive("checkpoint.keep_last", self.keep_last)


@dataclass
class StoreConfig:
    """Tables `rec export` writes into a Redis Cluster instead of the model (rec.contract.store)."""

    url: str = ""
    """redis://HOST:PORT[,HOST:PORT...] of the cluster; empty: every table stays in the model.

    Example: redis://10.0.0.5:7000,10.0.0.6:7000"""
    tables: list[str] = field(default_factory=list)
    """Tables to put there; empty: every table of min_bytes and more (stored size).

    Example: [user, item]"""
    min_bytes: int = 64 << 20
    """With no `tables`, the stored size from which a table goes to the store."""
    partitions: int = 16
    """Partition hashes per table (each on one node; rows by row % partitions)."""
    table_partitions: dict[str, int] = field(default_factory=dict)
    """Per-table override of `partitions`: a mapping from table name to its partitions.

    Example: {user: 64}"""

    def __post_init__(self) -> None:
        if self.url:
            from rec.contract.store import StoreError, parse_store_url

            try:
                parse_store_url(self.url)
            except StoreError as e:
                raise ConfigError(f"export.store.url: {e}") from e
        _check(isinstance(self.min_bytes, int) and self.min_bytes >= 0,
               f"export.store.min_bytes={self.min_bytes!r} must be an integer >= 0")  # fmt: skip
        for name, n in {"partitions": self.partitions, **self.table_partitions}.items():
            _check(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 1 << 14,
                   f"export.store partitions for {name}={n!r} must be in [1, 16384]")  # fmt: skip


@dataclass
class ExportConfig:
    """How `rec export` quantizes and packages the model."""

    quantize: str = "int8"
    """Default storage of embedding tables: int8, int4, fp16 or fp32. An int8 table needs an
    even dim and an int4 table a dim that is a multiple of 4 (FBGEMM packs a row's codes in
    whole fp16 words); a config that breaks this is refused before training starts."""
    table_dtypes: dict[str, str] = field(default_factory=dict)
    """Per-table override of `quantize`: a mapping from table name to int8, int4, fp16 or
    fp32.

    Example: {user: int4, category: fp16}"""
    model_name: str = "rec"
    """Model directory name inside the repository."""
    max_batch_size: int = 512
    """Largest batch a server may form (and the largest request it accepts)."""
    max_queue_delay_us: int = 500
    """How long a server's dynamic batcher may hold a request to fill a batch. Triton always
    waits it out; rec-server's adaptive window (its default) waits less for a small model, a
    lone client, or clients that have all sent theirs (cpp/README.md, "Batching")."""
    preferred_batch_sizes: list[int] = field(default_factory=list)
    """Batch sizes a server runs at once, without waiting out the window (Triton's meaning).

    Example: [64, 256]"""
    instances: int = 1
    """Model instances (executor threads) per server."""
    format: str = "torchscript"
    """What `rec export` writes: torchscript, onnx, aoti (torch.export + AOTInductor, model.pt2),
    both (torchscript and onnx) or all (each its own model directory)."""
    cpu_isa: str = "avx2"
    """The ISA an aoti package is compiled for: avx2 or avx512. avx2 is x86-64-v3, any x86-64
    server since 2013; avx512 is x86-64-v4. Servers refuse a package whose ISA their CPU
    lacks."""
    triton_batching: str = "none"
    """The config.pbtxt form: none or ragged. none: max_batch_size 0 with explicit -1 batch
    dims (stock Triton takes requests of any size but never merges them; rec-server batches
    them with rec.json's "serving" settings). ragged: max_batch_size, dynamic batching,
    `sparse_values` with allow_ragged_batch (stock Triton then takes one sample per request;
    rec-server batches it from the config). See rec.export.repository."""
    batch_invariant: bool = True
    """Dense layers whose result for a sample does not depend on the batch the server formed.
    rec::linear keeps one fixed FMA order per output on every CPU; CPU GEMM otherwise differs
    in the last bits for batches under 16. TorchScript only (rec.export.dense). Export checks
    it and refuses a model that is not."""
    dense_dtype: str = "fp32"
    """What the TorchScript model's dense layers compute in: fp32, int8 or bf16. int8: weights
    per output channel, activations per sample, int32 accumulation, batch invariant on every
    CPU (see rec.export.dense for which layers stay fp32). bf16: about 2x fp32's throughput at
    B = 512 with AVX-512 BF16, 3x and more with AMX, but not batch invariant on AMX CPUs (set
    batch_invariant false with it there). For int8 and bf16 export measures the AUC it costs
    and refuses a model under the 99.9 % bar unless `accept_quality_loss` is set."""
    accept_quality_loss: bool = False
    """Write a reduced-precision (dense_dtype int8 or bf16) model even if its held-out AUC is
    under 99.9 % of the float model's."""
    eval_batches: int = 0
    """Held-out batches (of max_batch_size) that export's verification scores; 0: all of them."""
    chunk_rows: int = 0
    """Rows per chunk as export streams each table out of the checkpoint (never a whole float
    table in memory); 0: as many as fit in 32 MiB of fp32."""
    store: StoreConfig = field(default_factory=StoreConfig)
    """The embedding tier: see docs/store.md."""

    def __post_init__(self) -> None:
        _check(
            isinstance(self.chunk_rows, int) and self.chunk_rows >= 0,
            f"export.chunk_rows={self.chunk_rows!r} must be an integer >= 0",
        )
        _one_of("export.quantize", self.quantize, QUANT_DTYPES)
        _one_of("export.format", self.format, export_formats())
        _one_of("export.cpu_isa", self.cpu_isa, EXPORT_CPU_ISAS)
        _one_of("export.triton_batching", self.triton_batching, ("ragged", "none"))
        _one_of("export.dense_dtype", self.dense_dtype, ("fp32", "int8", "bf16"))
        _check(self.eval_batches >= 0, f"export.eval_batches={self.eval_batches!r} must be >= 0")
        for size in self.preferred_batch_sizes:
            _check(
                isinstance(size, int) and 0 < size <= self.max_batch_size,
                f"export.preferred_batch_sizes has {size!r}; each must be in "
                f"[1, max_batch_size={self.max_batch_size}]",
            )
        for table, dtype in self.table_dtypes.items():
            _one_of(f"export.table_dtypes.{table}", dtype, QUANT_DTYPES)
        _positive("export.max_batch_size", self.max_batch_size)
        _check(
            self.max_queue_delay_us >= 0,
            f"export.max_queue_delay_us={self.max_queue_delay_us!r} must be >= 0",
        )
        _positive("export.instances", self.instances)


@dataclass
class PublishConfig:
    """Trained rows published to the update log while training runs (rec.contract.updates)."""

    url: str = ""
    """redis://HOST:PORT[/STREAM]: where `rec train` publishes the rows each step changed, for
    serving replicas to apply (`rec-server --updates`). Empty: publish nothing. `rec train
    --publish URL` sets it.

    Example: redis://10.0.0.7:6379/rec:updates"""
    every_steps: int = 0
    """Publish after this many steps; 0: by time only."""
    every_seconds: float = 0.5
    """Publish at the first step to end in each new interval of this many seconds (a grid of wall
    time every rank shares, so all publish at the same step); 0: by steps only. Also before every
    evaluation and at the end. `benchmarks/freshness.py --defaults` measures what it gives."""
    max_pending: int = 32
    """Publishes read from the tables and not yet acknowledged by the broker that a rank may hold
    (the broker is slow or down) before its training waits for them: none is ever dropped."""
    drain_timeout_s: float = 120.0
    """At the end of training, how long to wait for the broker to take what is pending before
    failing the run."""
    partitions: int = 0
    """Partitions of the update log (rec.contract.partitions): rank r writes partition r mod P,
    so a Redis Cluster spreads the ranks' writes over its masters. 0: one stream (the legacy
    layout) on one node, the first start's world size on a cluster. Fixed at a run's first
    start (recorded in the run's publish.json and the log's layout record); a resume on
    another world keeps it."""
    wait_replicas: int = -1
    """Replicas that must hold each batch of records before it counts as sent (Redis WAIT, up
    to 1 s; past that the batch is counted unreplicated, logged, and publishing goes on), so a
    master's failover loses none of what a checkpoint's flush saw sent. -1: 1 when the
    partition's master has a replica, else 0; 0: never wait."""
    trim: bool = False
    """Trim the update log after each checkpoint (rank 0, XTRIM MINID per partition) below what
    its registered readers and the checkpoint need (`reader_ttl_s`, `keep_s`). Off by default:
    rec-server does not register yet and replays the log from its export's step at every load,
    so a trim could take rows it needs; turn it on where Triton and `rec store follow` are the
    only readers, or where `keep_s` is longer than any served export's age."""
    reader_ttl_s: float = 60.0
    """Update-log readers (Triton's, `rec store follow`) register what they still need in
    `{S}:readers` every 5 s; after each checkpoint rank 0 trims the log below what registrations
    younger than this need (rec.logs.update_trim). An older one is a reader gone or stuck: it is
    trimmed past and, when back, says so and names the recovery (a newer export). No live
    registration: nothing is trimmed."""
    keep_s: float = 600.0
    """History of the update log always kept (entries younger than this are never trimmed),
    whatever the registrations say."""

    def __post_init__(self) -> None:
        _check(isinstance(self.every_steps, int) and self.every_steps >= 0,
               f"publish.every_steps={self.every_steps!r} must be an integer >= 0")  # fmt: skip
        _check(self.every_seconds >= 0,
               f"publish.every_seconds={self.every_seconds!r} must be >= 0")  # fmt: skip
        _check(self.every_steps > 0 or self.every_seconds > 0,
               "publish.every_steps and publish.every_seconds are both 0: nothing would ever "
               "be published")  # fmt: skip
        _positive("publish.max_pending", self.max_pending)
        _positive("publish.drain_timeout_s", self.drain_timeout_s)
        _positive("publish.reader_ttl_s", self.reader_ttl_s)
        _check(self.keep_s >= 0, f"publish.keep_s={self.keep_s!r} must be >= 0")
        _check(isinstance(self.wait_replicas, int) and self.wait_replicas >= -1,
               f"publish.wait_replicas={self.wait_replicas!r} must be an integer >= -1 "
               "(-1: as many as the master has, up to 1)")  # fmt: skip
        _check(isinstance(self.partitions, int) and 0 <= self.partitions <= MAX_PARTITIONS,
               f"publish.partitions={self.partitions!r} must be an integer in "
               f"[0, {MAX_PARTITIONS}]")  # fmt: skip
        if self.url:
            try:
                parse_update_url(self.url)
            except UpdateError as e:
                raise ConfigError(f"publish.url: {e}") from e


@dataclass
class RecConfig:
    """Everything a run needs; saved into the run directory as config.yaml."""

    tables: list[TableConfig]
    """The embedding tables, a list of mappings. A file that lists tables replaces the
    default's eight tables whole."""
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    publish: PublishConfig = field(default_factory=PublishConfig)

    def __post_init__(self) -> None:
        _check(len(self.tables) > 0, "tables: at least one embedding table is needed")
        names = [t.name for t in self.tables]
        _check(len(set(names)) == len(names), f"tables: a table name repeats in {names}")
        owner: dict[str, str] = {}
        for t in self.tables:
            for f in t.features:
                _check(
                    f not in owner,
                    f"feature {f!r} is in tables {owner.get(f)!r} and {t.name!r}; "
                    "a feature is looked up in exactly one table",
                )
                owner[f] = t.name
        if not self.features.sparse:
            self.features.sparse = list(owner)
        for f in self.features.sparse:
            _check(f in owner, f"features.sparse lists {f!r}, which no table uses")
        for f in owner:
            _check(
                f in self.features.sparse,
                f"table {owner[f]!r} uses feature {f!r}, which features.sparse does not list",
            )
        if self.model.arch not in CONCAT_ARCHS and not self.model.factory:
            dims = {t.dim for t in self.tables}
            _check(
                len(dims) == 1,
                f"tables have dims {sorted(dims)}; {self.model.arch}'s interaction needs one "
                f"dimension for all (model.arch {' or '.join(CONCAT_ARCHS)} takes any dims)",
            )
            dim = dims.pop()
            _check(
                self.model.dense_arch[-1] == dim,
                f"model.dense_arch={self.model.dense_arch} must end in the embedding dim {dim}",
            )
        store = self.export.store
        for table in [*self.sharding.constraints, *self.export.table_dtypes, *store.tables,
                      *store.table_partitions]:  # fmt: skip
            _check(table in names, f"unknown table {table!r}; tables are {names}")
        for t in self.tables:
            dtype = self.export.table_dtypes.get(t.name, self.export.quantize)
            multiple = EMBEDDING_DTYPES[dtype].dim_multiple
            _check(
                t.dim % multiple == 0,
                f"table {t.name!r} has dim {t.dim}, and export stores it as {dtype}, which needs "
                f"a dim that is a multiple of {multiple} (FBGEMM packs a row's codes in whole "
                f"fp16 words): make the dim a multiple of {multiple}, or set "
                f"export.table_dtypes.{t.name}: fp16",
            )
        self._check_sequences(names)
        self._check_hotness()
        self._check_zch()
        self._check_context()
        _check(
            not (self.data.stream.url and not self.training.steps
                 and self.training.lr_schedule != "constant"),
            f"training.lr_schedule={self.training.lr_schedule!r} decays over training.steps, and "
            "a run training from a stream (data.stream.url) with steps 0 has no end: use "
            "constant, or set training.steps",
        )  # fmt: skip
        refused = _not_keyed_jagged(self.export.format)
        if self.model.factory:
            _check(
                refused is None,
                f"export.format={self.export.format!r}: a model.factory model exports to "
                f"{refused and refused[0]} only (its forward takes a KeyedJaggedTensor, which "
                f"has no {refused and refused[1]} form)",
            )
        columns = self.data.columns
        if self.model.tasks and not columns.labels and (len(self.model.tasks) > 1
                                                        or columns.label == "label"):  # fmt: skip
            # Named tasks read the label columns of the same names (one task: unless
            # data.columns.label names its column).
            self.data.columns.labels = list(self.model.tasks)

    def _check_hotness(self) -> None:
        """data.synthetic.hotness names sparse features, and not din's candidate or history."""
        din = (self.model.candidate, self.model.history) if self.model.arch == "din" else ()
        for feature in self.data.synthetic.hotness:
            _check(
                feature in self.features.sparse,
                f"data.synthetic.hotness names {feature!r}, which is not a sparse feature; "
                f"they are {self.features.sparse}",
            )
            _check(
                feature not in din,
                f"data.synthetic.hotness names {feature!r}, din's model.candidate or "
                "model.history, whose lengths din sets (1 id; 0..history_length ids)",
            )

    def _check_zch(self) -> None:
        """What ZCH tables (tables[].ids.zch) cannot do yet, refused by name (docs/zch.md)."""
        zch = [t.name for t in self.tables if t.zch]
        stored = [t for t in self.export.store.tables if t in zch]
        _check(
            not (stored and self.model.arch == "din"),
            f"export.store.tables names ZCH tables {stored} of a din model: din's stored "
            "lookups share keys of rows, not raw ids, yet; leave them in the model",
        )
        for t in self.tables:
            c = self.sharding.constraints.get(t.name)
            _check(
                t.zch is None or c is None or list(c.sharding_types) != ["data_parallel"],
                f"table {t.name!r} has ids.zch but sharding.constraints allow it only "
                "data_parallel: a ZCH table's admitted rows and their optimizer state are reset "
                "in the embedding kernel; allow another sharding type (table_wise, row_wise, ...)",
            )

    def _check_context(self) -> None:
        """features.context: names the model's features, leaves each candidate a sparse feature
        and keeps to what the context form exports to (docs in FeaturesConfig.context)."""
        context = self.features.context
        if not context:
            return
        dense, sparse = self.features.dense_names, self.features.sparse
        for name in context:
            _check(context.count(name) == 1, f"features.context={context!r} lists {name!r} twice")
            _check(
                name in dense or name in sparse,
                f"features.context names {name!r}, which is not a feature: the dense features "
                f"are {dense} and the sparse features {sparse}",
            )
            _check(
                not (name in dense and name in sparse),
                f"features.context names {name!r}, which is both a dense and a sparse feature",
            )
        _check(
            any(f not in context for f in sparse),
            f"features.context names every sparse feature {sparse}: a candidate needs at least "
            "one sparse feature of its own",
        )
        _check(
            not (self.model.arch == "din" and self.model.candidate in context),
            f"features.context names {self.model.candidate!r}, din's model.candidate: the item "
            "scored is the candidate's, never the context's",
        )
        _check(
            not self.model.factory,
            f"features.context is not yet supported with model.factory={self.model.factory!r}: "
            "a factory's model takes the whole batch as one KeyedJaggedTensor, so its context "
            "cannot be looked up once; leave features.context empty",
        )
        _check(
            "onnx" not in contract_formats.resolve(self.export.format),
            f"features.context is not yet supported with export.format={self.export.format!r}: "
            "the context form exports to TorchScript and AOTInductor only; use torchscript or "
            "aoti",
        )
        _check(
            not self.export.store.tables,
            f"features.context is not yet supported with export.store.tables="
            f"{self.export.store.tables}: stored tables are looked up per flat row; leave "
            "them in the model, or leave features.context empty",
        )

    def _check_sequences(self, names: list[str]) -> None:
        sequence = [t for t in self.tables if t.pooling == "none"]
        owner = {f: t for t in self.tables for f in t.features}
        if self.model.arch != "din" or self.model.factory:
            _check(
                not sequence,
                f"tables {[t.name for t in sequence]} are sequence tables (pooling: none); "
                "they need model.arch: din",
            )
            return
        _check(
            len(sequence) < len(self.tables),
            "model.arch din needs at least one pooled table (pooling sum or mean) beside the "
            "sequence tables",
        )
        for role in ("candidate", "history"):
            feature = getattr(self.model, role)
            _check(bool(feature), f"model.arch din needs model.{role}: a sequence feature")
            _check(
                feature in owner and owner[feature].pooling == "none",
                f"model.{role}={feature!r} must be a feature of a sequence table "
                f"(pooling: none); those are {[f for t in sequence for f in t.features]}",
            )
        _check(
            self.model.candidate != self.model.history,
            "model.candidate and model.history must be different features",
        )
        refused = _not_keyed_jagged(self.export.format)
        _check(
            refused is None,
            f"export.format={self.export.format!r}: model.arch din exports to "
            f"{refused and refused[0]} only for now (its unpooled lookup has no "
            f"{refused and refused[1]} form in rec yet)",
        )
        dims = {t.dim for t in sequence}
        _check(len(dims) == 1, f"sequence tables have dims {sorted(dims)}; they need one dim")
        extra = [f for t in sequence for f in t.features
                 if f not in (self.model.candidate, self.model.history)]  # fmt: skip
        _check(not extra, f"sequence features {extra} are neither model.candidate nor history")
        for t in sequence:
            c = self.sharding.constraints.get(t.name)
            for st in c.sharding_types if c else []:
                _one_of(f"sharding.constraints.{t.name}.sharding_types[] (a sequence table)", st,
                        SEQUENCE_SHARDING_TYPES)  # fmt: skip

    @property
    def pooled_tables(self) -> list[TableConfig]:
        """The tables of the EmbeddingBagCollection (pooling sum or mean)."""
        return [t for t in self.tables if t.pooling != "none"]

    @property
    def sequence_tables(self) -> list[TableConfig]:
        """The tables of the EmbeddingCollection (pooling none)."""
        return [t for t in self.tables if t.pooling == "none"]

    @property
    def embedding_dim(self) -> int:
        """The one dim of every table (dlrm, dlrm_dcn; CONCAT_ARCHS allow `mixed_dims`)."""
        return self.tables[0].dim

    @property
    def mixed_dims(self) -> bool:
        return len({t.dim for t in self.tables}) > 1

    def feature_to_table(self) -> dict[str, str]:
        return {f: t.name for t in self.tables for f in t.features}

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for table in out["tables"]:  # the one-word form, as a user writes it
            if table["ids"]["zch"] is None:
                table["ids"] = "modulo"
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# --------------------------------------------------------------------------------------------
# Loading


def _from_dict(cls: type, data: Any, where: str) -> Any:
    """Builds dataclass `cls` from plain YAML data, rejecting unknown keys by name."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - known)
    if unknown:
        guesses = {k: difflib.get_close_matches(str(k), known, n=1) for k in unknown}
        hint = "; ".join(f"did you mean {g[0]!r} for {k!r}?" for k, g in guesses.items() if g)
        raise ConfigError(
            f"unknown key(s) {unknown} in {where or 'the top level'}"
            + (f" ({hint})" if hint else "") + f"; allowed: {sorted(known)}"
        )  # fmt: skip
    kwargs = {k: _convert(hints[k], v, f"{where}.{k}" if where else k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{where or 'config'}: {e}") from None


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict) and hasattr(tp, "from_scalar"):
            value = tp.from_scalar(value, where)  # a section that has a one-word form
        return _from_dict(tp, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}={value!r} must be a list")
        return [_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}={value!r} must be a mapping")
        return {str(k): _convert(args[1], v, f"{where}.{k}") for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if dataclasses.is_dataclass(a)]
        if inner and isinstance(value, dict):  # an optional section, given
            return _from_dict(inner[0], value, where)
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool) and not (
        isinstance(value, tp) and not (tp is int and isinstance(value, bool))
    ):
        raise ConfigError(f"{where}={value!r} must be of type {tp.__name__}")
    return value


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in _REPLACE_KEYS:
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


# Mappings keyed by table or feature name are taken whole from the file, not merged with the
# default's.
_REPLACE_KEYS = {"constraints", "table_dtypes", "sparse", "live_ids", "hotness"}


def default_config_dict() -> dict[str, Any]:
    """The embedded default: a small DLRM on synthetic data, about 2 minutes on 2 cores."""
    rows = [2000, 5000, 1000, 3000, 4000, 500, 2500, 1500]
    return {
        "tables": [
            {"name": f"t{i}", "rows": r, "dim": 16, "features": [f"cat_{i}"]}
            for i, r in enumerate(rows)
        ],
        "features": {"dense": 13},
    }


def config_from_dict(data: dict[str, Any], base: dict[str, Any] | None = None) -> RecConfig:
    """Validates `data` (laid over `base`, by default the embedded default) into a RecConfig."""
    merged = _merge(default_config_dict() if base is None else base, data or {})
    return _from_dict(RecConfig, merged, "")


def default_config() -> RecConfig:
    return config_from_dict({})


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> RecConfig:
    """Reads a YAML file (keys not given take the embedded default) and validates it.

    A file that lists `tables` replaces the default tables whole.
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping at the top level")
    if overrides:
        data = _merge(data, overrides)
    return config_from_dict(data)
