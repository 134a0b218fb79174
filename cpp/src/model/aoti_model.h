// The AOTInductor execution unit: loads a model.pt2 package (torch.export + AOTInductor, written
// by `rec export --format aoti`) with its tables memory-mapped from tables.bin, checks the CPU
// has the package's ISA and the warm-up batch against the spec, and runs forward passes.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "model/model_spec.h"
#include "model/runner.h"

namespace rec {

// Loads `package_path` with the "aoti" section of `manifest_path` (the version's rec.json).
// `concurrency`: forward passes that may run at once (one compiled-model instance each).
Status LoadAotiModel(const std::string& package_path, const std::string& manifest_path,
                     const ModelSpec& spec, const std::string& version, int concurrency,
                     std::shared_ptr<Runner>* runner, const UpdatesSpec& updates = UpdatesSpec{});

}  // namespace rec
