#include "model/aoti_manifest.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/batch_probe.h"

namespace rec {
namespace {

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

Status ReadAotiManifest(const std::string& manifest_path, AotiManifest* manifest) {
  std::ifstream in(manifest_path);
  if (!in) {
    return InvalidArgument(manifest_path +
                           " is missing: an AOTInductor package needs its rec.json (the \"aoti\" "
                           "section: ISA and table layout)");
  }
  auto bad = [&](const std::string& why) {
    return InvalidArgument(manifest_path + ": \"aoti\" " + why);
  };
  try {
    const nlohmann::json doc = nlohmann::json::parse(in);
    if (!doc.is_object() || !doc.contains("aoti") || !doc["aoti"].is_object()) {
      return bad("section is missing (was it written by `rec export --format aoti`?)");
    }
    const nlohmann::json& a = doc["aoti"];
    manifest->cpu_isa = a.at("cpu_isa").get<std::string>();
    manifest->march = a.at("march").get<std::string>();
    manifest->required_cpu_flags = a.at("required_cpu_flags").get<std::vector<std::string>>();
    manifest->tables_file = a.at("tables_file").get<std::string>();
    if (manifest->tables_file.empty() || manifest->tables_file.find('/') != std::string::npos) {
      return bad("tables_file must be a file name beside model.pt2");
    }
    manifest->tables.clear();
    for (const auto& t : a.at("tables")) {
      AotiTable table{t.at("name").get<std::string>(), t.at("offset").get<int64_t>(),
                      t.at("bytes").get<int64_t>()};
      if (table.offset < 0 || table.bytes < 0)
        return bad("table " + table.name + " has a negative span");
      manifest->tables.push_back(std::move(table));
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(std::string("section is malformed: ") + e.what());
  }
  return Status::Ok();
}

std::vector<std::string> MissingCpuFlags(const std::vector<std::string>& required,
                                         const std::vector<std::string>& cpu_flags) {
  std::vector<std::string> missing;
  for (const std::string& f : required) {
    if (std::find(cpu_flags.begin(), cpu_flags.end(), f) == cpu_flags.end()) missing.push_back(f);
  }
  return missing;
}

bool HiddenByIsaCap(const std::string& flag, const std::string& cap) {
  if (cap.empty()) return false;
  if (flag.rfind("amx", 0) == 0) return true;
  if (flag.rfind("avx512", 0) == 0) return cap == "avx2" || cap == "scalar";
  return cap == "scalar" &&
         (flag.rfind("avx", 0) == 0 || flag.rfind("fma", 0) == 0 || flag.rfind("f16c", 0) == 0);
}

std::vector<std::string> CpuFlags() {
  // REC_MAX_CPU_ISA makes the server see a smaller CPU, as rec's Python side and ops do
  // (rec/cpu.py): the refusal of a package for a larger ISA is then tested on every CPU.
  const char* cap_env = std::getenv("REC_MAX_CPU_ISA");
  const std::string cap = cap_env ? cap_env : "";
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream flags(line.substr(line.find(':') + 1));
    std::vector<std::string> out;
    for (std::string f; flags >> f;) {
      if (!HiddenByIsaCap(f, cap)) out.push_back(f);
    }
    return out;
  }
  return {};
}

Status CheckAotiCpu(const AotiManifest& manifest, const std::vector<std::string>& cpu_flags,
                    const std::string& package_path) {
  const std::vector<std::string> missing = MissingCpuFlags(manifest.required_cpu_flags, cpu_flags);
  if (missing.empty()) return Status::Ok();
  return InvalidArgument(package_path + " was compiled for " + manifest.cpu_isa + " (" +
                         manifest.march + "), which needs CPU flags " +
                         Join(manifest.required_cpu_flags) + "; this CPU, " + CpuDescription() +
                         ", lacks " + Join(missing) +
                         ". Export it again with export.cpu_isa: avx2");
}

}  // namespace rec
