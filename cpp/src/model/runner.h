// Runner: one loaded, warmed-up model version. The batcher only sees this interface, so the
// batching unit compiles and is tested without LibTorch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "updates/embedding_tables.h"

namespace rec {

class Runner {
 public:
  virtual ~Runner() = default;
  virtual const std::string& version() const = 0;
  // One forward pass on a batch (inputs in the spec's order); fills the outputs in the spec's
  // order. Safe to call from several threads at once. Never throws.
  virtual Status Run(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) = 0;
  // Run, also saying which embedding watermark the batch was scored at (a runner whose tables
  // take updates holds them still for the pass; others leave it invalid).
  virtual Status RunScored(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs,
                           Watermark* scored_at) {
    *scored_at = Watermark{};
    return Run(inputs, outputs);
  }
  // The unknown ids of ZCH features (read as their table's default row) of this thread's
  // forward passes since the last call, per request column (-1: not a ZCH feature), reset. Call
  // it on the thread that ran them: the op counts per thread (model/torch_model.h).
  virtual void TakeUnknownIds(std::vector<int64_t>* per_column) { per_column->clear(); }
  // The tables the update log writes into, or null when the version cannot take updates.
  virtual std::shared_ptr<EmbeddingTables> tables() const { return nullptr; }
};

}  // namespace rec
