#include "model/torch_model.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/script.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <unordered_set>
#include <vector>

#include "model/context_request.h"
#include "model/request.h"
#include "model/torch_io.h"

namespace rec {
namespace {

// The order in which fbgemm_gpu/__init__.py loads its libraries (later ones use earlier ones).
const char* const kFbgemmLibraries[] = {
    "fbgemm_gpu_config",
    "fbgemm_gpu_tbe_utils",
    "fbgemm_gpu_tbe_index_select",
    "fbgemm_gpu_tbe_cache",
    "fbgemm_gpu_tbe_optimizers",
    "fbgemm_gpu_tbe_inference",
    "fbgemm_gpu_tbe_training_forward",
    "fbgemm_gpu_tbe_training_backward",
    "fbgemm_gpu_tbe_training_backward_pt2",
    "fbgemm_gpu_tbe_training_backward_dense",
    "fbgemm_gpu_tbe_training_backward_split_host",
    "fbgemm_gpu_tbe_training_backward_gwd",
    "fbgemm_gpu_tbe_training_backward_vbe",
    "fbgemm_gpu_py",
};

c10::ScalarType ToTorch(DataType dtype) {
  switch (dtype) {
    case DataType::kBool:
      return c10::kBool;
    case DataType::kUint8:
      return c10::kByte;
    case DataType::kInt8:
      return c10::kChar;
    case DataType::kInt16:
      return c10::kShort;
    case DataType::kInt32:
      return c10::kInt;
    case DataType::kInt64:
      return c10::kLong;
    case DataType::kFp16:
      return c10::kHalf;
    case DataType::kFp64:
      return c10::kDouble;
    default:
      return c10::kFloat;
  }
}

DataType FromTorch(c10::ScalarType t) {
  switch (t) {
    case c10::kBool:
      return DataType::kBool;
    case c10::kByte:
      return DataType::kUint8;
    case c10::kChar:
      return DataType::kInt8;
    case c10::kShort:
      return DataType::kInt16;
    case c10::kInt:
      return DataType::kInt32;
    case c10::kLong:
      return DataType::kInt64;
    case c10::kHalf:
      return DataType::kFp16;
    case c10::kFloat:
      return DataType::kFp32;
    case c10::kDouble:
      return DataType::kFp64;
    default:
      return DataType::kInvalid;
  }
}

// Unknown ids of stored ZCH tables (raw ids the store lacks) per request column, counted by the
// forward that ran on this thread, as rec::zch_remap_counted counts the in-model ones (-1: not
// such a column); TakeUnknownIds adds them to the op's.
thread_local std::vector<int64_t> t_stored_unknown;

class TorchRunner : public Runner {
 public:
  TorchRunner(torch::jit::Module module, const ModelSpec& spec, std::string version,
              std::shared_ptr<EmbeddingStore> store)
      : module_(std::move(module)),
        spec_(spec),
        version_(std::move(version)),
        store_(std::move(store)) {
    if (!store_) return;
    // Each request column's stored table when that is keyed by raw id (a ZCH table), else -1.
    const std::vector<StoreTable>& tables = store_->spec().tables;
    for (const std::string& feature : spec_.sparse_feature_names) {
      int64_t raw = -1;
      for (size_t t = 0; t < tables.size(); ++t) {
        const auto& f = tables[t].features;
        if (tables[t].raw_id && std::find(f.begin(), f.end(), feature) != f.end()) raw = t;
      }
      raw_table_of_column_.push_back(raw);
      any_raw_column_ = any_raw_column_ || raw >= 0;
    }
  }

  const std::string& version() const override { return version_; }

  Status Run(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    Watermark unused;
    return RunScored(inputs, outputs, &unused);
  }

  Status RunScored(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs,
                   Watermark* scored_at) override {
    try {
      if (!tables_) {
        *scored_at = Watermark{};
        return RunOrThrow(inputs, outputs);
      }
      EmbeddingTables::Reading still(tables_.get());  // no row changes under this pass
      *scored_at = still.watermark();
      return RunOrThrow(inputs, outputs);
    } catch (const std::exception& e) {
      return Internal(std::string("forward failed: ") + e.what());
    }
  }

  // A model with stored tables: the rows its batch reads, from the store, then its forward.
  Status StoredForward(std::vector<c10::IValue> args, c10::IValue* result) {
    if (spec_.lengths_input < 0 || spec_.values_input < 0) {
      return InvalidArgument("a model with stored tables needs the sparse_lengths/values pair");
    }
    at::Tensor keys =
        module_.get_method("store_ids")({args[spec_.lengths_input], args[spec_.values_input]})
            .toTensor()
            .contiguous();
    // rec.store/2's models give (table, id) pairs, [U, 2]; rec.store/1's one key per row.
    const int columns = keys.dim() == 2 ? 2 : 1;
    std::string rows;
    std::vector<int64_t> defaulted;
    REC_RETURN_IF_ERROR(store_->Fetch(keys.data_ptr<int64_t>(), keys.numel() / columns, columns,
                                      &rows, &defaulted));
    if (any_raw_column_ && columns == 2) {
      CountStoredUnknowns(keys, defaulted, args[spec_.lengths_input].toTensor(),
                          args[spec_.values_input].toTensor());
    }
    args.emplace_back(torch::from_blob(rows.data(), {static_cast<int64_t>(rows.size())},
                                       torch::TensorOptions().dtype(c10::kByte)));
    *result = module_.get_method("forward_with_rows")(args);
    return Status::Ok();
  }

  void TakeUnknownIds(std::vector<int64_t>* per_column) override {
    TakeZchUnknowns(spec_.sparse_feature_names.size(), per_column);
    if (t_stored_unknown.empty()) return;
    if (per_column->size() < t_stored_unknown.size()) {
      per_column->resize(t_stored_unknown.size(), -1);
    }
    for (size_t c = 0; c < t_stored_unknown.size(); ++c) {
      if (t_stored_unknown[c] >= 0) {
        (*per_column)[c] = std::max<int64_t>((*per_column)[c], 0) + t_stored_unknown[c];
      }
    }
    t_stored_unknown.clear();
  }

  // The batch's ids of stored ZCH tables that read the default row (keys[defaulted[i]]: the
  // (table, raw id) pairs the store lacks), per request column, into t_stored_unknown.
  void CountStoredUnknowns(const at::Tensor& keys, const std::vector<int64_t>& defaulted,
                           const at::Tensor& lengths_in, const at::Tensor& values_in) {
    std::vector<std::unordered_set<int64_t>> lacked(store_->spec().tables.size());
    const int64_t* k = keys.data_ptr<int64_t>();
    for (int64_t i : defaulted) lacked[k[2 * i]].insert(k[2 * i + 1]);
    const at::Tensor lengths = lengths_in.to(c10::kLong).contiguous();
    const at::Tensor values = values_in.contiguous();
    const int64_t* len = lengths.data_ptr<int64_t>();
    const int64_t* v = values.data_ptr<int64_t>();
    const size_t cols = raw_table_of_column_.size();
    t_stored_unknown.assign(cols, -1);
    for (size_t c = 0; c < cols; ++c) {
      if (raw_table_of_column_[c] >= 0) t_stored_unknown[c] = 0;  // counting 0 declares it
    }
    // Batch-major: sample after sample, within a sample column after column.
    int64_t at = 0;
    for (int64_t i = 0; i < lengths.numel(); ++i) {
      const int64_t t = raw_table_of_column_[static_cast<size_t>(i) % cols];
      for (int64_t j = 0; j < len[i]; ++j, ++at) {
        if (t >= 0 && lacked[t].count(v[at]) > 0) ++t_stored_unknown[static_cast<size_t>(i) % cols];
      }
    }
  }

  std::shared_ptr<EmbeddingTables> tables() const override { return tables_; }

  // rec.json's "updates" names the storage buffers: the TBE's weights, written in place.
  Status AttachTables(const UpdatesSpec& updates) {
    if (!updates.present) return Status::Ok();
    auto held = std::make_shared<std::vector<at::Tensor>>();
    std::map<std::string, EmbeddingTables::Buffer> buffers;
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) {
      bool wanted = false;
      for (const auto& [table, place] : updates.tables) wanted = wanted || place.buffer == b.name;
      bool map = false;  // a ZCH table's id map (keys int64, used bool), written in place too
      for (const auto& [table, place] : updates.maps) {
        for (const auto& [keys, used] : place.buffers) {
          map = map || b.name == keys || b.name == used;
        }
      }
      if (!wanted && !map) continue;
      const at::Tensor& t = b.value;
      const bool typed = map ? t.scalar_type() == c10::kLong || t.scalar_type() == c10::kBool
                             : t.scalar_type() == c10::kByte;
      if (!typed || !t.is_contiguous() || t.device().type() != c10::kCPU) {
        return InvalidArgument("buffer '" + b.name + "' is not contiguous " +
                               (map ? "int64 or bool" : "uint8") + " on the CPU; " +
                               "rec.json's \"updates\" cannot write into it");
      }
      held->push_back(t);
      buffers[b.name] = {static_cast<uint8_t*>(t.data_ptr()), static_cast<int64_t>(t.nbytes())};
    }
    if (!store_) return EmbeddingTables::Create(updates, std::move(buffers), held, &tables_);
    UpdatesSpec with_stored = updates;
    const std::vector<StoreTable>& stored = store_->spec().tables;
    for (size_t i = 0; i < stored.size(); ++i) {
      // A raw-keyed (ZCH) table has no id map in the model (the store is its map): its records
      // go into the cache by the raw ids they name (rec.updates/3's `held`).
      if (stored[i].raw_id) with_stored.maps.erase(stored[i].name);
      with_stored.stored[stored[i].name] = {static_cast<int64_t>(i), stored[i].rows, stored[i].dim,
                                            stored[i].dtype, stored[i].raw_id};
    }
    // The tables' writer lock is held while a record's rows go into the cache, and a forward
    // pass (its fetch from the store included) holds the reader side: see Refresh.
    std::shared_ptr<EmbeddingStore> store = store_;  // the update log's reader may outlive us
    return EmbeddingTables::Create(
        with_stored, std::move(buffers), held, &tables_,
        [store](int64_t table, const UpdateRecord& r) { store->Refresh(table, r); });
  }

 private:
  Status RunOrThrow(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) {
    c10::InferenceMode guard;
    std::vector<c10::IValue> args;
    args.reserve(inputs.size());
    for (const Tensor& t : inputs) args.emplace_back(WrapInput(t));
    c10::IValue result;
    if (store_) {
      REC_RETURN_IF_ERROR(StoredForward(std::move(args), &result));
    } else {
      result = module_.forward(args);
    }
    std::vector<at::Tensor> tensors;
    if (result.isTensor()) {
      tensors.push_back(result.toTensor());
    } else if (result.isTuple()) {
      for (const auto& e : result.toTupleRef().elements()) tensors.push_back(e.toTensor());
    } else if (result.isTensorList()) {
      for (const at::Tensor& e : result.toTensorVector()) tensors.push_back(e);
    } else {
      return Internal("forward returned neither a tensor nor a tuple of tensors");
    }
    outputs->resize(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::string name = i < spec_.outputs.size() ? spec_.outputs[i].name : "output";
      REC_RETURN_IF_ERROR(ToTensor(name, tensors[i], &(*outputs)[i]));
    }
    return Status::Ok();
  }

  torch::jit::Module module_;
  const ModelSpec& spec_;
  std::string version_;
  std::shared_ptr<EmbeddingStore> store_;
  std::vector<int64_t> raw_table_of_column_;  // per request column: its raw-keyed table, or -1
  bool any_raw_column_ = false;
  std::shared_ptr<EmbeddingTables> tables_;
};

}  // namespace

at::Tensor WrapInput(const Tensor& t) {
  // from_blob: the batch owns the bytes for the duration of the call.
  return torch::from_blob(const_cast<char*>(t.data.data()), t.shape,
                          torch::TensorOptions().dtype(ToTorch(t.dtype)));
}

Status ToTensor(const std::string& name, const at::Tensor& value, Tensor* out) {
  at::Tensor t = value.contiguous();
  out->name = name;
  out->dtype = FromTorch(t.scalar_type());
  out->shape.assign(t.sizes().begin(), t.sizes().end());
  if (out->dtype == DataType::kInvalid) {
    return Internal("output '" + name + "' has an unsupported dtype");
  }
  out->data.assign(static_cast<const char*>(t.data_ptr()), t.nbytes());
  return Status::Ok();
}

std::string FirstLine(const std::exception& e) {
  std::string what = e.what();
  const size_t start = what.find_first_not_of('\n');
  what = what.substr(start == std::string::npos ? 0 : start);
  return what.substr(0, what.find('\n'));
}

namespace {

// A small valid batch: lengths of 1 and distinct ids, so every embedding path runs.
std::vector<Tensor> WarmupBatch(const ModelSpec& spec, int64_t rows) {
  // A context model: the flat batch split into `rows` contexts of one candidate each.
  if (spec.context.present) return SplitFlatInputs(spec, WarmupBatch(*spec.context.flat, rows));
  std::vector<Tensor> inputs(spec.inputs.size());
  int64_t num_ids = 0;
  if (spec.lengths_input >= 0) num_ids = rows * spec.inputs[spec.lengths_input].dims[0];
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    const IoSpec& io = spec.inputs[i];
    Tensor& t = inputs[i];
    t.name = io.name;
    t.dtype = io.dtype;
    if (io.ragged) {
      t.shape = {num_ids};
    } else {
      t.shape = {rows};
      t.shape.insert(t.shape.end(), io.dims.begin(), io.dims.end());
    }
    t.data.assign(static_cast<size_t>(ElementCount(t.shape)) * ElementSize(t.dtype), '\0');
    int64_t n = ElementCount(t.shape);
    if (static_cast<int>(i) == spec.lengths_input) {
      for (int64_t k = 0; k < n; ++k) t.MutableAs<int32_t>()[k] = 1;
    } else if (static_cast<int>(i) == spec.values_input && io.dtype == DataType::kInt64) {
      for (int64_t k = 0; k < n; ++k) t.MutableAs<int64_t>()[k] = k * 7919 + 1;
    } else if (io.dtype == DataType::kFp32) {
      for (int64_t k = 0; k < n; ++k) t.MutableAs<float>()[k] = 0.1f * static_cast<float>(k % 7);
    }
  }
  return inputs;
}

Status CheckSignature(const torch::jit::Module& module, const ModelSpec& spec) {
  auto method = module.find_method("forward");
  if (!method) return InvalidArgument("the TorchScript module has no forward method");
  const auto& args = method->function().getSchema().arguments();
  size_t n = args.empty() ? 0 : args.size() - 1;  // minus self
  if (n != spec.inputs.size()) {
    return InvalidArgument("forward takes " + std::to_string(n) +
                           " inputs but config.pbtxt lists " + std::to_string(spec.inputs.size()));
  }
  return Status::Ok();
}

}  // namespace

std::string DefaultFbgemmDir() {
#ifdef REC_FBGEMM_DIR
  return REC_FBGEMM_DIR;
#else
  return "";
#endif
}

// fbgemm_gpu's libraries need libtorch.so, which the linker drops from this binary (nothing here
// uses it directly) and which their RUNPATH does not find: load it from beside libtorch_cpu.so.
Status LoadLibtorch() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&at::set_num_threads), &info) == 0 || !info.dli_fname) {
    return Internal("cannot locate libtorch_cpu.so");
  }
  std::string path = std::filesystem::path(info.dli_fname).parent_path().string() + "/libtorch.so";
  if (std::filesystem::exists(path) && dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    return Internal("dlopen " + path + ": " + dlerror());
  }
  return Status::Ok();
}

Status LoadFbgemmLibraries(const std::string& dir, int* loaded) {
  *loaded = 0;
  if (dir.empty()) return Status::Ok();
  REC_RETURN_IF_ERROR(LoadLibtorch());
  if (!std::filesystem::is_directory(dir)) {
    return NotFound("fbgemm_gpu library directory '" + dir + "' does not exist");
  }
  for (const char* name : kFbgemmLibraries) {
    std::string path = dir + "/" + name + ".so";
    if (!std::filesystem::exists(path)) continue;
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      return Internal("dlopen " + path + ": " + dlerror());
    }
    ++*loaded;
  }
  return Status::Ok();
}

std::string DefaultOpsLibrary() {
#ifdef REC_OPS_LIBRARY
  return REC_OPS_LIBRARY;
#else
  return "";
#endif
}

namespace {

// cpp/ops/zch.cpp's rec_zch_take_unknowns: a plain C call, so a batch pays no boxed dispatch.
using TakeUnknowns = int64_t (*)(int64_t* out, int64_t capacity);
std::atomic<TakeUnknowns> take_unknowns{nullptr};

}  // namespace

Status LoadOpsLibrary(const std::string& path) {
  if (path.empty()) return Status::Ok();
  REC_RETURN_IF_ERROR(LoadLibtorch());
  if (!std::filesystem::is_regular_file(path)) {
    return NotFound("rec op library '" + path + "' does not exist (--ops-library)");
  }
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (library == nullptr) return Internal("dlopen " + path + ": " + dlerror());
  // Absent from an op library built before the counts: then nothing is counted.
  take_unknowns.store(reinterpret_cast<TakeUnknowns>(dlsym(library, "rec_zch_take_unknowns")));
  return Status::Ok();
}

void TakeZchUnknowns(size_t columns, std::vector<int64_t>* per_column) {
  per_column->clear();
  const TakeUnknowns take = take_unknowns.load(std::memory_order_relaxed);
  if (take == nullptr) return;
  per_column->resize(columns, -1);
  const int64_t n = take(per_column->data(), static_cast<int64_t>(columns));
  per_column->resize(std::min(columns, static_cast<size_t>(n)));
}

void ConfigureTorchThreads(int intra_op_threads) {
  if (intra_op_threads > 0) at::set_num_threads(intra_op_threads);
  // Batches already run concurrently on executor threads; no inter-op parallelism inside one.
  at::set_num_interop_threads(1);
}

Status LoadTorchModel(const std::string& model_path, const ModelSpec& spec,
                      const std::string& version, std::shared_ptr<Runner>* runner,
                      const UpdatesSpec& updates, std::shared_ptr<EmbeddingStore> store) {
  torch::jit::Module module;
  try {
    module = torch::jit::load(model_path, torch::kCPU);
    module.eval();
  } catch (const std::exception& e) {
    return InvalidArgument("cannot load " + model_path + ": " + FirstLine(e));
  }
  REC_RETURN_IF_ERROR(CheckSignature(module, spec));
  if (store && (!module.find_method("store_ids") || !module.find_method("forward_with_rows"))) {
    return InvalidArgument(model_path + ": rec.json has a \"store\" section but the model has " +
                           "no store_ids / forward_with_rows (not a tiered export)");
  }
  auto candidate =
      std::make_shared<TorchRunner>(std::move(module), spec, version, std::move(store));
  Status attached = candidate->AttachTables(updates);
  if (!attached.ok()) return InvalidArgument(model_path + ": " + attached.message());
  REC_RETURN_IF_ERROR(WarmUp(candidate.get(), spec, model_path));
  *runner = std::move(candidate);
  return Status::Ok();
}

Status WarmUp(Runner* runner, const ModelSpec& spec, const std::string& model_path) {
  int64_t rows = std::min<int64_t>(2, spec.max_batch_size);
  std::vector<Tensor> outputs;
  Status st = runner->Run(WarmupBatch(spec, rows), &outputs);
  if (st.code() == StatusCode::kUnavailable) return st;  // the embedding store, named
  if (st.ok()) st = CheckOutputs(spec, rows, outputs);
  if (!st.ok()) {
    return InvalidArgument("model " + model_path +
                           " disagrees with config.pbtxt in a warm-up batch: " + st.message());
  }
  return Status::Ok();
}

}  // namespace rec
