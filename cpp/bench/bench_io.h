// Inputs and a minimal blocking HTTP/1.1 keep-alive client for rec-bench.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model_spec.h"
#include "tensor.h"

namespace rec::bench {

// A valid random request of `rows` rows for `spec`: 0-3 ids per bag, ids of any int64 value.
std::vector<Tensor> RandomBatch(const ModelSpec& spec, int64_t rows, uint32_t seed);

// The newest numeric version directory of a model directory ("1" if none).
std::string NewestVersion(const std::string& model_dir);

// The full HTTP request (binary tensor data extension, binary output) for `inputs`.
std::string HttpInferRequest(const std::string& host, const std::string& model,
                             const std::vector<Tensor>& inputs);

class HttpConnection {
 public:
  explicit HttpConnection(const std::string& target);  // "host:port"
  ~HttpConnection();
  // Sends `request`, reads one response; returns its status code (0 on a broken connection,
  // which is then reopened).
  int RoundTrip(const std::string& request);

 private:
  void Connect();
  std::string host_;
  int port_ = 0;
  int fd_ = -1;
  std::string buffer_;
};

}  // namespace rec::bench
