"""Triton Python-backend model that serves rec's exported TorchScript `model.pt`.

Copied as `<staging>/<model>/<version>/model.py` by rec.serve.triton; runs inside Triton's
`triton_python_backend_stub`, with the venv's packages (torch, fbgemm_gpu). It stands in for the
pytorch_libtorch backend, which nvidia-pytriton's tritonserver does not ship, and serves the same
inputs and outputs (DESIGN.md I/O table). The path of model.pt comes from the config parameter
`model_path`, so the user's repository is read, never copied or changed.

Like the recommended Triton backend: requests that Triton's dynamic batcher hands over together
are validated one by one (an error goes to its own request), concatenated into one batch (valid
because the input is batch-major jagged), run once, and the scores sliced back per request.

A request may carry its ids as strings (`sparse_strings`, BYTES) instead of `sparse_values`; they
are mapped with the model's feature spec by rec.features, the code the training readers use.
"""

import json
import os

import fbgemm_gpu  # noqa: F401  (registers the torch.ops.fbgemm kernels model.pt calls)
import numpy as np
import torch
import triton_python_backend_utils as pb_utils

import rec.ops  # noqa: F401  (registers torch.ops.rec.linear, the dense layers model.pt calls)
from rec import batch_probe
from rec.contract import DENSE, LENGTHS, SCORES, STRINGS, VALUES
from rec.cpu import cpu_info, describe
from rec.features import FeatureSpec, TokenError


def _invalid(message):
    return pb_utils.InferenceResponse(
        output_tensors=[], error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
    )


def _check(dense, lengths, values, max_rows, values_name=VALUES):
    """Message for what Triton's own shape checks cannot see (the jagged pair), or None.

    Messages match the C++ server's (cpp/src/common/request.cpp), so clients see one wording.
    """
    if dense.shape[0] < 1:
        width = dense.shape[1]
        return f"input '{DENSE}': expected shape [B,{width}] with B >= 1, got [0,{width}]"
    if 0 < max_rows < dense.shape[0]:
        return f"input '{DENSE}': batch size {dense.shape[0]} exceeds max_batch_size {max_rows}"
    if dense.shape[0] != lengths.shape[0]:
        return (
            f"input '{LENGTHS}': batch size {lengths.shape[0]} differs from other inputs' "
            f"{dense.shape[0]}"
        )
    bad = np.argwhere(~np.isfinite(dense))
    if bad.size:
        r, c = (int(x) for x in bad[0])
        what = "nan" if np.isnan(dense[r, c]) else ("inf" if dense[r, c] > 0 else "-inf")
        return f"input '{DENSE}': value {what} at [{r}, {c}]: every value must be a finite number"
    negative = np.flatnonzero(lengths.reshape(-1) < 0)
    if negative.size:
        i = int(negative[0])
        return f"input '{LENGTHS}': negative length {int(lengths.reshape(-1)[i])} at flat index {i}"
    total = int(lengths.sum(dtype=np.int64))
    if values.size != total:
        return f"input '{values_name}': has {values.size} values but sum of '{LENGTHS}' is {total}"
    return None


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        path = params["model_path"]["string_value"]
        self.max_rows = int(params["max_rows"]["string_value"])
        threads = int(params.get("intra_op_threads", {}).get("string_value", "1"))
        if threads > 0:
            torch.set_num_threads(threads)
        if path.endswith(".pt2"):  # AOTInductor: tables memory-mapped, the CPU's ISA checked
            from rec.aoti_package import AotiModel

            self.model = AotiModel(os.path.dirname(path))
        else:
            self.model = torch.jit.load(path, map_location="cpu").eval()
        allow = params.get("allow_batch_variant", {}).get("string_value") == "true"
        self._probe_batching(path, args["model_name"], args["model_version"], allow)
        spec = params.get("feature_spec", {}).get("string_value")
        self.spec = FeatureSpec.from_dict(json.loads(spec)) if spec else None
        self.num_tasks = int(config["output"][0]["dims"][0])

    def _probe_batching(self, path, name, version, allow):
        """rec.json's batch probe on this CPU (rec.batch_probe): a model that scores it
        differently as one batch than one by one fails its load, or with `allow` is served with
        a warning and rec_model_batch_variant 1, as rec-server does."""
        manifest = batch_probe.read_manifest(path)
        request = batch_probe.from_manifest(manifest)
        if request is None:
            return
        diff = batch_probe.batch_variance(self.model, request)
        # The family is kept too: Triton drops a family's metrics when it is collected.
        self._variant_family = pb_utils.MetricFamily(
            name="rec_model_batch_variant",
            description="1 when the served version fails the load-time batch probe",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        labels = {"model": name, "version": str(version)}
        self._variant_metric = self._variant_family.Metric(labels=labels)
        self._variant_metric.set(1 if diff else 0)
        if diff == 0:
            return
        verified = manifest["dense"].get("verified_on", {}).get("model", "an unrecorded CPU")
        here = describe(cpu_info())
        message = batch_probe.refusal(name, version, len(request[0]), diff, here, verified)
        if not allow:
            raise pb_utils.TritonModelException(
                message + ". Serve it anyway with --allow-batch-variant"
            )
        pb_utils.Logger.log_warn(message + "; serving it anyway (--allow-batch-variant)")

    def execute(self, requests):
        responses = [None] * len(requests)
        batch, rows = [], []  # (request index, dense, lengths, values) of valid requests
        for i, request in enumerate(requests):
            dense = pb_utils.get_input_tensor_by_name(request, DENSE).as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, LENGTHS).as_numpy()
            values, problem = self._values(request, dense, lengths)
            if problem is None:
                problem = _check(dense, lengths, values, self.max_rows)
            if problem is not None:
                responses[i] = _invalid(problem)
                continue
            batch.append((i, dense, lengths, values))
            rows.append(dense.shape[0])
        if batch:
            try:
                scores = self._run(batch)
            except RuntimeError as e:  # a model failure fails the batch it ran, not the server
                for i, *_ in batch:
                    responses[i] = pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(f"model failed: {e}")
                    )
                return responses
            start = 0
            for (i, *_), n in zip(batch, rows, strict=True):
                out = pb_utils.Tensor(SCORES, scores[start : start + n])
                responses[i] = pb_utils.InferenceResponse(output_tensors=[out])
                start += n
        return responses

    def _values(self, request, dense, lengths):
        """(sparse_values [N] int64, None), or (None, message) for the request's error."""
        ids = pb_utils.get_input_tensor_by_name(request, VALUES)
        strings = pb_utils.get_input_tensor_by_name(request, STRINGS)
        if (ids is None) == (strings is None):
            both = "both" if ids is not None else "neither"
            return None, (
                f"a request carries either '{VALUES}' (INT64 ids) or '{STRINGS}' "
                f"(BYTES tokens); this one has {both}"
            )
        if ids is not None:
            # Ragged ids arrive as [1, N] from batching clients or [N]; the model wants [N].
            return ids.as_numpy().reshape(-1), None
        tokens = [t.decode("utf-8", errors="surrogateescape") for t in
                  strings.as_numpy().reshape(-1).tolist()]  # fmt: skip
        # Shapes and counts first, with the messages sparse_values gets, naming this input.
        problem = _check(dense, lengths, np.empty(len(tokens)), self.max_rows, STRINGS)
        if problem is not None:
            return None, problem
        try:
            return self.spec.encode_values(lengths, tokens), None
        except TokenError as e:
            return None, f"input '{STRINGS}': {e}"

    def _run(self, batch):
        def cat(k):
            # Copies (Triton's input buffers are read-only), which from_numpy wants anyway.
            return torch.from_numpy(np.concatenate([b[k] for b in batch]))

        with torch.inference_mode():
            scores = self.model(cat(1), cat(2), cat(3))
        return scores.numpy().astype(np.float32, copy=False)
