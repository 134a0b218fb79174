// Batcher: the dynamic batcher of one model. Validated requests wait in a bounded queue; executor
// threads gather them until they make max_batch_size rows or one of preferred_batch_sizes, or the
// batching window closes, run one forward pass on their concatenation, and hand each request its
// own output rows. A failure of the batch fails its requests; nothing else.
//
// The window is max_queue_delay_microseconds (Triton's meaning: the longest a request waits for
// others). With adaptive_window it is shorter in two cases:
// - It is at most the running mean of the model's recent forward passes: idling longer than one
//   more pass would cost cannot pay (the ski-rental bound: never worse than twice the better
//   choice), and on a fast CPU a small model's pass is tens of microseconds against 500.
// - It halves after each batch that found no company (one request), down to none after six, and
//   is whole again after any batch of two or more: a lone client, or a trickle of requests, is
//   not held for others who do not come, while requests that do come together (they queue up
//   during a pass even with no window) restore it at once.
// - It closes as soon as the batch holds as many requests as the largest batch of the last
//   kPeakBatches: closed-loop clients (the usual load generator, and callers that wait for their
//   answer) send no more until they are answered, so waiting out the rest is pure latency. The
//   peak is a maximum, not a mean, so batches do not shrink round after round; a batch larger
//   than the peak (more clients) raises it at once. An open stream reaches it too and runs
//   smaller batches sooner (benchmarks/batch_window.py measures both kinds of load).
// A window no longer than busy_poll_us is polled rather than slept through, so it closes on time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"
#include "model/model_spec.h"
#include "model/request.h"
#include "model/runner.h"
#include "observability/metrics.h"

namespace rec {

struct InferResult {
  Status status;
  std::string model_version;
  Watermark watermark;  // the embedding watermark the batch was scored at (valid with updates)
  std::vector<Tensor> outputs;  // every output of the model, this request's rows
};

// Called exactly once per accepted request, on an executor thread.
using InferCallback = std::function<void(InferResult&&)>;

struct BatcherOptions {
  int executor_threads = 1;        // 0: spec.instance_count
  size_t max_queue_size = 1024;    // requests waiting; beyond it Enqueue fails at once
  int64_t request_timeout_us = 0;  // a request still queued after this fails; 0 = no limit
  // An idle executor polls the queue this long before it sleeps: a sleeping thread takes tens of
  // microseconds to wake on a virtual machine, more than a B = 1 call's whole serving overhead.
  int64_t busy_poll_us = 0;
  // Close the window after the recent mean forward pass when that is shorter than
  // max_queue_delay_us (rec-server --batch-window adaptive); false: always wait it out (fixed).
  bool adaptive_window = true;
};

class Batcher {
 public:
  using RunnerSource = std::function<std::shared_ptr<Runner>()>;

  Batcher(const ModelSpec& spec, BatcherOptions options, RunnerSource current_runner,
          ModelStats* stats);
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Queues a request that ValidateRequest accepted. On error (queue full, shutting down) the
  // callback is not called and the caller answers the request.
  Status Enqueue(InferRequest&& request, InferCallback done);

  // Stops accepting, lets executors finish everything queued, and joins them.
  void Shutdown();

 private:
  struct Pending {
    InferRequest request;
    InferCallback done;
    uint64_t enqueue_ns;
  };
  using PendingList = std::vector<std::unique_ptr<Pending>>;

  void ExecutorLoop();
  bool NextBatch(PendingList* batch, PendingList* expired);
  void TakeFitting(int64_t* rows, PendingList* batch, PendingList* expired);
  void DropExpired(PendingList* batch, uint64_t now);
  size_t PreferredPrefix(const PendingList& batch) const;
  uint64_t WindowNs() const;
  void RecordForward(uint64_t forward_ns);
  void RecordCompany(size_t requests);
  void Execute(PendingList* batch);
  void Finish(Pending* p, InferResult&& result, uint64_t now_ns);

  const ModelSpec& spec_;
  const BatcherOptions options_;
  RunnerSource current_runner_;
  ModelStats* stats_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Pending>> queue_;
  bool gathering_ = false;  // one executor gathers at a time, so batches fill up
  bool stopping_ = false;
  std::atomic<uint64_t> arrivals_{0};    // Enqueue calls so far: what a polling executor watches
  std::atomic<uint64_t> forward_ns_{0};  // running mean of successful forward passes; 0: none yet
  // The adaptive window is (its cap) >> (kWholeWindow - company_): kWholeWindow after a batch of
  // two or more requests, one less after each lone one, 0 (no window) from the start.
  static constexpr int kWholeWindow = 6;
  std::atomic<int> company_{0};
  // The most requests in one batch over the last kPeakBatches batches (guarded by mu_): a batch
  // that reaches it runs at once. peak_next_ is the largest since peak_requests_ was last set.
  static constexpr int kPeakBatches = 16;
  size_t peak_requests_ = 0;
  size_t peak_next_ = 0;
  int batches_below_peak_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace rec
