"""The staged config.pbtxt's parameters that rec's Triton model reads (rec.serve.triton writes
them), as a typed InstanceConfig. Light on purpose: rec.serve.triton imports the names."""

from __future__ import annotations

import json
from dataclasses import dataclass

STORE_CACHE_PARAMETER = "store_cache_bytes"
"""Config parameter: the row cache's bound in bytes (rec-server's --store-cache-bytes)."""
DEFAULT_STORE_CACHE = 256 << 20
UPDATES_PARAMETER = "updates_url"
"""Config parameter overriding rec.json's `updates.url`: a redis:// URL, or `none`."""
STORE_RETRY_NOTE = "the load is retried every 2 s"
"""Ends a load failure that the launcher retries (rec.serve.triton retries such a load)."""


class LoadError(Exception):
    """The model instance cannot serve; the message names the model and why (Triton's
    TritonModelException in the adapter)."""


@dataclass(frozen=True)
class InstanceConfig:
    """What one model instance serves, and how."""

    name: str
    version: str
    model_path: str
    """The user's <repo>/<model>/<version>/model.pt (or model.pt2): read, never copied."""
    max_rows: int = 0
    """The largest request in samples (0: no limit)."""
    intra_op_threads: int = 1
    """torch's thread count (0: torch's default is left)."""
    allow_batch_variant: bool = False
    feature_spec: dict | None = None
    """rec.features' spec, for requests that carry their ids as strings."""
    updates_url: str = ""
    """rec-server's --updates: a redis:// URL over rec.json's, `none`, or "" for rec.json's."""
    store_cache_bytes: int = DEFAULT_STORE_CACHE

    @classmethod
    def from_triton(cls, model_config: dict, name: str, version: str) -> InstanceConfig:
        """From Triton's model_config JSON (args["model_config"], parsed)."""
        params = {
            k: v.get("string_value", "") for k, v in model_config.get("parameters", {}).items()
        }
        spec = params.get("feature_spec")
        return cls(
            name=name,
            version=str(version),
            model_path=params["model_path"],
            max_rows=int(params["max_rows"]),
            intra_op_threads=int(params.get("intra_op_threads") or 1),
            allow_batch_variant=params.get("allow_batch_variant") == "true",
            feature_spec=json.loads(spec) if spec else None,
            updates_url=params.get(UPDATES_PARAMETER, ""),
            store_cache_bytes=int(params.get(STORE_CACHE_PARAMETER) or DEFAULT_STORE_CACHE),
        )

    @property
    def where(self) -> str:
        return f"model '{self.name}' version {self.version}"
