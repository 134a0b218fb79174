// The embedding store's units without a cluster: rec.json's "store" section refused the way
// rec/contract/store.py words it, Redis Cluster's key slots, and the row cache's bound under
// ids chosen to break it.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "contract/store_spec.h"
#include "store/row_cache.h"

namespace rec {
namespace {

const char* kSection = R"({"store": {"format": "rec.store/1",
  "url": "redis://10.0.0.1:7000,h2:7001", "prefix": "rec:rec:1:abcdef01",
  "tables": {"t1": {"rows": 120, "dim": 8, "dtype": "fp16", "row_bytes": 16, "partitions": 4},
             "t0": {"rows": 300, "dim": 8, "dtype": "int4", "row_bytes": 8, "partitions": 7}}}})";

TEST(StoreSpec, ParsesTheSectionInItsOrder) {
  StoreSpec spec;
  ASSERT_TRUE(ParseStoreSection(kSection, "rec.json", &spec).ok());
  ASSERT_TRUE(spec.present);
  ASSERT_EQ(spec.nodes.size(), 2u);
  EXPECT_EQ(spec.nodes[1], (std::pair<std::string, int>{"h2", 7001}));
  ASSERT_EQ(spec.tables.size(), 2u);
  // A key's table index counts the tables sorted by name (rec.contract.store.store_order),
  // whatever order rec.json lists them in.
  EXPECT_EQ(spec.tables[0].name, "t0");
  EXPECT_EQ(spec.tables[0].partitions, 7);
  StoreSpec none;
  ASSERT_TRUE(ParseStoreSection(R"({"format": "torchscript"})", "rec.json", &none).ok());
  EXPECT_FALSE(none.present);
}

TEST(StoreSpec, RefusesAMalformedSectionNamingTheField) {
  struct Case {
    std::string from, to;
    const char* message;
  };
  const Case cases[] = {
      {"rec.store/1", "rec.store/2", "store.format must be \"rec.store/1\""},
      {"h2:7001", "h2:70010", "is not HOST:PORT"},
      {"\"row_bytes\": 16", "\"row_bytes\": 17", "store.tables.t1.row_bytes 17, want 16"},
      {"\"partitions\": 4", "\"partitions\": 0", "store.tables.t1.partitions must be a positive"},
      {"\"dtype\": \"fp16\"", "\"dtype\": \"bf16\"", "dtype 'bf16' is not int8"},
      {"rec:rec:1:abcdef01", "", "store.prefix must be a non-empty string"},
      // Its codes would not be whole bytes (tests/data/row_bytes_golden.json; the log refuses
      // such a row too).
      {"\"dim\": 8, \"dtype\": \"int4\"", "\"dim\": 7, \"dtype\": \"int4\"",
       "store.tables.t0: a int4 row of dim 7 is not a whole number of bytes"},
  };
  for (const Case& c : cases) {
    std::string text = kSection;
    text.replace(text.find(c.from), c.from.size(), c.to);
    StoreSpec spec;
    Status st = ParseStoreSection(text, "rec.json", &spec);
    ASSERT_FALSE(st.ok()) << c.to;
    EXPECT_NE(st.message().find(c.message), std::string::npos) << st.message();
  }
}

TEST(StoreSpec, KeySlotsAreRedisClusters) {
  // Values from Redis's own CLUSTER KEYSLOT.
  EXPECT_EQ(KeySlot("foo"), 12182);
  EXPECT_EQ(KeySlot("somekey"), 11058);
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("user1000"));
  EXPECT_EQ(KeySlot("foo{}{bar}"), KeySlot("foo{}{bar}"));  // an empty tag: the whole key
  EXPECT_NE(KeySlot("foo{}{bar}"), KeySlot("bar"));
  EXPECT_EQ(PartitionKey("rec:m:1:ab", "t0", 3), "{rec:m:1:ab:t0:3}");
}

TEST(RowCache, TheBoundHoldsUnderAnyIds) {
  const int64_t entry = 68 + RowCache::kEntryOverhead;
  const int64_t capacity = 64 * entry;
  RowCache cache(capacity);
  constexpr auto kAlways = RowCache::Admit::kAlways;
  const std::string row(68, 'r');
  // What the sketch takes leaves room for this many rows.
  const int64_t fits = (capacity - cache.bytes()) / entry;
  ASSERT_GT(fits, 48);
  // Every id new (a scan), then the same few again and again, then huge and negative ids.
  for (int64_t id = 0; id < 100000; ++id) cache.Put(id * 7919, row, kAlways);
  EXPECT_LE(cache.bytes(), capacity);
  EXPECT_EQ(cache.entries(), fits);
  for (int64_t id : {int64_t{-1}, INT64_MAX, INT64_MIN}) cache.Put(id, row, kAlways);
  EXPECT_LE(cache.bytes(), capacity);
  std::string out;
  EXPECT_TRUE(cache.Get(INT64_MIN, &out));
  EXPECT_EQ(out, row);
  // Second chance: a row read since the hand last passed survives the next inserts, the unread
  // ones go first.
  const int64_t oldest = (100000 - fits + 3) * 7919, next = oldest + 7919;
  EXPECT_TRUE(cache.Get(oldest, &out));
  cache.Put(-2, row, kAlways);
  cache.Put(-4, row, kAlways);
  EXPECT_TRUE(cache.Get(oldest, &out));
  EXPECT_FALSE(cache.Get(next, &out));  // unread, the next oldest: evicted
  // A newer copy of a row replaces it in place, with its new size counted.
  cache.Put(-2, std::string(100, 'n'));
  EXPECT_LE(cache.bytes(), capacity);
  out.clear();
  EXPECT_TRUE(cache.Get(-2, &out));
  EXPECT_EQ(out, std::string(100, 'n'));
  // A row larger than the whole cache is not kept, and evicts nothing.
  const int64_t entries = cache.entries();
  cache.Put(-3, std::string(capacity, 'x'), kAlways);
  EXPECT_FALSE(cache.Get(-3, &out));
  EXPECT_EQ(cache.entries(), entries);
  cache.Erase(-2);
  EXPECT_FALSE(cache.Get(-2, &out));
  // Erasing and re-inserting the same rows again and again, with the cache too empty for the
  // hand to move, keeps the bound and the count.
  for (int i = 0; i < 100000; ++i) {
    cache.Erase(i % 8);
    cache.Put(i % 8, row, kAlways);
  }
  EXPECT_LE(cache.bytes(), capacity);
  EXPECT_LE(cache.entries(), fits);
}

// GetMany (what EmbeddingStore::Fetch reads through): each held row copied to its place, the
// places of the rest (not held, or held with another size than their room) reported in order,
// and the bytes between untouched.
TEST(RowCache, GetManyCopiesHeldRowsIntoPlaceAndReportsTheRest) {
  RowCache cache(1 << 20);
  cache.Put(10, "aaaa", RowCache::Admit::kAlways);
  cache.Put(30, "cccccc", RowCache::Admit::kAlways);
  cache.Put(40, "dd", RowCache::Admit::kAlways);  // held, but 4 bytes are asked for
  const int64_t keys[] = {10, 20, 30, 40};
  const int64_t offsets[] = {0, 4, 8, 14, 18};
  std::string out(18, '.');
  std::vector<int64_t> missed;
  cache.GetMany(keys, 4, offsets, out.data(), &missed);
  EXPECT_EQ(out, "aaaa....cccccc....");
  EXPECT_EQ(missed, (std::vector<int64_t>{1, 3}));
  // An empty row (a raw-keyed table's evicted id) is reported apart when asked, else missed.
  cache.Put(20, "", RowCache::Admit::kAlways);
  std::vector<int64_t> missed2, empty;
  cache.GetMany(keys, 4, offsets, out.data(), &missed2, &empty);
  EXPECT_EQ(missed2, (std::vector<int64_t>{3}));
  EXPECT_EQ(empty, (std::vector<int64_t>{1}));
  EXPECT_EQ(out, "aaaa....cccccc....");
}

// TinyLFU's admission: rows asked for once (most of a Zipf tail) do not push out the rows asked
// for again and again; plain CLOCK (every row admitted) loses them; the update log's rows are
// always kept.
TEST(RowCache, RowsSeenOnceDoNotPushOutFrequentOnes) {
  const int64_t entry = 68 + RowCache::kEntryOverhead;
  const std::string row(68, 'r');
  auto hot_rows_kept = [&](RowCache::Admit admit) {
    RowCache cache(64 * entry);
    std::string out;
    int64_t next = 1000;
    for (int round = 0; round < 20; ++round) {  // what EmbeddingStore::Fetch does: Get, Put
      for (int64_t key = 0; key < 40; ++key) {
        if (!cache.Get(key, &out)) cache.Put(key, row, admit);
      }
      for (int i = 0; i < 40; ++i, ++next) {
        if (!cache.Get(next, &out)) cache.Put(next, row, admit);
      }
    }
    EXPECT_LE(cache.bytes(), 64 * entry);
    int kept = 0;
    for (int64_t key = 0; key < 40; ++key) kept += cache.Get(key, &out);
    return kept;
  };
  const int admitted = hot_rows_kept(RowCache::Admit::kIfFrequent);
  const int plain = hot_rows_kept(RowCache::Admit::kAlways);  // plain CLOCK
  EXPECT_GE(admitted, 30);
  EXPECT_GE(admitted, plain + 5) << "plain CLOCK kept " << plain;

  RowCache cache(64 * entry);
  std::string out;
  for (int64_t key = 0; key < 64; ++key) cache.Put(key, row, RowCache::Admit::kAlways);
  cache.Put(-7, row);  // never asked for, the cache full: not kept
  EXPECT_FALSE(cache.Get(-7, &out));
  for (int i = 0; i < 3; ++i) cache.Get(-7, &out);  // asked for more often than the victim
  cache.Put(-7, row);
  EXPECT_TRUE(cache.Get(-7, &out));
  cache.Put(-9, row, RowCache::Admit::kAlways);  // the update log's: kept, never asked for
  EXPECT_TRUE(cache.Get(-9, &out));
}

}  // namespace
}  // namespace rec
