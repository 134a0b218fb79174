// A log partitioned over a Redis Cluster (#60; rec/contract/partitions.py, the reference): its
// layout record and its partitions' stream keys, with the same refusal sentences.
//
// A stream S is one Redis stream (the key S; no layout record) or P partitions. The layout
// record, the JSON string at "{S}:layout" written once with SET NX, holds
// {"format": "rec.partitions/1", "partitions": P, "key": COLUMN or "", "keys": [KEY_0, ...]};
// a reader takes the keys from it and never recomputes them. Partition k's key is "{S:k:j}" with
// j the smallest j >= 0 whose slot lies in band k, [floor(k*16384/P), floor((k+1)*16384/P)): the
// masters `redis-cli --cluster create` makes own equal contiguous slot ranges, so with P a
// multiple of their number each serves P/M partitions. tests/data/partition_key_golden.json pins
// slots, bands, keys and records for both languages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace rec {

inline constexpr const char* kPartitionsFormat = "rec.partitions/1";
inline constexpr int64_t kClusterSlots = 16384;
// Partitions of one log at most (the key search costs about P^2 CRC16s).
inline constexpr int64_t kMaxPartitions = 1024;

// Partition k's slots, [low, high).
struct SlotBand {
  int64_t low = 0;
  int64_t high = 0;
};

// The k-th of `partitions` near-equal contiguous bands; InvalidArgument for a count outside
// [1, kMaxPartitions] or k outside [0, partitions).
Status PartitionBand(int64_t k, int64_t partitions, SlotBand* out);

// Partition k's stream key, "{S:k:j}" (the braces make it all the hash tag).
Status LogPartitionKey(const std::string& stream, int64_t k, int64_t partitions, std::string* out);

// The layout record's key, "{S}:layout".
Status LayoutKey(const std::string& stream, std::string* out);

// A partition's dead-letter stream: its key + ":dead", in the same slot.
inline std::string DeadKey(const std::string& partition_key) { return partition_key + ":dead"; }

struct PartitionLayout {
  int64_t partitions = 0;
  std::string key;                // the producers' key column; "" for round robin
  std::vector<std::string> keys;  // partition k's stream key at index k
};

// The layout of `stream` in `partitions` partitions, partitioned by column `key` ("" : round
// robin).
Status MakeLayout(const std::string& stream, int64_t partitions, const std::string& key,
                  PartitionLayout* out);

// The record as the layout key holds it: compact JSON, fields in the order above.
std::string LayoutJson(const PartitionLayout& layout);

// A layout record (the value of `where`, a layout key) -> its fields; InvalidArgument naming the
// field that is wrong, as rec/contract/partitions.py parse_layout words it.
Status ParseLayout(const std::string& text, const std::string& where, PartitionLayout* out);

}  // namespace rec
