// HttpServer: a compact HTTP/1.1 server on epoll. Each I/O thread owns its connections (keep-alive,
// pipelined requests answered in order); a handler may answer from any thread through the
// responder, which hands the serialized response back to the owning I/O thread. Responses always
// carry Content-Length (never chunked).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace rec {

struct HttpRequest {
  std::string method;
  std::string path;                                          // target without the query string
  std::string query;                                         // after '?', may be empty
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  bool keep_alive = true;
  uint64_t recv_start_ns = 0;  // steady clock: the request's first byte read, its last parsed
  uint64_t recv_end_ns = 0;

  // Value of the header with lower-case `name`, or nullptr.
  const std::string* Header(const std::string& name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // Called on the I/O thread with the steady-clock ns around the write of this response (the
  // bytes handed to the kernel, as far as it takes them at once); for traces.
  std::function<void(uint64_t send_start_ns, uint64_t send_end_ns)> on_sent;
};

// Answers one request; call exactly once, from any thread.
using HttpResponder = std::function<void(HttpResponse&&)>;
using HttpHandler = std::function<void(HttpRequest&&, HttpResponder)>;

enum class ParseResult { kIncomplete, kComplete, kError };

// Parses one request from the front of data[0, size). On kComplete sets *consumed; on kError sets
// *error_status (400, 413, 431, 501) and *error.
ParseResult ParseHttpRequest(const char* data, size_t size, size_t max_body_bytes,
                             HttpRequest* request, size_t* consumed, int* error_status,
                             std::string* error);

// Serializes a response, adding Content-Length and, when !keep_alive, Connection: close.
std::string SerializeHttpResponse(const HttpResponse& response, bool keep_alive);

// Why the server closed a connection on its own (see HttpServerOptions).
enum class HttpCloseReason { kIdleTimeout, kRequestTimeout, kConnectionLimit };

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port; see port()
  int io_threads = 1;
  size_t max_body_bytes = 64 << 20;
  // Without these limits a client that connects and never finishes (or never starts) a request
  // holds a connection and its buffer forever. 0 disables each.
  int idle_timeout_s = 60;     // close a connection with nothing received or sent for this long
  int request_timeout_s = 30;  // 408 if a request is not complete this long after its first byte
  int max_connections = 1024;  // across all I/O threads; beyond it: 503 and close
  // While a request is with the handler, the I/O thread polls this long for its answer before it
  // sleeps (busy_poll.h). 0: sleep at once.
  int64_t busy_poll_us = 0;
  // Called on an I/O thread for each such close (metrics); may be empty.
  std::function<void(HttpCloseReason)> on_close;
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  Status Start();
  int port() const { return port_; }
  // Stops accepting connections; open connections keep being served.
  void StopAccepting();
  // Waits (up to drain_timeout_ms) until every request handed to the handler is answered and
  // written, then joins the I/O threads. Their loops live until the server is destroyed, so a
  // late answer (after the timeout) has somewhere to go.
  void Stop(int drain_timeout_ms);

  class Loop;

 private:
  HttpServerOptions options_;
  HttpHandler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::vector<std::unique_ptr<Loop>> loops_;
  std::atomic<bool> accepting_{false};
  std::atomic<int> connections_{0};  // open connections of all loops, for max_connections
};

}  // namespace rec
