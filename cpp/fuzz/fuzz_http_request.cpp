// Bytes as they arrive on an HTTP connection: request parsing (pipelined requests, headers,
// Content-Length), Content-Encoding, the JSON header plus binary tensor data, validation and
// batch assembly, and the response encoding. Same steps and limits as HttpApi::Infer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_common.h"
#include "http/http_server.h"
#include "http/infer_json.h"

namespace {

constexpr size_t kMaxBody = 1 << 20;

void DecodeBody(rec::HttpRequest* http) {
  const std::string* encoding = http->Header("content-encoding");
  if (!rec::DecodeContentEncoding(encoding ? *encoding : "", kMaxBody, &http->body).ok()) return;
  long long header_length = -1;
  if (const std::string* h = http->Header("inference-header-content-length")) {
    char* end = nullptr;
    header_length = std::strtoll(h->c_str(), &end, 10);
    if (h->empty() || *end != '\0' || header_length < 0) return;
  }
  rec::InferRequest request;
  if (!rec::DecodeInferRequest(http->body, header_length, &request).ok()) return;
  rec::fuzz::ValidateAndBatch(&request);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  while (size > 0) {
    rec::HttpRequest http;
    size_t consumed = 0;
    int error_status = 0;
    std::string error;
    rec::ParseResult r =
        rec::ParseHttpRequest(p, size, kMaxBody, &http, &consumed, &error_status, &error);
    if (r != rec::ParseResult::kComplete) break;
    if (consumed == 0 || consumed > size) __builtin_trap();  // the connection loop would spin
    DecodeBody(&http);
    rec::SerializeHttpResponse(rec::HttpResponse{}, http.keep_alive);
    p += consumed;
    size -= consumed;
  }
  return 0;
}
