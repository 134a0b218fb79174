"""rec's Triton Python-backend model, without Triton: everything serve/triton_python_model.py
(the model.py rec.serve.triton stages) does, as plain Python on numpy and torch values, so it
runs and is tested in any process, not only inside tritonserver's stub.

    config.py    the staged config's parameters (InstanceConfig), LoadError
    inputs.py    one request's inputs decoded and checked (Inputs, Failure)
    metrics.py   the custom metrics (rec-server's names) over a metric sink
    store.py     the rows of stored tables, read from the embedding store
    updates.py   the update log applied to the model's tables
    instance.py  one model instance: load, the batch probe, scoring a batch of requests

The adapter converts pb_utils values to and from these and gives Triton's metric families
and logger as the sink and the log; nothing here imports triton_python_backend_utils.
"""
