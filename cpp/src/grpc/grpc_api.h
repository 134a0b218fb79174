// GrpcApi: what inference.GRPCInferenceService answers, apart from how calls arrive (GrpcServer).
// Inputs come from raw_input_contents (or typed contents); outputs go to raw_output_contents, the
// only place the stock client reads.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "grpc_service.grpc.pb.h"
#include "model/request.h"
#include "observability/trace.h"
#include "serving/admission.h"
#include "serving/model_manager.h"

namespace rec {

// Converts a protocol request into an InferRequest (not yet validated against the model). With
// `take_raw` (in's own raw_input_contents, mutable) the tensors take its bytes instead of a copy.
Status DecodeGrpcRequest(const inference::ModelInferRequest& in, InferRequest* out,
                         google::protobuf::RepeatedPtrField<std::string>* take_raw = nullptr);
// Fills `out` from a finished request's outputs, honouring the requested output names.
void EncodeGrpcResponse(const InferRequest& meta, const std::string& version,
                        std::vector<Tensor>& outputs, inference::ModelInferResponse* out);
grpc::Status ToGrpc(const Status& status);

class GrpcApi {
 public:
  GrpcApi(ModelManager* models, Admission* admission, bool enable_model_control);

  // Quick answers: run on the thread that read the call.
  grpc::Status ServerLive(const inference::ServerLiveRequest&,
                          inference::ServerLiveResponse* response);
  grpc::Status ServerReady(const inference::ServerReadyRequest&,
                           inference::ServerReadyResponse* response);
  grpc::Status ModelReady(const inference::ModelReadyRequest& request,
                          inference::ModelReadyResponse* response);
  grpc::Status ServerMetadata(const inference::ServerMetadataRequest&,
                              inference::ServerMetadataResponse* response);
  grpc::Status ModelMetadata(const inference::ModelMetadataRequest& request,
                             inference::ModelMetadataResponse* response);
  grpc::Status ModelConfig(const inference::ModelConfigRequest& request,
                           inference::ModelConfigResponse* response);
  grpc::Status ModelStatistics(const inference::ModelStatisticsRequest& request,
                               inference::ModelStatisticsResponse* response);
  // Reads and changes the log settings (Triton's logging extension), as GET/POST /v2/logging.
  grpc::Status LogSettings(const inference::LogSettingsRequest& request,
                           inference::LogSettingsResponse* response);
  // Reads and changes the trace settings (Triton's trace extension), as /v2/trace/setting.
  grpc::Status TraceSetting(const inference::TraceSettingRequest& request,
                            inference::TraceSettingResponse* response);
  // Triton's system shared memory extension, as /v2/systemsharedmemory/...
  grpc::Status SystemSharedMemoryRegister(const inference::SystemSharedMemoryRegisterRequest& r,
                                          inference::SystemSharedMemoryRegisterResponse*);
  grpc::Status SystemSharedMemoryUnregister(
      const inference::SystemSharedMemoryUnregisterRequest& request,
      inference::SystemSharedMemoryUnregisterResponse*);
  grpc::Status SystemSharedMemoryStatus(const inference::SystemSharedMemoryStatusRequest& request,
                                        inference::SystemSharedMemoryStatusResponse* response);
  grpc::Status RepositoryIndex(const inference::RepositoryIndexRequest&,
                               inference::RepositoryIndexResponse* response);
  // Blocks for a model load and warm-up: the caller runs it on a thread of its own.
  grpc::Status RepositoryModelLoad(const inference::RepositoryModelLoadRequest& request,
                                   inference::RepositoryModelLoadResponse*);

  // Decodes, validates and queues `request` (its raw inputs are moved out); fills `response`
  // and calls `done` exactly once: at once on an error, else on the batcher's thread. A traced
  // request's trace comes with it, stamped up to REQUEST_END: the caller stamps the send and
  // finishes it (Tracer::Finish).
  using InferDone = std::function<void(const Status&, std::shared_ptr<Trace>)>;
  void ModelInfer(inference::ModelInferRequest* request, inference::ModelInferResponse* response,
                  InferDone done);

 private:
  Status FindModel(const std::string& name, const std::string& version, ModelEntry** entry);

  ModelManager* models_;
  Admission* admission_;
  bool enable_model_control_;
};

}  // namespace rec
