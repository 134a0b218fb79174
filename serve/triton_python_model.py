"""Triton Python-backend model that serves rec's exported TorchScript `model.pt`: the adapter
between Triton's pb_utils and rec.serve.python_backend, which does the work.

Copied as `<staging>/<model>/<version>/model.py` by rec.serve.triton; runs inside Triton's
`triton_python_backend_stub`, with the venv's packages (torch, fbgemm_gpu, rec). It stands in
for the pytorch_libtorch backend, which nvidia-pytriton's tritonserver does not ship, and serves
the same inputs and outputs (docs/architecture.md#model-io). The path of model.pt comes from the
config parameter `model_path`, so the user's repository is read, never copied or changed.

This file only converts: the config to an InstanceConfig, each request's input tensors to
numpy (python_backend.inputs.Inputs), each result to a response (scores, or a TritonError
with the Failure's code), a LoadError to a TritonModelException; and it gives the instance
Triton's metric families (served on /metrics) and logger. What the model does (checks, the
batch, the embedding store, the update log, the batch probe, the metrics) is in
rec.serve.python_backend, which imports nothing from Triton and is tested without it.

Not done here, unlike rec-server: responses do NOT carry the embedding watermark
(`embedding_watermark_gen`, `_step`, `_wall_ns`). This Triton's (2.51) Python backend cannot set
response parameters: its pb_utils.InferenceResponse takes only `output_tensors` and `error`
(passing `parameters=` fails with "incompatible constructor arguments"), so a client learns the
watermark from /metrics only, not per response. Also missing: `--updates-max-behind-s` (a Python
model cannot make Triton's ready routes answer not ready) and the log for an AOTInductor
version (model.pt2 is served export-fresh).
"""

import json

import triton_python_backend_utils as pb_utils

from rec.contract import SCORES
from rec.serve.python_backend.config import InstanceConfig, LoadError
from rec.serve.python_backend.inputs import Failure, Inputs
from rec.serve.python_backend.instance import ModelInstance
from rec.serve.python_backend.metrics import COUNTER, GAUGE


class _Family:
    """A Triton metric family, as python_backend.metrics' sink gives one. (pb_utils' classes
    are read here, not at import: the stub binds MetricFamily and the rest after it has
    imported model.py.)"""

    def __init__(self, name, description, kind):
        kinds = {COUNTER: pb_utils.MetricFamily.COUNTER, GAUGE: pb_utils.MetricFamily.GAUGE}
        self.family = pb_utils.MetricFamily(name=name, description=description, kind=kinds[kind])

    def metric(self, labels):
        return self.family.Metric(labels=labels)


def _log(level, message):
    getattr(pb_utils.Logger, f"log_{level}")(message)


def _inputs(request):
    # Every input the request carries (a context model's config declares both forms, each
    # optional): which form it is, and what is missing or extra, is python_backend's to say.
    return Inputs({t.name(): t.as_numpy() for t in request.inputs()})


def _response(result):
    if isinstance(result, Failure):
        error = pb_utils.TritonError(result.message, getattr(pb_utils.TritonError, result.code))
        return pb_utils.InferenceResponse(output_tensors=[], error=error)
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(SCORES, result)])


class TritonPythonModel:
    def initialize(self, args):
        config = InstanceConfig.from_triton(
            json.loads(args["model_config"]), args["model_name"], args["model_version"]
        )
        try:
            self.instance = ModelInstance(config, _Family, _log)
        except LoadError as e:
            raise pb_utils.TritonModelException(str(e)) from None

    def execute(self, requests):
        return [_response(r) for r in self.instance.execute([_inputs(r) for r in requests])]

    def finalize(self):
        if getattr(self, "instance", None) is not None:
            self.instance.close()
