"""rec.train: distributed training with TorchRec's DistributedModelParallel (Contract 1 writer)."""
