#include "serving/admission.h"

#include "observability/trace.h"

namespace rec {
namespace {

// What a response needs of its request once the request itself has moved into the batcher.
InferRequest ResponseMeta(const InferRequest& request) {
  InferRequest meta;
  meta.model_name = request.model_name;
  meta.id = request.id;
  meta.outputs = request.outputs;
  meta.binary_output_default = request.binary_output_default;
  meta.trace = request.trace;
  return meta;
}

}  // namespace

Status Admission::Open() const {
  if (shutting_down_) return Unavailable("server is shutting down");
  return Status::Ok();
}

void Admission::CountRefusal(ModelEntry* entry) { entry->stats()->RecordFailure(0); }

Status Admission::Admit(ModelEntry* entry, InferRequest&& request, uint64_t request_start,
                        const Stamps& stamps, Reply reply) {
  auto refuse = [&](Status st) {
    CountRefusal(entry);
    return st;
  };
  const std::string& version = request.model_version;
  auto runner = entry->Current();
  if (!version.empty() && !(runner && runner->version() == version)) {
    return refuse(
        NotFound("model '" + entry->spec().name + "' version " + version + " is not served"));
  }
  if (!runner) return refuse(entry->NotLoaded());
  Status st = ValidateRequest(entry->spec(), &request);
  if (!st.ok()) return refuse(st);
  for (size_t f = 0; f < request.negative_ids.size(); ++f) {
    if (request.negative_ids[f] > 0) {
      entry->stats()->CountNegativeIds(entry->spec().sparse_encodings[f].feature,
                                       static_cast<uint64_t>(request.negative_ids[f]));
    }
  }
  if ((request.trace = Tracer::Get().Start(request.model_name))) {
    for (const auto& [name, ns] : stamps) request.trace->Stamp(name, ns);
    request.trace->Stamp("REQUEST_START", request_start);
  }
  auto done = [meta = ResponseMeta(request), reply = std::move(reply)](InferResult&& result) {
    if (result.status.ok()) result.status = WriteSharedMemoryOutputs(meta, result.outputs);
    reply(meta, std::move(result));
  };
  st = entry->batcher().Enqueue(std::move(request), std::move(done));
  return st.ok() ? st : refuse(st);
}

}  // namespace rec
