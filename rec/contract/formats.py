"""The model repository's layout: its file names and the table of formats (what each writes,
where, and which Triton platform serves it). Export writes through it, the servers, the batch
probe, the benchmarks and the tests read through it; how a format is built and verified stays
in rec.export.formats, one plug-in per entry of this table.

    <repo>/<model dir>/config.pbtxt          Triton's model config
    <repo>/<model dir>/rec.json              rec's manifest (rec.contract.manifest)
    <repo>/<model dir>/<version>/<file>      the format's model file (+ its rec.json copy)

Example:
    >>> FORMATS["aoti"].file, FORMATS["aoti"].model_dir_name("rec")
    ('model.pt2', 'rec_aoti')
    >>> resolve("both")
    ['torchscript', 'onnx']
"""

from __future__ import annotations

from dataclasses import dataclass

MANIFEST_FILE = "rec.json"
TRITON_CONFIG_FILE = "config.pbtxt"
# AOTInductor's tables, beside model.pt2 (memory-mapped at load), and their offsets.
AOTI_TABLES_FILE = "tables.bin"
AOTI_TABLES_INDEX = "tables.json"


@dataclass(frozen=True)
class FormatSpec:
    """One export format's facts, as every stage sees them."""

    name: str
    """`export.format` / `--format` value, and the model directory's suffix (`rec_<name>`)."""
    title: str
    """How messages name it ("TorchScript")."""
    file: str
    """The model file in each version directory."""
    platform: str
    """config.pbtxt's `platform` (Triton's backend for it)."""
    order: int
    """Where it comes in `all` and in the build order."""
    default_name: bool = False
    """Its model directory takes export.model_name itself (the others add `_<name>`)."""
    ram_copies: float = 1.0
    """Copies of the quantized tables export holds at once while building it."""
    keyed_jagged: bool = False
    """Exports every model rec trains: model.factory models (KeyedJaggedTensor input) and din's
    unpooled lookups. Without it config validation refuses those models for this format."""
    rec_dense: bool = False
    """Its dense layers are rec's (export.dense_dtype applies; the reduced-precision bar is
    checked on its scores)."""
    rec_serves: bool = False
    """rec-server and rec's Triton Python model load it."""

    def model_dir_name(self, model_name: str) -> str:
        return model_name if self.default_name else f"{model_name}_{self.name}"


FORMATS = {
    f.name: f
    for f in (
        FormatSpec("torchscript", "TorchScript", "model.pt", "pytorch_libtorch", order=0,
                   default_name=True, keyed_jagged=True, rec_dense=True, rec_serves=True),
        # ram_copies: the torch module's tables, then ONNX Runtime's own copy.
        FormatSpec("onnx", "ONNX", "model.onnx", "onnxruntime_onnx", order=1, ram_copies=2.0),
        # torch_aoti: Triton's PyTorch backend for AOTInductor packages (beta, 26.03+).
        FormatSpec("aoti", "AOTInductor (aoti)", "model.pt2", "torch_aoti", order=2,
                   keyed_jagged=True, rec_dense=True, rec_serves=True),
    )
}  # fmt: skip
# A name that means several formats; `all` is every format.
ALIASES = {"both": ("torchscript", "onnx")}


def names() -> list[str]:
    """Every format, in build order."""
    return sorted(FORMATS, key=lambda n: FORMATS[n].order)


def choices() -> list[str]:
    """What export.format accepts: each format, `both` and `all`."""
    return [*names(), *ALIASES, "all"]


def resolve(value: str) -> list[str]:
    """export.format -> the formats it means, in build order."""
    if value == "all":
        return names()
    if value in ALIASES:
        return list(ALIASES[value])
    if value not in FORMATS:
        raise ValueError(f"unknown export format {value!r}; choose from {choices()}")
    return [value]


def served_files() -> dict[str, str]:
    """Triton platform -> model file, of the formats rec's own servers load."""
    return {f.platform: f.file for f in FORMATS.values() if f.rec_serves}
