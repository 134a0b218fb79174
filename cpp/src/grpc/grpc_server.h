// GrpcServer: serves GrpcApi as inference.GRPCInferenceService on gRPC's completion-queue API.
// Each of `threads` threads polls a completion queue of its own: it reads calls and answers the
// quick ones at once. A ModelInfer (or ModelStreamInfer) answer is started by the batcher's
// thread when the batch finishes, a model load's by a thread of its own; no thread waits on a
// call. Methods the server does not implement answer UNIMPLEMENTED.
//
// Why not the callback API: gRPC 1.51 (Debian 12) runs callback methods on two "nexting" threads
// that take turns polling, plus an executor thread; measured on 2 cores that is ~6 thread switches
// per B = 1 call and a bare ServerLive round trip of ~97 us, against ~68 us with one thread
// polling its own completion queue (cpp/README.md, "gRPC").
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grpc/grpc_api.h"

namespace rec {

struct GrpcServerOptions {
  std::string address;  // host:port; port 0 picks a free one
  int threads = 1;      // completion queues, one polling thread each
  int max_receive_bytes = 64 << 20;
  int64_t busy_poll_us = 0;  // a poller polls its queue this long after each event (busy_poll.h)
};

class GrpcServer {
 public:
  GrpcServer(GrpcApi* api, GrpcServerOptions options);
  ~GrpcServer();
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // Listens and starts the polling threads; `port` is the bound port.
  Status Start(int* port);
  // Stops taking calls; calls in flight may finish until `deadline`, then they are cancelled.
  // Answers from the batchers are still delivered: stop the batchers after this, then Join().
  void Shutdown(std::chrono::system_clock::time_point deadline);
  // Once nothing can start a gRPC operation any more (batchers stopped): stops the completion
  // queues and joins every thread.
  void Join();

  // Internal: the pieces a call needs (defined in grpc_server.cpp).
  class Service;
  struct Queue;
  // Runs `fn` on a thread of its own that Join() waits for (model loads).
  void Spawn(std::function<void()> fn);

 private:
  GrpcApi* api_;
  GrpcServerOptions options_;
  std::unique_ptr<Service> service_;
  std::vector<std::unique_ptr<Queue>> queues_;  // destroyed after the server
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::shared_ptr<void>> methods_;  // what each unary method's calls point to
  std::vector<std::thread> pollers_;
  std::mutex spawn_mu_;
  std::vector<std::thread> spawned_;
  bool joined_ = false;
};

}  // namespace rec
