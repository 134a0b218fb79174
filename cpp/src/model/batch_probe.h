// BatchProbe: the load-time check that a model scores a batch exactly as its samples one by one
// on this server's CPU. Export verifies that on its own CPU and stores the request it used in
// rec.json ("batch_probe"); a model carried to another CPU kind is checked again here before it
// serves anything, so a CPU change is never silent.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "model/model_spec.h"
#include "model/runner.h"

namespace rec {

struct BatchProbe {
  bool present = false;       // rec.json claims batch invariance and carries a probe
  std::vector<Tensor> batch;  // the probe request, inputs in the spec's order
  int64_t rows = 0;           // a context model's: candidates
  std::string verified_on;    // the CPU export verified on, for messages
};

// Reads `manifest_path` (a version's rec.json). A missing file, a model not claimed invariant
// (dense.batch_invariant false) or one without "batch_probe" gives present = false; a probe
// that does not match the spec's inputs is InvalidArgument naming the file.
Status ReadBatchProbe(const std::string& manifest_path, const ModelSpec& spec, BatchProbe* probe);

// Row `row` of a batch as its own request (dense and lengths rows, that row's ids).
std::vector<Tensor> SliceRow(const ModelSpec& spec, const std::vector<Tensor>& batch, int64_t row);

// Scores the probe as one batch and row by row (a context model's: request by request, and
// candidate by candidate with its context); *max_diff is the largest absolute difference
// of any score (0 exactly when every score has the same bits).
Status RunBatchProbe(Runner* runner, const ModelSpec& spec, const BatchProbe& probe,
                     double* max_diff);

// /proc/cpuinfo's model name, with "(with AMX)" or "(no AMX)".
std::string CpuDescription();

}  // namespace rec
