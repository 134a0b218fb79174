#include "contract/manifest.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "contract/row_bytes.h"

namespace rec {
namespace {

using nlohmann::json;

// Where a refusal comes from: "model '<model>': <source>".
struct Where {
  const std::string& model;
  const std::string& source;

  Status Fail(const std::string& what) const {
    return InvalidArgument("model '" + model + "': " + source + what);
  }
  // `<source>: "<field>" must be <what>, got <value>`
  // (tests/serve_cpp/test_manifest_contract.py feeds the Python reader the same files).
  Status BadField(const std::string& field, const std::string& want, const json* got) const {
    return Fail(": \"" + field + "\" must be " + want + ", got " +
                (got ? got->dump() : std::string("none")));
  }
};

bool IsStringList(const json& v) {
  if (!v.is_array()) return false;
  for (const auto& x : v) {
    if (!x.is_string()) return false;
  }
  return true;
}

bool SmallInteger(const json& v) {
  return v.is_number_integer() && v.get<int64_t>() <= (int64_t{1} << 30);
}

// "serving": checked whatever the form (rec/contract/manifest.py does too); model_spec.cpp
// applies it to a config with max_batch_size 0 only.
Status ParseServing(const json& manifest, const Where& where, ServingSection* out) {
  if (!manifest.contains("serving")) return Status::Ok();
  const json& serving = manifest["serving"];
  if (!serving.is_object())
    return where.Fail(": \"serving\" must be an object, got " + serving.dump());
  auto bad = [&](const std::string& key, const std::string& want) {
    return where.BadField("serving." + key, want, serving.contains(key) ? &serving[key] : nullptr);
  };
  const auto max_batch = serving.find("max_batch_size");
  if (max_batch == serving.end() || !SmallInteger(*max_batch) || max_batch->get<int64_t>() < 1) {
    return bad("max_batch_size", "an integer in [1, 2^30]");
  }
  out->max_batch_size = max_batch->get<int64_t>();
  const auto delay = serving.find("max_queue_delay_us");
  if (delay != serving.end()) {
    if (!SmallInteger(*delay) || delay->get<int64_t>() < 0) {
      return bad("max_queue_delay_us", "an integer in [0, 2^30]");
    }
    out->max_queue_delay_us = delay->get<int64_t>();
  }
  const auto sizes = serving.find("preferred_batch_sizes");
  if (sizes != serving.end()) {
    const std::string want =
        "a list of integers in [1, max_batch_size=" + std::to_string(out->max_batch_size) + "]";
    if (!sizes->is_array()) return bad("preferred_batch_sizes", want);
    for (const auto& size : *sizes) {
      if (!SmallInteger(size) || size.get<int64_t>() < 1 ||
          size.get<int64_t>() > out->max_batch_size) {
        return bad("preferred_batch_sizes", want);
      }
      out->preferred_batch_sizes.push_back(size.get<int64_t>());
    }
  }
  out->present = true;
  return Status::Ok();
}

// One table of "updates.tables": where its rows lie in the model's storage.
Status ParseTablePlace(const json& t, const std::string& field, const Where& where, TablePlace* p) {
  auto num = [&](const char* key, int64_t* dst) -> Status {
    auto f = t.is_object() ? t.find(key) : t.end();
    if (!t.is_object() || f == t.end() || !f->is_number_integer() || f->get<int64_t>() < 0) {
      return where.BadField(field + "." + key, "an integer >= 0",
                            t.is_object() && f != t.end() ? &*f : nullptr);
    }
    *dst = f->get<int64_t>();
    return Status::Ok();
  };
  REC_RETURN_IF_ERROR(num("offset", &p->offset));
  REC_RETURN_IF_ERROR(num("row_stride", &p->row_stride));
  REC_RETURN_IF_ERROR(num("rows", &p->rows));
  REC_RETURN_IF_ERROR(num("dim", &p->dim));
  auto str = [&](const char* key, std::string* dst) -> Status {
    auto f = t.find(key);
    if (f == t.end() || !f->is_string()) {
      return where.BadField(field + "." + key, "a string", f == t.end() ? nullptr : &*f);
    }
    *dst = f->get<std::string>();
    return Status::Ok();
  };
  REC_RETURN_IF_ERROR(str("buffer", &p->buffer));
  REC_RETURN_IF_ERROR(str("dtype", &p->dtype));
  std::string sb;
  REC_RETURN_IF_ERROR(str("scale_bias", &sb));
  if (RowBytes(p->dim, p->dtype) < 0) {  // an int4 row of odd dim too, as before
    return where.BadField(field + ".dtype", "one of int8, int4, fp16, fp32", &t["dtype"]);
  }
  if (sb != "first" && sb != "none") {
    return where.BadField(field + ".scale_bias", "\"first\" or \"none\"", &t["scale_bias"]);
  }
  p->scale_bias_first = sb == "first";
  if (p->scale_bias_first != (p->dtype == "int8" || p->dtype == "int4")) {
    return where.BadField(field + ".scale_bias",
                          "\"first\" for int8/int4 rows and \"none\" otherwise", &t["scale_bias"]);
  }
  return Status::Ok();
}

// "updates": the export's place in the update log, and where each table's rows lie.
Status ParseUpdates(const json& manifest, const Where& where, UpdatesSpec* out) {
  auto it = manifest.find("updates");
  if (it == manifest.end() || it->is_null()) return Status::Ok();
  const json& u = *it;
  if (!u.is_object()) return where.BadField("updates", "an object or null", &u);
  UpdatesSpec spec;
  spec.present = true;
  for (auto [key, dst] : {std::pair{"url", &spec.url}, std::pair{"run", &spec.run}}) {
    auto f = u.find(key);
    if (f == u.end() || f->is_null()) continue;
    if (!f->is_string()) {
      return where.BadField(std::string("updates.") + key, "a string or null", &*f);
    }
    *dst = f->get<std::string>();
  }
  auto step = u.find("step");
  if (step == u.end() || !step->is_number_integer() || step->get<int64_t>() < 0) {
    return where.BadField("updates.step", "an integer >= 0", step == u.end() ? nullptr : &*step);
  }
  spec.step = step->get<int64_t>();
  auto gen = u.find("gen");  // absent in an export of before generations: 0
  if (gen != u.end() && (!gen->is_number_integer() || gen->get<int64_t>() < 0)) {
    return where.BadField("updates.gen", "an integer >= 0", &*gen);
  }
  spec.gen = gen == u.end() ? 0 : gen->get<int64_t>();
  auto tables = u.find("tables");
  if (tables == u.end() || !tables->is_object()) {
    return where.BadField("updates.tables", "an object", tables == u.end() ? nullptr : &*tables);
  }
  for (auto item = tables->begin(); item != tables->end(); ++item) {
    TablePlace p;
    REC_RETURN_IF_ERROR(ParseTablePlace(item.value(), "updates.tables." + item.key(), where, &p));
    spec.tables[item.key()] = p;
  }
  *out = std::move(spec);
  return Status::Ok();
}

// "features" (dense and sparse names) and "num_tasks": optional for a foreign model.
Status ParseNames(const json& manifest, const Where& where, Manifest* out) {
  if (manifest.contains("features")) {
    const json& f = manifest["features"];
    for (const char* key : {"dense", "sparse"}) {
      const json* names = f.is_object() && f.contains(key) ? &f[key] : nullptr;
      if (!names || !IsStringList(*names)) {
        return where.BadField(std::string("features.") + key, "a list of strings", names);
      }
      auto& dst = std::string(key) == "dense" ? out->dense_features : out->sparse_features;
      dst = names->get<std::vector<std::string>>();
    }
    out->has_features = true;
  }
  if (manifest.contains("num_tasks")) {
    const json& n = manifest["num_tasks"];
    if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > (int64_t{1} << 30)) {
      return where.BadField("num_tasks", "an integer in [1, 2^30]", &n);
    }
    out->num_tasks = n.get<int64_t>();
  }
  return Status::Ok();
}

// "inputs": each input's role (kInputRoles), each at most once.
Status ParseRoles(const json& manifest, const Where& where, std::vector<InputRole>* out) {
  if (!manifest.contains("inputs")) return Status::Ok();
  const json& inputs = manifest["inputs"];
  if (!inputs.is_array()) {
    return where.BadField("inputs", "a list of {name, role} objects", &inputs);
  }
  std::string want = "one of ";
  for (const char* role : kInputRoles) want += std::string(role) + ", ";
  want += "each once";
  std::set<std::string> seen;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const json& entry = inputs[i];
    const std::string at = "inputs[" + std::to_string(i) + "]";
    const json* name = entry.is_object() && entry.contains("name") ? &entry["name"] : nullptr;
    if (!name || !name->is_string()) return where.BadField(at + ".name", "a string", name);
    InputRole r{name->get<std::string>(), ""};
    if (entry.contains("role")) {
      const json& role = entry["role"];
      if (!role.is_string()) return where.BadField(at + ".role", want, &role);
      r.role = role.get<std::string>();
      const bool known = std::any_of(std::begin(kInputRoles), std::end(kInputRoles),
                                     [&](const char* k) { return r.role == k; });
      if (!known || !seen.insert(r.role).second) return where.BadField(at + ".role", want, &role);
    }
    out->push_back(std::move(r));
  }
  if (seen.count("lengths") != seen.count("values")) {
    return where.BadField("inputs", "roles with both lengths and values", &inputs);
  }
  return Status::Ok();
}

// A list of ascending distinct column indices in [0, width).
bool IsColumnList(const json& v, int64_t width) {
  if (!v.is_array()) return false;
  int64_t last = -1;
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() <= last || x.get<int64_t>() >= width) {
      return false;
    }
    last = x.get<int64_t>();
  }
  return true;
}

// "context": absent (or null) for a model without a context form; checked as
// rec/contract/context.py ContextSplit.from_dict and Manifest.context check it.
Status ParseContext(const json& manifest, const Where& where, const Manifest& names,
                    ContextSection* out) {
  auto it = manifest.find("context");
  if (it == manifest.end() || it->is_null()) return Status::Ok();
  const json& c = *it;
  if (!c.is_object()) return where.BadField("context", "an object or null", &c);
  auto field = [&](const char* k) { return c.contains(k) ? &c[k] : nullptr; };
  const json* version = field("version");
  if (!version || !version->is_number_integer() || *version != kContextVersion) {
    return where.BadField("context.version", std::to_string(kContextVersion), version);
  }
  for (auto [key, dst] :
       {std::pair{"num_dense", &out->num_dense}, std::pair{"num_sparse", &out->num_sparse}}) {
    const json* n = field(key);
    if (!n || !n->is_number_integer() || n->get<int64_t>() < 0 ||
        n->get<int64_t>() > (int64_t{1} << 30)) {
      return where.BadField(std::string("context.") + key, "an integer in [0, 2^30]", n);
    }
    *dst = n->get<int64_t>();
  }
  for (auto [key, width, dst] : {std::tuple{"dense", out->num_dense, &out->dense},
                                 std::tuple{"sparse", out->num_sparse, &out->sparse}}) {
    const json* cols = field(key);
    if (!cols || !IsColumnList(*cols, width)) {
      return where.BadField(std::string("context.") + key,
                            "ascending distinct column indices in [0, num_" + std::string(key) +
                                "=" + std::to_string(width) + ")",
                            cols);
    }
    *dst = cols->get<std::vector<int64_t>>();
  }
  if (out->dense.empty() && out->sparse.empty()) {
    return where.BadField("context", "at least one context column", &c);
  }
  if (static_cast<int64_t>(out->sparse.size()) == out->num_sparse) {
    return where.BadField("context.sparse",
                          "fewer than num_sparse=" + std::to_string(out->num_sparse) +
                              " columns (a candidate needs a sparse feature)",
                          &c["sparse"]);
  }
  if (names.has_features) {
    for (auto [key, width, count] :
         {std::tuple{"dense", out->num_dense, names.dense_features.size()},
          std::tuple{"sparse", out->num_sparse, names.sparse_features.size()}}) {
      if (width == static_cast<int64_t>(count)) continue;
      return where.BadField(std::string("context.num_") + key,
                            std::to_string(count) + ", the number of features." + key,
                            &c[std::string("num_") + key]);
    }
  }
  out->present = true;
  return Status::Ok();
}

// feature_spec.hash must be the hash this server implements: ids computed with another would
// differ from training's without any error, so such a model does not load.
Status CheckHash(const json& hash, const std::function<Status(std::string)>& bad) {
  auto field = [&](const char* key) {
    return hash.is_object() && hash.contains(key) ? hash[key] : json();
  };
  const std::string implemented = std::string("rec-server implements hash version ") +
                                  std::to_string(kHashVersion) + " (" + kHashAlgorithm + ", " +
                                  std::to_string(kHashDigestBytes) + "-byte digest)";
  if (field("version") != kHashVersion) {
    return bad(".hash.version is " + field("version").dump() + ", not implemented: " + implemented);
  }
  if (field("algorithm") != kHashAlgorithm || field("digest_bytes") != kHashDigestBytes) {
    return bad(".hash is " + hash.dump() + ", not implemented: " + implemented);
  }
  // Optional in the manifest, but if given they must describe the same digest reading.
  if ((hash.contains("byte_order") && hash["byte_order"] != "little") ||
      (hash.contains("signed") && hash["signed"] != true)) {
    return bad(".hash is " + hash.dump() + ", not implemented: " + implemented +
               ", read as a little-endian signed int64");
  }
  return Status::Ok();
}

// "feature_spec" (rec/features.py): the server needs only each sparse feature's encoding, in
// sparse_lengths' column order, and the hash. Dense transforms are inside the model.
Status ParseFeatureSpec(const json& manifest, const Where& where,
                        const std::vector<std::string>& sparse_names, FeatureSpecSection* out) {
  auto it = manifest.find("feature_spec");
  if (it == manifest.end() || it->is_null()) return Status::Ok();
  auto bad = [&](const std::string& problem) { return where.Fail(": feature_spec" + problem); };
  const json& fs = *it;
  if (!fs.is_object()) return where.BadField("feature_spec", "an object or null", &fs);
  REC_RETURN_IF_ERROR(CheckHash(fs.contains("hash") ? fs["hash"] : json(), bad));
  if (!fs.contains("sparse") || !fs["sparse"].is_array()) return bad(".sparse must be a list");
  const json& sparse = fs["sparse"];
  for (size_t i = 0; i < sparse.size(); ++i) {
    const json& f = sparse[i];
    const std::string at = ".sparse[" + std::to_string(i) + "]";
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() ||
        !f.contains("encoding") || !f["encoding"].is_string()) {
      return bad(at + " needs a string \"name\" and \"encoding\", got " + f.dump());
    }
    SparseEncoding e;
    e.feature = f["name"].get<std::string>();
    Status st = ParseEncoding(f["encoding"].get<std::string>(), &e.encoding);
    if (!st.ok()) return bad(at + " (feature '" + e.feature + "'): " + st.message());
    if (i < sparse_names.size() && sparse_names[i] != e.feature) {
      return bad(at + " is feature '" + e.feature + "' but features.sparse[" + std::to_string(i) +
                 "] is '" + sparse_names[i] + "'");
    }
    out->sparse.push_back(std::move(e));
  }
  out->present = true;
  return Status::Ok();
}

bool IntegerIn(const json& v, int64_t low, int64_t high) {
  return v.is_number_integer() && v.get<int64_t>() >= low && v.get<int64_t>() <= high;
}

// One table of "zch.tables", checked in the Python reader's order (ZchTable.from_dict).
Status ParseZchTable(const json& t, const std::string& name, const Where& where,
                     ZchTableSpec* out) {
  const std::string key = "zch.tables." + name;
  if (!t.is_object()) return where.BadField(key, "an object", &t);
  auto field = [&](const char* k) { return t.contains(k) ? &t[k] : nullptr; };
  auto bad = [&](const char* k, const std::string& want) {
    return where.BadField(key + "." + k, want, field(k));
  };
  const json* slots = field("slots");
  if (!slots || !IntegerIn(*slots, 1, int64_t{1} << 62)) return bad("slots", "an integer >= 1");
  out->name = name;
  out->slots = slots->get<int64_t>();
  const json* row = field("default_row");
  if (!row || !row->is_number_integer() || row->get<int64_t>() != out->slots) {
    return bad("default_row", "the table's last row, slots=" + std::to_string(out->slots));
  }
  out->default_row = out->slots;
  if (!field("eviction") || !t["eviction"].is_string()) return bad("eviction", "a string");
  out->eviction = t["eviction"].get<std::string>();
  const json* probes = field("probes");
  if (!probes || !IntegerIn(*probes, 1, out->slots)) {
    return bad("probes", "an integer in [1, " + std::to_string(out->slots) + "]");
  }
  out->probes = probes->get<int64_t>();
  const json* admit = field("admit_after");
  if (!admit || !IntegerIn(*admit, 1, int64_t{1} << 30))
    return bad("admit_after", "an integer >= 1");
  out->admit_after = admit->get<int64_t>();
  const json* live = field("live");
  if (live && !live->is_null()) {
    if (!IntegerIn(*live, 0, INT64_MAX)) return bad("live", "an integer >= 0");
    out->live = live->get<int64_t>();
  }
  const json* buffers = field("buffers");
  if (buffers && !buffers->is_null() && !IsStringList(*buffers)) {
    return bad("buffers", "a list of strings");
  }
  if (buffers && !buffers->is_null()) out->buffers = buffers->get<std::vector<std::string>>();
  return Status::Ok();
}

// "zch": present only for a model with ZCH tables; an unknown map layout is refused by name.
Status ParseZch(const json& manifest, const Where& where, ZchSection* out) {
  if (!manifest.contains("zch") || manifest["zch"].is_null()) return Status::Ok();
  const json& zch = manifest["zch"];
  if (!zch.is_object()) return where.BadField("zch", "an object", &zch);
  const json* layout = zch.contains("layout") ? &zch["layout"] : nullptr;
  if (!layout || !layout->is_string() || layout->get<std::string>() != kZchMapLayout) {
    std::string want = std::string(kZchMapLayout) +
                       " (the id map layout this reader knows: " + kZchMapLayoutText + ")";
    if (layout && layout->is_string() && layout->get<std::string>() == kZchMapLayoutV1) {
      want += kZchReexport;
    }
    return where.BadField("zch.layout", want, layout);
  }
  out->layout = kZchMapLayout;
  const json* tables = zch.contains("tables") ? &zch["tables"] : nullptr;
  if (!tables || !tables->is_object() || tables->empty()) {
    return where.BadField("zch.tables", "an object of ZCH tables", tables);
  }
  for (const auto& item : tables->items()) {
    ZchTableSpec t;
    REC_RETURN_IF_ERROR(ParseZchTable(item.value(), item.key(), where, &t));
    out->tables.push_back(std::move(t));
  }
  out->present = true;
  return Status::Ok();
}

// The text as a JSON object, and `parse` run on it with nlohmann's exceptions turned into a
// refusal naming the file.
Status WithObject(const std::string& text, const Where& where,
                  const std::function<Status(const json&)>& parse) {
  json manifest = json::parse(text, nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object()) {
    return InvalidArgument("model '" + where.model + "': " + where.source +
                           " is not a JSON object");
  }
  try {
    return parse(manifest);
  } catch (const json::exception& e) {
    return where.Fail(std::string(": ") + e.what());
  }
}

// The update log's view of the ZCH tables: each one's map buffers, paired keys with used.
void ZchMapPlaces(const ZchSection& zch, UpdatesSpec* updates) {
  const std::string keys = ".keys", used = ".used";
  for (const ZchTableSpec& t : zch.tables) {
    MapPlace place{t.slots, t.probes, {}};
    for (const std::string& b : t.buffers) {
      if (b.size() > keys.size() && b.compare(b.size() - keys.size(), keys.size(), keys) == 0) {
        place.buffers.emplace_back(b, b.substr(0, b.size() - keys.size()) + used);
      }
    }
    updates->maps[t.name] = std::move(place);
  }
}

}  // namespace

Status ParseManifest(const std::string& text, const std::string& model, const std::string& source,
                     Manifest* out) {
  const Where where{model, source};
  return WithObject(text, where, [&](const json& manifest) -> Status {
    REC_RETURN_IF_ERROR(ParseServing(manifest, where, &out->serving));
    REC_RETURN_IF_ERROR(ParseUpdates(manifest, where, &out->updates));
    REC_RETURN_IF_ERROR(ParseNames(manifest, where, out));
    REC_RETURN_IF_ERROR(ParseRoles(manifest, where, &out->inputs));
    REC_RETURN_IF_ERROR(ParseZch(manifest, where, &out->zch));
    ZchMapPlaces(out->zch, &out->updates);
    REC_RETURN_IF_ERROR(ParseContext(manifest, where, *out, &out->context));
    return ParseFeatureSpec(manifest, where, out->sparse_features, &out->feature_spec);
  });
}

Status ParseUpdatesSection(const std::string& text, const std::string& model,
                           const std::string& source, UpdatesSpec* out) {
  const Where where{model, source};
  return WithObject(text, where, [&](const json& manifest) {
    REC_RETURN_IF_ERROR(ParseUpdates(manifest, where, out));
    ZchSection zch;  // the ZCH tables' maps, which a record's map changes write with its rows
    REC_RETURN_IF_ERROR(ParseZch(manifest, where, &zch));
    ZchMapPlaces(zch, out);
    return Status::Ok();
  });
}

}  // namespace rec
