// grpc-pingpong: the smallest gRPC server that answers KServe v2's ServerLive, built against the
// same gRPC as rec-server. `rec-bench grpc --call live` against it measures the floor a gRPC
// server on this machine can reach, which rec-server's own ServerLive is compared with
// (benchmarks/grpc_floor.py). The async server also answers ModelInfer at once with zero scores,
// so `rec-bench grpc --call infer` measures the floor of a call of ModelInfer's size.
//
//   grpc-pingpong --port P [--api async|callback] [--absl-deadlock-detection on|off]
//
// async: one completion queue polled by one thread, one call requested at a time, the way
// gRPC's own async examples (and rec-server) drive it. callback: gRPC's callback API, with the
// library's own threads. --absl-deadlock-detection off turns off what Debian's abseil (built
// without NDEBUG) does on every Mutex lock, gRPC's included: a deadlock-cycle check (a nested
// lock pair costs 147 ns with it, 25 without, measured here). It moved ServerLive's p50 by 2 %.
#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

#include "grpc_service.grpc.pb.h"

namespace {

using Svc = inference::GRPCInferenceService;

class LiveCallback final : public Svc::CallbackService {
  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx,
                                       const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* response) override {
    response->set_live(true);
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

// A request for the next call of one method on the queue: the tag is the call, whose Proceed
// answers it (and requests the next) or, once answered, deletes it.
class Call {
 public:
  virtual ~Call() = default;
  virtual void Proceed(bool ok) = 0;
};

template <class Req, class Resp>
class UnaryCall final : public Call {
 public:
  using Writer = grpc::ServerAsyncResponseWriter<Resp>;
  using RequestFn = void (Svc::AsyncService::*)(grpc::ServerContext*, Req*, Writer*,
                                                grpc::CompletionQueue*,
                                                grpc::ServerCompletionQueue*, void*);
  using AnswerFn = void (*)(const Req&, Resp*);

  static void Listen(Svc::AsyncService* service, grpc::ServerCompletionQueue* cq, RequestFn request,
                     AnswerFn answer) {
    auto* call = new UnaryCall(service, cq, request, answer);
    (service->*request)(&call->ctx_, &call->request_, &call->writer_, cq, cq, call);
  }

  void Proceed(bool ok) override {
    if (!ok || answered_) {  // answered, or the queue is shutting down
      delete this;
      return;
    }
    // A new call arrived: request the next one before answering this.
    Listen(service_, cq_, request_fn_, answer_);
    answered_ = true;
    answer_(request_, &response_);
    writer_.Finish(response_, grpc::Status::OK, this);
  }

 private:
  UnaryCall(Svc::AsyncService* service, grpc::ServerCompletionQueue* cq, RequestFn request,
            AnswerFn answer)
      : service_(service), cq_(cq), request_fn_(request), answer_(answer) {}

  Svc::AsyncService* service_;
  grpc::ServerCompletionQueue* cq_;
  RequestFn request_fn_;
  AnswerFn answer_;
  grpc::ServerContext ctx_;
  Req request_;
  Resp response_;
  Writer writer_{&ctx_};
  bool answered_ = false;
};

void AnswerLive(const inference::ServerLiveRequest&, inference::ServerLiveResponse* response) {
  response->set_live(true);
}

// ModelInfer answered at once with one FP32 score per row (zeros), the shape of rec's answer:
// what a call of ModelInfer's size costs in gRPC itself, without a model or a thread hop.
int64_t infer_delay_us = 0;  // --infer-delay-us

void AnswerInfer(const inference::ModelInferRequest& request,
                 inference::ModelInferResponse* response) {
  // A stand-in for a model's time, spent on the polling thread: what a late answer costs gRPC
  // beyond the delay itself (the client has gone to sleep, the write is a poll cycle of its own).
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(infer_delay_us);
  while (std::chrono::steady_clock::now() < until) {
  }
  int64_t rows = request.inputs_size() > 0 && request.inputs(0).shape_size() > 0
                     ? request.inputs(0).shape(0)
                     : 1;
  response->set_model_name(request.model_name());
  response->set_model_version("1");
  response->set_id(request.id());
  auto* out = response->add_outputs();
  out->set_name("scores");
  out->set_datatype("FP32");
  out->add_shape(rows);
  out->add_shape(1);
  response->add_raw_output_contents(std::string(static_cast<size_t>(rows) * sizeof(float), '\0'));
}

void ServeAsync(Svc::AsyncService* service, grpc::ServerCompletionQueue* cq) {
  UnaryCall<inference::ServerLiveRequest, inference::ServerLiveResponse>::Listen(
      service, cq, &Svc::AsyncService::RequestServerLive, AnswerLive);
  UnaryCall<inference::ModelInferRequest, inference::ModelInferResponse>::Listen(
      service, cq, &Svc::AsyncService::RequestModelInfer, AnswerInfer);
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) static_cast<Call*>(tag)->Proceed(ok);
}

}  // namespace

int main(int argc, char** argv) {
  std::string port, api = "async", detection = "on";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--port") {
      port = argv[i + 1];
    } else if (flag == "--api") {
      api = argv[i + 1];
    } else if (flag == "--absl-deadlock-detection") {
      detection = argv[i + 1];
    } else if (flag == "--infer-delay-us") {
      infer_delay_us = std::stoll(argv[i + 1]);
    } else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (port.empty() || (api != "async" && api != "callback") ||
      (detection != "on" && detection != "off")) {
    std::cerr << "usage: grpc-pingpong --port P [--api async|callback] "
                 "[--absl-deadlock-detection on|off] [--infer-delay-us N]\n";
    return 2;
  }
  if (detection == "off") absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  grpc::ServerBuilder builder;
  int bound = 0;  // --port 0: the kernel picks one, printed below
  builder.AddListeningPort("127.0.0.1:" + port, grpc::InsecureServerCredentials(), &bound);
  Svc::AsyncService async_service;
  LiveCallback callback_service;
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  if (api == "async") {
    builder.RegisterService(&async_service);
    cq = builder.AddCompletionQueue();
  } else {
    builder.RegisterService(&callback_service);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    std::cerr << "grpc-pingpong: cannot listen on 127.0.0.1:" << port << "\n";
    return 1;
  }
  std::cout << "listening on 127.0.0.1:" << bound << " (" << api << ")" << std::endl;
  if (api == "async") {
    ServeAsync(&async_service, cq.get());
  } else {
    server->Wait();
  }
  return 0;
}
