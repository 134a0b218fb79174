#include "http/http_api.h"

#include <google/protobuf/util/json_util.h>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/version.h"
#include "http/infer_json.h"
#include "model_config.pb.h"
#include "observability/metrics.h"
#include "observability/settings_json.h"
#include "observability/trace.h"

namespace rec {
namespace {

using nlohmann::json;

HttpResponse JsonResponse(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump();
  return r;
}

HttpResponse ErrorResponse(const Status& status) {
  HttpResponse r;
  r.status = HttpStatusOf(status);
  r.body = ErrorJson(status.message());
  return r;
}

HttpResponse Empty(int status) {
  HttpResponse r;
  r.status = status;
  return r;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decoding; a malformed escape is kept as it is.
std::string UrlDecode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    int hi = i + 2 < s.size() && s[i] == '%' ? HexDigit(s[i + 1]) : -1;
    int lo = hi >= 0 ? HexDigit(s[i + 2]) : -1;
    if (lo >= 0) {
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> parts;
  size_t pos = 0;
  while (pos < path.size()) {
    size_t next = path.find('/', pos);
    if (next == std::string::npos) next = path.size();
    if (next > pos) parts.push_back(UrlDecode(path.substr(pos, next - pos)));
    pos = next + 1;
  }
  return parts;
}

json IoJson(const IoSpec& io) {
  std::vector<int64_t> shape = {-1};
  shape.insert(shape.end(), io.dims.begin(), io.dims.end());
  if (io.ragged) shape = {-1};
  return {{"name", io.name}, {"datatype", DataTypeName(io.dtype)}, {"shape", shape}};
}

// protobuf's JSON writes 64-bit integers as strings; Triton's config endpoint writes numbers.
void Int64FieldsToNumbers(json* j) {
  static const char* const kInt64Fields[] = {"dims", "max_queue_delay_microseconds",
                                             "default_timeout_microseconds", "shape",
                                             "max_sequence_idle_microseconds"};
  if (j->is_array()) {
    for (json& e : *j) Int64FieldsToNumbers(&e);
    return;
  }
  if (!j->is_object()) return;
  for (auto& [key, value] : j->items()) {
    bool int64_field = false;
    for (const char* f : kInt64Fields) int64_field = int64_field || key == f;
    auto convert = [](json* v) {
      if (v->is_string()) *v = std::stoll(v->get<std::string>());
    };
    if (int64_field && value.is_array()) {
      for (json& e : value) convert(&e);
    } else if (int64_field) {
      convert(&value);
    } else {
      Int64FieldsToNumbers(&value);
    }
  }
}

json Duration(uint64_t count, uint64_t ns) { return {{"count", count}, {"ns", ns}}; }

json ModelStatsJson(ModelEntry* e) {
  const ModelStats& s = *e->stats();
  auto runner = e->Current();
  uint64_t execs = s.execution_count.load();
  return {
      {"name", e->spec().name},
      {"version", runner ? runner->version() : ""},
      {"last_inference", s.last_inference_ms.load()},
      {"inference_count", s.inference_count.load()},
      {"execution_count", execs},
      {"inference_stats",
       {{"success", Duration(s.success_count.load(), s.success_ns.load())},
        {"fail", Duration(s.fail_count.load(), s.fail_ns.load())},
        {"queue", Duration(s.queue_count.load(), s.queue_ns.load())},
        {"compute_input", Duration(execs, s.compute_input_ns.load())},
        {"compute_infer", Duration(execs, s.compute_infer_ns.load())},
        {"compute_output", Duration(execs, s.compute_output_ns.load())},
        {"cache_hit", Duration(0, 0)},
        {"cache_miss", Duration(0, 0)}}},
      {"batch_stats", json::array()},
  };
}

}  // namespace

int HttpStatusOf(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kDeadlineExceeded:
      return 503;
    case StatusCode::kTooLarge:
      return 413;
    case StatusCode::kInternal:
      return 500;
  }
  return 500;
}

HttpApi::HttpApi(ModelManager* models, Admission* admission, Metrics* metrics, ApiOptions options)
    : models_(models), admission_(admission), metrics_(metrics), options_(options) {}

bool HttpApi::Ready() {
  if (admission_->shutting_down()) return false;
  for (ModelEntry* e : models_->All()) {
    if (!e->Ready()) return false;
  }
  return true;
}

void HttpApi::Handle(HttpRequest&& request, HttpResponder respond) {
  std::vector<std::string> p = SplitPath(request.path);
  const std::string& m = request.method;
  if (p.empty() || p[0] != "v2") return respond(ErrorResponse(NotFound("unknown path")));
  if (p.size() == 1) {
    json meta = {{"name", kServerName}, {"version", kServerVersion}, {"extensions", json::array()}};
    for (const char* ext : kServerExtensions) meta["extensions"].push_back(ext);
    return respond(JsonResponse(200, meta));
  }
  if (p.size() == 2 && p[1] == "logging") return respond(LoggingRoute(request.body, m));
  if (p.size() == 3 && p[1] == "trace" && p[2] == "setting") {
    return respond(TraceRoute("", request.body, m));
  }
  if (p.size() == 5 && p[1] == "models" && p[3] == "trace" && p[4] == "setting") {
    if (models_->Find(p[2]) == nullptr) {
      return respond(ErrorResponse(NotFound("unknown model '" + p[2] + "'")));
    }
    return respond(TraceRoute(p[2], request.body, m));
  }
  if (p.size() == 3 && p[1] == "health") {
    if (p[2] == "live") return respond(Empty(200));
    if (p[2] == "ready") return respond(Empty(Ready() ? 200 : 503));
  }
  if (p[1] == "repository") return respond(RepositoryRoute(p, m));
  if (p[1] == "systemsharedmemory") return respond(SharedMemoryRoute(p, request.body, m));
  if (p[1] == "cudasharedmemory") {
    return respond(ErrorResponse(
        InvalidArgument("CUDA shared memory is not supported on this server (it has no GPU); "
                        "use system shared memory")));
  }
  if (p[1] != "models" || p.size() < 3) return respond(ErrorResponse(NotFound("unknown path")));
  if (p.size() == 3 && p[2] == "stats") return respond(Statistics(models_->All()));
  ModelEntry* entry = models_->Find(p[2]);
  if (entry == nullptr) return respond(ErrorResponse(NotFound("unknown model '" + p[2] + "'")));
  size_t next = 3;
  std::string version;
  if (p.size() >= 5 && p[3] == "versions") {
    version = p[4];
    next = 5;
  }
  std::string verb = p.size() > next ? p[next] : "";
  if (p.size() > next + 1) return respond(ErrorResponse(NotFound("unknown path")));
  if (verb == "infer" && m == "POST") return Infer(entry, version, std::move(request), respond);
  respond(ModelRoute(entry, version, verb, m));
}

HttpResponse HttpApi::ModelRoute(ModelEntry* entry, const std::string& version,
                                 const std::string& verb, const std::string& method) {
  auto runner = entry->Current();
  bool version_ok = version.empty() || (runner && runner->version() == version);
  if (!version_ok) {
    return ErrorResponse(
        NotFound("model '" + entry->spec().name + "' version " + version + " is not served"));
  }
  if (method != "GET") return ErrorResponse(NotFound("unknown route for " + method));
  if (verb == "ready" && !runner) return ErrorResponse(entry->NotLoaded());  // with the reason
  if (verb == "ready") return Empty(entry->Ready() && !admission_->shutting_down() ? 200 : 503);
  if (verb == "stats") return Statistics({entry});
  if (verb == "config") {
    std::string out;
    google::protobuf::util::JsonPrintOptions opts;
    opts.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(*entry->spec().config, &out, opts);
    json config = json::parse(out, nullptr, false);
    Int64FieldsToNumbers(&config);
    return JsonResponse(200, config);
  }
  if (!verb.empty()) return ErrorResponse(NotFound("unknown route '" + verb + "'"));
  json inputs = json::array(), outputs = json::array();
  for (const IoSpec& io : RequestInputs(entry->spec())) inputs.push_back(IoJson(io));
  for (const IoSpec& io : entry->spec().outputs) outputs.push_back(IoJson(io));
  json meta = {{"name", entry->spec().name},
               {"versions", runner ? json::array({runner->version()}) : json::array()},
               {"platform", entry->spec().platform},
               {"inputs", inputs},
               {"outputs", outputs}};
  return JsonResponse(200, meta);
}

HttpResponse HttpApi::RepositoryRoute(const std::vector<std::string>& p,
                                      const std::string& method) {
  if (method != "POST") return ErrorResponse(NotFound("unknown route"));
  if (p.size() == 3 && p[2] == "index") {
    json index = json::array();
    for (ModelEntry* e : models_->All()) {
      auto runner = e->Current();
      index.push_back({{"name", e->spec().name},
                       {"version", runner ? runner->version() : ""},
                       {"state", runner ? "READY" : "UNAVAILABLE"},
                       {"reason", runner ? "" : e->LoadError()}});
    }
    return JsonResponse(200, index);
  }
  if (p.size() == 5 && p[2] == "models" && (p[4] == "load" || p[4] == "unload")) {
    if (!options_.enable_model_control) {  // 503, as Triton answers without model control
      return ErrorResponse(Unavailable(
          "explicit model load / unload is not allowed; start with --enable-model-control"));
    }
    if (p[4] == "unload") return ErrorResponse(InvalidArgument("unload is not supported"));
    Status st = models_->Reload(p[3]);
    return st.ok() ? Empty(200) : ErrorResponse(st);
  }
  return ErrorResponse(NotFound("unknown repository route"));
}

HttpResponse HttpApi::LoggingRoute(const std::string& body, const std::string& method) {
  if (method == "POST") {
    LogSettings updates;
    Status st = LogUpdatesFromJson(body, &updates);
    if (st.ok()) st = UpdateLogSettings(updates, /*from_network=*/true);
    if (!st.ok()) return ErrorResponse(st);
  } else if (method != "GET") {
    return ErrorResponse(NotFound("unknown route for " + method));
  }
  HttpResponse r;
  r.body = LogSettingsToJson(CurrentLogSettings());
  return r;
}

HttpResponse HttpApi::TraceRoute(const std::string& model, const std::string& body,
                                 const std::string& method) {
  if (method == "POST") {
    TraceUpdates updates;
    Status st = TraceUpdatesFromJson(body, &updates);
    if (st.ok()) st = Tracer::Get().Update(model, updates);
    if (!st.ok()) return ErrorResponse(st);
  } else if (method != "GET") {
    return ErrorResponse(NotFound("unknown route for " + method));
  }
  HttpResponse r;
  r.body = TraceSettingsToJson(Tracer::Get().Settings(model));
  return r;
}

HttpResponse HttpApi::SharedMemoryRoute(const std::vector<std::string>& p, const std::string& body,
                                        const std::string& method) {
  // v2/systemsharedmemory[/region/<name>]/{status,register,unregister}
  std::string name, verb;
  if (p.size() == 3) {
    verb = p[2];
  } else if (p.size() == 5 && p[2] == "region") {
    name = p[3];
    verb = p[4];
  } else {
    return ErrorResponse(NotFound("unknown shared memory route"));
  }
  SharedMemoryRegistry& registry = SharedMemoryRegistry::Get();
  if (verb == "status" && method == "GET") {
    std::vector<std::shared_ptr<const SharedMemoryRegion>> regions;
    Status st = registry.List(name, &regions);
    if (!st.ok()) return ErrorResponse(st);
    json out = json::array();
    for (const auto& r : regions) {
      out.push_back(
          {{"name", r->name}, {"key", r->key}, {"offset", r->offset}, {"byte_size", r->byte_size}});
    }
    return JsonResponse(200, out);
  }
  if (verb == "unregister" && method == "POST") {
    Status st = registry.Unregister(name);
    return st.ok() ? Empty(200) : ErrorResponse(st);
  }
  if (verb == "register" && method == "POST" && !name.empty()) {
    json in = json::parse(body, nullptr, false);
    if (in.is_discarded() || !in.is_object() || !in.contains("key") || !in["key"].is_string() ||
        !in.contains("byte_size") || !in["byte_size"].is_number_unsigned() ||
        (in.contains("offset") && !in["offset"].is_number_unsigned())) {
      return ErrorResponse(InvalidArgument(
          "register needs a JSON object with 'key' (a string), 'byte_size' and optionally "
          "'offset' (numbers >= 0)"));
    }
    Status st = registry.Register(name, in["key"].get<std::string>(),
                                  in.value("offset", uint64_t{0}), in["byte_size"].get<uint64_t>());
    return st.ok() ? Empty(200) : ErrorResponse(st);
  }
  return ErrorResponse(NotFound("unknown shared memory route '" + verb + "' for " + method));
}

HttpResponse HttpApi::Statistics(const std::vector<ModelEntry*>& entries) {
  json stats = json::array();
  for (ModelEntry* e : entries) stats.push_back(ModelStatsJson(e));
  return JsonResponse(200, {{"model_stats", stats}});
}

void HttpApi::HandleMetrics(HttpRequest&& request, HttpResponder respond) {
  if (request.path != "/metrics") return respond(ErrorResponse(NotFound("try /metrics")));
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4";
  r.body = metrics_->Prometheus();
  respond(std::move(r));
}

}  // namespace rec

namespace rec {
namespace {

// The response to an admitted request; a traced one is stamped REQUEST_END here, and its send
// once the bytes are out.
HttpResponse EncodeResult(const InferRequest& meta, InferResult&& result) {
  HttpResponse r;
  if (!result.status.ok()) {
    r = ErrorResponse(result.status);
  } else {
    long long json_size = -1;
    auto params = WatermarkParameters(result.watermark);
    EncodeInferResponse(meta, result.model_version, result.outputs, &r.body, &json_size, &params);
    if (json_size >= 0) {
      r.content_type = "application/octet-stream";
      r.headers.emplace_back("Inference-Header-Content-Length", std::to_string(json_size));
    }
  }
  if (meta.trace) {
    meta.trace->Stamp("REQUEST_END");
    r.on_sent = [trace = meta.trace](uint64_t start, uint64_t end) {
      trace->Stamp("HTTP_SEND_START", start);
      trace->Stamp("HTTP_SEND_END", end);
      Tracer::Get().Finish(trace);
    };
  }
  return r;
}

}  // namespace

void HttpApi::Infer(ModelEntry* entry, const std::string& version, HttpRequest&& http,
                    HttpResponder respond) {
  Status st = admission_->Open();
  if (!st.ok()) return respond(ErrorResponse(st));
  const uint64_t request_start = NowNs();
  auto fail = [&](const Status& st) {
    Admission::CountRefusal(entry);
    respond(ErrorResponse(st));
  };
  const std::string* encoding = http.Header("content-encoding");
  st = DecodeContentEncoding(encoding ? *encoding : "", options_.max_body_bytes, &http.body);
  if (!st.ok()) return fail(st);
  long long header_length = -1;
  if (const std::string* h = http.Header("inference-header-content-length")) {
    char* end = nullptr;
    header_length = std::strtoll(h->c_str(), &end, 10);
    if (h->empty() || *end != '\0' || header_length < 0) {
      return fail(InvalidArgument("bad Inference-Header-Content-Length '" + *h + "'"));
    }
  }
  InferRequest request;
  st = DecodeInferRequest(http.body, header_length, &request);
  http.body.clear();
  if (!st.ok()) return fail(st);
  request.model_name = entry->spec().name;
  request.model_version = version;
  const Admission::Stamps stamps = {{"HTTP_RECV_START", http.recv_start_ns},
                                    {"HTTP_RECV_END", http.recv_end_ns}};
  st = admission_->Admit(entry, std::move(request), request_start, stamps,
                         [respond](const InferRequest& meta, InferResult&& result) {
                           respond(EncodeResult(meta, std::move(result)));
                         });
  if (!st.ok()) respond(ErrorResponse(st));
}

}  // namespace rec
