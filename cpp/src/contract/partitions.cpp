#include "contract/partitions.h"

#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "contract/store_spec.h"

namespace rec {
namespace {

using nlohmann::json;

// j's bound in the key search: CRC16 spreads decimal suffixes evenly, so a band of b slots is
// hit within about 16384/b tries; far past that, something is wrong.
constexpr int64_t kMaxTries = int64_t{1} << 20;

// A value as Python's repr() writes it, for messages worded as rec/contract/partitions.py's.
std::string PyRepr(const json& v) {
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    const char quote =
        s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
    std::string out(1, quote);
    for (char c : s) {
      if (c == '\\' || c == quote) out += '\\';
      out += c;
    }
    return out + quote;
  }
  if (v.is_array() || v.is_object()) {
    std::string out;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!out.empty()) out += ", ";
      if (v.is_object()) out += PyRepr(it.key()) + ": ";
      out += PyRepr(*it);
    }
    return v.is_array() ? "[" + out + "]" : "{" + out + "}";
  }
  return v.dump();
}

Status CheckCount(int64_t partitions) {
  if (partitions < 1 || partitions > kMaxPartitions) {
    return InvalidArgument("partitions " + std::to_string(partitions) + " is not in [1, " +
                           std::to_string(kMaxPartitions) + "]");
  }
  return Status::Ok();
}

// A brace would end or start the hash tag inside the name: every partition in one slot.
Status CheckStream(const std::string& stream) {
  if (stream.empty() || stream.find_first_of("{}") != std::string::npos) {
    return InvalidArgument("stream " + PyRepr(stream) +
                           " cannot be partitioned: want a non-empty name without '{' or '}' "
                           "(they would cut its keys' hash tag)");
  }
  return Status::Ok();
}

// An integer in [1, kMaxPartitions] (a positive one parses as unsigned, a negative as signed).
bool IsCount(const json& v) {
  if (v.is_number_unsigned()) {
    const auto n = v.get<uint64_t>();
    return n >= 1 && n <= static_cast<uint64_t>(kMaxPartitions);
  }
  return v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= kMaxPartitions;
}

// "keys": a list of non-empty strings.
bool IsKeyList(const json& v) {
  if (!v.is_array()) return false;
  for (const json& k : v) {
    if (!k.is_string() || k.get<std::string>().empty()) return false;
  }
  return true;
}

}  // namespace

Status PartitionBand(int64_t k, int64_t partitions, SlotBand* out) {
  REC_RETURN_IF_ERROR(CheckCount(partitions));
  if (k < 0 || k >= partitions) {
    return InvalidArgument("partition " + std::to_string(k) + " is not in [0, " +
                           std::to_string(partitions) + ")");
  }
  *out = {k * kClusterSlots / partitions, (k + 1) * kClusterSlots / partitions};
  return Status::Ok();
}

Status LogPartitionKey(const std::string& stream, int64_t k, int64_t partitions, std::string* out) {
  REC_RETURN_IF_ERROR(CheckStream(stream));
  SlotBand band;
  REC_RETURN_IF_ERROR(PartitionBand(k, partitions, &band));
  // The hash tag is "S:k:j": the CRC of "S:k:" once, then each j's digits from there.
  const std::string head = stream + ":" + std::to_string(k) + ":";
  const uint16_t crc = Crc16(head);
  for (int64_t j = 0; j < kMaxTries; ++j) {
    const std::string digits = std::to_string(j);
    const int64_t slot = Crc16(digits, crc) % kClusterSlots;
    if (band.low <= slot && slot < band.high) {
      *out = "{" + head + digits + "}";
      return Status::Ok();
    }
  }
  return Internal("no key of " + PyRepr(stream) + " partition " + std::to_string(k) +
                  " falls in slots [" + std::to_string(band.low) + ", " +
                  std::to_string(band.high) + ")");
}

Status LayoutKey(const std::string& stream, std::string* out) {
  REC_RETURN_IF_ERROR(CheckStream(stream));
  *out = "{" + stream + "}:layout";
  return Status::Ok();
}

Status MakeLayout(const std::string& stream, int64_t partitions, const std::string& key,
                  PartitionLayout* out) {
  REC_RETURN_IF_ERROR(CheckCount(partitions));
  PartitionLayout layout{partitions, key, {}};
  for (int64_t k = 0; k < partitions; ++k) {
    std::string partition_key;
    REC_RETURN_IF_ERROR(LogPartitionKey(stream, k, partitions, &partition_key));
    layout.keys.push_back(std::move(partition_key));
  }
  *out = std::move(layout);
  return Status::Ok();
}

std::string LayoutJson(const PartitionLayout& layout) {
  nlohmann::ordered_json record = {{"format", kPartitionsFormat},
                                   {"partitions", layout.partitions},
                                   {"key", layout.key},
                                   {"keys", layout.keys}};
  return record.dump(-1, ' ', /*ensure_ascii=*/true);  // as Python's json.dumps
}

Status ParseLayout(const std::string& text, const std::string& where, PartitionLayout* out) {
  auto bad = [&where](const std::string& what) { return InvalidArgument(where + ": " + what); };
  const json data = json::parse(text, nullptr, false);
  if (data.is_discarded()) return bad("not a JSON layout record (not valid JSON)");
  if (!data.is_object()) return bad("a layout record must be a JSON object");
  const json none;
  auto field = [&](const char* name) -> const json& {
    auto it = data.find(name);
    return it == data.end() ? none : *it;
  };
  if (field("format") != kPartitionsFormat) {
    return bad("format " + PyRepr(field("format")) + ", want '" + kPartitionsFormat + "'");
  }
  const json& count = field("partitions");
  if (!IsCount(count)) {
    return bad("partitions must be an integer in [1, " + std::to_string(kMaxPartitions) +
               "], got " + PyRepr(count));
  }
  if (!field("key").is_string()) {
    return bad("key must be a string (a column, or '' for round robin)");
  }
  if (!IsKeyList(field("keys"))) return bad("keys must be a list of non-empty strings");
  const auto keys = field("keys").get<std::vector<std::string>>();
  const std::set<std::string> distinct(keys.begin(), keys.end());
  const auto p = count.get<int64_t>();
  if (static_cast<int64_t>(keys.size()) != p || static_cast<int64_t>(distinct.size()) != p) {
    return bad("keys must name " + std::to_string(p) + " distinct streams, got " +
               std::to_string(keys.size()) + " (" + std::to_string(distinct.size()) + " distinct)");
  }
  *out = {p, field("key").get<std::string>(), keys};
  return Status::Ok();
}

}  // namespace rec
