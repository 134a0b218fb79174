// Inputs and a minimal blocking HTTP/1.1 keep-alive client for rec-bench.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/tensor.h"
#include "model/model_spec.h"

namespace rec::bench {

// A valid random request of `rows` rows for `spec`: 0-3 ids per bag, ids of any int64 value.
std::vector<Tensor> RandomBatch(const ModelSpec& spec, int64_t rows, uint32_t seed);

// The newest numeric version directory of a model directory ("1" if none).
std::string NewestVersion(const std::string& model_dir);

// The full HTTP request (binary tensor data extension, binary output) for `inputs`.
std::string HttpInferRequest(const std::string& host, const std::string& model,
                             const std::vector<Tensor>& inputs);

// A client's system shared memory for --shared-memory system: one POSIX object holding `inputs`
// one after another, then room for the outputs; registered with the server as two regions
// (<tag>_in, <tag>_out) through `registrar` (the protocol's register / unregister calls), and
// unregistered and unlinked by the destructor.
class SharedMemoryInputs {
 public:
  struct Registrar {
    std::function<bool(const std::string& region, const std::string& key, size_t offset,
                       size_t size)>
        add;
    std::function<void(const std::string& region)> remove;
  };
  SharedMemoryInputs(Registrar registrar, const std::string& tag, const std::vector<Tensor>& inputs,
                     size_t output_bytes);
  ~SharedMemoryInputs();
  bool ok() const { return ok_; }
  std::string in_region() const { return tag_ + "_in"; }
  std::string out_region() const { return tag_ + "_out"; }
  size_t output_bytes() const { return output_bytes_; }
  // Each input's offset in the input region, in order.
  const std::vector<size_t>& offsets() const { return offsets_; }

 private:
  Registrar registrar_;
  std::string tag_, key_;
  size_t in_bytes_ = 0, output_bytes_ = 0;
  std::vector<size_t> offsets_;
  bool ok_ = false;
};

// The HTTP request for `inputs` read from, and the outputs written into, `shm`'s regions.
std::string HttpSharedMemoryRequest(const std::string& host, const std::string& model,
                                    const std::vector<Tensor>& inputs,
                                    const SharedMemoryInputs& shm);

// Register / unregister over HTTP at `target` ("host:port").
SharedMemoryInputs::Registrar HttpRegistrar(const std::string& target);

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
