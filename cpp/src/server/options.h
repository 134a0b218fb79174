// Command-line flags of rec-server.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace rec {

struct ServerOptions {
  std::string model_repository;
  std::string model;  // empty: every TorchScript model in the repository
  int64_t model_version = 0;
  std::string host = "127.0.0.1";
  int http_port = 8000;
  int grpc_port = 8001;
  int metrics_port = 8002;
  int http_threads = 1;
  int grpc_threads = 1;
  int executor_threads = 0;  // 0: the model's instance_group count
  int intra_op_threads = 1;
  int64_t busy_poll_us = 2000;  // executors and I/O threads poll this long before sleeping
  int64_t max_queue_size = 1024;
  bool adaptive_batch_window = true;  // --batch-window adaptive (default) or fixed
  int64_t request_timeout_ms = 0;
  int64_t max_body_bytes = 64 << 20;
  int http_idle_timeout_s = 60;     // 0: never
  int http_request_timeout_s = 30;  // 0: never
  int http_max_connections = 1024;  // 0: unlimited
  std::string fbgemm_lib_dir;       // empty: the fbgemm_gpu package found at build time
  std::string ops_library;          // empty: rec's op library found at build time
  bool enable_model_control = false;
  bool allow_batch_variant = false;
  int poll_repository_s = 0;
  std::string updates;           // the update log; empty: rec.json's "updates.url"; "none": no log
  int updates_max_behind_s = 0;  // not ready past this far behind the log; 0: no bound
  int64_t store_cache_bytes = int64_t{256} << 20;  // the embedding store's row cache per version
  int log_verbose = 0;     // the starting log_verbose_level (POST /v2/logging changes it)
  std::string log_file;    // empty: stderr
  std::string trace_file;  // empty: tracing cannot be turned on
  bool help = false;
};

// Parses argv; on error returns InvalidArgument naming the flag.
Status ParseOptions(int argc, char** argv, ServerOptions* options);
std::string UsageText(const std::string& default_fbgemm_dir, const std::string& default_ops);

}  // namespace rec
