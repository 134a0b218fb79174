#include "http/infer_json.h"

#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

namespace rec {
namespace {

using nlohmann::json;

// Converts a JSON number to T only when the value fits: a float-to-integer conversion out of
// range, or a double beyond FLT_MAX to float, is undefined behaviour in C++ (found by
// cpp/fuzz/fuzz_infer_body: an INT32 value of 2.27e23).
template <typename T>
bool ConvertJson(const json& v, T* x) {
  if constexpr (std::is_same_v<T, bool>) {
    *x = v.get<bool>();
    return true;
  } else if constexpr (std::is_floating_point_v<T>) {
    double d = v.get<double>();
    if (std::isfinite(d) && std::fabs(d) > static_cast<double>(std::numeric_limits<T>::max())) {
      return false;
    }
    *x = static_cast<T>(d);
    return true;
  } else {
    using Limits = std::numeric_limits<T>;
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(Limits::max())) return false;
      *x = static_cast<T>(u);
    } else if (v.is_number_integer()) {
      int64_t i = v.get<int64_t>();
      if (i < static_cast<int64_t>(Limits::min()) ||
          (i > 0 && static_cast<uint64_t>(i) > static_cast<uint64_t>(Limits::max()))) {
        return false;
      }
      *x = static_cast<T>(i);
    } else if (v.is_number_float()) {
      double d = v.get<double>();
      // max + 1 is exact in double for every integer type (2^63 for int64).
      if (!(d >= static_cast<double>(Limits::min()) &&
            d < static_cast<double>(Limits::max()) + 1.0)) {
        return false;
      }
      *x = static_cast<T>(d);
    } else {
      *x = static_cast<T>(v.get<bool>());
    }
    return true;
  }
}

template <typename T>
Status AppendAs(const json& v, const std::string& name, DataType dtype, std::string* out) {
  T x{};
  if (!ConvertJson(v, &x)) {
    return InvalidArgument("input '" + name + "': value " + v.dump() + " does not fit " +
                           DataTypeName(dtype));
  }
  out->append(reinterpret_cast<const char*>(&x), sizeof(T));
  return Status::Ok();
}

// Appends the flattened JSON data (numbers, possibly nested lists) as raw bytes of `dtype`;
// BYTES data (JSON strings, already unescaped to UTF-8 by the parser) as length-prefixed
// elements, the form binary data and gRPC bring them in.
Status AppendJsonData(const json& v, DataType dtype, const std::string& name, std::string* out) {
  if (v.is_array()) {
    for (const json& e : v) REC_RETURN_IF_ERROR(AppendJsonData(e, dtype, name, out));
    return Status::Ok();
  }
  if (dtype == DataType::kBytes) {
    if (!v.is_string()) {
      return InvalidArgument("input '" + name + "': BYTES data must hold strings");
    }
    AppendBytesElement(v.get_ref<const std::string&>(), out);
    return Status::Ok();
  }
  if (!v.is_number() && !v.is_boolean()) {
    return InvalidArgument("input '" + name + "': data must hold numbers");
  }
  switch (dtype) {
    case DataType::kFp32:
      return AppendAs<float>(v, name, dtype, out);
    case DataType::kFp64:
      return AppendAs<double>(v, name, dtype, out);
    case DataType::kInt32:
      return AppendAs<int32_t>(v, name, dtype, out);
    case DataType::kInt64:
      return AppendAs<int64_t>(v, name, dtype, out);
    case DataType::kInt16:
      return AppendAs<int16_t>(v, name, dtype, out);
    case DataType::kInt8:
      return AppendAs<int8_t>(v, name, dtype, out);
    case DataType::kUint8:
      return AppendAs<uint8_t>(v, name, dtype, out);
    case DataType::kBool:
      return AppendAs<bool>(v, name, dtype, out);
    default:
      return InvalidArgument("input '" + name + "': datatype " + DataTypeName(dtype) +
                             " is not accepted as JSON data");
  }
}

// shared_memory_region / _byte_size / _offset parameters (Triton's names) to a checked slice.
Status SharedMemoryParams(const json& params, const std::string& what, SharedMemorySlice* slice) {
  const json& region = params["shared_memory_region"];
  auto size = params.find("shared_memory_byte_size");
  auto offset = params.find("shared_memory_offset");
  if (!region.is_string()) return InvalidArgument(what + ": shared_memory_region must be a string");
  if (size == params.end() || !size->is_number_unsigned()) {
    return InvalidArgument(what + ": shared_memory_byte_size must be given, a number >= 0");
  }
  if (offset != params.end() && !offset->is_number_unsigned()) {
    return InvalidArgument(what + ": shared_memory_offset must be a number >= 0");
  }
  return SharedMemoryRegistry::Get().Slice(region.get<std::string>(),
                                           offset == params.end() ? 0 : offset->get<uint64_t>(),
                                           size->get<uint64_t>(), what, slice);
}

Status DecodeInput(const json& in, const char* binary, size_t binary_size, size_t* binary_offset,
                   Tensor* t) {
  if (!in.is_object() || !in.contains("name") || !in["name"].is_string()) {
    return InvalidArgument("each input needs a string 'name'");
  }
  t->name = in["name"].get<std::string>();
  if (!in.contains("datatype") || !in["datatype"].is_string() || !in.contains("shape") ||
      !in["shape"].is_array()) {
    return InvalidArgument("input '" + t->name + "': needs 'datatype' and 'shape'");
  }
  t->dtype = ParseDataType(in["datatype"].get<std::string>());
  if (t->dtype == DataType::kInvalid) {
    return InvalidArgument("input '" + t->name + "': unsupported datatype " +
                           in["datatype"].get<std::string>());
  }
  for (const json& d : in["shape"]) {
    if (!d.is_number_integer()) return InvalidArgument("input '" + t->name + "': bad shape");
    t->shape.push_back(d.get<int64_t>());
  }
  auto params = in.find("parameters");
  if (params != in.end() && params->is_object() && params->contains("shared_memory_region")) {
    if (params->contains("binary_data_size") || in.contains("data")) {
      return InvalidArgument("input '" + t->name +
                             "': shared_memory_region and data in the body are exclusive");
    }
    SharedMemorySlice slice;
    REC_RETURN_IF_ERROR(SharedMemoryParams(*params, "input '" + t->name + "'", &slice));
    return ReadSlice(slice, &t->data);
  }
  if (params != in.end() && params->contains("binary_data_size")) {
    const json& size_json = (*params)["binary_data_size"];
    if (!size_json.is_number_unsigned()) {
      return InvalidArgument("input '" + t->name + "': bad binary_data_size");
    }
    size_t size = size_json.get<size_t>();
    if (size > binary_size - *binary_offset) {
      return InvalidArgument("input '" + t->name + "': binary_data_size " + std::to_string(size) +
                             " runs past the end of the body");
    }
    t->data.assign(binary + *binary_offset, size);
    *binary_offset += size;
    return Status::Ok();
  }
  if (!in.contains("data")) return InvalidArgument("input '" + t->name + "': no data");
  return AppendJsonData(in["data"], t->dtype, t->name, &t->data);
}

Status DecodeOutputs(const json& root, InferRequest* r) {
  auto params = root.find("parameters");
  if (params != root.end() && params->is_object() && params->contains("binary_data_output")) {
    r->binary_output_default =
        (*params)["binary_data_output"].is_boolean() && (*params)["binary_data_output"].get<bool>();
  }
  auto outputs = root.find("outputs");
  if (outputs == root.end()) return Status::Ok();
  if (!outputs->is_array()) return InvalidArgument("'outputs' must be a list");
  for (const json& o : *outputs) {
    if (!o.is_object() || !o.contains("name") || !o["name"].is_string()) {
      return InvalidArgument("each requested output needs a string 'name'");
    }
    RequestedOutput ro{o["name"].get<std::string>(), r->binary_output_default, std::nullopt};
    auto op = o.find("parameters");
    if (op != o.end() && op->is_object() && op->contains("binary_data")) {
      ro.binary = (*op)["binary_data"].is_boolean() && (*op)["binary_data"].get<bool>();
    }
    if (op != o.end() && op->is_object() && op->contains("shared_memory_region")) {
      SharedMemorySlice slice;
      REC_RETURN_IF_ERROR(SharedMemoryParams(*op, "output '" + ro.name + "'", &slice));
      ro.shm = std::move(slice);
    }
    r->outputs.push_back(ro);
  }
  return Status::Ok();
}

Status DecodeRoot(const json& root, const char* binary, size_t binary_size, InferRequest* r) {
  if (!root.is_object()) return InvalidArgument("request body must be a JSON object");
  if (root.contains("id") && root["id"].is_string()) r->id = root["id"].get<std::string>();
  auto inputs = root.find("inputs");
  if (inputs == root.end() || !inputs->is_array()) {
    return InvalidArgument("request needs an 'inputs' list");
  }
  size_t offset = 0;
  for (const json& in : *inputs) {
    Tensor t;
    REC_RETURN_IF_ERROR(DecodeInput(in, binary, binary_size, &offset, &t));
    r->inputs.push_back(std::move(t));
  }
  if (offset != binary_size) {
    return InvalidArgument("body has " + std::to_string(binary_size - offset) +
                           " bytes of binary data that no input claims");
  }
  return DecodeOutputs(root, r);
}

template <typename T>
void AppendJsonValues(const Tensor& t, json* data) {
  const T* p = t.As<T>();
  int64_t n = ElementCount(t.shape);
  for (int64_t i = 0; i < n; ++i) data->push_back(p[i]);
}

json TensorDataJson(const Tensor& t) {
  json data = json::array();
  switch (t.dtype) {
    case DataType::kFp32:
      AppendJsonValues<float>(t, &data);
      break;
    case DataType::kFp64:
      AppendJsonValues<double>(t, &data);
      break;
    case DataType::kInt32:
      AppendJsonValues<int32_t>(t, &data);
      break;
    case DataType::kInt64:
      AppendJsonValues<int64_t>(t, &data);
      break;
    default:
      break;
  }
  return data;
}

}  // namespace

Status DecodeContentEncoding(const std::string& encoding, size_t max_bytes, std::string* body) {
  if (encoding.empty() || encoding == "identity") return Status::Ok();
  if (encoding != "gzip" && encoding != "deflate") {
    return InvalidArgument("unsupported Content-Encoding '" + encoding + "'");
  }
  z_stream zs{};
  // 15 + 32: zlib or gzip header, detected automatically.
  if (inflateInit2(&zs, 15 + 32) != Z_OK) return Internal("zlib init failed");
  std::string out;
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(body->data()));
  zs.avail_in = static_cast<uInt>(body->size());
  int rc = Z_OK;
  char chunk[65536];
  while (rc == Z_OK) {
    zs.next_out = reinterpret_cast<Bytef*>(chunk);
    zs.avail_out = sizeof(chunk);
    rc = inflate(&zs, Z_NO_FLUSH);
    out.append(chunk, sizeof(chunk) - zs.avail_out);
    if (out.size() > max_bytes) rc = Z_MEM_ERROR;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) break;
  }
  inflateEnd(&zs);
  if (out.size() > max_bytes) {
    return Status(StatusCode::kTooLarge,
                  "decompressed body exceeds " + std::to_string(max_bytes) + " bytes");
  }
  if (rc != Z_STREAM_END) return InvalidArgument("body is not valid " + encoding + " data");
  *body = std::move(out);
  return Status::Ok();
}

Status DecodeInferRequest(const std::string& body, long long header_length, InferRequest* r) {
  size_t json_size = body.size();
  if (header_length >= 0) {
    if (static_cast<unsigned long long>(header_length) > body.size()) {
      return InvalidArgument("Inference-Header-Content-Length " + std::to_string(header_length) +
                             " exceeds the body size " + std::to_string(body.size()));
    }
    json_size = static_cast<size_t>(header_length);
  }
  json root;
  try {
    root = json::parse(body.data(), body.data() + json_size);
  } catch (const json::exception& e) {
    // e.what() says where and what it read ("... invalid literal; last read: '1.0, N'"): NaN and
    // Infinity, which some encoders write, are not JSON. A number past double's range (1e400)
    // is an out_of_range, not a parse_error.
    return InvalidArgument(
        std::string(header_length >= 0 ? "the JSON header" : "the request body") +
        " is not valid JSON: " + e.what());
  }
  try {
    return DecodeRoot(root, body.data() + json_size, body.size() - json_size, r);
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("bad request JSON: ") + e.what());
  }
}

void EncodeInferResponse(const InferRequest& request, const std::string& model_version,
                         const std::vector<Tensor>& outputs, std::string* body,
                         long long* header_length,
                         const std::vector<std::pair<std::string, int64_t>>* parameters) {
  json root;
  root["model_name"] = request.model_name;
  root["model_version"] = model_version;
  if (!request.id.empty()) root["id"] = request.id;
  if (parameters != nullptr && !parameters->empty()) {
    json params = json::object();
    for (const auto& [k, v] : *parameters) params[k] = v;
    root["parameters"] = params;
  }
  json outs = json::array();
  std::string binary;
  for (const Tensor& t : outputs) {
    bool as_binary = request.binary_output_default;
    bool wanted = request.outputs.empty();
    const SharedMemorySlice* shm = nullptr;
    for (const RequestedOutput& o : request.outputs) {
      if (o.name == t.name) {
        as_binary = o.binary;
        wanted = true;
        if (o.shm) shm = &*o.shm;
      }
    }
    if (!wanted) continue;
    json o = {{"name", t.name}, {"datatype", DataTypeName(t.dtype)}, {"shape", t.shape}};
    if (shm != nullptr) {  // written there already (WriteSharedMemoryOutputs)
      o["parameters"] = {{"shared_memory_region", shm->region->name},
                         {"shared_memory_byte_size", t.data.size()}};
      if (shm->offset != 0) o["parameters"]["shared_memory_offset"] = shm->offset;
    } else if (as_binary) {
      o["parameters"] = {{"binary_data_size", t.data.size()}};
      binary += t.data;
    } else {
      o["data"] = TensorDataJson(t);
    }
    outs.push_back(std::move(o));
  }
  root["outputs"] = std::move(outs);
  *body = root.dump();
  *header_length = binary.empty() ? -1 : static_cast<long long>(body->size());
  body->append(binary);
}

std::string ErrorJson(const std::string& message) {
  return nlohmann::json{{"error", message}}.dump(-1, ' ', false,
                                                 nlohmann::json::error_handler_t::replace);
}

}  // namespace rec
