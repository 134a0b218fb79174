// Admission: the one path an inference request takes from a protocol front end into its model's
// batcher. HTTP and gRPC only decode a request into an InferRequest and encode its result; the
// checks between (shutdown, the version served, validation), its trace and its place in the
// queue are here, so that both protocols refuse, count and trace a request alike.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "batching/batcher.h"
#include "common/status.h"
#include "model/request.h"
#include "serving/model_manager.h"

namespace rec {

class Admission {
 public:
  // Trace stamps a front end took before the request was decoded (HTTP_RECV_START, ...).
  using Stamps = std::vector<std::pair<const char*, uint64_t>>;
  // Answers a request once its batch ran, on the executor's thread. `meta` is the request as
  // far as its response needs it (its inputs moved into the batch); the outputs it asked for in
  // shared memory are written there already (a failure to is in result.status). The front end
  // encodes, stamps REQUEST_END on a traced request and sends.
  using Reply = std::function<void(const InferRequest& meta, InferResult&& result)>;

  // After SIGTERM no new inference is accepted, also on a connection that was open before: the
  // drain waits only for requests the front ends already hold, so one read after their last
  // look would be computed and never answered.
  void SetShuttingDown() { shutting_down_ = true; }
  bool shutting_down() const { return shutting_down_; }
  // Unavailable after SIGTERM, asked before anything is decoded. Refused before it reaches a
  // model, such a request is not counted in any model's statistics.
  Status Open() const;

  // Counts a request to `entry` that was refused before Admit (its body did not decode).
  static void CountRefusal(ModelEntry* entry);

  // Checks that `request.model_version` (empty: whichever) is the version `entry` serves and
  // that one is served, validates the request against the model, starts its trace (`stamps`,
  // then REQUEST_START at `request_start`) and queues it. On a refusal, counted as the model's
  // failure, `reply` is never called and the caller answers with the status.
  Status Admit(ModelEntry* entry, InferRequest&& request, uint64_t request_start,
               const Stamps& stamps, Reply reply);

 private:
  std::atomic<bool> shutting_down_{false};
};

}  // namespace rec
