#include "updates/embedding_tables.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <unordered_set>

#include "contract/zch_home.h"

namespace rec {

std::vector<std::pair<std::string, int64_t>> WatermarkParameters(const Watermark& w) {
  if (!w.valid) return {};
  return {{"embedding_watermark_gen", w.gen},
          {"embedding_watermark_step", w.step},
          {"embedding_watermark_wall_ns", w.wall_ns}};
}

Status EmbeddingTables::Create(const UpdatesSpec& spec, std::map<std::string, Buffer> buffers,
                               std::shared_ptr<void> owner, std::shared_ptr<EmbeddingTables>* out,
                               StoredRowsSink stored_rows) {
  if (!spec.stored.empty() && !stored_rows) {
    return InvalidArgument("stored tables but nowhere to put their fresh rows");
  }
  for (const auto& [name, place] : spec.tables) {
    auto it = buffers.find(place.buffer);
    if (it == buffers.end()) {
      return InvalidArgument("rec.json: \"updates.tables." + name + ".buffer\" names '" +
                             place.buffer + "', which the model does not hold");
    }
    const int64_t bytes = RowBytes(place.dim, place.dtype);
    const int64_t size = it->second.size;
    const bool rowwise = place.dtype == "int8" || place.dtype == "int4";
    // Divided, not multiplied: a crafted rec.json must not overflow its way past the check.
    bool fits = bytes >= 0 && place.row_stride >= bytes && place.row_stride > 0 &&
                place.offset >= 0 && place.offset <= size && place.rows >= 0 &&
                place.rows <= (size - place.offset) / place.row_stride &&
                place.scale_bias_first == rowwise;
    if (!fits) {
      return InvalidArgument(
          "rec.json: \"updates.tables." + name + "\" (offset " + std::to_string(place.offset) +
          ", " + std::to_string(place.rows) + " rows of " + std::to_string(place.row_stride) +
          " bytes) does not fit its buffer of " + std::to_string(it->second.size) + " bytes");
    }
  }
  std::map<std::string, Map> maps;
  REC_RETURN_IF_ERROR(FindMaps(spec, buffers, &maps));
  out->reset(
      new EmbeddingTables(spec, std::move(buffers), std::move(owner), std::move(stored_rows)));
  (*out)->maps_ = std::move(maps);
  return Status::Ok();
}

Status EmbeddingTables::FindMaps(const UpdatesSpec& spec,
                                 const std::map<std::string, Buffer>& buffers,
                                 std::map<std::string, Map>* out) {
  for (const auto& [name, place] : spec.maps) {
    Map map;
    map.slots = place.slots;
    map.probes = place.probes;
    for (const auto& [keys, used] : place.buffers) {
      auto k = buffers.find(keys);
      auto u = buffers.find(used);
      if (k == buffers.end() || u == buffers.end()) {
        return InvalidArgument("rec.json: \"zch.tables." + name + ".buffers\" names '" + keys +
                               "' and '" + used + "', which the model does not hold");
      }
      // Divided, not multiplied, as for the tables: no overflow past the check.
      if (k->second.size / 8 != place.slots || k->second.size % 8 != 0 ||
          u->second.size != place.slots ||
          reinterpret_cast<uintptr_t>(k->second.data) % alignof(int64_t) != 0) {
        return InvalidArgument("rec.json: ZCH table '" + name + "': the model's map ('" + keys +
                               "', '" + used + "') is not int64 and bool [" +
                               std::to_string(place.slots) + "] (zch.tables." + name + ".slots)");
      }
      map.copies.emplace_back(reinterpret_cast<int64_t*>(k->second.data), u->second.data);
    }
    if (map.copies.empty()) {
      return InvalidArgument("rec.json: \"zch.tables." + name + ".buffers\" names no id map");
    }
    (*out)[name] = std::move(map);
  }
  return Status::Ok();
}

EmbeddingTables::EmbeddingTables(UpdatesSpec spec, std::map<std::string, Buffer> buffers,
                                 std::shared_ptr<void> owner, StoredRowsSink stored_rows)
    : spec_(std::move(spec)),
      buffers_(std::move(buffers)),
      owner_(std::move(owner)),
      stored_rows_(std::move(stored_rows)) {
  pthread_rwlockattr_t attr;
  pthread_rwlockattr_init(&attr);
  // glibc prefers readers by default: overlapping forward passes would starve the writer.
  pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&lock_, &attr);
  pthread_rwlockattr_destroy(&attr);
  run_ = spec_.run;
  watermark_ = Watermark{true, spec_.gen, spec_.step, 0};
}

EmbeddingTables::~EmbeddingTables() { pthread_rwlock_destroy(&lock_); }

EmbeddingTables::Reading::Reading(EmbeddingTables* t) : t_(t) { pthread_rwlock_rdlock(&t_->lock_); }
EmbeddingTables::Reading::~Reading() { pthread_rwlock_unlock(&t_->lock_); }

Watermark EmbeddingTables::CurrentWatermark() {
  Reading r(this);
  return r.watermark();
}

int64_t EmbeddingTables::HeldBy() {
  Reading r(this);
  if (world_ <= 0 || complete_.empty()) return -1;
  for (int64_t rank = 0; rank < world_; ++rank) {
    if (complete_.count(rank) == 0) return rank;
  }
  auto version = [](const Watermark& w) { return std::make_pair(w.gen, w.step); };
  auto low = complete_.begin(), high = complete_.begin();
  for (auto it = complete_.begin(); it != complete_.end(); ++it) {
    if (version(it->second) < version(low->second)) low = it;  // the smallest rank of the oldest
    if (version(it->second) > version(high->second)) high = it;
  }
  return version(low->second) < version(high->second) ? low->first : -1;
}

UpdateOutcome EmbeddingTables::Check(const UpdateRecord& r, MapPlan* plan, std::string* why) const {
  if (!run_.empty() && r.run != run_) {
    *why = "record of run '" + r.run + "', the served version is of run '" + run_ + "'";
    return UpdateOutcome::kOtherRun;
  }
  auto seen = rank_version_.find(r.rank);
  if (seen != rank_version_.end() && std::make_pair(r.gen, r.step) < seen->second) {
    *why = "rank " + std::to_string(r.rank) + " sent (gen " + std::to_string(r.gen) + ", step " +
           std::to_string(r.step) + ") after (gen " + std::to_string(seen->second.first) +
           ", step " + std::to_string(seen->second.second) + ")";
    return UpdateOutcome::kBackwards;
  }
  if (r.ids.empty() && !r.changes_map()) return UpdateOutcome::kApplied;
  auto it = spec_.tables.find(r.table);
  auto stored = spec_.stored.find(r.table);
  if (it == spec_.tables.end() && stored == spec_.stored.end()) {
    *why = "table '" + r.table + "' is not in the served model";
    return UpdateOutcome::kUnknownTable;
  }
  const bool local = it != spec_.tables.end();
  const std::string& dtype = local ? it->second.dtype : stored->second.dtype;
  const int64_t dim = local ? it->second.dim : stored->second.dim;
  const int64_t rows = local ? it->second.rows : stored->second.rows;
  if (r.dtype != dtype || r.dim != dim) {
    *why = "'" + r.table + "' is served as " + dtype + " dim " + std::to_string(dim) +
           ", the record has " + r.dtype + " dim " + std::to_string(r.dim);
    return UpdateOutcome::kRowFormat;
  }
  if (!r.ids.empty() && r.ids.back() >= rows) {
    *why = "id " + std::to_string(r.ids.back()) + " is outside '" + r.table + "''s " +
           std::to_string(rows) + " rows";
    return UpdateOutcome::kIdRange;
  }
  // The export's map already holds the changes of what it holds: skipped, not checked.
  if (std::tie(r.gen, r.step) <= std::tie(spec_.gen, spec_.step)) return UpdateOutcome::kSkipped;
  return CheckMap(r, plan, why);
}

namespace {

using SlotId = UpdateRecord::SlotId;

// The pair of a slot in a record's list (sorted by slot, as the record holds it), or null: a
// binary search, not a tree.
const SlotId* Find(const std::vector<SlotId>& list, int64_t slot) {
  auto it = std::lower_bound(list.begin(), list.end(), slot,
                             [](const SlotId& e, int64_t s) { return e.slot < s; });
  return it != list.end() && it->slot == slot ? &*it : nullptr;
}

std::string Name(const SlotId* c) { return c == nullptr ? "None" : std::to_string(c->id); }

// A (gen, step) as Python prints the tuple, so both replicas' reasons read alike.
std::string Str(const std::pair<int64_t, int64_t>& v) {
  return "(" + std::to_string(v.first) + ", " + std::to_string(v.second) + ")";
}

}  // namespace

// rec.served_map.ServedMap.check, rule for rule, in its order and words.
UpdateOutcome EmbeddingTables::CheckMap(const UpdateRecord& r, MapPlan* plan,
                                        std::string* why) const {
  const std::string table = "'" + r.table + "'";
  auto stored = spec_.stored.find(r.table);
  if (stored != spec_.stored.end() && stored->second.raw_id) {
    // No map here: the store is the table's map, and `held` says where each row goes.
    if (r.has_held) return UpdateOutcome::kApplied;
    *why = table + " is stored by raw id, and a record of format '" + kUpdateFormatV2 +
           "' or older does not say which id a row is";
    return UpdateOutcome::kRowFormat;
  }
  auto it = maps_.find(r.table);
  if (!r.changes_map()) {
    return it == maps_.end() ? UpdateOutcome::kApplied : CheckHeld(r, it->second, *plan, why);
  }
  if (it == maps_.end()) {
    *why = table + " is not a ZCH table of the served model: no slots";
    return UpdateOutcome::kSlotRange;
  }
  const Map& m = it->second;
  for (const auto* list : {&r.evicted, &r.admitted}) {
    for (const auto& c : *list) {
      if (c.slot >= m.slots) {
        *why = "slot " + std::to_string(c.slot) + " is outside " + table + "'s " +
               std::to_string(m.slots) + " slots";
        return UpdateOutcome::kSlotRange;
      }
    }
  }
  UpdateOutcome done = PlanDone(r, m, plan, why);
  if (done != UpdateOutcome::kApplied) return done;
  const Version v{r.gen, r.step};
  auto held = [&](int64_t slot) {
    return m.copies[0].second[slot] != 0 ? std::to_string(m.copies[0].first[slot]) : "None";
  };
  for (const auto& e : r.evicted) {
    if (plan->done.count(e.slot) != 0 || m.Holds(e.slot, e.id)) continue;
    auto gone = m.vacated.find(e.slot);
    if (gone != m.vacated.end() && gone->second.id == e.id && v <= gone->second.at) continue;
    *why = "slot " + std::to_string(e.slot) + " of " + table + " holds id " + held(e.slot) +
           ", the record evicts id " + std::to_string(e.id);
    return UpdateOutcome::kMapMismatch;
  }
  UpdateOutcome admitted = PlanAdmissions(r, m, plan, why);
  if (admitted != UpdateOutcome::kApplied) return admitted;
  return CheckHeld(r, m, *plan, why);
}

// The admissions of ServedMap.check: each into a free slot of its id's window, once, and the
// id's other holder vacated, or the admission written free, or refused (rec.served_map).
UpdateOutcome EmbeddingTables::PlanAdmissions(const UpdateRecord& r, const Map& m, MapPlan* plan,
                                              std::string* why) const {
  const std::string table = "'" + r.table + "'";
  const Version v{r.gen, r.step};
  auto held = [&](int64_t slot) {
    return m.copies[0].second[slot] != 0 ? std::to_string(m.copies[0].first[slot]) : "None";
  };
  // Evicted by this record: its holder leaves here.
  auto freed = [&](int64_t slot) {
    return Find(r.evicted, slot) != nullptr && plan->done.count(slot) == 0;
  };
  std::unordered_set<int64_t> admitted(r.admitted.size());
  for (const auto& a : r.admitted) {
    if (plan->done.count(a.slot) != 0) continue;
    auto gone = m.vacated.find(a.slot);
    if (!freed(a.slot) && m.copies[0].second[a.slot] != 0) {
      *why = "slot " + std::to_string(a.slot) + " of " + table + " holds id " + held(a.slot) +
             ", which the record does not evict, and admits id " + std::to_string(a.id);
      return UpdateOutcome::kMapMismatch;
    }
    if (!freed(a.slot) && gone != m.vacated.end() && v <= gone->second.at) {
      *why = "slot " + std::to_string(a.slot) + " of " + table + " held id " +
             std::to_string(gone->second.id) + " until " + Str(gone->second.at) +
             ", which the record of " + Str(v) + " does not evict";
      return UpdateOutcome::kMapMismatch;
    }
    const int64_t home = ZchHome(a.id, m.slots);
    const int64_t offset = (a.slot - home + m.slots) % m.slots;  // a.slot's place in the window
    if (offset >= m.probes) {
      *why = "slot " + std::to_string(a.slot) + " is not in id " + std::to_string(a.id) +
             "'s window of " + table + " (" + std::to_string(m.probes) + " slots from " +
             std::to_string(home) + ")";
      return UpdateOutcome::kSlotRange;
    }
    if (!admitted.insert(a.id).second) {
      *why = "id " + std::to_string(a.id) + " is admitted twice to " + table;
      return UpdateOutcome::kIdHeld;
    }
    for (int64_t k = 0, s = home; k < m.probes; ++k, s = s + 1 == m.slots ? 0 : s + 1) {
      if (s == a.slot || !m.Holds(s, a.id) || freed(s)) continue;
      auto own = m.changed.find(s);
      if (own == m.changed.end() || own->second < v) {
        plan->vacate[s] = Vacated{a.id, v};  // the id left s since: s's own record is on its way
      } else if (own->second > v) {
        plan->shadow[a.slot] = own->second;  // the id left a.slot since, and took s
      } else {
        *why = "id " + std::to_string(a.id) + " is already held by slot " + std::to_string(s) +
               " of " + table + " since " + Str(own->second) + ", the record's own (gen, step)";
        return UpdateOutcome::kIdHeld;
      }
    }
  }
  return UpdateOutcome::kApplied;
}

// rec.served_map.ServedMap._done: the record's slots whose own change is newer (superseded), or
// this one sent again after a broker error, which must be in place.
UpdateOutcome EmbeddingTables::PlanDone(const UpdateRecord& r, const Map& m, MapPlan* plan,
                                        std::string* why) const {
  const Version v{r.gen, r.step};
  for (const auto* list : {&r.evicted, &r.admitted}) {
    for (const auto& c : *list) {
      auto own = m.changed.find(c.slot);
      if (own == m.changed.end() || own->second < v || plan->done.count(c.slot) != 0) continue;
      if (own->second == v) {
        const SlotId* want = Find(r.admitted, c.slot);
        SlotId now{c.slot, m.copies[0].first[c.slot]};
        auto gone = m.vacated.find(c.slot);
        const SlotId* has = m.copies[0].second[c.slot] != 0 ? &now : nullptr;
        if (has == nullptr && gone != m.vacated.end()) {
          now.id = gone->second.id;
          has = &now;
        }
        if ((has == nullptr) != (want == nullptr) || (has != nullptr && has->id != want->id)) {
          *why = "slot " + std::to_string(c.slot) + " of '" + r.table + "' already changed at " +
                 Str(own->second) + " to hold id " + Name(has) +
                 ", the record of that (gen, step) says " + Name(want);
          return UpdateOutcome::kMapMismatch;
        }
      }
      plan->done.insert(c.slot);
    }
  }
  return UpdateOutcome::kApplied;
}

// rec.updates/3's `held` against the map after the record's changes, each slot as of the
// record's (gen, step) (the Python twin is rec.served_map.ServedMap.check_held): a cheap check
// that publisher and replica agree.
UpdateOutcome EmbeddingTables::CheckHeld(const UpdateRecord& r, const Map& m, const MapPlan& plan,
                                         std::string* why) const {
  if (!r.has_held) return UpdateOutcome::kApplied;
  const Version v{r.gen, r.step};
  for (int64_t slot : r.ids) {
    SlotId now{slot, 0};
    const SlotId* want = nullptr;  // the id the slot holds after the record
    const bool mine = plan.done.count(slot) == 0;
    if (const SlotId* a = Find(r.admitted, slot); a != nullptr && mine) {
      want = a;
    } else if (Find(r.evicted, slot) != nullptr && mine) {
      want = nullptr;
    } else if (slot < m.slots) {
      auto own = m.changed.find(slot);
      if (own != m.changed.end() && v < own->second) continue;  // changed since: not kept
      const Vacated* gone = nullptr;
      if (auto p = plan.vacate.find(slot); p != plan.vacate.end()) {
        gone = &p->second;
      } else if (auto q = m.vacated.find(slot); q != m.vacated.end()) {
        gone = &q->second;
      }
      if (gone != nullptr && v <= gone->at) {
        now.id = gone->id;
        want = &now;
      } else if (m.copies[0].second[slot]) {
        now.id = m.copies[0].first[slot];
        want = &now;
      }
    }
    const SlotId* said = Find(r.held, slot);
    if ((want == nullptr) != (said == nullptr) || (want != nullptr && want->id != said->id)) {
      *why = "slot " + std::to_string(slot) + " of '" + r.table + "' holds id " + Name(want) +
             " after the record, the record says " + Name(said);
      return UpdateOutcome::kMapMismatch;
    }
  }
  return UpdateOutcome::kApplied;
}

UpdateOutcome EmbeddingTables::Apply(const UpdateRecord& r, std::string* why) {
  pthread_rwlock_wrlock(&lock_);
  MapPlan plan;
  UpdateOutcome outcome = Check(r, &plan, why);
  auto stored = spec_.stored.find(r.table);
  const bool applied = outcome == UpdateOutcome::kApplied;
  if (applied && stored != spec_.stored.end() && (!r.ids.empty() || r.changes_map())) {
    stored_rows_(stored->second.index, r);  // a raw-keyed table's evictions go there too
  } else if (applied && !r.ids.empty()) {
    WriteRows(r);
  }
  if (applied && r.changes_map() && maps_.count(r.table) != 0) WriteMap(r, plan);
  if (outcome == UpdateOutcome::kApplied || outcome == UpdateOutcome::kSkipped) {
    if (run_.empty()) run_ = r.run;
    Advance(r);
  }
  pthread_rwlock_unlock(&lock_);
  return outcome;
}

void EmbeddingTables::WriteRows(const UpdateRecord& r) {
  const TablePlace& p = spec_.tables.at(r.table);
  uint8_t* base = buffers_.at(p.buffer).data + p.offset;
  const size_t row_bytes = static_cast<size_t>(RowBytes(r.dim, r.dtype));
  const uint8_t* src = reinterpret_cast<const uint8_t*>(r.rows.data());
  for (size_t i = 0; i < r.ids.size(); ++i, src += row_bytes) {
    uint8_t* dst = base + r.ids[i] * p.row_stride;
    if (p.scale_bias_first) {  // the log sends codes then scale and bias; FBGEMM stores them
                               // first
      std::memcpy(dst, src + row_bytes - 4, 4);
      std::memcpy(dst + 4, src, row_bytes - 4);
    } else {
      std::memcpy(dst, src, row_bytes);
    }
  }
}

// rec.served_map.ServedMap.write: the vacated slots, the evictions, then the admissions (a
// slot both evicted and admitted ends holding its new id), into every copy; then each written
// slot's version and vacate.
void EmbeddingTables::WriteMap(const UpdateRecord& r, const MapPlan& plan) {
  Map& m = maps_.at(r.table);
  const Version v{r.gen, r.step};
  for (const auto& [keys, used] : m.copies) {
    for (const auto& [slot, gone] : plan.vacate) used[slot] = 0;
    for (const auto& e : r.evicted) {
      if (plan.done.count(e.slot) == 0) used[e.slot] = 0;
    }
    for (const auto& a : r.admitted) {
      if (plan.done.count(a.slot) != 0) continue;
      keys[a.slot] = a.id;
      used[a.slot] = plan.shadow.count(a.slot) == 0 ? 1 : 0;
    }
  }
  for (const auto& [slot, gone] : plan.vacate) m.vacated[slot] = gone;
  for (const auto* list : {&r.evicted, &r.admitted}) {
    for (const auto& c : *list) {
      if (plan.done.count(c.slot) != 0) continue;
      m.vacated.erase(c.slot);
      m.changed[c.slot] = v;
    }
  }
  for (const auto& a : r.admitted) {
    auto shadow = plan.shadow.find(a.slot);
    if (plan.done.count(a.slot) == 0 && shadow != plan.shadow.end()) {
      m.vacated[a.slot] = Vacated{a.id, shadow->second};
    }
  }
}

void EmbeddingTables::Advance(const UpdateRecord& r) {
  rank_version_[r.rank] = {r.gen, r.step};
  if (r.gen > complete_gen_) {  // a resumed run: its ranks (maybe another number) start over
    complete_gen_ = r.gen;
    complete_.clear();
  }
  world_ = r.world;
  if (!r.last || r.gen < complete_gen_) return;
  complete_[r.rank] = Watermark{true, r.gen, r.step, r.wall_ns};
  if (static_cast<int64_t>(complete_.size()) < world_) return;
  Watermark low = complete_.begin()->second;
  for (const auto& [rank, w] : complete_) {
    // The oldest (gen, step); of ranks at the same step, the earliest clock.
    if (std::tie(w.gen, w.step, w.wall_ns) < std::tie(low.gen, low.step, low.wall_ns)) low = w;
  }
  // The watermark only grows: from the export's (gen, step), past which the log's rows apply.
  bool later = std::tie(low.gen, low.step) > std::tie(watermark_.gen, watermark_.step);
  if (!later) return;
  watermark_ = low;
  // rec.served_map.ServedMap.settle: every record still to come is at the watermark or newer,
  // and to it a slot changed before it is one changed at the export.
  const Version mark{low.gen, low.step};
  for (auto& [name, m] : maps_) {
    for (auto it = m.changed.begin(); it != m.changed.end();) {
      it = it->second < mark ? m.changed.erase(it) : std::next(it);
    }
  }
}

}  // namespace rec
