// Status: the error type every fallible function returns. No exception crosses a module or
// thread boundary; code that calls into libraries that throw catches at its edge.
#pragma once

#include <string>
#include <utility>

namespace rec {

enum class StatusCode {
  kOk,
  kInvalidArgument,   // HTTP 400, gRPC INVALID_ARGUMENT
  kNotFound,          // HTTP 404, gRPC NOT_FOUND
  kUnavailable,       // HTTP 503, gRPC UNAVAILABLE (queue full, not ready, shutting down)
  kDeadlineExceeded,  // HTTP 504 is not what clients expect; mapped to 503 / DEADLINE_EXCEEDED
  kTooLarge,          // HTTP 413, gRPC RESOURCE_EXHAUSTED
  kInternal,          // HTTP 500, gRPC INTERNAL
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status NotFound(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
inline Status Unavailable(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
inline Status Internal(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

}  // namespace rec

#define REC_RETURN_IF_ERROR(expr) \
  do {                            \
    ::rec::Status _st = (expr);   \
    if (!_st.ok()) return _st;    \
  } while (0)
