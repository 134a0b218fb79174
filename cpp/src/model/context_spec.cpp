#include "model/context_spec.h"

namespace rec {
namespace {

// The complement of `columns` (ascending) in [0, width).
std::vector<int64_t> Complement(const std::vector<int64_t>& columns, int64_t width) {
  std::vector<int64_t> out;
  size_t k = 0;
  for (int64_t c = 0; c < width; ++c) {
    if (k < columns.size() && columns[k] == c) {
      ++k;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

bool IsFlatName(const std::string& name) {
  return name == kFlatDenseInput || name == kFlatLengthsInput || name == kFlatValuesInput;
}

// Each role's input index in ContextSpec, and what its IoSpec must be.
struct RoleSlot {
  const char* role;
  int ContextSpec::*index;
  DataType dtype;
  int64_t width;  // dims [width]; -1: ragged [-1]
};

std::vector<RoleSlot> Slots(const ContextSpec& c) {
  const int64_t dc = static_cast<int64_t>(c.dense.size());
  const int64_t fc = static_cast<int64_t>(c.sparse.size());
  return {
      {"context_dense", &ContextSpec::context_dense, DataType::kFp32, dc},
      {"context_lengths", &ContextSpec::context_lengths, DataType::kInt32, fc},
      {"context_values", &ContextSpec::context_values, DataType::kInt64, -1},
      {"candidate_dense", &ContextSpec::candidate_dense, DataType::kFp32, c.num_dense - dc},
      {"candidate_lengths", &ContextSpec::candidate_lengths, DataType::kInt32, c.num_sparse - fc},
      {"candidate_values", &ContextSpec::candidate_values, DataType::kInt64, -1},
      {"candidate_offsets", &ContextSpec::candidate_offsets, DataType::kInt32, -1},
  };
}

// A role's input is present exactly when its side has columns of that kind (offsets always).
bool Expected(const RoleSlot& slot, const ContextSpec& c) {
  const std::string role = slot.role;
  if (role == "context_values") return !c.sparse.empty();
  if (role == "candidate_values" || role == "candidate_offsets") return true;
  return slot.width > 0;
}

}  // namespace

Status ApplyContext(const ContextSection& section, const std::vector<InputRole>& roles,
                    const std::string& source, bool batched_config, ModelSpec* spec) {
  auto fail = [&](const std::string& what) {
    return InvalidArgument("model '" + spec->name + "': " + source + ": " + what);
  };
  if (!section.present) {
    for (const InputRole& r : roles) {
      if (r.role.rfind("context_", 0) == 0 || r.role.rfind("candidate_", 0) == 0) {
        return fail("input '" + r.name + "' has role " + r.role + " but there is no \"context\"");
      }
    }
    return Status::Ok();
  }
  if (batched_config) {
    return fail(
        "a context model is served by rec-server in the unbatched form only "
        "(export.triton_batching: none); config.pbtxt has max_batch_size > 0");
  }
  ContextSpec c;
  c.present = true;
  c.dense = section.dense;
  c.sparse = section.sparse;
  c.num_dense = section.num_dense;
  c.num_sparse = section.num_sparse;
  c.cand_dense = Complement(c.dense, c.num_dense);
  c.cand_sparse = Complement(c.sparse, c.num_sparse);
  std::vector<IoSpec> inputs;
  for (const InputRole& r : roles) {
    const int index = FindInput(*spec, r.name);
    // The offsets may be absent from config.pbtxt (Triton fills them as a batch_input there).
    if (index < 0 && r.role != "candidate_offsets") {
      return fail("input '" + r.name + "' is not an input of config.pbtxt");
    }
    IoSpec io = index >= 0 ? spec->inputs[index] : IoSpec{r.name, DataType::kInt32, {-1}, true};
    bool known = false;
    for (const RoleSlot& slot : Slots(c)) {
      if (r.role != slot.role) continue;
      known = true;
      if (!Expected(slot, c)) return fail("input '" + r.name + "' (" + r.role + ") has no columns");
      // The offsets' [-1] was taken for the batch dimension (NormalizeUnbatched): it is [R+1].
      if (slot.dtype == DataType::kInt32 && slot.width < 0 && io.dims.empty()) {
        io.dims = {-1};
        io.ragged = true;
      }
      const std::vector<int64_t> want =
          slot.width < 0 ? std::vector<int64_t>{-1} : std::vector<int64_t>{slot.width};
      if (io.dtype != slot.dtype || io.dims != want) {
        return fail("input '" + r.name + "' (" + r.role + ") must be " + DataTypeName(slot.dtype) +
                    " " + ShapeString(want) + " per row, config.pbtxt has " +
                    DataTypeName(io.dtype) + " " + ShapeString(io.dims));
      }
      c.*slot.index = static_cast<int>(inputs.size());
    }
    if (!known) return fail("input '" + r.name + "' needs a context role, got '" + r.role + "'");
    inputs.push_back(std::move(io));
  }
  for (const RoleSlot& slot : Slots(c)) {
    if (Expected(slot, c) && c.*slot.index < 0) {
      return fail(std::string("\"inputs\" has no input of role ") + slot.role);
    }
  }
  for (const IoSpec& io : spec->inputs) {
    bool listed = false;
    for (const InputRole& r : roles) listed = listed || r.name == io.name;
    if (!listed && !IsFlatName(io.name)) {
      return fail("config.pbtxt input '" + io.name + "' is not among rec.json's \"inputs\"");
    }
  }
  spec->inputs = std::move(inputs);
  spec->lengths_input = spec->values_input = -1;
  spec->context = std::move(c);
  return Status::Ok();
}

void FinishContext(ModelSpec* spec) {
  ContextSpec& c = spec->context;
  if (!c.present) return;
  c.context_encodings.clear();
  c.candidate_encodings.clear();
  if (spec->has_feature_spec) {
    for (int64_t col : c.sparse) c.context_encodings.push_back(spec->sparse_encodings[col]);
    for (int64_t col : c.cand_sparse) c.candidate_encodings.push_back(spec->sparse_encodings[col]);
  }
  auto flat = std::make_shared<ModelSpec>();
  flat->name = spec->name;
  flat->max_batch_size = spec->max_batch_size;
  flat->outputs = spec->outputs;
  if (c.num_dense > 0) flat->inputs.push_back({kFlatDenseInput, DataType::kFp32, {c.num_dense}});
  flat->lengths_input = static_cast<int>(flat->inputs.size());
  flat->inputs.push_back({kFlatLengthsInput, DataType::kInt32, {c.num_sparse}});
  flat->values_input = static_cast<int>(flat->inputs.size());
  flat->inputs.push_back({kFlatValuesInput, DataType::kInt64, {-1}, true});
  flat->has_feature_spec = spec->has_feature_spec;
  flat->sparse_encodings = spec->sparse_encodings;
  c.flat = std::move(flat);
}

}  // namespace rec
