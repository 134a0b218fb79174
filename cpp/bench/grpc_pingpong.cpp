// grpc-pingpong: the smallest gRPC server that answers KServe v2's ServerLive, built against the
// same gRPC as rec-server. `rec-bench grpc --call live` against it measures the floor a gRPC
// server on this machine can reach, which rec-server's own ServerLive is compared with
// (benchmarks/grpc_floor.py).
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

// One ServerLive call in flight on the queue: requested, answered, then replaced by the next.
struct LiveCall {
  grpc::ServerContext ctx;
  inference::ServerLiveRequest request;
  inference::ServerLiveResponse response;
  grpc::ServerAsyncResponseWriter<inference::ServerLiveResponse> writer{&ctx};
  bool answered = false;
};

void ServeAsync(Svc::AsyncService* service, grpc::ServerCompletionQueue* cq) {
  auto* call = new LiveCall;
  service->RequestServerLive(&call->ctx, &call->request, &call->writer, cq, cq, call);
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) {
    auto* done = static_cast<LiveCall*>(tag);
    if (!ok || done->answered) {  // answered, or the queue is shutting down
      delete done;
      continue;
    }
    // A new call arrived: request the next one before answering this.
    auto* next = new LiveCall;
    service->RequestServerLive(&next->ctx, &next->request, &next->writer, cq, cq, next);
    done->answered = true;
    done->response.set_live(true);
    done->writer.Finish(done->response, grpc::Status::OK, done);
  }
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
    } else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (port.empty() || (api != "async" && api != "callback") ||
      (detection != "on" && detection != "off")) {
    std::cerr << "usage: grpc-pingpong --port P [--api async|callback] "
                 "[--absl-deadlock-detection on|off]\n";
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
