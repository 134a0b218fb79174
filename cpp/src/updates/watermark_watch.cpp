#include "updates/watermark_watch.h"

#include <algorithm>

namespace rec {

void WatermarkWatch::Heard(int64_t rank, int64_t partition, int64_t now_ms) {
  rank_heard_ms_[rank] = now_ms;
  partition_heard_ms_[partition] = now_ms;
}

std::string WatermarkWatch::Name(int64_t rank, int64_t partitions) {
  if (partitions <= 0) return "rank " + std::to_string(rank);
  return "partition " + std::to_string(rank % partitions) + " (rank " + std::to_string(rank) + ")";
}

std::string WatermarkWatch::Check(int64_t held_rank, int64_t gen, int64_t step, int64_t partitions,
                                  int64_t now_ms) {
  const std::pair<int64_t, int64_t> mark{gen, step};
  if (held_) {
    if (held_rank == held_rank_ && mark == held_mark_) return "";
    held_ = false;
    return "watermark moved on from gen " + std::to_string(held_mark_.first) + " step " +
           std::to_string(held_mark_.second) + ": " + Name(held_rank_, partitions) + " spoke again";
  }
  if (held_rank < 0) return "";
  auto heard = rank_heard_ms_.find(held_rank);
  const int64_t silent = now_ms - (heard == rank_heard_ms_.end() ? since_ms_ : heard->second);
  if (silent < after_ms_) return "";
  held_ = true;
  held_rank_ = held_rank;
  held_mark_ = mark;
  return "watermark held at gen " + std::to_string(gen) + " step " + std::to_string(step) + " by " +
         Name(held_rank, partitions) + ": silent " + std::to_string((silent + 500) / 1000) + " s";
}

std::map<int64_t, int64_t> WatermarkWatch::SilentMs(int64_t partitions, int64_t now_ms) const {
  std::map<int64_t, int64_t> out;
  for (int64_t k = 0; k < std::max<int64_t>(partitions, 1); ++k) {
    auto heard = partition_heard_ms_.find(k);
    out[k] = now_ms - (heard == partition_heard_ms_.end() ? since_ms_ : heard->second);
  }
  return out;
}

}  // namespace rec
