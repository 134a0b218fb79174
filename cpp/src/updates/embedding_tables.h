// The served tables as the update log writes them: where each table's rows lie in the model's
// storage (rec.json "updates"), the rules for applying a record (the Python reference is
// rec.update_log.ReplicaState), and the lock that keeps a forward pass from seeing a torn row.
//
// A forward pass holds a Reading for its whole run; Apply writes a record's rows, and a ZCH
// table's id map changes (evictions, then admissions, into every copy of the map the model
// holds), under the exclusive side of the same reader-writer lock (writer-preferring, so a steady
// stream of batches cannot starve it). A batch therefore sees each record wholly applied or not at
// all, and the watermark a Reading reports is exactly the one its rows are at; no batch reads a
// slot's new id with its old row, or the reverse.
#pragma once

#include <pthread.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/status.h"
#include "contract/update_record.h"
#include "contract/updates_spec.h"
#include "observability/update_stats.h"

namespace rec {

// Where a stored table's checked record goes (the row cache): its table index, the record.
using StoredRowsSink = std::function<void(int64_t, const UpdateRecord&)>;

// The embedding watermark: every row trained up to (gen, step) is in the tables. A version
// starts at its export's (gen, step), with no wall time.
struct Watermark {
  bool valid = false;
  int64_t gen = 0;
  int64_t step = 0;
  int64_t wall_ns = 0;  // when that step ended; 0: not known (the export's own)
};

// A response's parameters for the watermark it was scored at (none when not valid):
// embedding_watermark_gen, _step and _wall_ns (0: the export's own, time unknown).
std::vector<std::pair<std::string, int64_t>> WatermarkParameters(const Watermark& w);

class EmbeddingTables {
 public:
  struct Buffer {
    uint8_t* data = nullptr;
    int64_t size = 0;
  };

  // Checks that every table, and every ZCH map copy (spec.maps), lies inside its buffer.
  // `owner` keeps the buffers alive.
  // `stored_rows` takes the rows of spec.stored's tables (required when there are any).
  static Status Create(const UpdatesSpec& spec, std::map<std::string, Buffer> buffers,
                       std::shared_ptr<void> owner, std::shared_ptr<EmbeddingTables>* out,
                       StoredRowsSink stored_rows = nullptr);
  ~EmbeddingTables();
  EmbeddingTables(const EmbeddingTables&) = delete;
  EmbeddingTables& operator=(const EmbeddingTables&) = delete;

  // Applies `r` whole, or refuses it whole (*why says why). Thread-safe.
  UpdateOutcome Apply(const UpdateRecord& r, std::string* why);

  // Held by a forward pass: no record is applied meanwhile.
  class Reading {
   public:
    explicit Reading(EmbeddingTables* t);
    ~Reading();
    Reading(const Reading&) = delete;
    Reading& operator=(const Reading&) = delete;
    Watermark watermark() const { return t_->watermark_; }

   private:
    EmbeddingTables* t_;
  };

  Watermark CurrentWatermark();
  // The rank holding the watermark back (rec.update_log.Applier.held_by), once a rank of the
  // newest generation has a complete publish: one with none yet (the smallest), else the one
  // whose newest is the oldest while another's is newer; -1 when no rank is behind another.
  int64_t HeldBy();
  const UpdatesSpec& spec() const { return spec_; }

 private:
  EmbeddingTables(UpdatesSpec spec, std::map<std::string, Buffer> buffers,
                  std::shared_ptr<void> owner, StoredRowsSink stored_rows);
  using Version = std::pair<int64_t, int64_t>;  // (gen, step)
  struct Vacated {
    int64_t id = 0;  // the id that left the slot
    Version at;      // the admission elsewhere that freed it
  };
  // A ZCH table's id map: every copy of its keys and used flags in the model's buffers, and
  // the ordering state of rec.served_map (its docstring is the rule): each slot's last own
  // change (absent: at or before the export) and the slots vacated ahead of their own record.
  struct Map {
    int64_t slots = 0;
    int64_t probes = 0;
    std::vector<std::pair<int64_t*, uint8_t*>> copies;  // the first is read
    std::unordered_map<int64_t, Version> changed;
    std::unordered_map<int64_t, Vacated> vacated;
    bool Holds(int64_t slot, int64_t id) const {
      return copies[0].second[slot] != 0 && copies[0].first[slot] == id;
    }
  };
  // How a checked record changes a map (rec.served_map.Plan).
  struct MapPlan {
    std::unordered_set<int64_t> done;             // its slots whose own change is newer or this
    std::unordered_map<int64_t, Vacated> vacate;  // slots an admission elsewhere frees
    std::unordered_map<int64_t, Version> shadow;  // admitted slots whose id a newer one holds
  };
  static Status FindMaps(const UpdatesSpec& spec, const std::map<std::string, Buffer>& buffers,
                         std::map<std::string, Map>* out);
  UpdateOutcome Check(const UpdateRecord& r, MapPlan* plan, std::string* why) const;
  UpdateOutcome CheckMap(const UpdateRecord& r, MapPlan* plan, std::string* why) const;
  UpdateOutcome PlanDone(const UpdateRecord& r, const Map& m, MapPlan* plan,
                         std::string* why) const;
  UpdateOutcome PlanAdmissions(const UpdateRecord& r, const Map& m, MapPlan* plan,
                               std::string* why) const;
  UpdateOutcome CheckHeld(const UpdateRecord& r, const Map& m, const MapPlan& plan,
                          std::string* why) const;
  void WriteRows(const UpdateRecord& r);
  void WriteMap(const UpdateRecord& r, const MapPlan& plan);
  void Advance(const UpdateRecord& r);

  UpdatesSpec spec_;
  std::map<std::string, Buffer> buffers_;
  std::shared_ptr<void> owner_;
  StoredRowsSink stored_rows_;
  std::map<std::string, Map> maps_;
  pthread_rwlock_t lock_;
  // Under the write lock:
  std::string run_;
  std::map<int64_t, std::pair<int64_t, int64_t>> rank_version_;  // rank -> (gen, step)
  int64_t complete_gen_ = 0;
  std::map<int64_t, Watermark> complete_;  // rank -> its newest complete publish, this gen
  int64_t world_ = 0;
  Watermark watermark_;
};

}  // namespace rec
