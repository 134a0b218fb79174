// The context form's half of ModelSpec: rec.json's "context" section and the inputs' context
// roles applied to a parsed config (model_spec.cpp calls it from ApplyManifestText).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "contract/manifest.h"
#include "model/model_spec.h"

namespace rec {

// The flat inputs a context model still takes from a request (split per row by the server).
inline constexpr char kFlatDenseInput[] = "dense_features";
inline constexpr char kFlatLengthsInput[] = "sparse_lengths";
inline constexpr char kFlatValuesInput[] = "sparse_values";

// For a manifest with "context": spec->inputs become rec.json's "inputs" in their order (each
// one of config.pbtxt's; config.pbtxt's flat inputs, if listed, are request-only and dropped),
// each checked against its role and the section's widths, and spec->context is filled. Without
// "context", a context role is refused. rec-server serves the unbatched form only (config.pbtxt
// max_batch_size 0; `batched_config` otherwise). Messages name the model and `source`.
Status ApplyContext(const ContextSection& context, const std::vector<InputRole>& roles,
                    const std::string& source, bool batched_config, ModelSpec* spec);

// Once the rest of rec.json is applied: the context and candidate subsets of
// spec->sparse_encodings, and spec->context.flat.
void FinishContext(ModelSpec* spec);

}  // namespace rec
