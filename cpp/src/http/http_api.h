// HttpApi: the KServe v2 REST routes on top of HttpServer, and the Prometheus route of the
// metrics port. Decodes and validates each request here; inference goes through the model's
// Batcher and is answered from the executor thread.
#pragma once

#include <atomic>
#include <string>

#include "http/http_server.h"
#include "observability/metrics.h"
#include "serving/admission.h"
#include "serving/model_manager.h"

namespace rec {

struct ApiOptions {
  bool enable_model_control = false;
  size_t max_body_bytes = 64 << 20;
};

// Maps a status to the HTTP status code the protocol uses.
int HttpStatusOf(const Status& status);

class HttpApi {
 public:
  HttpApi(ModelManager* models, Admission* admission, Metrics* metrics, ApiOptions options);

  void Handle(HttpRequest&& request, HttpResponder respond);
  void HandleMetrics(HttpRequest&& request, HttpResponder respond);

 private:
  void Infer(ModelEntry* entry, const std::string& version, HttpRequest&& request,
             HttpResponder respond);
  HttpResponse ModelRoute(ModelEntry* entry, const std::string& version, const std::string& verb,
                          const std::string& method);
  HttpResponse RepositoryRoute(const std::vector<std::string>& parts, const std::string& method);
  // GET /v2/logging reads the log settings, POST changes them (Triton's logging extension).
  HttpResponse LoggingRoute(const std::string& body, const std::string& method);
  // Triton's system shared memory extension: register, status, unregister.
  HttpResponse SharedMemoryRoute(const std::vector<std::string>& parts, const std::string& body,
                                 const std::string& method);
  // GET /v2[/models/<m>]/trace/setting reads the trace settings, POST changes them.
  HttpResponse TraceRoute(const std::string& model, const std::string& body,
                          const std::string& method);
  HttpResponse Statistics(const std::vector<ModelEntry*>& entries);
  bool Ready();

  ModelManager* models_;
  Admission* admission_;  // after its SetShuttingDown, readiness reports 503
  Metrics* metrics_;
  ApiOptions options_;
};

}  // namespace rec
