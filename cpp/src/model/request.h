// InferRequest and the three pure steps around a forward pass: validate one request against the
// model spec, concatenate validated requests into one batch, and slice the batch's output rows
// back out. Batch-major jagged inputs make concatenation plain: dense and lengths along dim 0,
// values end to end (docs/architecture.md#batching-by-concatenation).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/shared_memory.h"
#include "common/status.h"
#include "common/tensor.h"
#include "model/model_spec.h"
#include "observability/trace.h"

namespace rec {

struct RequestedOutput {
  std::string name;
  bool binary = false;                   // HTTP only: send as binary tensor data
  std::optional<SharedMemorySlice> shm;  // write it there instead of into the response
};

struct InferRequest {
  std::string model_name;
  std::string model_version;  // empty: the served version
  std::string id;
  std::vector<Tensor> inputs;
  std::vector<RequestedOutput> outputs;  // empty: every output
  bool binary_output_default = false;    // HTTP request parameter binary_data_output
  int64_t batch_size = 0;                // set by ValidateRequest
  // Per sparse feature, negative integer tokens of `sparse_strings` (set by ValidateRequest;
  // empty for a request that sends ids), for rec_questionable_ids_total.
  std::vector<int64_t> negative_ids;
  std::shared_ptr<Trace> trace;  // set when this request is sampled for a trace
};

// The input that carries a request's sparse ids as text (BYTES [N], ragged like the values) in
// place of the INT64 values, for a model whose rec.json has a feature_spec.
inline constexpr char kSparseStringsInput[] = "sparse_strings";

// Checks names, dtypes, shapes, byte sizes, batch size and the jagged invariants (lengths >= 0,
// sum(lengths) == number of values). A request may send `sparse_strings` instead of the values:
// they are mapped to ids here (spec.sparse_encodings), so the batcher and the model only ever
// see INT64 ids. On success, inputs are reordered to the spec's order, ragged inputs are
// flattened to 1-D and batch_size is set. Messages name the tensor. A context model's requests
// go to ValidateContextModelRequest (model/context_request.h).
Status ValidateRequest(const ModelSpec& spec, InferRequest* request);

// The inputs a request may carry, for model metadata: the model's, and `sparse_strings` (BYTES
// [-1], ragged) when the model has a feature spec.
std::vector<IoSpec> RequestInputs(const ModelSpec& spec);

// Concatenates validated requests (inputs in spec order) into one batch of inputs (a context
// model's candidate_offsets: ConcatenateOffsets).
std::vector<Tensor> ConcatenateInputs(const ModelSpec& spec,
                                      const std::vector<const InferRequest*>& requests);

// Writes each output the request asked for in shared memory into its slice (before the response
// is encoded; those outputs carry no data in it). InvalidArgument naming one that does not fit.
Status WriteSharedMemoryOutputs(const InferRequest& request, const std::vector<Tensor>& outputs);

// Checks the model's outputs for a batch of `batch_size` rows against the spec.
Status CheckOutputs(const ModelSpec& spec, int64_t batch_size, const std::vector<Tensor>& outputs);

// Rows [begin, begin + rows) of each batch output (each output's dim 0 is the batch).
std::vector<Tensor> SliceOutputs(const std::vector<Tensor>& outputs, int64_t begin, int64_t rows);

// The checks ValidateRequest is made of, shared with model/context_request.cpp. Each message
// names the tensor.
// t's datatype is io's.
Status CheckDtype(const IoSpec& io, const Tensor& t);
// A ragged input's shape is [n]; Triton-style clients' [1, n] is taken as [n] (t's shape set).
Status CheckRaggedShape(Tensor* t);
// t's data has the bytes its shape needs, and FP32 values are finite.
Status CheckData(const Tensor& t);
// lengths >= 0 and sum(lengths) == the number of values (`values_count`, named `values_name`).
Status CheckJagged(const Tensor& lengths, const std::string& values_name, int64_t values_count);
bool HasInput(const InferRequest& r, const std::string& name);
// Takes the BYTES input `strings_name` out of the request's inputs into *strings (*has_strings
// says whether there was one) after checking that the request carries exactly one of it and
// `values_name` (a model with a feature spec), or neither's strings (one without).
Status TakeStrings(const ModelSpec& spec, const std::string& strings_name,
                   const std::string& values_name, InferRequest* r, Tensor* strings,
                   bool* has_strings);
// Maps `strings` to INT64 ids in *values (named `values_name`): checked like the values
// (datatype, shape, count against the lengths), then each token with its feature's encoding.
Status StringsToValues(const std::vector<SparseEncoding>& encodings, Tensor* strings,
                       const Tensor& lengths, const std::string& values_name, Tensor* values,
                       std::vector<int64_t>* negatives);
// Orders r->inputs to the spec's inputs, refusing an unknown or repeated name; an input i with
// pending(i) (strings sent in its values' place, the server's candidate_offsets) may be missing.
Status OrderInputs(const ModelSpec& spec, const std::function<bool(int)>& pending, InferRequest* r);
// Every output the request asks for is one of the spec's.
Status CheckOutputs(const ModelSpec& spec, const InferRequest& r);

}  // namespace rec
