// rec-server: wires the units together. Startup fails with one clear line; SIGTERM/SIGINT drain.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "common/log.h"
#include "common/malloc_settings.h"
#include "grpc/grpc_api.h"
#include "grpc/grpc_server.h"
#include "http/http_api.h"
#include "http/http_server.h"
#include "model/torch_model.h"
#include "observability/metrics.h"
#include "observability/trace.h"
#include "server/options.h"
#include "serving/model_manager.h"

namespace {

using rec::Status;

int Fail(const Status& st) {
  rec::LogError("startup failed: " + st.message());
  return 1;
}

// Stops accepting, then lets every accepted request finish: protocol servers first (the batchers
// still run and answer them), then the batchers.
void Drain(rec::HttpServer* http, rec::GrpcServer* grpc_server, rec::ModelManager* models) {
  http->StopAccepting();
  grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  http->Stop(10000);
  models->Shutdown();
  grpc_server->Join();  // no batcher is left to answer a gRPC call
}

void CountClose(rec::HttpCloseCounts* closes, rec::HttpCloseReason reason) {
  switch (reason) {
    case rec::HttpCloseReason::kIdleTimeout:
      closes->idle_timeout.fetch_add(1, std::memory_order_relaxed);
      break;
    case rec::HttpCloseReason::kRequestTimeout:
      closes->request_timeout.fetch_add(1, std::memory_order_relaxed);
      break;
    case rec::HttpCloseReason::kConnectionLimit:
      closes->connection_limit.fetch_add(1, std::memory_order_relaxed);
      break;
  }
}

// Blocks SIGTERM and SIGINT in every thread started after this, so sigwait() in main sees them.
sigset_t BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return set;
}

int Serve(const rec::ServerOptions& o) {
  sigset_t signals = BlockShutdownSignals();
  std::string fbgemm_dir = o.fbgemm_lib_dir.empty() ? rec::DefaultFbgemmDir() : o.fbgemm_lib_dir;
  int loaded = 0;
  Status st = rec::LoadFbgemmLibraries(fbgemm_dir, &loaded);
  if (!st.ok()) return Fail(st);
  rec::LogInfo("starting: loaded " + std::to_string(loaded) + " fbgemm_gpu libraries from '" +
               fbgemm_dir + "'");
  std::string ops = o.ops_library.empty() ? rec::DefaultOpsLibrary() : o.ops_library;
  st = rec::LoadOpsLibrary(ops);
  if (!st.ok()) return Fail(st);
  if (!ops.empty()) rec::LogInfo("starting: loaded rec's op library '" + ops + "'");
  rec::ConfigureTorchThreads(o.intra_op_threads);

  rec::Metrics metrics;
  rec::ManagerOptions mo;
  mo.repository = o.model_repository;
  mo.model_name = o.model;
  mo.pinned_version = o.model_version;
  mo.allow_batch_variant = o.allow_batch_variant;
  mo.updates_url = o.updates;
  mo.updates_max_behind_ms = static_cast<int64_t>(o.updates_max_behind_s) * 1000;
  mo.store_cache_bytes = o.store_cache_bytes;
  mo.batcher.executor_threads = o.executor_threads;
  mo.batcher.max_queue_size = static_cast<size_t>(o.max_queue_size);
  mo.batcher.request_timeout_us = o.request_timeout_ms * 1000;
  mo.batcher.busy_poll_us = o.busy_poll_us;
  mo.batcher.adaptive_window = o.adaptive_batch_window;
  rec::ModelManager models(mo, &metrics);
  st = models.LoadAll();
  if (!st.ok()) return Fail(st);

  rec::ApiOptions ao{o.enable_model_control, static_cast<size_t>(o.max_body_bytes)};
  rec::Admission admission;
  rec::HttpApi api(&models, &admission, &metrics, ao);
  rec::HttpServerOptions ho;
  ho.host = o.host;
  ho.port = o.http_port;
  ho.io_threads = o.http_threads;
  ho.max_body_bytes = ao.max_body_bytes;
  ho.idle_timeout_s = o.http_idle_timeout_s;
  ho.request_timeout_s = o.http_request_timeout_s;
  ho.max_connections = o.http_max_connections;
  ho.busy_poll_us = o.busy_poll_us;
  ho.on_close = [closes = metrics.http_closes()](rec::HttpCloseReason reason) {
    CountClose(closes, reason);
  };
  rec::HttpServerOptions metrics_ho = ho;  // the metrics port gets the same connection limits
  metrics_ho.port = o.metrics_port;
  metrics_ho.io_threads = 1;
  metrics_ho.max_body_bytes = 1 << 16;
  metrics_ho.busy_poll_us = 0;  // nothing on it is latency-critical
  rec::HttpServer http(ho, [&api](rec::HttpRequest&& r, rec::HttpResponder d) {
    api.Handle(std::move(r), std::move(d));
  });
  rec::HttpServer metrics_http(metrics_ho, [&api](rec::HttpRequest&& r, rec::HttpResponder d) {
    api.HandleMetrics(std::move(r), std::move(d));
  });
  if (!(st = http.Start()).ok() || !(st = metrics_http.Start()).ok()) return Fail(st);
  rec::GrpcApi grpc_api(&models, &admission, o.enable_model_control);
  rec::GrpcServerOptions go;
  go.address = o.host + ":" + std::to_string(o.grpc_port);
  go.threads = o.grpc_threads;
  go.busy_poll_us = o.busy_poll_us;
  go.max_receive_bytes = static_cast<int>(std::min<int64_t>(o.max_body_bytes, INT32_MAX));
  rec::GrpcServer grpc_server(&grpc_api, go);
  int grpc_port = 0;
  if (!(st = grpc_server.Start(&grpc_port)).ok()) return Fail(st);
  models.StartPolling(o.poll_repository_s);

  std::string where = "http=" + o.host + ":" + std::to_string(http.port()) + " grpc=" + o.host +
                      ":" + std::to_string(grpc_port) + " metrics=" + o.host + ":" +
                      std::to_string(metrics_http.port());
  rec::LogInfo("serving " + where);
  std::printf("rec-server ready %s\n", where.c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  rec::LogInfo(std::string("shutting down on ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") +
               ": finishing in-flight requests");
  admission.SetShuttingDown();  // readiness turns 503 / false, inference UNAVAILABLE
  Drain(&http, &grpc_server, &models);
  rec::Tracer::Get().Flush();  // every traced request has been answered
  metrics_http.Stop(0);
  rec::LogInfo("shutdown complete (" + metrics.Summary() + ")");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  rec::KeepFreedMemory();
  rec::ServerOptions options;
  Status st = rec::ParseOptions(argc, argv, &options);
  if (options.help) {
    std::cout << rec::UsageText(rec::DefaultFbgemmDir(), rec::DefaultOpsLibrary());
    return 0;
  }
  if (!st.ok()) {
    std::cerr << "rec-server: " << st.message() << "\n";
    return 2;
  }
  st = rec::UpdateLogSettings({{"log_verbose_level", static_cast<uint32_t>(options.log_verbose)},
                               {"log_file", options.log_file}},
                              /*from_network=*/false);
  if (!st.ok()) {
    std::cerr << "rec-server: " << st.message() << "\n";
    return 2;
  }
  rec::Tracer::Get().Configure(options.trace_file);
  return Serve(options);
}
