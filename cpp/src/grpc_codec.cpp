#include <cstring>

#include "grpc_api.h"

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

Status DecodeGrpcRequest(const inference::ModelInferRequest& in, InferRequest* out,
                         google::protobuf::RepeatedPtrField<std::string>* take_raw) {
  out->model_name = in.model_name();
  out->model_version = in.model_version();
  out->id = in.id();
  bool raw = in.raw_input_contents_size() > 0;
  if (raw && in.raw_input_contents_size() != in.inputs_size()) {
    return InvalidArgument("raw_input_contents has " +
                           std::to_string(in.raw_input_contents_size()) + " entries for " +
                           std::to_string(in.inputs_size()) + " inputs");
  }
  for (int i = 0; i < in.inputs_size(); ++i) {
    const auto& input = in.inputs(i);
    Tensor t;
    t.name = input.name();
    t.dtype = ParseDataType(input.datatype());
    if (t.dtype == DataType::kInvalid) {
      return InvalidArgument("input '" + t.name + "': unsupported datatype " + input.datatype());
    }
    t.shape.assign(input.shape().begin(), input.shape().end());
    if (raw && take_raw != nullptr) {
      t.data.swap(*take_raw->Mutable(i));
    } else if (raw) {
      t.data = in.raw_input_contents(i);
    } else {
      REC_RETURN_IF_ERROR(DecodeTypedContents(input.contents(), &t));
    }
    out->inputs.push_back(std::move(t));
  }
  for (const auto& o : in.outputs()) out->outputs.push_back({o.name(), false});
  return Status::Ok();
}

void EncodeGrpcResponse(const InferRequest& meta, const std::string& version,
                        std::vector<Tensor>& outputs, inference::ModelInferResponse* out) {
  out->set_model_name(meta.model_name);
  out->set_model_version(version);
  out->set_id(meta.id);
  for (Tensor& t : outputs) {
    bool wanted = meta.outputs.empty();
    for (const RequestedOutput& o : meta.outputs) wanted = wanted || o.name == t.name;
    if (!wanted) continue;
    auto* o = out->add_outputs();
    o->set_name(t.name);
    o->set_datatype(DataTypeName(t.dtype));
    for (int64_t d : t.shape) o->add_shape(d);
    out->add_raw_output_contents(std::move(t.data));
  }
}

}  // namespace rec
