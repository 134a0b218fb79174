"""rec.export: sharded checkpoint -> quantized TorchScript / ONNX model repository (Contract 2).

    >>> from rec.export import export_run
    >>> export_run("runs/demo", "model_repository", quantize="int8")  # doctest: +SKIP

`export_run` is imported on first use, so `import rec.export` (the CLI does) stays light.
"""

from typing import Any

__all__ = ["ExportResult", "export_run"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from rec.export import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'rec.export' has no attribute {name!r}")
