// rec.json as rec-server reads it (Python's reader and writer: rec/contract/manifest.py): each
// section the server uses, typed, and checked here as the Python reader checks it. A refusal of
// a malformed field is worded as the Python reader words it: `model '<m>': <source>: "<field>"
// must be <what>, got <value>`. What a section means for the config's inputs and outputs
// (roles, feature counts) is checked where the two meet, in model/model_spec.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/feature_encoding.h"
#include "common/status.h"
#include "contract/updates_spec.h"

namespace rec {

// "serving": the batching of a model whose config has max_batch_size 0 (export.triton_batching:
// none), which Triton cannot batch.
struct ServingSection {
  bool present = false;
  int64_t max_batch_size = 0;
  int64_t max_queue_delay_us = 0;
  std::vector<int64_t> preferred_batch_sizes;
};

// One entry of "inputs": an input's name and its role (dense, lengths, values, or a context
// model's context_* / candidate_* roles, kInputRoles; empty: none given).
struct InputRole {
  std::string name;
  std::string role;
};

// Every role an input may have, each at most once (rec/contract/io.py ROLES).
inline constexpr const char* kInputRoles[] = {"dense",
                                              "lengths",
                                              "values",
                                              "context_dense",
                                              "context_lengths",
                                              "context_values",
                                              "candidate_dense",
                                              "candidate_lengths",
                                              "candidate_values",
                                              "candidate_offsets"};

// "context" (rec/contract/context.py ContextSplit): which flat columns belong to the request's
// one context (user, device, time) rather than to each candidate, for a model exported with
// features.context. Columns are ascending, within [0, num_dense) and [0, num_sparse).
inline constexpr int64_t kContextVersion = 1;
struct ContextSection {
  bool present = false;
  std::vector<int64_t> dense;
  std::vector<int64_t> sparse;
  int64_t num_dense = 0;
  int64_t num_sparse = 0;
};

// "feature_spec": each sparse feature's encoding, in sparse_lengths' column order. The hash it
// names is the one this server implements (another would give other ids without an error).
struct FeatureSpecSection {
  bool present = false;
  std::vector<SparseEncoding> sparse;
};

// "zch": the model's collision-free tables (rec/contract/sections.py, ZchSection). The remap
// runs inside the model; the server checks the map layout it was built with, so that a model of
// another layout (another hash, another encoding) is refused rather than served reading other
// rows. kZchMapLayout and its text are the Python contract's ZCH_MAP_LAYOUT(_TEXT).
inline constexpr char kZchMapLayout[] = "rec.zch.map/2";
inline constexpr char kZchMapLayoutText[] =
    "keys int64 [slots], used bool [slots]; home() version 2";
// Layout 1 placed ids by an earlier home(); its artifacts are refused with this hint
// (ZCH_MAP_LAYOUT_V1 and ZCH_REEXPORT in Python).
inline constexpr char kZchMapLayoutV1[] = "rec.zch.map/1";
inline constexpr char kZchReexport[] =
    "; this artifact was exported with ZCH map layout 1 and must be re-exported with this rec "
    "(`rec export`)";

struct ZchTableSpec {
  std::string name;
  int64_t slots = 0;
  int64_t default_row = 0;  // always `slots`: the table's last row
  std::string eviction;
  int64_t probes = 0;
  int64_t admit_after = 0;
  int64_t live = 0;
  std::vector<std::string> buffers;  // the map's buffers in the model: keys, used per lookup
};

struct ZchSection {
  bool present = false;
  std::string layout;
  std::vector<ZchTableSpec> tables;
};

struct Manifest {
  ServingSection serving;
  ZchSection zch;
  UpdatesSpec updates;  // "updates" (its `stored` tables come from "store": contract/store_spec.h)
  bool has_features = false;  // "features": the dense and sparse feature names
  std::vector<std::string> dense_features;
  std::vector<std::string> sparse_features;
  int64_t num_tasks = -1;         // -1: not given
  std::vector<InputRole> inputs;  // empty: not given
  FeatureSpecSection feature_spec;
  ContextSection context;
};

// Parses rec.json's text (read from `source`, named in errors, of model `model`).
Status ParseManifest(const std::string& text, const std::string& model, const std::string& source,
                     Manifest* out);

// Only the "updates" section of a rec.json's text (a version's own, read when it loads), with
// the ZCH tables' maps of its "zch" section (UpdatesSpec::maps).
Status ParseUpdatesSection(const std::string& text, const std::string& model,
                           const std::string& source, UpdatesSpec* out);

}  // namespace rec
