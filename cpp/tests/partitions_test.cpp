// A partitioned log's keys and layout record (contract/partitions.h) against
// tests/data/partition_key_golden.json, which rec/contract/partitions.py's tests load too: key
// slots (KeySlot, Redis Cluster's hash tag edge cases), each partition's band, key, slot and
// dead-letter key for P in 1, 2, 3, 6, 16, layout records byte for byte, and each refusal.
#include "contract/partitions.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "contract/store_spec.h"
#include "golden_file.h"

namespace rec {
namespace {

using nlohmann::json;
using testing::Cases;
using testing::Contains;
using testing::Golden;

const json& File() {
  static const json g = Golden("partition_key_golden.json");
  return g;
}

TEST(Partitions, ConstantsAreThePythonOnes) {
  EXPECT_EQ(File().value("format", ""), kPartitionsFormat);
  EXPECT_EQ(File().value("slots", 0), kClusterSlots);
  EXPECT_EQ(File().value("max_partitions", 0), kMaxPartitions);
}

TEST(Partitions, KeySlotsAreRedisClusters) {
  for (const json& c : Cases(File(), "key_slot")) {
    const std::string key = c["key"].get<std::string>();  // UTF-8 bytes, as Python encodes
    EXPECT_EQ(KeySlot(key), c["slot"].get<int>()) << key;
  }
}

TEST(Partitions, Crc16ContinuesAnEarlierCall) {
  EXPECT_EQ(Crc16("123456789"), 0x31C3);  // CRC16/XMODEM's check value
  EXPECT_EQ(Crc16("6789", Crc16("12345")), Crc16("123456789"));
}

TEST(Partitions, LayoutKeys) {
  for (const json& c : Cases(File(), "layout_key")) {
    std::string key;
    ASSERT_TRUE(LayoutKey(c["stream"].get<std::string>(), &key).ok()) << c["stream"];
    EXPECT_EQ(key, c["key"].get<std::string>());
  }
}

TEST(Partitions, EachPartitionsBandKeySlotAndDeadKey) {
  for (const json& c : Cases(File(), "partitions")) {
    const std::string stream = c["stream"].get<std::string>();
    const auto p = c["partitions"].get<int64_t>();
    PartitionLayout layout;
    ASSERT_TRUE(MakeLayout(stream, p, "", &layout).ok()) << stream << " " << p;
    ASSERT_EQ(layout.keys.size(), c["parts"].size()) << p;
    for (const json& part : c["parts"]) {
      const auto k = part["partition"].get<int64_t>();
      SlotBand band;
      ASSERT_TRUE(PartitionBand(k, p, &band).ok());
      EXPECT_EQ(band.low, part["band"][0].get<int64_t>()) << p << " " << k;
      EXPECT_EQ(band.high, part["band"][1].get<int64_t>()) << p << " " << k;
      std::string key;
      ASSERT_TRUE(LogPartitionKey(stream, k, p, &key).ok());
      EXPECT_EQ(key, part["key"].get<std::string>()) << p << " " << k;
      EXPECT_EQ(layout.keys[static_cast<size_t>(k)], key);
      EXPECT_EQ(KeySlot(key), part["slot"].get<int>()) << key;
      EXPECT_EQ(DeadKey(key), part["dead"].get<std::string>());
      EXPECT_EQ(KeySlot(DeadKey(key)), KeySlot(key)) << "a dead-letter stream shares its slot";
    }
  }
}

// Beyond the golden P: every key lies in its own band, so the masters of cluster-create (equal
// contiguous ranges) get P/M partitions each, up to the largest P.
TEST(Partitions, EveryKeyLiesInItsBandUpToTheLargestCount) {
  for (int64_t p : {int64_t{5}, int64_t{7}, int64_t{48}, int64_t{256}, kMaxPartitions}) {
    PartitionLayout layout;
    ASSERT_TRUE(MakeLayout("rec:events", p, "user_id", &layout).ok()) << p;
    ASSERT_EQ(static_cast<int64_t>(layout.keys.size()), p);
    for (int64_t k = 0; k < p; ++k) {
      SlotBand band;
      ASSERT_TRUE(PartitionBand(k, p, &band).ok());
      const int slot = KeySlot(layout.keys[static_cast<size_t>(k)]);
      EXPECT_TRUE(band.low <= slot && slot < band.high) << p << " " << k << " " << slot;
    }
  }
}

TEST(Partitions, LayoutRecordsAreWrittenAsPythonWritesThemAndReadBack) {
  for (const json& c : Cases(File(), "layout")) {
    PartitionLayout layout;
    ASSERT_TRUE(MakeLayout(c["stream"].get<std::string>(), c["partitions"].get<int64_t>(),
                           c["key"].get<std::string>(), &layout)
                    .ok());
    const std::string record = c["record"].get<std::string>();
    EXPECT_EQ(LayoutJson(layout), record);
    PartitionLayout read;
    ASSERT_TRUE(ParseLayout(record, "{s}:layout", &read).ok()) << record;
    EXPECT_EQ(read.partitions, layout.partitions);
    EXPECT_EQ(read.key, layout.key);
    EXPECT_EQ(read.keys, layout.keys);
  }
}

TEST(Partitions, BadLayoutRecordsAreRefusedNamingTheField) {
  for (const json& c : Cases(File(), "layout_refused")) {
    PartitionLayout read;
    Status st = ParseLayout(c["record"].get<std::string>(), "{s}:layout", &read);
    ASSERT_FALSE(st.ok()) << c["record"];
    EXPECT_TRUE(Contains(st, "{s}:layout: " + c["error"].get<std::string>())) << st.message();
  }
}

TEST(Partitions, StreamsAndCountsThatCannotBePartitionedAreRefused) {
  for (const json& c : Cases(File(), "refused")) {
    PartitionLayout layout;
    Status st =
        MakeLayout(c["stream"].get<std::string>(), c["partitions"].get<int64_t>(), "", &layout);
    ASSERT_FALSE(st.ok()) << c["stream"] << " " << c["partitions"];
    EXPECT_TRUE(Contains(st, c["error"].get<std::string>())) << st.message();
  }
  SlotBand band;
  EXPECT_EQ(PartitionBand(3, 3, &band).message(), "partition 3 is not in [0, 3)");
  std::string key;
  EXPECT_FALSE(LayoutKey("a{b", &key).ok());
}

}  // namespace
}  // namespace rec
