#include <cstring>
#include <string>

#include "http/http_server.h"

namespace rec {
namespace {

const char* ReasonPhrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Unknown";
  }
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

constexpr size_t kMaxHeaderBytes = 64 * 1024;

bool ParseRequestLine(const std::string& line, HttpRequest* r, bool* http10) {
  size_t a = line.find(' ');
  size_t b = a == std::string::npos ? a : line.find(' ', a + 1);
  if (b == std::string::npos) return false;
  r->method = line.substr(0, a);
  std::string target = line.substr(a + 1, b - a - 1);
  std::string version = line.substr(b + 1);
  if (version.rfind("HTTP/1.", 0) != 0 || target.empty()) return false;
  *http10 = version == "HTTP/1.0";
  size_t q = target.find('?');
  r->path = target.substr(0, q);
  r->query = q == std::string::npos ? "" : target.substr(q + 1);
  return true;
}

}  // namespace

const std::string* HttpRequest::Header(const std::string& name) const {
  for (const auto& h : headers) {
    if (h.first == name) return &h.second;
  }
  return nullptr;
}

ParseResult ParseHttpRequest(const char* data, size_t size, size_t max_body_bytes, HttpRequest* r,
                             size_t* consumed, int* error_status, std::string* error) {
  const char* end = static_cast<const char*>(memmem(data, size, "\r\n\r\n", 4));
  if (end == nullptr) {
    if (size <= kMaxHeaderBytes) return ParseResult::kIncomplete;
    *error_status = 431;
    *error = "request headers exceed " + std::to_string(kMaxHeaderBytes) + " bytes";
    return ParseResult::kError;
  }
  size_t header_size = static_cast<size_t>(end - data) + 4;
  std::string head(data, header_size - 4);
  size_t line_end = head.find("\r\n");
  bool http10 = false;
  *r = HttpRequest();
  if (!ParseRequestLine(head.substr(0, line_end), r, &http10)) {
    *error_status = 400;
    *error = "malformed request line";
    return ParseResult::kError;
  }
  size_t content_length = 0;
  r->keep_alive = !http10;
  size_t pos = line_end == std::string::npos ? head.size() : line_end + 2;
  while (pos < head.size()) {
    size_t next = head.find("\r\n", pos);
    if (next == std::string::npos) next = head.size();
    std::string line = head.substr(pos, next - pos);
    pos = next + 2;
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = Lower(Trim(line.substr(0, colon)));
    std::string value = Trim(line.substr(colon + 1));
    if (name == "content-length") {
      char* stop = nullptr;
      unsigned long long n = std::strtoull(value.c_str(), &stop, 10);
      if (value.empty() || *stop != '\0') {
        *error_status = 400;
        *error = "bad Content-Length";
        return ParseResult::kError;
      }
      content_length = static_cast<size_t>(n);
    } else if (name == "transfer-encoding") {
      *error_status = 501;
      *error = "Transfer-Encoding is not supported; send Content-Length";
      return ParseResult::kError;
    } else if (name == "connection") {
      std::string v = Lower(value);
      if (v == "close") r->keep_alive = false;
      if (v == "keep-alive") r->keep_alive = true;
    }
    r->headers.emplace_back(std::move(name), std::move(value));
  }
  if (content_length > max_body_bytes) {
    *error_status = 413;
    *error = "request body of " + std::to_string(content_length) + " bytes exceeds the limit of " +
             std::to_string(max_body_bytes);
    return ParseResult::kError;
  }
  if (size - header_size < content_length) return ParseResult::kIncomplete;
  r->body.assign(data + header_size, content_length);
  *consumed = header_size + content_length;
  return ParseResult::kComplete;
}

std::string SerializeHttpResponse(const HttpResponse& response, bool keep_alive) {
  std::string out;
  out.reserve(160 + response.body.size());
  out += "HTTP/1.1 ";
  out += std::to_string(response.status);
  out += ' ';
  out += ReasonPhrase(response.status);
  out += "\r\nContent-Type: ";
  out += response.content_type;
  out += "\r\nContent-Length: ";
  out += std::to_string(response.body.size());
  out += "\r\n";
  for (const auto& h : response.headers) out += h.first + ": " + h.second + "\r\n";
  if (!keep_alive) out += "Connection: close\r\n";
  out += "\r\n";
  out += response.body;
  return out;
}

}  // namespace rec
