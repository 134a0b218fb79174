// The update log's units without a broker: rows written into a table's storage at rec.json's
// place (FBGEMM's scale and bias moved to the front), refused whole, and the watermark kept.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "contract/update_record.h"
#include "updates/embedding_tables.h"

namespace rec {
namespace {

std::string Ids(const std::vector<int64_t>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 8);
}

StreamFields Fields(int64_t step, const std::vector<int64_t>& ids, const std::string& rows,
                    const std::string& table = "t0", int64_t rank = 0, bool last = true) {
  return {{"format", "rec.updates/1"},
          {"run", "r1"},
          {"gen", "1"},
          {"rank", std::to_string(rank)},
          {"world", "2"},
          {"step", std::to_string(step)},
          {"wall_ns", std::to_string(1000000 * step)},
          {"last", last ? "1" : "0"},
          {"table", table},
          {"dtype", "int8"},
          {"dim", "4"},
          {"count", std::to_string(ids.size())},
          {"ids", Ids(ids)},
          {"rows", rows}};
}

void Set(StreamFields* f, const std::string& key, const std::string& value) {
  for (auto& [k, v] : *f) {
    if (k == key) v = value;
  }
}

// Decoding and refusing one record, and the URL, are checked against the golden files both
// languages load: contract_golden_test.cpp.

class Tables : public ::testing::Test {
 protected:
  void SetUp() override {
    storage_.assign(4 * 16 + 8, 0);
    UpdatesSpec spec;
    spec.present = true;
    spec.run = "r1";
    spec.step = 10;
    spec.gen = 1;  // the export holds what generation 1 trained up to step 10
    // t0: 4 rows of int8 dim 4 (8 bytes), padded to 16, from byte 8.
    spec.tables["t0"] = TablePlace{"w", 8, 16, 4, 4, "int8", true};
    ASSERT_TRUE(EmbeddingTables::Create(
                    spec, {{"w", {storage_.data(), static_cast<int64_t>(storage_.size())}}},
                    nullptr, &tables_)
                    .ok());
  }
  UpdateOutcome Apply(const StreamFields& f) {
    UpdateRecord r;
    EXPECT_TRUE(DecodeUpdateRecord(f, &r).ok());
    std::string why;
    return tables_->Apply(r, &why);
  }
  std::vector<uint8_t> storage_;
  std::shared_ptr<EmbeddingTables> tables_;
};

TEST_F(Tables, WritesRowsWithScaleAndBiasFirst) {
  // Row = codes c0..c3 then scale s0 s1 and bias b0 b1.
  EXPECT_EQ(Apply(Fields(11, {2}, "ABCDsSbB")), UpdateOutcome::kApplied);
  const uint8_t* row = storage_.data() + 8 + 2 * 16;
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(row), 8), "sSbBABCD");
  EXPECT_EQ(row[8], 0);            // the padding is left alone
  EXPECT_EQ(storage_[8 + 16], 0);  // and the other rows
  EXPECT_EQ(Apply(Fields(9, {1}, "ABCDsSbB", "t0", 1)), UpdateOutcome::kSkipped);  // <= export
  StreamFields resumed = Fields(9, {3}, "ABCDsSbB", "t0", 1);  // a resumed run's (gen 2) step 9
  Set(&resumed, "gen", "2");
  EXPECT_EQ(Apply(resumed), UpdateOutcome::kApplied);
  EXPECT_EQ(storage_[8 + 16], 0);
}

TEST_F(Tables, RefusesWholeRecords) {
  std::string two(16, 'z');
  EXPECT_EQ(Apply(Fields(11, {1, 4}, two)), UpdateOutcome::kIdRange);
  EXPECT_EQ(Apply(Fields(11, {1}, "ABCDsSbB", "t9")), UpdateOutcome::kUnknownTable);
  StreamFields other = Fields(11, {1}, "ABCDsSbB");
  Set(&other, "run", "r2");
  EXPECT_EQ(Apply(other), UpdateOutcome::kOtherRun);
  StreamFields wide = Fields(11, {1}, std::string(9, 'w'));
  Set(&wide, "dim", "5");
  EXPECT_EQ(Apply(wide), UpdateOutcome::kRowFormat);
  for (uint8_t b : storage_) EXPECT_EQ(b, 0);
  EXPECT_EQ(Apply(Fields(12, {1}, "ABCDsSbB")), UpdateOutcome::kApplied);
  EXPECT_EQ(Apply(Fields(11, {1}, "abcdsSbB")), UpdateOutcome::kBackwards);
  EXPECT_EQ(storage_[8 + 16 + 4], 'A');
}

TEST_F(Tables, TheWatermarkWaitsForEveryRankAndStartsAtTheExport) {
  Watermark w = tables_->CurrentWatermark();
  EXPECT_TRUE(w.valid);
  EXPECT_EQ(w.step, 10);
  EXPECT_EQ(w.wall_ns, 0);
  Apply(Fields(14, {1}, "ABCDsSbB", "t0", 0));
  EXPECT_EQ(tables_->CurrentWatermark().step, 10);  // rank 1 has not published
  Apply(Fields(12, {}, "", "", 1));
  EXPECT_EQ(tables_->CurrentWatermark().step, 12);
  EXPECT_EQ(tables_->CurrentWatermark().wall_ns, 12000000);
  Apply(Fields(16, {}, "", "", 1, /*last=*/false));  // not complete yet
  EXPECT_EQ(tables_->CurrentWatermark().step, 12);
}

}  // namespace
}  // namespace rec
