#include <cstring>

#include "grpc/grpc_api.h"

namespace rec {
namespace {

template <typename Dst, typename Field>
void AppendTyped(const Field& field, std::string* out) {
  for (const auto& v : field) {
    Dst x = static_cast<Dst>(v);
    out->append(reinterpret_cast<const char*>(&x), sizeof(Dst));
  }
}

Status DecodeTypedContents(const inference::InferTensorContents& c, Tensor* t) {
  switch (t->dtype) {
    case DataType::kFp32:
      AppendTyped<float>(c.fp32_contents(), &t->data);
      break;
    case DataType::kFp64:
      AppendTyped<double>(c.fp64_contents(), &t->data);
      break;
    case DataType::kInt32:
      AppendTyped<int32_t>(c.int_contents(), &t->data);
      break;
    case DataType::kInt16:
      AppendTyped<int16_t>(c.int_contents(), &t->data);
      break;
    case DataType::kInt8:
      AppendTyped<int8_t>(c.int_contents(), &t->data);
      break;
    case DataType::kInt64:
      AppendTyped<int64_t>(c.int64_contents(), &t->data);
      break;
    case DataType::kUint8:
      AppendTyped<uint8_t>(c.uint_contents(), &t->data);
      break;
    case DataType::kBool:
      AppendTyped<bool>(c.bool_contents(), &t->data);
      break;
    case DataType::kBytes:
      for (const std::string& element : c.bytes_contents()) AppendBytesElement(element, &t->data);
      break;
    default:
      return InvalidArgument("input '" + t->name + "': datatype " + DataTypeName(t->dtype) +
                             " is not accepted in typed contents");
  }
  return Status::Ok();
}

}  // namespace

grpc::Status ToGrpc(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return grpc::Status::OK;
    case StatusCode::kInvalidArgument:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, status.message());
    case StatusCode::kNotFound:
      return grpc::Status(grpc::StatusCode::NOT_FOUND, status.message());
    case StatusCode::kUnavailable:
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, status.message());
    case StatusCode::kDeadlineExceeded:
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, status.message());
    case StatusCode::kTooLarge:
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, status.message());
    case StatusCode::kInternal:
      return grpc::Status(grpc::StatusCode::INTERNAL, status.message());
  }
  return grpc::Status(grpc::StatusCode::UNKNOWN, status.message());
}

// Triton's shared_memory_region / _byte_size / _offset parameters, or `*found` false.
static Status SharedMemoryParams(
    const google::protobuf::Map<std::string, inference::InferParameter>& params,
    const std::string& what, SharedMemorySlice* slice, bool* found) {
  auto region = params.find("shared_memory_region");
  *found = region != params.end();
  if (!*found) return Status::Ok();
  auto number = [&](const char* key, bool required, uint64_t* value) -> Status {
    auto it = params.find(key);
    if (it == params.end()) {
      return required ? InvalidArgument(what + ": " + key + " must be given") : Status::Ok();
    }
    if (it->second.has_uint64_param()) {
      *value = it->second.uint64_param();
    } else if (it->second.has_int64_param() && it->second.int64_param() >= 0) {
      *value = static_cast<uint64_t>(it->second.int64_param());
    } else {
      return InvalidArgument(what + ": " + key + " must be an integer >= 0");
    }
    return Status::Ok();
  };
  if (!region->second.has_string_param()) {
    return InvalidArgument(what + ": shared_memory_region must be a string");
  }
  uint64_t size = 0, offset = 0;
  REC_RETURN_IF_ERROR(number("shared_memory_byte_size", true, &size));
  REC_RETURN_IF_ERROR(number("shared_memory_offset", false, &offset));
  return SharedMemoryRegistry::Get().Slice(region->second.string_param(), offset, size, what,
                                           slice);
}

Status DecodeGrpcRequest(const inference::ModelInferRequest& in, InferRequest* out,
                         google::protobuf::RepeatedPtrField<std::string>* take_raw) {
  out->model_name = in.model_name();
  out->model_version = in.model_version();
  out->id = in.id();
  // Inputs in shared memory have no raw_input_contents entry (as the stock client sends them).
  int in_body = 0;
  for (const auto& input : in.inputs())
    in_body += input.parameters().count("shared_memory_region") ? 0 : 1;
  bool raw = in.raw_input_contents_size() > 0;
  if (raw && in.raw_input_contents_size() != in_body) {
    return InvalidArgument("raw_input_contents has " +
                           std::to_string(in.raw_input_contents_size()) + " entries for " +
                           std::to_string(in_body) + " inputs not in shared memory");
  }
  int next_raw = 0;
  for (int i = 0; i < in.inputs_size(); ++i) {
    const auto& input = in.inputs(i);
    Tensor t;
    t.name = input.name();
    t.dtype = ParseDataType(input.datatype());
    if (t.dtype == DataType::kInvalid) {
      return InvalidArgument("input '" + t.name + "': unsupported datatype " + input.datatype());
    }
    t.shape.assign(input.shape().begin(), input.shape().end());
    SharedMemorySlice slice;
    bool shm = false;
    REC_RETURN_IF_ERROR(
        SharedMemoryParams(input.parameters(), "input '" + t.name + "'", &slice, &shm));
    if (shm) {
      if (input.has_contents()) {
        return InvalidArgument("input '" + t.name +
                               "': shared_memory_region and contents are exclusive");
      }
      REC_RETURN_IF_ERROR(ReadSlice(slice, &t.data));
    } else if (raw && take_raw != nullptr) {
      t.data.swap(*take_raw->Mutable(next_raw++));
    } else if (raw) {
      t.data = in.raw_input_contents(next_raw++);
    } else {
      REC_RETURN_IF_ERROR(DecodeTypedContents(input.contents(), &t));
    }
    out->inputs.push_back(std::move(t));
  }
  for (const auto& o : in.outputs()) {
    RequestedOutput ro{o.name(), false, std::nullopt};
    SharedMemorySlice slice;
    bool shm = false;
    REC_RETURN_IF_ERROR(
        SharedMemoryParams(o.parameters(), "output '" + o.name() + "'", &slice, &shm));
    if (shm) ro.shm = std::move(slice);
    out->outputs.push_back(std::move(ro));
  }
  return Status::Ok();
}

void EncodeGrpcResponse(const InferRequest& meta, const std::string& version,
                        std::vector<Tensor>& outputs, inference::ModelInferResponse* out) {
  out->set_model_name(meta.model_name);
  out->set_model_version(version);
  out->set_id(meta.id);
  for (Tensor& t : outputs) {
    bool wanted = meta.outputs.empty();
    const SharedMemorySlice* shm = nullptr;
    for (const RequestedOutput& o : meta.outputs) {
      wanted = wanted || o.name == t.name;
      if (o.name == t.name && o.shm) shm = &*o.shm;
    }
    if (!wanted) continue;
    auto* o = out->add_outputs();
    o->set_name(t.name);
    o->set_datatype(DataTypeName(t.dtype));
    for (int64_t d : t.shape) o->add_shape(d);
    if (shm != nullptr) {  // written there already (WriteSharedMemoryOutputs)
      auto& params = *o->mutable_parameters();
      params["shared_memory_region"].set_string_param(shm->region->name);
      params["shared_memory_byte_size"].set_int64_param(static_cast<int64_t>(t.data.size()));
      if (shm->offset != 0) {
        params["shared_memory_offset"].set_int64_param(static_cast<int64_t>(shm->offset));
      }
      continue;
    }
    out->add_raw_output_contents(std::move(t.data));
  }
}

}  // namespace rec
