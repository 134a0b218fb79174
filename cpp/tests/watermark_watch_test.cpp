// WatermarkWatch's rules (updates/watermark_watch.h) on the test's clock, with the words
// rec.update_log.WatermarkWatch logs: nothing while the holding rank was heard from within the
// bound, "held ... by partition k (rank r): silent N s" once past it (once), "spoke again" when
// the watermark moves on, and each partition's silence.
#include "updates/watermark_watch.h"

#include <gtest/gtest.h>

namespace rec {
namespace {

TEST(WatermarkWatch, NamesTheSilentPartitionOnceAndItsReturn) {
  WatermarkWatch watch(5000, /*now_ms=*/0);
  watch.Heard(0, 0, 1000);
  watch.Heard(1, 1, 1000);
  EXPECT_EQ(watch.Check(-1, 1, 60, 2, 9000), "");  // nobody holds it back
  watch.Heard(0, 0, 8000);                         // rank 0 goes on, rank 1 stays at step 60
  EXPECT_EQ(watch.Check(1, 1, 60, 2, 5999), "");   // silent 4.999 s: within the bound
  EXPECT_EQ(watch.Check(1, 1, 60, 2, 9400),
            "watermark held at gen 1 step 60 by partition 1 (rank 1): silent 8 s");
  EXPECT_EQ(watch.Check(1, 1, 60, 2, 12000), "");  // said once
  const auto silent = watch.SilentMs(2, 12000);
  EXPECT_EQ(silent.at(0), 4000);
  EXPECT_EQ(silent.at(1), 11000);
  watch.Heard(1, 1, 12500);
  EXPECT_EQ(watch.Check(-1, 1, 63, 2, 12500),
            "watermark moved on from gen 1 step 60: partition 1 (rank 1) spoke again");
  EXPECT_EQ(watch.Check(-1, 1, 63, 2, 30000), "");
}

TEST(WatermarkWatch, ARankNeverHeardFromIsSilentSinceTheStartAndOneStreamNamesTheRank) {
  WatermarkWatch watch(5000, /*now_ms=*/100);
  EXPECT_EQ(watch.Check(3, 2, 7, 0, 5000), "");
  EXPECT_EQ(watch.Check(3, 2, 7, 0, 6100), "watermark held at gen 2 step 7 by rank 3: silent 6 s");
  // Another rank now holds it at the same mark: the report moves on, then names it when due.
  EXPECT_EQ(watch.Check(2, 2, 7, 0, 6200),
            "watermark moved on from gen 2 step 7: rank 3 spoke again");
  EXPECT_EQ(watch.SilentMs(0, 6200).at(0), 6100);  // one stream is partition 0
}

}  // namespace
}  // namespace rec
