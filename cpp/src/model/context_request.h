// A context model's requests (model_spec.h ContextSpec): one context (the user's features) and
// N candidates, or the flat form split into B contexts of one candidate each. Both come out in
// the model's form with the request's own candidate_offsets [R+1] = Fn * (0, N1, N1+N2, ...)
// appended, and batch_size = candidates, so the batcher counts pairs (max_batch_size, preferred
// sizes, the adaptive window) and concatenates requests like any others: the offsets shifted by
// the candidates before them (ConcatenateOffsets).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "model/model_spec.h"
#include "model/request.h"

namespace rec {

// Request-only BYTES inputs in place of context_values / candidate_values.
inline constexpr char kContextStringsInput[] = "context_strings";
inline constexpr char kCandidateStringsInput[] = "candidate_strings";

// Either form: flat and context inputs together are refused (naming the first of each);
// otherwise ValidateContextRequest or SplitFlatRequest.
Status ValidateContextModelRequest(const ModelSpec& spec, InferRequest* request);

// The context form: first the checks tests/data/request_golden.json orders (candidate_offsets
// sent, a context batch other than 1, no candidate, more than max_batch_size), then context inputs
// of batch 1 ([1, Dc], [1, Fc]; values [m] or [1, m]), candidates [N, Dn], [N, Fn] with 1 <= N <=
// max_batch_size, strings encoded with the subsets' encodings (negative-id counts land on the flat
// features), jagged invariants per side.
Status ValidateContextRequest(const ModelSpec& spec, InferRequest* request);

// The flat form (dense_features, sparse_lengths, sparse_values or sparse_strings), validated as
// on a flat model, then split by columns into B contexts of one candidate each.
Status SplitFlatRequest(const ModelSpec& spec, InferRequest* request);

// Validated flat inputs (spec.context.flat's order) as the model's inputs: B contexts of one
// candidate each, offsets included.
std::vector<Tensor> SplitFlatInputs(const ModelSpec& spec, const std::vector<Tensor>& flat);

// The batch's candidate_offsets: each request's offsets shifted by the pairs before it, the
// later requests' leading zeros dropped.
Tensor ConcatenateOffsets(const ModelSpec& spec, const std::vector<const InferRequest*>& requests);

// The inputs a request to a context model may carry, for model metadata: the model's but the
// offsets, the strings inputs with a feature spec, and the flat inputs.
std::vector<IoSpec> ContextRequestInputs(const ModelSpec& spec);

// Context `context` of a batch in the model's form with `count` of its candidates, from its
// `first`, as a request of its own (offsets [0, count * Fn]).
std::vector<Tensor> SliceContext(const ModelSpec& spec, const std::vector<Tensor>& batch,
                                 int64_t context, int64_t first, int64_t count);

// The number of contexts in a batch in the model's form, and the candidates of context `r`:
// [*first, *first + *count).
int64_t ContextCount(const ModelSpec& spec, const std::vector<Tensor>& batch);
void ContextCandidates(const ModelSpec& spec, const std::vector<Tensor>& batch, int64_t r,
                       int64_t* first, int64_t* count);

}  // namespace rec
