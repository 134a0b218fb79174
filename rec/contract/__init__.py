"""Contract 2, the model repository, written once: the model's I/O and dtypes (`io`), the
repository's file names and formats (`formats`), and rec.json's fields with their reader
(`manifest`, its sections typed in `sections`), and the layout of a model's files and versions
(`repository`). Export writes through this package; the servers, the batch probe, the benchmarks
and the tests read through it. It imports nothing heavy (no torch), so any stage may use it.
"""

from rec.contract.formats import (
    ALIASES,
    AOTI_TABLES_FILE,
    AOTI_TABLES_INDEX,
    FORMATS,
    MANIFEST_FILE,
    TRITON_CONFIG_FILE,
    FormatSpec,
    served_files,
)
from rec.contract.io import (
    DENSE,
    DTYPES,
    EMBEDDING_DTYPES,
    INPUT_NAMES,
    LENGTHS,
    NUMPY_DTYPES,
    OUTPUT_NAME,
    ROLES,
    SCORES,
    STRINGS,
    VALUES,
    EmbeddingDtype,
    io_manifest,
    triton_dtype,
)
from rec.contract.manifest import (
    Manifest,
    ManifestError,
    parse_manifest,
    read_manifest,
    write_manifest,
)
from rec.contract.repository import ModelDir, manifest_in, model_file_in, versions
from rec.contract.requests import random_request

__all__ = [
    "ALIASES",
    "AOTI_TABLES_FILE",
    "AOTI_TABLES_INDEX",
    "DENSE",
    "DTYPES",
    "EMBEDDING_DTYPES",
    "FORMATS",
    "INPUT_NAMES",
    "LENGTHS",
    "MANIFEST_FILE",
    "NUMPY_DTYPES",
    "OUTPUT_NAME",
    "ROLES",
    "SCORES",
    "STRINGS",
    "TRITON_CONFIG_FILE",
    "VALUES",
    "EmbeddingDtype",
    "FormatSpec",
    "Manifest",
    "ManifestError",
    "ModelDir",
    "io_manifest",
    "manifest_in",
    "model_file_in",
    "parse_manifest",
    "random_request",
    "read_manifest",
    "served_files",
    "triton_dtype",
    "versions",
    "write_manifest",
]
