#include "bench_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

namespace rec::bench {

std::vector<Tensor> RandomBatch(const ModelSpec& spec, int64_t rows, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Tensor> inputs(spec.inputs.size());
  int64_t num_ids = 0;
  if (spec.lengths_input >= 0) {
    Tensor& l = inputs[static_cast<size_t>(spec.lengths_input)];
    int64_t n = rows * spec.inputs[static_cast<size_t>(spec.lengths_input)].dims[0];
    l.data.resize(static_cast<size_t>(n) * 4);
    for (int64_t i = 0; i < n; ++i) {
      l.MutableAs<int32_t>()[i] = static_cast<int32_t>(rng() % 4);
      num_ids += l.MutableAs<int32_t>()[i];
    }
  }
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    const IoSpec& io = spec.inputs[i];
    Tensor& t = inputs[i];
    t.name = io.name;
    t.dtype = io.dtype;
    t.shape = io.ragged ? std::vector<int64_t>{num_ids} : std::vector<int64_t>{rows};
    if (!io.ragged) t.shape.insert(t.shape.end(), io.dims.begin(), io.dims.end());
    if (static_cast<int>(i) == spec.lengths_input) continue;
    int64_t n = ElementCount(t.shape);
    t.data.resize(static_cast<size_t>(n) * ElementSize(t.dtype));
    for (int64_t k = 0; k < n; ++k) {
      if (t.dtype == DataType::kFp32) {
        t.MutableAs<float>()[k] = static_cast<float>(rng() % 1000) / 1000.0f;
      } else if (t.dtype == DataType::kInt64) {
        t.MutableAs<int64_t>()[k] = static_cast<int64_t>(rng());
      } else if (t.dtype == DataType::kInt32) {
        t.MutableAs<int32_t>()[k] = static_cast<int32_t>(rng() % 4);
      }
    }
  }
  return inputs;
}

std::string NewestVersion(const std::string& model_dir) {
  int64_t best = 1;
  for (const auto& e : std::filesystem::directory_iterator(model_dir)) {
    std::string name = e.path().filename().string();
    if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos) {
      best = std::max<int64_t>(best, std::stoll(name));
    }
  }
  return std::to_string(best);
}

std::string HttpInferRequest(const std::string& host, const std::string& model,
                             const std::vector<Tensor>& inputs) {
  nlohmann::json header;
  std::string binary;
  for (const Tensor& t : inputs) {
    header["inputs"].push_back({{"name", t.name},
                                {"datatype", DataTypeName(t.dtype)},
                                {"shape", t.shape},
                                {"parameters", {{"binary_data_size", t.data.size()}}}});
    binary += t.data;
  }
  header["parameters"] = {{"binary_data_output", true}};
  std::string json = header.dump();
  std::string body = json + binary;
  return "POST /v2/models/" + model + "/infer HTTP/1.1\r\nHost: " + host +
         "\r\nInference-Header-Content-Length: " + std::to_string(json.size()) +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

HttpConnection::HttpConnection(const std::string& target) {
  size_t colon = target.rfind(':');
  host_ = target.substr(0, colon);
  port_ = std::stoi(target.substr(colon + 1));
  Connect();
}

HttpConnection::~HttpConnection() {
  if (fd_ >= 0) close(fd_);
}

void HttpConnection::Connect() {
  if (fd_ >= 0) close(fd_);
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  inet_pton(AF_INET, host_.c_str(), &addr.sin_addr);
  if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd_);
    fd_ = -1;
  }
  buffer_.clear();
}

int HttpConnection::RoundTrip(const std::string& request) {
  if (fd_ < 0) Connect();
  size_t sent = 0;
  while (fd_ >= 0 && sent < request.size()) {
    ssize_t n = send(fd_, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  char chunk[65536];
  while (fd_ >= 0) {
    size_t end = buffer_.find("\r\n\r\n");
    if (end != std::string::npos) {
      // Anchored at a line start: "Inference-Header-Content-Length: " (which Triton sends
      // first) also contains "Content-Length: ".
      size_t cl = buffer_.find("\r\nContent-Length: ");
      size_t length = cl < end ? std::stoul(buffer_.substr(cl + 18)) : 0;
      if (buffer_.size() >= end + 4 + length) {
        int status = std::atoi(buffer_.c_str() + 9);
        buffer_.erase(0, end + 4 + length);
        return status;
      }
    }
    ssize_t n = recv(fd_, chunk, sizeof(chunk), 0);
    if (n <= 0) break;
    buffer_.append(chunk, static_cast<size_t>(n));
  }
  Connect();
  return 0;
}

SharedMemoryInputs::SharedMemoryInputs(Registrar registrar, const std::string& tag,
                                       const std::vector<Tensor>& inputs, size_t output_bytes)
    : registrar_(std::move(registrar)), tag_(tag), key_("/" + tag), output_bytes_(output_bytes) {
  for (const Tensor& t : inputs) {
    offsets_.push_back(in_bytes_);
    in_bytes_ += t.data.size();
  }
  int fd = shm_open(key_.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
  if (fd < 0) return;
  void* map = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(in_bytes_ + output_bytes_)) == 0) {
    map = mmap(nullptr, in_bytes_ + output_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (map == MAP_FAILED) return;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::memcpy(static_cast<char*>(map) + offsets_[i], inputs[i].data.data(),
                inputs[i].data.size());
  }
  munmap(map, in_bytes_ + output_bytes_);
  ok_ = registrar_.add(in_region(), key_, 0, in_bytes_) &&
        registrar_.add(out_region(), key_, in_bytes_, output_bytes_);
}

SharedMemoryInputs::~SharedMemoryInputs() {
  registrar_.remove(in_region());
  registrar_.remove(out_region());
  shm_unlink(key_.c_str());
}

SharedMemoryInputs::Registrar HttpRegistrar(const std::string& target) {
  auto conn = std::make_shared<HttpConnection>(target);
  auto post = [conn, target](const std::string& path, const std::string& body) {
    return conn->RoundTrip("POST " + path + " HTTP/1.1\r\nHost: " + target +
                           "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
                           body) == 200;
  };
  return {[post](const std::string& region, const std::string& key, size_t offset, size_t size) {
            nlohmann::json body = {{"key", key}, {"offset", offset}, {"byte_size", size}};
            return post("/v2/systemsharedmemory/region/" + region + "/register", body.dump());
          },
          [post](const std::string& region) {
            post("/v2/systemsharedmemory/region/" + region + "/unregister", "");
          }};
}

std::string HttpSharedMemoryRequest(const std::string& host, const std::string& model,
                                    const std::vector<Tensor>& inputs,
                                    const SharedMemoryInputs& shm) {
  nlohmann::json header;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    header["inputs"].push_back({{"name", t.name},
                                {"datatype", DataTypeName(t.dtype)},
                                {"shape", t.shape},
                                {"parameters",
                                 {{"shared_memory_region", shm.in_region()},
                                  {"shared_memory_offset", shm.offsets()[i]},
                                  {"shared_memory_byte_size", t.data.size()}}}});
  }
  header["outputs"] = {{{"name", "scores"},
                        {"parameters",
                         {{"shared_memory_region", shm.out_region()},
                          {"shared_memory_byte_size", shm.output_bytes()}}}}};
  std::string body = header.dump();
  return "POST /v2/models/" + model + "/infer HTTP/1.1\r\nHost: " + host +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace rec::bench
