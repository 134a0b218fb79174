#include "updates/update_log_reader.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>

#include "common/clock.h"

namespace rec {
namespace {

std::string Where(const UpdateUrl& url) {
  std::string nodes;
  for (const auto& [host, port] : url.nodes) {
    nodes += (nodes.empty() ? "" : ",") + host + ":" + std::to_string(port);
  }
  if (nodes.empty()) nodes = url.host + ":" + std::to_string(url.port);
  return "redis://" + nodes + "/" + url.stream;
}

int64_t EntryMs(const std::string& id) { return std::atoll(id.substr(0, id.find('-')).c_str()); }

}  // namespace

UpdateLogReader::UpdateLogReader(const UpdateUrl& url, int count, int block_ms)
    : url_(url), where_(Where(url)), count_(count), block_ms_(block_ms) {
  auto seeds = url.nodes;
  if (seeds.empty()) seeds.emplace_back(url.host, url.port);
  // A read blocks up to block_ms: the socket waits longer than that.
  client_ = std::make_unique<ClusterClient>("update log " + where_, seeds,
                                            std::chrono::milliseconds(5000 + block_ms),
                                            std::chrono::milliseconds(0));
}

std::string UpdateLogReader::Places() const {
  if (!layout_) return "entry " + cursor_;
  std::string out = "partitions ";
  for (size_t k = 0; k < cursors_.size(); ++k) {
    out += (k ? ", " : "") + std::to_string(k) + ":" + cursors_[k];
  }
  return out;
}

Status UpdateLogReader::LookForLayout() {
  std::string key, text;
  if (!LayoutKey(url_.stream, &key).ok()) {  // a name with a brace has no partitions: legacy
    settled_ = true;
    return Status::Ok();
  }
  bool found = false;
  Status st = client_->Get(key, &found, &text);
  if (!st.ok() || !found) return st;
  PartitionLayout layout;
  st = ParseLayout(text, key, &layout);
  if (!st.ok()) return st;
  cursors_.assign(static_cast<size_t>(layout.partitions), "0");
  layout_ = std::move(layout);
  settled_ = true;
  return Status::Ok();
}

Status UpdateLogReader::Fetch(const std::vector<int64_t>& streams,
                              std::map<int64_t, std::vector<StreamEntry>>* got) {
  auto read_of = [&](int64_t k) {
    return layout_ ? StreamRead{layout_->keys[k], cursors_[k]} : StreamRead{url_.stream, cursor_};
  };
  std::vector<std::vector<StreamEntry>> replies;
  if (streams.size() == 1) {
    Status st = client_->StreamReads({read_of(streams[0])}, count_, block_ms_, &replies);
    if (!st.ok()) return st;
    (*got)[streams[0]] = std::move(replies[0]);
    return Status::Ok();
  }
  std::vector<StreamRead> reads;
  for (int64_t k : streams) reads.push_back(read_of(k));
  Status st = client_->StreamReads(reads, count_, -1, &replies);
  if (!st.ok()) return st;
  bool any = false;
  for (size_t i = 0; i < streams.size(); ++i) {
    any = any || !replies[i].empty();
    (*got)[streams[i]] = std::move(replies[i]);
  }
  if (any) return Status::Ok();
  // All empty: wait for news on one partition, a different one each time.
  const int64_t k = streams[turn_++ % streams.size()];
  st = client_->StreamReads({read_of(k)}, count_, std::min(block_ms_, kPartitionBlockMs), &replies);
  if (!st.ok()) return st;
  (*got)[k] = std::move(replies[0]);
  return Status::Ok();
}

std::vector<LogEntry> UpdateLogReader::Take(int64_t k, const std::vector<StreamEntry>& raw) const {
  std::vector<LogEntry> out;
  for (const StreamEntry& e : raw) {
    LogEntry entry;
    entry.partition = k;
    entry.id = e.id;
    try {
      entry.status = DecodeUpdateRecord(e.fields, &entry.record);
    } catch (const std::exception& x) {  // out of memory: the entry is refused, the reader goes on
      entry.status = InvalidArgument(std::string("update record: ") + x.what());
    }
    out.push_back(std::move(entry));
  }
  return out;
}

int64_t UpdateLogReader::Low() const {
  int64_t low = std::numeric_limits<int64_t>::max();
  for (int64_t k = 0; k < partitions(); ++k) {
    if (caught_.count(k)) continue;
    auto it = next_gen_.find(k);
    low = std::min(low, it == next_gen_.end() ? 0 : it->second);
  }
  return low;
}

std::vector<LogEntry> UpdateLogReader::InGenerationOrder(
    std::map<int64_t, std::vector<LogEntry>>* taken, const std::map<int64_t, size_t>& fetched) {
  std::map<int64_t, std::vector<int64_t>> gens;
  for (auto& [k, entries] : *taken) {
    int64_t gen = next_gen_.count(k) ? next_gen_[k] : 0;
    for (const LogEntry& e : entries) {
      if (e.status.ok()) gen = e.record.gen;  // a malformed entry has no generation
      gens[k].push_back(gen);
    }
    next_gen_[k] = gen;
    caught_.erase(k);
    if (fetched.at(k) < static_cast<size_t>(count_)) caught_.insert(k);
  }
  const int64_t low = Low();
  std::vector<std::pair<int64_t, LogEntry>> out;
  for (auto& [k, entries] : *taken) {
    const std::vector<int64_t>& g = gens[k];
    size_t cut = 0;
    while (cut < entries.size() && g[cut] <= low) ++cut;
    if (cut < entries.size()) {  // held back: read again once the others caught up
      next_gen_[k] = g[cut];
      caught_.erase(k);
    }
    if (cut > 0) cursors_[k] = entries[cut - 1].id;
    for (size_t i = 0; i < cut; ++i) out.emplace_back(g[i], std::move(entries[i]));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<LogEntry> ordered;
  for (auto& [gen, entry] : out) ordered.push_back(std::move(entry));
  return ordered;
}

Status UpdateLogReader::Read(std::vector<LogEntry>* out, int64_t* behind_ms) {
  out->clear();
  *behind_ms = 0;
  if (!settled_) {
    Status st = LookForLayout();
    if (!st.ok()) return st;
  }
  for (;;) {
    std::vector<int64_t> streams, held;
    const int64_t low = Low();
    for (int64_t k = 0; k < std::max<int64_t>(1, partitions()); ++k) {
      // A partition held back waits until the others catch up.
      (layout_ && next_gen_.count(k) && next_gen_[k] > low ? held : streams).push_back(k);
    }
    if (streams.empty()) return Status::Ok();
    std::map<int64_t, std::vector<StreamEntry>> got;
    Status st = Fetch(streams, &got);
    if (!st.ok()) return st;
    std::map<int64_t, std::vector<LogEntry>> taken;
    std::map<int64_t, size_t> fetched;
    for (const auto& [k, raw] : got) {
      taken[k] = Take(k, raw);
      fetched[k] = raw.size();
      if (raw.size() >= static_cast<size_t>(count_)) {
        *behind_ms =
            std::max<int64_t>(*behind_ms, static_cast<int64_t>(WallMs()) - EntryMs(raw.back().id));
      }
    }
    if (!layout_) {
      *out = std::move(taken[0]);
      if (!out->empty()) cursor_ = out->back().id, settled_ = true;
      return Status::Ok();
    }
    *out = InGenerationOrder(&taken, fetched);
    bool released = false;
    for (int64_t k : held) released = released || next_gen_[k] <= Low();
    if (!out->empty() || !released) return Status::Ok();
    // The others caught up: the partitions held back go on now.
  }
}

}  // namespace rec
