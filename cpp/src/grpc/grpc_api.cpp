#include "grpc/grpc_api.h"

#include "common/log.h"
#include "common/version.h"
#include "observability/metrics.h"
#include "observability/trace.h"

namespace rec {
namespace {

void FillDuration(uint64_t count, uint64_t ns, inference::StatisticDuration* d) {
  d->set_count(count);
  d->set_ns(ns);
}

void FillStats(ModelEntry* e, inference::ModelStatistics* out) {
  const ModelStats& s = *e->stats();
  auto runner = e->Current();
  uint64_t execs = s.execution_count.load();
  out->set_name(e->spec().name);
  out->set_version(runner ? runner->version() : "");
  out->set_last_inference(s.last_inference_ms.load());
  out->set_inference_count(s.inference_count.load());
  out->set_execution_count(execs);
  auto* is = out->mutable_inference_stats();
  FillDuration(s.success_count.load(), s.success_ns.load(), is->mutable_success());
  FillDuration(s.fail_count.load(), s.fail_ns.load(), is->mutable_fail());
  FillDuration(s.queue_count.load(), s.queue_ns.load(), is->mutable_queue());
  FillDuration(execs, s.compute_input_ns.load(), is->mutable_compute_input());
  FillDuration(execs, s.compute_infer_ns.load(), is->mutable_compute_infer());
  FillDuration(execs, s.compute_output_ns.load(), is->mutable_compute_output());
}

void FillTensorMetadata(const IoSpec& io, inference::ModelMetadataResponse::TensorMetadata* t) {
  t->set_name(io.name);
  t->set_datatype(DataTypeName(io.dtype));
  t->add_shape(-1);
  if (!io.ragged) {
    for (int64_t d : io.dims) t->add_shape(d);
  }
}

}  // namespace

GrpcApi::GrpcApi(ModelManager* models, Admission* admission, bool enable_model_control)
    : models_(models), admission_(admission), enable_model_control_(enable_model_control) {}

Status GrpcApi::FindModel(const std::string& name, const std::string& version, ModelEntry** entry) {
  *entry = models_->Find(name);
  if (*entry == nullptr) return NotFound("unknown model '" + name + "'");
  auto runner = (*entry)->Current();
  if (!version.empty() && !(runner && runner->version() == version)) {
    return NotFound("model '" + name + "' version " + version + " is not served");
  }
  return Status::Ok();
}

grpc::Status GrpcApi::ServerLive(const inference::ServerLiveRequest&,
                                 inference::ServerLiveResponse* response) {
  response->set_live(true);
  return grpc::Status::OK;
}

grpc::Status GrpcApi::ServerReady(const inference::ServerReadyRequest&,
                                  inference::ServerReadyResponse* response) {
  bool ready = !admission_->shutting_down();
  for (ModelEntry* e : models_->All()) ready = ready && e->Ready();
  response->set_ready(ready);
  return grpc::Status::OK;
}

grpc::Status GrpcApi::ModelReady(const inference::ModelReadyRequest& request,
                                 inference::ModelReadyResponse* response) {
  ModelEntry* e = nullptr;
  Status st = FindModel(request.name(), request.version(), &e);
  response->set_ready(st.ok() && e->Ready() && !admission_->shutting_down());
  return grpc::Status::OK;
}

grpc::Status GrpcApi::ServerMetadata(const inference::ServerMetadataRequest&,
                                     inference::ServerMetadataResponse* response) {
  response->set_name(kServerName);
  response->set_version(kServerVersion);
  for (const char* ext : kServerExtensions) response->add_extensions(ext);
  return grpc::Status::OK;
}

grpc::Status GrpcApi::LogSettings(const inference::LogSettingsRequest& request,
                                  inference::LogSettingsResponse* response) {
  rec::LogSettings updates;
  for (const auto& [name, v] : request.settings()) {
    using V = inference::LogSettingsRequest::SettingValue;
    switch (v.parameter_choice_case()) {
      case V::kBoolParam:
        updates.emplace_back(name, v.bool_param());
        break;
      case V::kUint32Param:
        updates.emplace_back(name, v.uint32_param());
        break;
      case V::kStringParam:
        updates.emplace_back(name, v.string_param());
        break;
      default:
        return ToGrpc(InvalidArgument("log setting '" + name + "' has no value"));
    }
  }
  Status st = UpdateLogSettings(updates, /*from_network=*/true);
  if (!st.ok()) return ToGrpc(st);
  auto* out = response->mutable_settings();
  for (const auto& [name, value] : CurrentLogSettings()) {
    auto& setting = (*out)[name];
    if (const bool* b = std::get_if<bool>(&value)) setting.set_bool_param(*b);
    if (const uint32_t* u = std::get_if<uint32_t>(&value)) setting.set_uint32_param(*u);
    if (const std::string* s = std::get_if<std::string>(&value)) setting.set_string_param(*s);
  }
  return grpc::Status::OK;
}

grpc::Status GrpcApi::TraceSetting(const inference::TraceSettingRequest& request,
                                   inference::TraceSettingResponse* response) {
  const std::string& model = request.model_name();
  if (!model.empty() && models_->Find(model) == nullptr) {
    return ToGrpc(NotFound("unknown model '" + model + "'"));
  }
  TraceUpdates updates;
  for (const auto& [name, v] : request.settings()) {
    if (v.value().empty()) {
      updates.emplace_back(name, std::nullopt);
    } else {
      updates.emplace_back(name, std::vector<std::string>(v.value().begin(), v.value().end()));
    }
  }
  Status st = Tracer::Get().Update(model, updates);
  if (!st.ok()) return ToGrpc(st);
  auto* out = response->mutable_settings();
  for (const auto& [name, values] : Tracer::Get().Settings(model)) {
    for (const std::string& value : values) (*out)[name].add_value(value);
  }
  return grpc::Status::OK;
}

grpc::Status GrpcApi::SystemSharedMemoryRegister(
    const inference::SystemSharedMemoryRegisterRequest& request,
    inference::SystemSharedMemoryRegisterResponse*) {
  return ToGrpc(SharedMemoryRegistry::Get().Register(request.name(), request.key(),
                                                     request.offset(), request.byte_size()));
}

grpc::Status GrpcApi::SystemSharedMemoryUnregister(
    const inference::SystemSharedMemoryUnregisterRequest& request,
    inference::SystemSharedMemoryUnregisterResponse*) {
  return ToGrpc(SharedMemoryRegistry::Get().Unregister(request.name()));
}

grpc::Status GrpcApi::SystemSharedMemoryStatus(
    const inference::SystemSharedMemoryStatusRequest& request,
    inference::SystemSharedMemoryStatusResponse* response) {
  std::vector<std::shared_ptr<const SharedMemoryRegion>> regions;
  Status st = SharedMemoryRegistry::Get().List(request.name(), &regions);
  if (!st.ok()) return ToGrpc(st);
  for (const auto& r : regions) {
    auto& out = (*response->mutable_regions())[r->name];
    out.set_name(r->name);
    out.set_key(r->key);
    out.set_offset(r->offset);
    out.set_byte_size(r->byte_size);
  }
  return grpc::Status::OK;
}

grpc::Status GrpcApi::ModelMetadata(const inference::ModelMetadataRequest& request,
                                    inference::ModelMetadataResponse* response) {
  ModelEntry* e = nullptr;
  Status st = FindModel(request.name(), request.version(), &e);
  if (!st.ok()) return ToGrpc(st);
  response->set_name(e->spec().name);
  if (auto runner = e->Current()) response->add_versions(runner->version());
  response->set_platform(e->spec().platform);
  for (const IoSpec& io : RequestInputs(e->spec())) FillTensorMetadata(io, response->add_inputs());
  for (const IoSpec& io : e->spec().outputs) FillTensorMetadata(io, response->add_outputs());
  return grpc::Status::OK;
}

grpc::Status GrpcApi::ModelConfig(const inference::ModelConfigRequest& request,
                                  inference::ModelConfigResponse* response) {
  ModelEntry* e = nullptr;
  Status st = FindModel(request.name(), request.version(), &e);
  if (!st.ok()) return ToGrpc(st);
  *response->mutable_config() = *e->spec().config;
  return grpc::Status::OK;
}

grpc::Status GrpcApi::ModelStatistics(const inference::ModelStatisticsRequest& request,
                                      inference::ModelStatisticsResponse* response) {
  if (request.name().empty()) {
    for (ModelEntry* e : models_->All()) FillStats(e, response->add_model_stats());
    return grpc::Status::OK;
  }
  ModelEntry* e = nullptr;
  Status st = FindModel(request.name(), request.version(), &e);
  if (!st.ok()) return ToGrpc(st);
  FillStats(e, response->add_model_stats());
  return grpc::Status::OK;
}

grpc::Status GrpcApi::RepositoryIndex(const inference::RepositoryIndexRequest&,
                                      inference::RepositoryIndexResponse* response) {
  for (ModelEntry* e : models_->All()) {
    auto* m = response->add_models();
    auto runner = e->Current();
    m->set_name(e->spec().name);
    m->set_version(runner ? runner->version() : "");
    m->set_state(runner ? "READY" : "UNAVAILABLE");
    if (!runner) m->set_reason(e->LoadError());
  }
  return grpc::Status::OK;
}

grpc::Status GrpcApi::RepositoryModelLoad(const inference::RepositoryModelLoadRequest& request,
                                          inference::RepositoryModelLoadResponse*) {
  if (!enable_model_control_) {  // UNAVAILABLE, as Triton answers without model control
    return ToGrpc(Unavailable(
        "explicit model load / unload is not allowed; start with --enable-model-control"));
  }
  return ToGrpc(models_->Reload(request.model_name()));
}

void GrpcApi::ModelInfer(inference::ModelInferRequest* request,
                         inference::ModelInferResponse* response, InferDone done) {
  // gRPC's own Shutdown() refuses new calls too, but not those already read.
  Status st = admission_->Open();
  if (!st.ok()) return done(st, nullptr);
  const uint64_t request_start = NowNs();
  ModelEntry* e = nullptr;
  st = FindModel(request->model_name(), request->model_version(), &e);
  if (!st.ok()) return done(st, nullptr);
  // The tensors take the request's raw bytes instead of copying them (a B = 512 request is
  // hundreds of KB); the request is not read again.
  InferRequest r;
  st = DecodeGrpcRequest(*request, &r, request->mutable_raw_input_contents());
  if (!st.ok()) {
    Admission::CountRefusal(e);
    return done(st, nullptr);
  }
  auto reply = [response, done](const InferRequest& meta, InferResult&& result) {
    if (result.status.ok()) {
      EncodeGrpcResponse(meta, result.model_version, result.outputs, response);
      for (const auto& [k, v] : WatermarkParameters(result.watermark)) {
        (*response->mutable_parameters())[k].set_int64_param(v);
      }
    }
    if (meta.trace) meta.trace->Stamp("REQUEST_END");
    done(result.status, meta.trace);
  };
  st = admission_->Admit(e, std::move(r), request_start, {{"GRPC_WAITREAD_END", request_start}},
                         std::move(reply));
  if (!st.ok()) done(st, nullptr);
}

}  // namespace rec
