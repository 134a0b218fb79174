// AotiManifest: what rec-server needs from a version's rec.json to run an AOTInductor package
// (model.pt2): the ISA it was compiled for, the CPU flags that ISA needs, and where each table
// lies in tables.bin. Torch-free, so the checks are unit-tested without LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace rec {

struct AotiTable {
  std::string name;  // the served module's buffer, for messages
  int64_t offset = 0;
  int64_t bytes = 0;
};

struct AotiManifest {
  std::string cpu_isa;  // "avx2", "avx512"
  std::string march;    // "x86-64-v3", ...
  std::vector<std::string> required_cpu_flags;
  std::string tables_file;  // beside model.pt2
  std::vector<AotiTable> tables;
};

// Reads rec.json's "aoti" section; a missing file or section, or a malformed one, is
// InvalidArgument naming the file (a package cannot run without its tables' layout).
Status ReadAotiManifest(const std::string& manifest_path, AotiManifest* manifest);

// The flags of `required` that `cpu_flags` lacks.
std::vector<std::string> MissingCpuFlags(const std::vector<std::string>& required,
                                         const std::vector<std::string>& cpu_flags);

// Whether a CPU held to `cap` (REC_MAX_CPU_ISA: avx512, avx2, scalar; empty: no cap) lacks
// `flag`: AMX is above avx512, AVX-512 above avx2, every vector extension above scalar.
bool HiddenByIsaCap(const std::string& flag, const std::string& cap);

// /proc/cpuinfo's flags of the first CPU, less those above REC_MAX_CPU_ISA.
std::vector<std::string> CpuFlags();

// InvalidArgument naming the package's ISA and this CPU when `cpu_flags` lacks one it needs.
Status CheckAotiCpu(const AotiManifest& manifest, const std::vector<std::string>& cpu_flags,
                    const std::string& package_path);

}  // namespace rec
