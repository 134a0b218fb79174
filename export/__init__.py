"""rec.export: sharded checkpoint -> quantized TorchScript / ONNX model repository (Contract 2)."""
