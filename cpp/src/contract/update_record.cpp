#include "contract/update_record.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <map>

namespace rec {
namespace {

Status Bad(const std::string& what) { return InvalidArgument("update record: " + what); }

// A decimal integer in [0, 2^63 - 1]; false for anything else (no overflow).
bool ParseCount(const std::string& text, int64_t* out) {
  if (text.empty() || text.size() > 19) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v > static_cast<uint64_t>(INT64_MAX)) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

std::string Quoted(const std::string& s) { return "'" + s + "'"; }

// `n` (slot, raw id) pairs of field `key` (empty when absent): slots >= 0, strictly increasing.
Status DecodePairs(const std::map<std::string, const std::string*>& by_name, const char* key,
                   int64_t n, std::vector<UpdateRecord::SlotId>* out) {
  static const std::string kEmpty;
  auto it = by_name.find(key);
  const std::string& data = it == by_name.end() ? kEmpty : *it->second;
  const std::string name = std::string("\"") + key + "\"";
  if (data.size() != static_cast<size_t>(16 * n)) {
    return Bad(name + " holds " + std::to_string(data.size()) + " bytes, " + std::to_string(n) +
               " (slot, id) pairs need " + std::to_string(16 * n));
  }
  out->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {  // little-endian host
    std::memcpy(&(*out)[i].slot, data.data() + 16 * i, 8);
    std::memcpy(&(*out)[i].id, data.data() + 16 * i + 8, 8);
    if ((*out)[i].slot < 0 || (i > 0 && (*out)[i].slot <= (*out)[i - 1].slot)) {
      return Bad(name + " slots must be non-negative and strictly increasing");
    }
  }
  return Status::Ok();
}

// Version 3's `held` agrees with the record: each held slot has a row, an admitted slot is held
// by its admitted id, a slot only evicted is held by none. Every list is sorted by slot.
Status CheckHeld(const UpdateRecord& r) {
  auto find = [](const std::vector<UpdateRecord::SlotId>& list, int64_t slot) {
    auto it = std::lower_bound(list.begin(), list.end(), slot,
                               [](const UpdateRecord::SlotId& e, int64_t s) { return e.slot < s; });
    return it != list.end() && it->slot == slot ? &*it : nullptr;
  };
  for (const auto& h : r.held) {
    if (!std::binary_search(r.ids.begin(), r.ids.end(), h.slot)) {
      return Bad("\"held\" slot " + std::to_string(h.slot) + " has no row in \"ids\"");
    }
  }
  for (const auto& a : r.admitted) {
    const UpdateRecord::SlotId* h = find(r.held, a.slot);
    if (h == nullptr || h->id != a.id) {
      return Bad("\"held\" does not give admitted slot " + std::to_string(a.slot) + " its id " +
                 std::to_string(a.id));
    }
  }
  for (const auto& e : r.evicted) {
    if (find(r.held, e.slot) != nullptr && find(r.admitted, e.slot) == nullptr) {
      return Bad("\"held\" slot " + std::to_string(e.slot) +
                 " is evicted and not admitted: it holds no id after the record");
    }
  }
  return Status::Ok();
}

}  // namespace

Status DecodeUpdateRecord(const StreamFields& fields, UpdateRecord* out) {
  std::map<std::string, const std::string*> by_name;
  for (const auto& [k, v] : fields) by_name[k] = &v;
  auto text = [&](const char* key, const std::string** v) -> Status {
    auto it = by_name.find(key);
    if (it == by_name.end()) return Bad(std::string("\"") + key + "\" is missing");
    *v = it->second;
    return Status::Ok();
  };
  const std::string* v = nullptr;
  REC_RETURN_IF_ERROR(text("format", &v));
  if (*v != kUpdateFormat && *v != kUpdateFormatV2 && *v != kUpdateFormatV1) {
    return Bad(std::string("\"format\" must be one of ['") + kUpdateFormatV1 + "', '" +
               kUpdateFormatV2 + "', '" + kUpdateFormat + "'], got " + Quoted(*v));
  }
  const bool v3 = *v == kUpdateFormat;
  const bool v2 = v3 || *v == kUpdateFormatV2;
  std::vector<const char*> int_fields = {"gen", "rank", "world", "step", "wall_ns", "dim", "count"};
  if (v2) int_fields.insert(int_fields.end(), {"evicts", "admits"});
  if (v3) int_fields.push_back("holds");
  std::map<std::string, int64_t> ints;
  for (const char* key : int_fields) {
    REC_RETURN_IF_ERROR(text(key, &v));
    int64_t n = 0;
    if (!ParseCount(*v, &n)) {
      return Bad(std::string("\"") + key + "\" must be a non-negative integer, got " + Quoted(*v));
    }
    ints[key] = n;
  }
  if (ints["rank"] >= ints["world"]) {
    return Bad("\"rank\" " + std::to_string(ints["rank"]) + " is not in [0, " +
               std::to_string(ints["world"]) + ")");
  }
  if (ints["gen"] < 1) return Bad("\"gen\" must be at least 1");
  REC_RETURN_IF_ERROR(text("last", &v));
  if (*v != "0" && *v != "1") return Bad("\"last\" must be \"0\" or \"1\", got " + Quoted(*v));
  out->last = *v == "1";
  REC_RETURN_IF_ERROR(text("dtype", &v));
  out->dtype = *v;
  if (RowBytes(0, out->dtype) < 0) {
    return Bad("\"dtype\" must be one of ['int8', 'int4', 'fp16', 'fp32'], got " + Quoted(*v));
  }
  REC_RETURN_IF_ERROR(text("table", &v));
  out->table = *v;
  REC_RETURN_IF_ERROR(text("run", &v));
  out->run = *v;
  int64_t count = ints["count"];
  if (count > kMaxUpdateRows) {
    return Bad("\"count\" " + std::to_string(count) + " is over " + std::to_string(kMaxUpdateRows) +
               " rows");
  }
  if (ints["dim"] > kMaxUpdateDim) {
    return Bad("\"dim\" " + std::to_string(ints["dim"]) + " is over " +
               std::to_string(kMaxUpdateDim));
  }
  if (count > 0 && out->table.empty()) return Bad("\"table\" is empty but \"count\" is not 0");
  for (const char* key : {"evicts", "admits", "holds"}) {
    if (ints[key] > kMaxUpdateRows) {
      return Bad(std::string("\"") + key + "\" " + std::to_string(ints[key]) + " is over " +
                 std::to_string(kMaxUpdateRows) + " slots");
    }
  }
  static const std::string kEmpty;
  auto ids_it = by_name.find("ids");
  auto rows_it = by_name.find("rows");
  const std::string& ids = ids_it == by_name.end() ? kEmpty : *ids_it->second;
  const std::string& rows = rows_it == by_name.end() ? kEmpty : *rows_it->second;
  if (ids.size() != static_cast<size_t>(8 * count)) {
    return Bad("\"ids\" holds " + std::to_string(ids.size()) + " bytes, " + std::to_string(count) +
               " ids need " + std::to_string(8 * count));
  }
  int64_t row_bytes = 0;
  Status row = CheckRowBytes(ints["dim"], out->dtype, &row_bytes);
  if (!row.ok()) return Bad(row.message());
  int64_t want = count * row_bytes;
  if (rows.size() != static_cast<size_t>(want)) {
    return Bad("\"rows\" holds " + std::to_string(rows.size()) + " bytes, " +
               std::to_string(count) + " " + out->dtype + " rows of dim " +
               std::to_string(ints["dim"]) + " need " + std::to_string(want));
  }
  out->ids.resize(static_cast<size_t>(count));
  if (count > 0) std::memcpy(out->ids.data(), ids.data(), ids.size());  // little-endian host
  for (int64_t i = 0; i < count; ++i) {
    if (out->ids[i] < 0 || (i > 0 && out->ids[i] <= out->ids[i - 1])) {
      return Bad("\"ids\" must be non-negative and strictly increasing");
    }
  }
  REC_RETURN_IF_ERROR(DecodePairs(by_name, "evicted", ints["evicts"], &out->evicted));
  REC_RETURN_IF_ERROR(DecodePairs(by_name, "admitted", ints["admits"], &out->admitted));
  if (out->changes_map() && out->table.empty()) {
    return Bad("\"table\" is empty but the record changes an id map");
  }
  for (const auto& a : out->admitted) {  // ids are sorted: a binary search each
    if (!std::binary_search(out->ids.begin(), out->ids.end(), a.slot)) {
      return Bad("\"admitted\" slot " + std::to_string(a.slot) +
                 " has no row in \"ids\": a slot's new id comes with its row");
    }
  }
  out->has_held = v3;
  if (v3) {
    REC_RETURN_IF_ERROR(DecodePairs(by_name, "held", ints["holds"], &out->held));
    REC_RETURN_IF_ERROR(CheckHeld(*out));
  }
  out->rows = rows;
  out->gen = ints["gen"];
  out->rank = ints["rank"];
  out->world = ints["world"];
  out->step = ints["step"];
  out->wall_ns = ints["wall_ns"];
  out->dim = ints["dim"];
  return Status::Ok();
}

namespace {

constexpr char kUrlForm[] = "redis://HOST:PORT[/STREAM]";
constexpr char kClusterUrlForm[] = "redis://HOST:PORT,HOST:PORT...[/STREAM]";

// No character of `banned` and no white space in `s`.
bool Clean(const std::string& s, const char* banned) {
  return std::none_of(s.begin(), s.end(), [banned](char c) {
    return std::strchr(banned, c) != nullptr || std::isspace(static_cast<unsigned char>(c));
  });
}

bool Digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// One node of the list, HOST:PORT (rec/contract/urls.py _NODE: no '/', ':', '?', '#', ',' or
// space in the host, five digits at most in the port); false when it is not of that form.
bool ParseNode(const std::string& part, std::pair<std::string, int>* node) {
  const size_t colon = part.find(':');
  if (colon == std::string::npos || colon == 0) return false;
  const std::string host = part.substr(0, colon), port = part.substr(colon + 1);
  if (!Clean(host, "/:?#,") || port.size() > 5 || !Digits(port)) return false;
  *node = {host, std::stoi(port)};
  return true;
}

}  // namespace

Status ParseUpdateUrl(const std::string& url, UpdateUrl* out) {
  // By hand, not std::regex: GCC 12's regex trips -Wmaybe-uninitialized in the sanitized build.
  const std::string where = "update log URL '" + url + "'";
  const Status bad = InvalidArgument(where + " must look like " + kUrlForm +
                                     " (a cluster: " + kClusterUrlForm + ")");
  const std::string scheme = "redis://";
  if (url.rfind(scheme, 0) != 0) return bad;
  // The node list stops at the first '/', so a stream may hold ',' or ':'.
  const std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  const std::string list = rest.substr(0, slash);
  std::string stream = slash == std::string::npos ? "" : rest.substr(slash + 1);
  if (list.empty() || !Clean(list, "?#") || !Clean(stream, "?#")) return bad;
  std::vector<std::pair<std::string, int>> nodes;
  for (size_t start = 0, end = 0; end != std::string::npos; start = end + 1) {
    end = list.find(',', start);
    const std::string part = list.substr(start, end == std::string::npos ? end : end - start);
    std::pair<std::string, int> node;
    if (!ParseNode(part, &node)) {
      if (start == 0 && end == std::string::npos) return bad;  // one node: the whole URL's form
      return InvalidArgument(where + ": '" + part + "' is not HOST:PORT; want " + kClusterUrlForm);
    }
    if (node.second < 1 || node.second > 65535) {
      return InvalidArgument(where + ": port " + std::to_string(node.second) +
                             " is not in [1, 65535]");
    }
    nodes.push_back(std::move(node));
  }
  if (stream.empty()) stream = kDefaultUpdateStream;
  if (Digits(stream)) {
    return InvalidArgument(where + ": the path names the stream, and '" + stream +
                           "' looks like a Redis database number; name the stream " +
                           "(for example /rec:updates)");
  }
  out->host = nodes[0].first;
  out->port = nodes[0].second;
  out->stream = stream;
  out->nodes = std::move(nodes);
  return Status::Ok();
}

}  // namespace rec
