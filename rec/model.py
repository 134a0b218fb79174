"""The recommendation model over one EmbeddingBagCollection: TorchRec's DLRM or DLRM-DCN
(every table at one dim), or DCN-v2, MMoE or DIN over the concatenated embeddings (tables of
any dims); DIN also reads sequences through an EmbeddingCollection.

`build_model` returns the float model (what training shards and export quantizes); the loss
lives in `TrainModel`, a wrapper, not in the model. The checkpoint stores the wrapper's state
dict, so every key starts with `model.` (see `MODEL_PREFIX`).
"""

# No `from __future__ import annotations`: FX writes forward's annotations into the traced code,
# which TorchScript then reads; they must be types, not strings.
import torch
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.models.dlrm import DLRM, DLRM_DCN, DenseArch, OverArch
from torchrec.modules.crossnet import LowRankCrossNet
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.modules.mlp import MLP
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rec.batch import PAD_LABEL
from rec.config import RecConfig
from rec.factory import build_custom

# The table facts live in rec.tables (the factory needs them too); re-exported here because
# train, export and the tests have always imported them from the model.
from rec.tables import embedding_configs, sequence_configs, table_rows  # noqa: F401

MODEL_PREFIX = "model."


class ConcatSparseArch(nn.Module):
    """Every feature's pooled embedding side by side: [B, sum of the features' dims].

    Named like TorchRec's SparseArch (`embedding_bag_collection`, `sparse_feature_names`), so
    the checkpoint's keys and export's code are those of the DLRMs; unlike it, the tables may
    have different dims. Features are in the EBC's config order (table by table), picked by
    name: a sharded EBC's KeyedTensor holds its columns in the plan's order (rank by rank),
    so `.values()` would train the layers above on another order than the export feeds."""

    def __init__(self, embedding_bag_collection: EmbeddingBagCollection) -> None:
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        configs = embedding_bag_collection.embedding_bag_configs()
        self.sparse_feature_names = ebc_features(embedding_bag_collection)
        self.width = sum(c.embedding_dim * len(c.feature_names) for c in configs)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.embedding_bag_collection(features).to_dict()
        return torch.cat([pooled[name] for name in self.sparse_feature_names], 1)


class ConcatModel(nn.Module):
    """x0 = [dense_arch(dense), e_1, ..., e_F] (each pooled embedding at its table's dim), then
    over_arch(inter_arch(x0)) -> logits [B, T].

    The attribute names are TorchRec's DLRM's (sparse_arch, dense_arch, inter_arch, over_arch),
    so checkpoints and export read every architecture the same way; what differs from the
    DLRMs is the interaction's input, which takes the embeddings as they are rather than at
    the dense arch's output dim. Subclasses set inter_arch and over_arch."""

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        dense_in_features: int,
        dense_arch_layer_sizes: list[int],
        dense_device: torch.device | None,
    ) -> None:
        super().__init__()
        self.sparse_arch = ConcatSparseArch(embedding_bag_collection)
        self.dense_arch = DenseArch(dense_in_features, dense_arch_layer_sizes, dense_device)
        self.width = dense_arch_layer_sizes[-1] + self.sparse_arch.width

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> torch.Tensor:
        x0 = torch.cat([self.dense_arch(dense_features), self.sparse_arch(sparse_features)], 1)
        return self.over_arch(self.inter_arch(x0))


class DcnV2(ConcatModel):
    """DCN-v2 (Wang et al., 2021) over the concatenation, for tables of any dims.

    `num_layers` low-rank cross layers x_{l+1} = x0 * (W_l V_l x_l + b_l) + x_l (TorchRec's
    LowRankCrossNet) over x0, then the over arch to one logit per task."""

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        dense_in_features: int,
        dense_arch_layer_sizes: list[int],
        over_arch_layer_sizes: list[int],
        dcn_num_layers: int,
        dcn_low_rank_dim: int,
        dense_device: torch.device | None = None,
    ) -> None:
        super().__init__(
            embedding_bag_collection, dense_in_features, dense_arch_layer_sizes, dense_device
        )
        self.inter_arch = LowRankCrossNet(self.width, dcn_num_layers, dcn_low_rank_dim)
        self.over_arch = OverArch(self.width, over_arch_layer_sizes, dense_device)


class TaskTower(nn.Module):
    """One task of MMoE: its softmax gate mixes the shared experts' outputs, its tower maps the
    mixture to the task's logit [B, 1]."""

    def __init__(
        self, in_features: int, num_experts: int, expert_dim: int, tower: list[int], device
    ) -> None:
        super().__init__()
        self.gate = nn.Linear(in_features, num_experts, device=device)
        self.tower = OverArch(expert_dim, tower, device)

    def forward(self, x: torch.Tensor, experts: list[torch.Tensor]) -> torch.Tensor:
        weight = torch.softmax(self.gate(x), dim=1)
        # A weighted sum by elementwise ops, not a bmm: each sample's result then does not
        # depend on the batch it is in (the served model's batched = single-sample).
        mixed = weight[:, 0:1] * experts[0]
        for k in range(1, len(experts)):
            mixed = mixed + weight[:, k : k + 1] * experts[k]
        return self.tower(mixed)


class MultiGateExperts(nn.Module):
    """MMoE's top (Ma et al., 2018): experts shared by all tasks, and per task a gate over them
    and a tower: x [B, W] -> logits [B, T], one column per task in model.tasks order."""

    def __init__(
        self,
        in_features: int,
        num_experts: int,
        expert_layer_sizes: list[int],
        tower_layer_sizes: list[int],
        num_tasks: int,
        device: torch.device | None,
    ) -> None:
        super().__init__()
        self.experts = nn.ModuleList(
            [MLP(in_features, expert_layer_sizes, device=device) for _ in range(num_experts)]
        )
        self.tasks = nn.ModuleList(
            [
                TaskTower(
                    in_features, num_experts, expert_layer_sizes[-1], tower_layer_sizes, device
                )
                for _ in range(num_tasks)
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts = [expert(x) for expert in self.experts]
        return torch.cat([task(x, experts) for task in self.tasks], 1)


class Mmoe(ConcatModel):
    """Multi-gate mixture of experts over the concatenation: the interaction is the
    concatenation itself (an identity), the over arch is MultiGateExperts."""

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        dense_in_features: int,
        dense_arch_layer_sizes: list[int],
        over_arch_layer_sizes: list[int],
        num_experts: int,
        expert_layer_sizes: list[int],
        num_tasks: int,
        dense_device: torch.device | None = None,
    ) -> None:
        super().__init__(
            embedding_bag_collection, dense_in_features, dense_arch_layer_sizes, dense_device
        )
        self.inter_arch = nn.Identity()
        self.over_arch = MultiGateExperts(
            self.width,
            num_experts,
            expert_layer_sizes,
            over_arch_layer_sizes,
            num_tasks,
            dense_device,
        )


class SequenceArch(nn.Module):
    """The candidate and the history through the EmbeddingCollection (TorchRec's unpooled
    lookup): candidate [B, D] (its ids summed: one id, or none for a zero vector), the
    history's item embeddings [N, D] in order, and the sample of each [N]."""

    def __init__(self, embedding_collection: EmbeddingCollection, candidate: str, history: str):
        super().__init__()
        self.embedding_collection = embedding_collection
        self.candidate = candidate
        self.history = history

    def forward(
        self, features: KeyedJaggedTensor, like: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sequences = self.embedding_collection(features)
        candidate, history = sequences[self.candidate], sequences[self.history]
        items = history.values()
        # Zero rows for B samples (`like` is [B, ...]); built from a tensor, not torch.zeros
        # of a size, which TorchRec's pipeline tracer cannot take.
        pooled = like.new_zeros(like.shape[0], items.shape[1])
        owner = torch.repeat_interleave(candidate.lengths().long())
        pooled = pooled.index_add(0, owner, candidate.values())
        return pooled, items, torch.repeat_interleave(history.lengths().long())


class AttentionPooling(nn.Module):
    """DIN's activation unit (Zhou et al., 2018): each history item h gets the weight
    w(h, c) = MLP([h, c, h - c, h * c]) from the candidate c, and the user's interest in c is
    sum_h w(h, c) h (no softmax, as in the paper: the sum keeps how much of the history
    relates to c). Per-item rows and an index_add: a sample's result does not depend on the
    batch it is in."""

    def __init__(self, dim: int, hidden: list[int], device: torch.device | None) -> None:
        super().__init__()
        self.mlp = MLP(4 * dim, hidden, device=device)
        self.weight = nn.Linear(hidden[-1], 1, device=device)

    def forward(
        self, candidate: torch.Tensor, items: torch.Tensor, owner: torch.Tensor
    ) -> torch.Tensor:
        c = candidate.index_select(0, owner)
        w = self.weight(self.mlp(torch.cat([items, c, items - c, items * c], 1)))
        return torch.zeros_like(candidate).index_add(0, owner, w * items)


class Din(ConcatModel):
    """DIN over the concatenation: x0 = [dense_arch(dense), pooled features at their dims],
    then the over arch reads [x0, c, u, c * u]: the candidate c, the user's interest u (the
    history pooled by its attention to c, AttentionPooling) and their product, whose sum is
    the dot product c . u that an MLP would otherwise have to learn."""

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        embedding_collection: EmbeddingCollection,
        dense_in_features: int,
        dense_arch_layer_sizes: list[int],
        over_arch_layer_sizes: list[int],
        candidate: str,
        history: str,
        attention_layer_sizes: list[int],
        dense_device: torch.device | None = None,
    ) -> None:
        super().__init__(
            embedding_bag_collection, dense_in_features, dense_arch_layer_sizes, dense_device
        )
        dim = embedding_collection.embedding_dim()
        self.sequence_arch = SequenceArch(embedding_collection, candidate, history)
        self.inter_arch = AttentionPooling(dim, attention_layer_sizes, dense_device)
        self.over_arch = OverArch(self.width + 3 * dim, over_arch_layer_sizes, dense_device)

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> torch.Tensor:
        x0 = torch.cat([self.dense_arch(dense_features), self.sparse_arch(sparse_features)], 1)
        candidate, items, owner = self.sequence_arch(sparse_features, x0)
        interest = self.inter_arch(candidate, items, owner)
        return self.over_arch(torch.cat([x0, candidate, interest, candidate * interest], 1))


def build_model(cfg: RecConfig, device: torch.device | str = "cpu") -> nn.Module:
    """The model of `cfg.model.arch` with its embedding tables on `device` ("meta" for
    sharding later).

    Example:
        >>> from rec.config import default_config
        >>> model = build_model(default_config())
        >>> type(model).__name__
        'DLRM'
    """
    device = torch.device(device)
    ebc = EmbeddingBagCollection(tables=embedding_configs(cfg), device=device)
    if cfg.model.factory:
        return build_custom(cfg, ebc)
    dense_device = torch.device("cpu") if device.type == "meta" else device
    common = dict(
        embedding_bag_collection=ebc,
        dense_in_features=cfg.features.dense,
        dense_arch_layer_sizes=list(cfg.model.dense_arch),
        over_arch_layer_sizes=list(cfg.model.over_arch),
        dense_device=dense_device,
    )
    if cfg.model.arch == "dcn_v2":
        return DcnV2(
            dcn_num_layers=cfg.model.dcn_num_layers,
            dcn_low_rank_dim=cfg.model.dcn_low_rank_dim,
            **common,
        )
    if cfg.model.arch == "din":
        return Din(
            embedding_collection=EmbeddingCollection(tables=sequence_configs(cfg), device=device),
            candidate=cfg.model.candidate,
            history=cfg.model.history,
            attention_layer_sizes=list(cfg.model.attention_arch),
            **common,
        )
    if cfg.model.arch == "mmoe":
        return Mmoe(
            num_experts=cfg.model.num_experts,
            expert_layer_sizes=list(cfg.model.expert_arch),
            num_tasks=cfg.model.num_tasks,
            **common,
        )
    if cfg.model.arch == "dlrm_dcn":
        return DLRM_DCN(
            dcn_num_layers=cfg.model.dcn_num_layers,
            dcn_low_rank_dim=cfg.model.dcn_low_rank_dim,
            **common,
        )
    return DLRM(**common)


def embedding_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Attribute path -> the model's EmbeddingBagCollection and EmbeddingCollection (din),
    unsharded: every table is in one of them."""
    kinds = (EmbeddingBagCollection, EmbeddingCollection)
    return {path: m for path, m in model.named_modules() if isinstance(m, kinds)}


def table_keys(model: nn.Module) -> dict[str, str]:
    """Table name -> the state-dict key of its weight in `model` (the checkpoint holds it
    under the TrainModel's `model.` prefix, MODEL_PREFIX)."""
    out = {}
    for path, m in embedding_modules(model).items():
        holder = "embedding_bags" if isinstance(m, EmbeddingBagCollection) else "embeddings"
        for table in getattr(m, holder):
            out[table] = f"{path}.{holder}.{table}.weight"
    return out


def ebc_path(model: nn.Module) -> str:
    """The attribute path of the model's one EmbeddingBagCollection, which holds every table:
    `sparse_arch.embedding_bag_collection` for rec's architectures, anywhere for a factory's
    model (rec.factory checks there is exactly one)."""
    paths = [name for name, m in model.named_modules() if isinstance(m, EmbeddingBagCollection)]
    if len(paths) != 1:
        raise ValueError(f"the model holds {len(paths)} EmbeddingBagCollections {paths}; rec "
                         "needs exactly one, the one it built from `tables`")  # fmt: skip
    return paths[0]


def replace_submodule(model: nn.Module, path: str, module: nn.Module) -> nn.Module:
    """Puts `module` at attribute path `path` of `model`; returns what was there."""
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    old = getattr(parent, name)
    setattr(parent, name, module)
    return old


def ebc_features(ebc: nn.Module) -> list[str]:
    """The EBC's features in the order of its output (table by table)."""
    return [f for c in ebc.embedding_bag_configs() for f in c.feature_names]


class TrainModel(nn.Module):
    """The model plus its loss, in the (loss, output) form TorchRec's train pipelines expect."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = nn.BCEWithLogitsLoss(reduction="none")

    def forward(self, batch: Batch) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        logits = self.model(batch.dense_features, batch.sparse_features)
        # The mean over real rows. Rows labelled PAD_LABEL stand in for a rank that has no event
        # in a step of stream training (rec.train.stream_loop): they give no loss and no gradient,
        # and a rank with only them gives 0, not the NaN of an empty mean.
        real = (batch.labels != PAD_LABEL).to(logits.dtype)
        per_row = self.loss_fn(logits, batch.labels.clamp(min=0.0)) * real
        loss = per_row.sum() / real.sum().clamp(min=1.0)
        return loss, (loss.detach(), logits.detach(), batch.labels)
