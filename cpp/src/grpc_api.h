// GrpcApi: inference.GRPCInferenceService. ModelInfer uses gRPC's callback API so a request
// waiting in the batcher holds no thread; ModelStreamInfer reads on its handler thread and
// writes each response when its batch finishes. Inputs come from raw_input_contents (or typed
// contents); outputs go to raw_output_contents, the only place the stock client reads.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "grpc_service.grpc.pb.h"
#include "model_manager.h"
#include "request.h"

namespace rec {

// Converts a protocol request into an InferRequest (not yet validated against the model).
Status DecodeGrpcRequest(const inference::ModelInferRequest& in, InferRequest* out);
// Fills `out` from a finished request's outputs, honouring the requested output names.
void EncodeGrpcResponse(const InferRequest& meta, const std::string& version,
                        std::vector<Tensor>& outputs, inference::ModelInferResponse* out);
grpc::Status ToGrpc(const Status& status);

using GrpcServiceBase = inference::GRPCInferenceService::WithCallbackMethod_ModelInfer<
    inference::GRPCInferenceService::Service>;

class GrpcApi final : public GrpcServiceBase {
 public:
  GrpcApi(ModelManager* models, bool enable_model_control);
  void SetShuttingDown() { shutting_down_ = true; }

  grpc::Status ServerLive(grpc::ServerContext*, const inference::ServerLiveRequest*,
                          inference::ServerLiveResponse* response) override;
  grpc::Status ServerReady(grpc::ServerContext*, const inference::ServerReadyRequest*,
                           inference::ServerReadyResponse* response) override;
  grpc::Status ModelReady(grpc::ServerContext*, const inference::ModelReadyRequest* request,
                          inference::ModelReadyResponse* response) override;
  grpc::Status ServerMetadata(grpc::ServerContext*, const inference::ServerMetadataRequest*,
                              inference::ServerMetadataResponse* response) override;
  grpc::Status ModelMetadata(grpc::ServerContext*, const inference::ModelMetadataRequest* request,
                             inference::ModelMetadataResponse* response) override;
  grpc::Status ModelConfig(grpc::ServerContext*, const inference::ModelConfigRequest* request,
                           inference::ModelConfigResponse* response) override;
  grpc::Status ModelStatistics(grpc::ServerContext*,
                               const inference::ModelStatisticsRequest* request,
                               inference::ModelStatisticsResponse* response) override;
  grpc::Status RepositoryIndex(grpc::ServerContext*, const inference::RepositoryIndexRequest*,
                               inference::RepositoryIndexResponse* response) override;
  grpc::Status RepositoryModelLoad(grpc::ServerContext*,
                                   const inference::RepositoryModelLoadRequest* request,
                                   inference::RepositoryModelLoadResponse*) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override;
  grpc::Status ModelStreamInfer(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<inference::ModelStreamInferResponse, inference::ModelInferRequest>*
          stream) override;

 private:
  // Decodes, validates and queues `request`; `done` is called exactly once, possibly at once.
  void StartInfer(const inference::ModelInferRequest& request,
                  inference::ModelInferResponse* response, std::function<void(const Status&)> done);
  Status FindModel(const std::string& name, const std::string& version, ModelEntry** entry);

  ModelManager* models_;
  bool enable_model_control_;
  std::atomic<bool> shutting_down_{false};
};

}  // namespace rec
