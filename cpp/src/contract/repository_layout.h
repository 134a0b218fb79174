// The model repository's file names (Contract 2), as rec/contract/formats.py defines them for
// every Python reader and writer. C++ cannot import that table, so this is its one C++ copy;
// tests/serve_cpp/test_manifest_contract.py checks that the two agree.
#pragma once

namespace rec {

constexpr char kTritonConfigFile[] = "config.pbtxt";
constexpr char kManifestFile[] = "rec.json";
constexpr char kTorchScriptFile[] = "model.pt";  // FORMATS["torchscript"].file
constexpr char kAotiFile[] = "model.pt2";        // FORMATS["aoti"].file

}  // namespace rec
