#include "server/options.h"

#include <cstdlib>
#include <functional>
#include <map>

#include "contract/update_record.h"

namespace rec {
namespace {

Status ParseInt(const std::string& flag, const std::string& text, int64_t min, int64_t max,
                int64_t* out) {
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < min || v > max) {
    return InvalidArgument(flag + " expects an integer in [" + std::to_string(min) + ", " +
                           std::to_string(max) + "], got '" + text + "'");
  }
  *out = v;
  return Status::Ok();
}

using Setter = std::function<Status(const std::string&, const std::string&)>;

// Flags that take a value, each with the field it sets.
std::map<std::string, Setter> ValueFlags(ServerOptions* o) {
  auto str = [](std::string* field) -> Setter {
    return [field](const std::string&, const std::string& v) {
      *field = v;
      return Status::Ok();
    };
  };
  auto i64 = [](int64_t* field, int64_t min, int64_t max) -> Setter {
    return
        [=](const std::string& f, const std::string& v) { return ParseInt(f, v, min, max, field); };
  };
  auto i32 = [](int* field, int64_t min, int64_t max) -> Setter {
    return [=](const std::string& f, const std::string& v) {
      int64_t x = 0;
      REC_RETURN_IF_ERROR(ParseInt(f, v, min, max, &x));
      *field = static_cast<int>(x);
      return Status::Ok();
    };
  };
  auto window = [o](const std::string& f, const std::string& v) {
    if (v != "adaptive" && v != "fixed") {
      return InvalidArgument(f + " expects adaptive or fixed, got '" + v + "'");
    }
    o->adaptive_batch_window = v == "adaptive";
    return Status::Ok();
  };
  return {
      {"--model-repository", str(&o->model_repository)},
      {"--model", str(&o->model)},
      {"--model-version", i64(&o->model_version, 0, INT64_MAX)},
      {"--host", str(&o->host)},
      {"--http-port", i32(&o->http_port, 0, 65535)},
      {"--grpc-port", i32(&o->grpc_port, 0, 65535)},
      {"--metrics-port", i32(&o->metrics_port, 0, 65535)},
      {"--http-threads", i32(&o->http_threads, 1, 64)},
      {"--grpc-threads", i32(&o->grpc_threads, 1, 64)},
      {"--executor-threads", i32(&o->executor_threads, 0, 256)},
      {"--intra-op-threads", i32(&o->intra_op_threads, 1, 256)},
      {"--busy-poll-us", i64(&o->busy_poll_us, 0, 1000000)},
      {"--batch-window", window},
      {"--max-queue-size", i64(&o->max_queue_size, 1, INT64_MAX)},
      {"--request-timeout-ms", i64(&o->request_timeout_ms, 0, INT64_MAX / 1000)},
      {"--max-body-bytes", i64(&o->max_body_bytes, 1, INT64_MAX)},
      {"--http-idle-timeout-s", i32(&o->http_idle_timeout_s, 0, 86400)},
      {"--http-request-timeout-s", i32(&o->http_request_timeout_s, 0, 86400)},
      {"--http-max-connections", i32(&o->http_max_connections, 0, 1 << 20)},
      {"--fbgemm-lib-dir", str(&o->fbgemm_lib_dir)},
      {"--ops-library", str(&o->ops_library)},
      {"--poll-repository-s", i32(&o->poll_repository_s, 0, 86400)},
      {"--log-verbose", i32(&o->log_verbose, 0, 1000)},
      {"--log-file", str(&o->log_file)},
      {"--trace-file", str(&o->trace_file)},
      {"--updates", str(&o->updates)},
      {"--updates-max-behind-s", i32(&o->updates_max_behind_s, 0, 86400)},
      {"--store-cache-bytes", i64(&o->store_cache_bytes, 0, INT64_MAX)},
  };
}

}  // namespace

Status ParseOptions(int argc, char** argv, ServerOptions* o) {
  const std::map<std::string, Setter> with_value = ValueFlags(o);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    if (arg == "--help" || arg == "-h") {
      o->help = true;
      continue;
    }
    if (arg == "--enable-model-control") {
      o->enable_model_control = true;
      continue;
    }
    if (arg == "--allow-batch-variant") {
      o->allow_batch_variant = true;
      continue;
    }
    auto it = with_value.find(arg);
    if (it == with_value.end()) return InvalidArgument("unknown flag '" + arg + "' (see --help)");
    if (!has_value) {
      if (i + 1 >= argc) return InvalidArgument(arg + " needs a value");
      value = argv[++i];
    }
    REC_RETURN_IF_ERROR(it->second(arg, value));
  }
  if (!o->help && o->model_repository.empty()) {
    return InvalidArgument("--model-repository is required (see --help)");
  }
  if (!o->updates.empty() && o->updates != "none") {
    UpdateUrl url;
    Status st = ParseUpdateUrl(o->updates, &url);
    if (!st.ok()) return InvalidArgument("--updates: " + st.message());
  }
  return Status::Ok();
}

std::string UsageText(const std::string& default_fbgemm_dir, const std::string& default_ops) {
  return "usage: rec-server --model-repository DIR [flags]\n"
         "\n"
         "Serves the TorchScript and AOTInductor models of a Triton-layout model repository\n"
         "over the KServe v2 protocol (HTTP/REST and gRPC) with dynamic batching, and\n"
         "Prometheus metrics.\n"
         "\n"
         "  --model-repository DIR   repository: DIR/<model>/config.pbtxt, "
         "DIR/<model>/<v>/model.pt\n"
         "                           (or model.pt2 with tables.bin, from rec export --format "
         "aoti)\n"
         "  --model NAME             serve only this model (default: every pytorch_libtorch "
         "and torch_aoti model)\n"
         "  --model-version N        serve version N instead of the newest\n"
         "  --host ADDR              IPv4 address to bind (default 127.0.0.1)\n"
         "  --http-port N            HTTP/REST port (default 8000; 0 = any free port)\n"
         "  --grpc-port N            gRPC port (default 8001; 0 = any free port)\n"
         "  --metrics-port N         Prometheus /metrics port (default 8002; 0 = any free port)\n"
         "  --http-threads N         HTTP I/O (epoll) threads (default 1)\n"
         "  --grpc-threads N         gRPC completion queues, one polling thread each (default 1)\n"
         "  --executor-threads N     threads running batches per model (default: the config's\n"
         "                           instance_group count, else 1)\n"
         "  --intra-op-threads N     LibTorch intra-op threads per forward (default 1)\n"
         "  --busy-poll-us N         threads poll N us for due work before they sleep:\n"
         "                           idle CPU time for lower latency (0 to 1000000,\n"
         "                           default 2000; 0: sleep at once)\n"
         "  --batch-window MODE      how long dynamic batching waits for a batch to fill: fixed\n"
         "                           waits the config's max_queue_delay_microseconds (as Triton\n"
         "                           does); adaptive (default) closes the window sooner when the\n"
         "                           model's recent forward passes took less time than that\n"
         "  --max-queue-size N       queued requests per model before 503/UNAVAILABLE (default "
         "1024)\n"
         "  --request-timeout-ms N   fail requests queued longer than this (default 0 = never)\n"
         "  --max-body-bytes N       largest request body, after decompression (default 64 MiB)\n"
         "  --http-idle-timeout-s N  close an HTTP connection idle this long (default 60; 0 = "
         "never)\n"
         "  --http-request-timeout-s N\n"
         "                           408 and close if a request is not fully received N s after\n"
         "                           its first byte (default 30; 0 = never)\n"
         "  --http-max-connections N open HTTP connections before new ones get 503 and close\n"
         "                           (default 1024; 0 = unlimited)\n"
         "  --fbgemm-lib-dir DIR     directory of the fbgemm_gpu .so files\n"
         "                           (default: " +
         (default_fbgemm_dir.empty() ? std::string("none found at build time")
                                     : default_fbgemm_dir) +
         ")\n"
         "  --ops-library PATH       rec's op library (rec::linear, the dense layers)\n"
         "                           (default: " +
         (default_ops.empty() ? std::string("none found at build time") : default_ops) +
         ")\n"
         "  --allow-batch-variant    serve a version whose rec.json batch probe scores a batch\n"
         "                           differently from its samples one by one on this CPU (a\n"
         "                           warning and rec_model_batch_variant 1) instead of refusing\n"
         "                           it\n"
         "  --enable-model-control   allow POST /v2/repository/models/<m>/load (and gRPC\n"
         "                           RepositoryModelLoad) to load a new version\n"
         "  --poll-repository-s N    every N s, load a newer version directory if one appeared\n"
         "                           (default 0 = off)\n"
         "  --log-verbose N          verbose log level at start (default 0; 1: a line per\n"
         "                           executed batch); GET/POST /v2/logging and the\n"
         "                           LogSettings RPC read and change it while running\n"
         "  --log-file PATH          append the log to PATH instead of stderr\n"
         "  --updates URL            apply the update log at redis://HOST:PORT[/STREAM] to\n"
         "                           the served tables while serving (default: rec.json's\n"
         "                           \"updates.url\"; none: no log)\n"
         "  --updates-max-behind-s N  not ready while more than N s behind the update log (or\n"
         "                           its broker unreachable that long); 0: no bound\n"
         "  --store-cache-bytes N    rows of the embedding store (rec.json \"store\") kept in\n"
         "                           memory per served version, least recently used out\n"
         "                           first (default 268435456 = 256 MiB)\n"
         "  --trace-file PATH        where request traces go (Triton's JSON trace format),\n"
         "                           once POST /v2/trace/setting or the TraceSetting RPC\n"
         "                           sets trace_level TIMESTAMPS; PATH.N every\n"
         "                           log_frequency traces\n"
         "  --help                   this text\n"
         "\n"
         "Prints 'rec-server ready http=H:P grpc=H:P metrics=H:P' once serving. SIGTERM or "
         "SIGINT:\n"
         "stop accepting, finish in-flight requests, exit 0.\n";
}

}  // namespace rec
