// rec-bench's requests to a context model (#61, model_spec.h ContextSpec): one user's context and
// N candidates, sent in the context form or as the flat form of the same pairs (the context
// repeated per candidate, as rec/contract/context.py's repeat pins it), so the two forms' bytes
// and rates compare like for like.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "model/model_spec.h"

namespace rec::bench {

// A context request as a client sends it: one random context (batch 1) and `candidates` random
// candidates, context_* then candidate_* (zero-width ones left out, no candidate_offsets, which
// the server fills); 0-3 ids per bag, ids of any int64 value, as RandomBatch.
std::vector<Tensor> RandomContextRequest(const ModelSpec& spec, int64_t candidates, uint32_t seed);

// The same pairs as a flat request (spec.context.flat's inputs: dense_features, sparse_lengths,
// sparse_values), the context's columns and bags repeated in every row.
std::vector<Tensor> RepeatContext(const ModelSpec& spec, const std::vector<Tensor>& request);

// A request's inputs as the model takes them (for the in-process forward): a context model's
// request of either form through rec-server's own ValidateContextModelRequest (offsets filled,
// a flat one split into contexts of one candidate); a flat model's as they are.
Status ModelInputs(const ModelSpec& spec, std::vector<Tensor> request, std::vector<Tensor>* out);

}  // namespace rec::bench
