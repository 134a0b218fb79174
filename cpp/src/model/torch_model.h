// The model execution unit: loads the FBGEMM op libraries and a TorchScript model version,
// checks it against the spec with a warm-up batch, and runs forward passes. The only unit that
// includes LibTorch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/model_spec.h"
#include "model/runner.h"
#include "store/embedding_store.h"

namespace rec {

// The fbgemm_gpu package directory found at build time (may be empty).
std::string DefaultFbgemmDir();

// dlopen()s the fbgemm_gpu op libraries in `dir` with RTLD_GLOBAL so that their ops are
// registered before a model that calls them is loaded. Sets *loaded to the number of files.
Status LoadFbgemmLibraries(const std::string& dir, int* loaded);

// rec's op library (the rec Python package's _ops.so) found at build time (may be empty).
std::string DefaultOpsLibrary();

// dlopen()s rec's op library (rec::linear, which the exported dense layers call) with
// RTLD_GLOBAL; an empty path loads nothing.
Status LoadOpsLibrary(const std::string& path);

// This thread's unknown ids of ZCH features since the last call, per request column (the
// served model's rec::zch_remap_counted counts them; -1: no ZCH map read the column), at most
// `columns` of them, and resets them. Empty without rec's op library, or with one older than
// the counts; an artifact exported before them counts nothing (its op is rec::zch_remap).
void TakeZchUnknowns(size_t columns, std::vector<int64_t>* per_column);

// Sets LibTorch's intra-op and inter-op thread pools; call once, before any model runs.
void ConfigureTorchThreads(int intra_op_threads);

// Loads `model_path`, checks forward's arity against the spec, runs a warm-up batch and checks
// the outputs' dtypes and shapes. On success *runner serves `version`.
// `updates`: where the version's tables lie for the update log (its rec.json "updates"); a
// version without one cannot take updates. `store`: where its stored tables' rows are (its
// rec.json "store"; the model then has store_ids and forward_with_rows, rec.export.tiered).
Status LoadTorchModel(const std::string& model_path, const ModelSpec& spec,
                      const std::string& version, std::shared_ptr<Runner>* runner,
                      const UpdatesSpec& updates = UpdatesSpec{},
                      std::shared_ptr<EmbeddingStore> store = nullptr);

}  // namespace rec
