#include "contract/store_spec.h"

#include <nlohmann/json.hpp>

#include "contract/row_bytes.h"

namespace rec {
namespace {

constexpr const char* kFormat = "rec.store/1";
constexpr const char* kFormatRawIds = "rec.store/2";  // with a table keyed by raw id
constexpr int64_t kMaxPartitions = 1 << 14;

}  // namespace

Status ParseStoreUrl(const std::string& url, std::vector<std::pair<std::string, int>>* nodes) {
  const std::string scheme = "redis://";
  if (url.compare(0, scheme.size(), scheme) != 0) {
    return InvalidArgument("store URL '" + url + "': want redis://HOST:PORT[,HOST:PORT...]");
  }
  nodes->clear();
  size_t start = scheme.size();
  while (true) {
    const size_t end = url.find(',', start);
    const std::string part = url.substr(start, end == std::string::npos ? end : end - start);
    // The host is everything before the first ':' (rec.contract.store's pattern: no ':', '/',
    // '?', '#' or space in it), the port five digits at most after it.
    const size_t colon = part.find(':');
    bool ok = colon != std::string::npos && colon > 0 && colon + 1 < part.size() &&
              part.size() - colon - 1 <= 5 &&
              part.find_first_of("/?# \t\n\r\f\v") == std::string::npos;
    int port = 0;
    for (size_t i = colon + 1; ok && i < part.size(); ++i) {
      ok = part[i] >= '0' && part[i] <= '9';
      port = port * 10 + (part[i] - '0');
    }
    if (!ok || port < 1 || port > 65535) {
      return InvalidArgument("store URL '" + url + "': '" + part + "' is not HOST:PORT (1-65535)");
    }
    nodes->emplace_back(part.substr(0, colon), port);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return Status::Ok();
}

Status ParseStoreSection(const std::string& manifest_text, const std::string& source,
                         StoreSpec* out) {
  *out = StoreSpec{};
  nlohmann::json manifest = nlohmann::json::parse(manifest_text, nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object()) {
    return InvalidArgument(source + " is not a JSON object");
  }
  auto it = manifest.find("store");
  if (it == manifest.end() || it->is_null()) return Status::Ok();
  const nlohmann::json& s = *it;
  auto bad = [&](const std::string& what) { return InvalidArgument(source + ": store" + what); };
  if (!s.is_object()) return bad(" must be an object");
  if (!s.contains("format") || (s["format"] != kFormat && s["format"] != kFormatRawIds)) {
    return bad(".format must be \"" + std::string(kFormat) + "\" or \"" + kFormatRawIds + "\"");
  }
  if (!s.contains("url") || !s["url"].is_string()) return bad(".url must be a string");
  out->url = s["url"].get<std::string>();
  Status url = ParseStoreUrl(out->url, &out->nodes);
  if (!url.ok()) return bad(".url: " + url.message());
  if (!s.contains("prefix") || !s["prefix"].is_string() || s["prefix"].get<std::string>().empty()) {
    return bad(".prefix must be a non-empty string");
  }
  out->prefix = s["prefix"].get<std::string>();
  if (!s.contains("tables") || !s["tables"].is_object() || s["tables"].empty()) {
    return bad(".tables must name at least one table");
  }
  for (const auto& [name, t] : s["tables"].items()) {
    const std::string where = ".tables." + name;
    if (!t.is_object()) return bad(where + " must be an object");
    StoreTable table;
    table.name = name;
    const std::pair<const char*, int64_t*> ints[] = {{"rows", &table.rows},
                                                     {"dim", &table.dim},
                                                     {"row_bytes", &table.row_bytes},
                                                     {"partitions", &table.partitions}};
    for (const auto& [key, dest] : ints) {
      if (!t.contains(key) || !t[key].is_number_integer() || t[key].get<int64_t>() < 1) {
        return bad(where + "." + key + " must be a positive integer");
      }
      *dest = t[key].get<int64_t>();
    }
    if (!t.contains("dtype") || !t["dtype"].is_string()) return bad(where + ".dtype: missing");
    table.dtype = t["dtype"].get<std::string>();
    if (RowBytes(0, table.dtype) < 0) {
      return bad(where + ".dtype '" + table.dtype + "' is not int8, int4, fp16, fp32");
    }
    int64_t want = 0;
    Status row = CheckRowBytes(table.dim, table.dtype, &want);
    if (!row.ok()) return bad(where + ": " + row.message());
    if (table.row_bytes != want) {
      return bad(where + ".row_bytes " + std::to_string(table.row_bytes) + ", want " +
                 std::to_string(want) + " for dim " + std::to_string(table.dim) + " " +
                 table.dtype);
    }
    if (table.partitions > kMaxPartitions || table.rows > (int64_t{1} << 40)) {
      return bad(where + ": partitions over 16384 or rows over 2^40");
    }
    if (t.contains("keys")) {
      if (t["keys"] != "row" && t["keys"] != "raw_id") {
        return bad(where + ".keys must be \"row\" or \"raw_id\"");
      }
      table.raw_id = t["keys"] == "raw_id";
    }
    auto described = manifest.find("tables");
    if (described != manifest.end() && described->is_array()) {
      for (const auto& d : *described) {
        if (!d.is_object() || d.value("name", "") != name || !d.contains("features")) continue;
        for (const auto& f : d["features"]) {
          if (f.is_string()) table.features.push_back(f.get<std::string>());
        }
      }
    }
    out->tables.push_back(std::move(table));
  }
  bool any_raw = false;
  for (const StoreTable& table : out->tables) any_raw = any_raw || table.raw_id;
  if (any_raw != (s["format"] == kFormatRawIds)) {
    return bad(".format must be \"" + std::string(any_raw ? kFormatRawIds : kFormat) +
               "\" for these tables (rec.store/2: a table keyed by raw id)");
  }
  out->present = true;
  return Status::Ok();
}

std::string PartitionKey(const std::string& prefix, const std::string& table, int64_t partition) {
  return "{" + prefix + ":" + table + ":" + std::to_string(partition) + "}";
}

std::string MetaKey(const std::string& prefix) { return "{" + prefix + "}:meta"; }

int KeySlot(const std::string& key) {
  // Redis hashes the part between the first '{' and the next '}' when it is not empty.
  size_t start = 0, len = key.size();
  const size_t open = key.find('{');
  if (open != std::string::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string::npos && close > open + 1) {
      start = open + 1;
      len = close - open - 1;
    }
  }
  return Crc16(std::string_view(key).substr(start, len)) & 16383;
}

uint16_t Crc16(std::string_view data, uint16_t crc) {
  for (char c : data) {
    crc ^= static_cast<uint16_t>(static_cast<uint8_t>(c)) << 8;
    for (int b = 0; b < 8; ++b) {
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<uint16_t>(crc << 1);
    }
  }
  return crc;
}

}  // namespace rec
