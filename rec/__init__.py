"""rec: train sharded TorchRec models, export them quantized, serve them fast."""

__version__ = "0.1.0"
