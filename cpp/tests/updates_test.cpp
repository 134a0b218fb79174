// The update log's units without a broker: rows written into a table's storage at rec.json's
// place (FBGEMM's scale and bias moved to the front), refused whole, and the watermark kept.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "contract/update_record.h"
#include "contract/zch_home.h"
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
  EXPECT_EQ(tables_->HeldBy(), -1);  // no rank has published
  Apply(Fields(14, {1}, "ABCDsSbB", "t0", 0));
  EXPECT_EQ(tables_->CurrentWatermark().step, 10);  // rank 1 has not published
  EXPECT_EQ(tables_->HeldBy(), 1);
  Apply(Fields(12, {}, "", "", 1));
  EXPECT_EQ(tables_->CurrentWatermark().step, 12);
  EXPECT_EQ(tables_->CurrentWatermark().wall_ns, 12000000);
  EXPECT_EQ(tables_->HeldBy(), 1);                   // at 12 while rank 0 is at 14
  Apply(Fields(16, {}, "", "", 1, /*last=*/false));  // not complete yet
  EXPECT_EQ(tables_->CurrentWatermark().step, 12);
  Apply(Fields(16, {}, "", "", 1));
  EXPECT_EQ(tables_->HeldBy(), 0);  // at 14 while rank 1 is at 16
  Apply(Fields(16, {}, "", "", 0));
  EXPECT_EQ(tables_->HeldBy(), -1);  // both at 16: nobody behind
}

// (slot, raw id) pairs as a version 2 record holds them.
std::string Pairs(const std::vector<std::pair<int64_t, int64_t>>& pairs) {
  std::vector<int64_t> flat;
  for (const auto& [slot, id] : pairs) flat.insert(flat.end(), {slot, id});
  return Ids(flat);
}

StreamFields MapFields(int64_t step, const std::vector<int64_t>& ids,
                       const std::vector<std::pair<int64_t, int64_t>>& evicted,
                       const std::vector<std::pair<int64_t, int64_t>>& admitted) {
  StreamFields f = Fields(step, ids, std::string(8 * ids.size(), 'r'));
  Set(&f, "format", "rec.updates/2");
  f.insert(f.end(), {{"evicts", std::to_string(evicted.size())},
                     {"evicted", Pairs(evicted)},
                     {"admits", std::to_string(admitted.size())},
                     {"admitted", Pairs(admitted)}});
  return f;
}

// t0 as a ZCH table: 8 slots and the default row, probes 2, its map in two copies (two lookups
// read it), as rec.json's "zch" section places it.
class ZchTables : public ::testing::Test {
 protected:
  static constexpr int64_t kSlots = 8;
  void SetUp() override {
    rows_.assign(16 * (kSlots + 1), 0);
    for (auto* keys : {&keys_a_, &keys_b_}) keys->assign(kSlots, 0);
    for (auto* used : {&used_a_, &used_b_}) used->assign(kSlots, 0);
    UpdatesSpec spec;
    spec.present = true;
    spec.run = "r1";
    spec.step = 10;
    spec.gen = 1;
    spec.tables["t0"] = TablePlace{"w", 0, 16, kSlots + 1, 4, "int8", true};
    spec.maps["t0"] = MapPlace{kSlots, 2, {{"a.keys", "a.used"}, {"b.keys", "b.used"}}};
    auto buf = [](auto* v) {
      return EmbeddingTables::Buffer{reinterpret_cast<uint8_t*>(v->data()),
                                     static_cast<int64_t>(v->size() * sizeof((*v)[0]))};
    };
    ASSERT_TRUE(EmbeddingTables::Create(spec,
                                        {{"w", buf(&rows_)},
                                         {"a.keys", buf(&keys_a_)},
                                         {"a.used", buf(&used_a_)},
                                         {"b.keys", buf(&keys_b_)},
                                         {"b.used", buf(&used_b_)}},
                                        nullptr, &tables_)
                    .ok());
  }
  // The nth id (from 1 up) whose window starts at `slot`.
  static int64_t IdAt(int64_t slot, int n = 0) {
    for (int64_t id = 1;; ++id) {
      if (ZchHome(id, kSlots) == slot && n-- == 0) return id;
    }
  }
  UpdateOutcome Apply(const StreamFields& f, std::string* why = nullptr) {
    UpdateRecord r;
    Status st = DecodeUpdateRecord(f, &r);
    EXPECT_TRUE(st.ok()) << st.message();
    std::string unused;
    return tables_->Apply(r, why ? why : &unused);
  }
  std::vector<uint8_t> rows_, used_a_, used_b_;
  std::vector<int64_t> keys_a_, keys_b_;
  std::shared_ptr<EmbeddingTables> tables_;
};

TEST_F(ZchTables, WritesASlotsRowAndItsIdIntoEveryCopyOfTheMap) {
  const int64_t a = IdAt(3), b = IdAt(3, 1);
  EXPECT_EQ(Apply(MapFields(11, {3}, {}, {{3, a}})), UpdateOutcome::kApplied);
  EXPECT_EQ(rows_[3 * 16 + 4], 'r');
  EXPECT_EQ(Apply(MapFields(12, {3, 4}, {{3, a}}, {{3, b}, {4, a}})), UpdateOutcome::kApplied);
  for (const auto* keys : {&keys_a_, &keys_b_}) EXPECT_EQ((*keys)[3], b);
  for (const auto* keys : {&keys_a_, &keys_b_}) EXPECT_EQ((*keys)[4], a);
  EXPECT_EQ(Apply(MapFields(13, {}, {{4, a}}, {})), UpdateOutcome::kApplied);  // evicted alone
  for (const auto* used : {&used_a_, &used_b_}) {
    EXPECT_EQ(std::vector<uint8_t>(*used), std::vector<uint8_t>({0, 0, 0, 1, 0, 0, 0, 0}));
  }
  StreamFields exported = MapFields(10, {}, {{5, 99}}, {});  // the export holds it: unchecked
  Set(&exported, "rank", "1");
  EXPECT_EQ(Apply(exported), UpdateOutcome::kSkipped);
}

TEST_F(ZchTables, AMapRecordSentAgainRewritesItsRowsAndLeavesTheMap) {
  const int64_t a = IdAt(3), b = IdAt(3, 1);
  ASSERT_EQ(Apply(MapFields(11, {3}, {}, {{3, a}})), UpdateOutcome::kApplied);
  const StreamFields moved = MapFields(12, {3}, {{3, a}}, {{3, b}});
  EXPECT_EQ(Apply(moved), UpdateOutcome::kApplied);
  EXPECT_EQ(Apply(moved), UpdateOutcome::kApplied);  // the publisher sent it again
  EXPECT_EQ(keys_a_[3], b);
  EXPECT_EQ(used_a_[3], 1);
  // Of the same step but not in place: checked, and refused.
  EXPECT_EQ(Apply(MapFields(12, {4}, {}, {{4, b}})), UpdateOutcome::kIdHeld);
  EXPECT_EQ(Apply(MapFields(12, {8}, {}, {{8, b}})), UpdateOutcome::kSlotRange);
}

TEST_F(ZchTables, RefusesABadMapChangeWholeAndChangesNothing) {
  const int64_t a = IdAt(3), b = IdAt(3, 1), c = IdAt(5);
  ASSERT_EQ(Apply(MapFields(11, {3}, {}, {{3, a}})), UpdateOutcome::kApplied);
  const auto rows = rows_;
  const auto keys = keys_a_;
  const auto used = used_a_;
  struct Bad {
    StreamFields fields;
    UpdateOutcome outcome;
    const char* why;
  };
  const std::vector<Bad> bad = {
      {MapFields(12, {8}, {}, {{8, c}}), UpdateOutcome::kSlotRange, "outside 't0''s 8 slots"},
      {MapFields(12, {7}, {}, {{7, c}}), UpdateOutcome::kSlotRange, "is not in id"},
      // held since the record's own (gen, step): two holders, not explained by order
      {MapFields(11, {4}, {}, {{4, a}}), UpdateOutcome::kIdHeld, "already held by slot 3"},
      {MapFields(12, {5, 6}, {}, {{5, c}, {6, c}}), UpdateOutcome::kIdHeld, "admitted twice"},
      {MapFields(12, {}, {{3, b}}, {}), UpdateOutcome::kMapMismatch, "the record evicts id"},
      {MapFields(12, {}, {{6, c}}, {}), UpdateOutcome::kMapMismatch, "holds id None"},
      {MapFields(12, {3}, {}, {{3, b}}), UpdateOutcome::kMapMismatch, "does not evict"},
  };
  for (const Bad& r : bad) {
    std::string why;
    EXPECT_EQ(Apply(r.fields, &why), r.outcome) << why;
    EXPECT_NE(why.find(r.why), std::string::npos) << why;
  }
  StreamFields not_zch = MapFields(12, {}, {{0, 1}}, {});
  Set(&not_zch, "table", "t9");
  EXPECT_EQ(Apply(not_zch), UpdateOutcome::kUnknownTable);
  EXPECT_EQ(rows_, rows);
  EXPECT_EQ(keys_a_, keys);
  EXPECT_EQ(used_a_, used);
  EXPECT_EQ(used_b_, used);
  EXPECT_EQ(tables_->CurrentWatermark().step, 10);
}

// rec.updates/3: the raw id each row's slot holds after the record (`held`).
StreamFields HeldFields(StreamFields f, const std::vector<std::pair<int64_t, int64_t>>& held) {
  Set(&f, "format", "rec.updates/3");
  f.insert(f.end(), {{"holds", std::to_string(held.size())}, {"held", Pairs(held)}});
  return f;
}

StreamFields OfRank(StreamFields f, int rank) {
  Set(&f, "rank", std::to_string(rank));
  return f;
}

// Map changes out of order across ranks (rec.served_map's rule; tests/core/test_updates.py has
// the Python twins). Round 12: rank 0 evicts a from slot 3 and gives it to b; round 14: rank 1
// admits a into slot 4. Rank 0's sender a round behind: both orders end with the same map.
TEST_F(ZchTables, AnAdmissionAheadOfTheEvictionItFollowsIsAppliedInEitherOrder) {
  const int64_t a = IdAt(3), b = IdAt(3, 1);
  const StreamFields first = MapFields(11, {3}, {}, {{3, a}});
  const StreamFields rank0 = MapFields(12, {3}, {{3, a}}, {{3, b}});
  const StreamFields rank1 = OfRank(MapFields(14, {4}, {}, {{4, a}}), 1);
  std::vector<std::vector<int64_t>> ends;
  for (bool lag : {false, true}) {
    SetUp();
    ASSERT_EQ(Apply(first), UpdateOutcome::kApplied);
    std::string why;
    EXPECT_EQ(Apply(lag ? rank1 : rank0, &why), UpdateOutcome::kApplied) << why;
    if (lag) {
      EXPECT_EQ(used_a_[3], 0);  // vacated: a moved on, rank 0's eviction not in yet
    }
    EXPECT_EQ(Apply(lag ? rank0 : rank1, &why), UpdateOutcome::kApplied) << why;
    ends.push_back({keys_a_[3], used_a_[3], keys_a_[4], used_a_[4], keys_b_[3], used_b_[3]});
  }
  EXPECT_EQ(ends[0], ends[1]);
  EXPECT_EQ(ends[0], std::vector<int64_t>({b, 1, a, 1, b, 1}));
}

TEST_F(ZchTables, AVacatedSlotTakesOnlyTheEvictionItStoodFor) {
  const int64_t a = IdAt(3), b = IdAt(3, 1);
  ASSERT_EQ(Apply(MapFields(11, {3}, {}, {{3, a}})), UpdateOutcome::kApplied);
  ASSERT_EQ(Apply(OfRank(MapFields(14, {4}, {}, {{4, a}}), 1)), UpdateOutcome::kApplied);
  std::string why;
  // rank 0's rows before its eviction still say a; an admission without the eviction does not
  EXPECT_EQ(Apply(HeldFields(MapFields(12, {3}, {}, {}), {{3, a}}), &why), UpdateOutcome::kApplied)
      << why;
  EXPECT_EQ(Apply(MapFields(12, {3}, {}, {{3, b}}), &why), UpdateOutcome::kMapMismatch);
  EXPECT_NE(why.find("until (1, 14), which the record of (1, 12) does not evict"),
            std::string::npos)
      << why;
  EXPECT_EQ(Apply(MapFields(15, {}, {{3, a}}, {})), UpdateOutcome::kMapMismatch);  // newer
  EXPECT_EQ(Apply(MapFields(13, {}, {{3, a}}, {})), UpdateOutcome::kApplied);
  EXPECT_EQ(used_a_[3], 0);
  EXPECT_EQ(Apply(MapFields(15, {3}, {}, {{3, b}})), UpdateOutcome::kApplied);  // free since
}

// Rank 1 two rounds behind: its admission of a (12) and eviction (13) arrive after rank 0
// admitted a at 14. a stays in rank 0's slot, rank 1's ends free.
TEST_F(ZchTables, AnAdmissionOlderThanItsIdsHolderIsAppliedVacated) {
  const int64_t a = IdAt(3);
  ASSERT_EQ(Apply(MapFields(14, {3}, {}, {{3, a}})), UpdateOutcome::kApplied);
  std::string why;
  EXPECT_EQ(Apply(OfRank(HeldFields(MapFields(12, {4}, {}, {{4, a}}), {{4, a}}), 1), &why),
            UpdateOutcome::kApplied)
      << why;
  EXPECT_EQ(used_a_[4], 0);
  EXPECT_EQ(Apply(OfRank(MapFields(13, {}, {{4, a}}, {}), 1), &why), UpdateOutcome::kApplied)
      << why;
  EXPECT_EQ(std::vector<int64_t>({keys_a_[3], used_a_[3], used_a_[4], used_b_[4]}),
            std::vector<int64_t>({a, 1, 0, 0}));
  // The same step from two ranks is not explained by order.
  EXPECT_EQ(Apply(OfRank(MapFields(14, {4}, {}, {{4, a}}), 1), &why), UpdateOutcome::kIdHeld);
  EXPECT_NE(why.find("since (1, 14), the record's own (gen, step)"), std::string::npos) << why;
}

TEST_F(ZchTables, HeldIdsThatDisagreeWithTheMapAreAMismatch) {
  const int64_t a = IdAt(3), b = IdAt(3, 1);
  ASSERT_EQ(Apply(HeldFields(MapFields(11, {3, 8}, {}, {{3, a}}), {{3, a}})),
            UpdateOutcome::kApplied);  // slot 8: the default row, which holds no id
  const auto rows = rows_;
  std::string why;
  // A row of slot 3 said to be b's (the map holds a), or said to hold none.
  EXPECT_EQ(Apply(HeldFields(MapFields(12, {3}, {}, {}), {{3, b}}), &why),
            UpdateOutcome::kMapMismatch);
  EXPECT_NE(why.find("slot 3 of 't0' holds id " + std::to_string(a) + " after the record"),
            std::string::npos)
      << why;
  EXPECT_EQ(Apply(HeldFields(MapFields(12, {3}, {}, {}), {})), UpdateOutcome::kMapMismatch);
  // A free slot said to hold an id.
  EXPECT_EQ(Apply(HeldFields(MapFields(12, {5}, {}, {}), {{5, b}})), UpdateOutcome::kMapMismatch);
  EXPECT_EQ(rows_, rows);
  EXPECT_EQ(Apply(HeldFields(MapFields(12, {3}, {}, {}), {{3, a}})), UpdateOutcome::kApplied);
}

// A ZCH table in the embedding store (keyed by raw id): no map, its records go to the sink
// whole (evictions alone too), and a record that does not say which id a row is is refused.
TEST(StoredZchTable, TakesOnlyRecordsThatNameEachRowsIdAndPassesThemWhole) {
  UpdatesSpec spec;
  spec.present = true;
  spec.run = "r1";
  spec.step = 10;
  spec.gen = 1;
  spec.stored["t0"] = StoredPlace{2, 9, 4, "int8", true};
  std::vector<UpdateRecord> got;
  std::shared_ptr<EmbeddingTables> tables;
  ASSERT_TRUE(EmbeddingTables::Create(spec, {}, nullptr, &tables,
                                      [&got](int64_t table, const UpdateRecord& r) {
                                        EXPECT_EQ(table, 2);
                                        got.push_back(r);
                                      })
                  .ok());
  auto apply = [&tables](const StreamFields& f, std::string* why) {
    UpdateRecord r;
    EXPECT_TRUE(DecodeUpdateRecord(f, &r).ok());
    return tables->Apply(r, why);
  };
  std::string why;
  EXPECT_EQ(apply(MapFields(11, {3}, {}, {{3, -5}}), &why), UpdateOutcome::kRowFormat);
  EXPECT_NE(why.find("is stored by raw id"), std::string::npos) << why;
  EXPECT_EQ(apply(Fields(11, {3}, "ABCDsSbB"), &why), UpdateOutcome::kRowFormat);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(apply(HeldFields(MapFields(11, {3, 8}, {{3, 7}}, {{3, -5}}), {{3, -5}}), &why),
            UpdateOutcome::kApplied)
      << why;
  EXPECT_EQ(apply(HeldFields(MapFields(12, {}, {{4, 9}}, {}), {}), &why), UpdateOutcome::kApplied)
      << why;
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].held, (std::vector<UpdateRecord::SlotId>{{3, -5}}));
  EXPECT_EQ(got[1].evicted, (std::vector<UpdateRecord::SlotId>{{4, 9}}));
}

}  // namespace
}  // namespace rec
