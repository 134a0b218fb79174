#include "batching/batcher.h"

#include <algorithm>
#include <chrono>

#include "common/busy_poll.h"
#include "common/log.h"

namespace rec {

Batcher::Batcher(const ModelSpec& spec, BatcherOptions options, RunnerSource current_runner,
                 ModelStats* stats)
    : spec_(spec), options_(options), current_runner_(std::move(current_runner)), stats_(stats) {
  stats_->batch_window_us.store(static_cast<int64_t>(WindowNs() / 1000));
  int threads = options_.executor_threads > 0 ? options_.executor_threads : spec_.instance_count;
  for (int i = 0; i < std::max(1, threads); ++i) {
    threads_.emplace_back([this] { ExecutorLoop(); });
  }
}

Batcher::~Batcher() { Shutdown(); }

Status Batcher::Enqueue(InferRequest&& request, InferCallback done) {
  auto p = std::make_unique<Pending>();
  p->request = std::move(request);
  p->done = std::move(done);
  p->enqueue_ns = NowNs();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Unavailable("server is shutting down");
    if (queue_.size() >= options_.max_queue_size) {
      return Unavailable("request queue of model '" + spec_.name + "' is full (" +
                         std::to_string(options_.max_queue_size) + " requests)");
    }
    queue_.push_back(std::move(p));
    stats_->pending.fetch_add(1, std::memory_order_relaxed);
  }
  arrivals_.fetch_add(1, std::memory_order_release);
  cv_.notify_one();
  return Status::Ok();
}

void Batcher::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  arrivals_.fetch_add(1, std::memory_order_release);  // ends the executors' polls
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void Batcher::ExecutorLoop() {
  PendingList batch, expired;
  while (true) {
    batch.clear();
    expired.clear();
    bool more = NextBatch(&batch, &expired);
    uint64_t now = NowNs();
    for (auto& p : expired) {
      InferResult r;
      r.status = Status(StatusCode::kDeadlineExceeded,
                        "request timed out after " + std::to_string(options_.request_timeout_us) +
                            " us in the queue");
      Finish(p.get(), std::move(r), now);
    }
    if (!batch.empty()) Execute(&batch);
    if (!more) return;
  }
}

// Moves queued requests into the batch while they fit; requests past their timeout go to expired.
void Batcher::TakeFitting(int64_t* rows, PendingList* batch, PendingList* expired) {
  uint64_t now = NowNs();
  uint64_t timeout_ns = static_cast<uint64_t>(options_.request_timeout_us) * 1000;
  while (!queue_.empty()) {
    Pending* front = queue_.front().get();
    if (timeout_ns > 0 && now - front->enqueue_ns > timeout_ns) {
      expired->push_back(std::move(queue_.front()));
      queue_.pop_front();
      continue;
    }
    if (!batch->empty() && *rows + front->request.batch_size > spec_.max_batch_size) return;
    *rows += front->request.batch_size;
    batch->push_back(std::move(queue_.front()));
    queue_.pop_front();
    if (!spec_.dynamic_batching) return;
  }
}

// Triton's preferred_batch_sizes: the longest prefix of `batch` (in requests) whose rows make a
// preferred size, which is then the largest preferred size the batch can form; 0 when none.
size_t Batcher::PreferredPrefix(const PendingList& batch) const {
  const std::vector<int64_t>& preferred = spec_.preferred_batch_sizes;
  size_t longest = 0;
  int64_t rows = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    rows += batch[i]->request.batch_size;
    if (std::find(preferred.begin(), preferred.end(), rows) != preferred.end()) longest = i + 1;
  }
  return longest;
}

uint64_t Batcher::WindowNs() const {
  if (!spec_.dynamic_batching) return 0;
  uint64_t configured = static_cast<uint64_t>(spec_.max_queue_delay_us) * 1000;
  if (!options_.adaptive_window) return configured;
  int company = company_.load(std::memory_order_relaxed);
  if (company <= 0) return 0;
  uint64_t cap = std::min(configured, forward_ns_.load(std::memory_order_relaxed));
  return cap >> (kWholeWindow - company);
}

// Folds one forward pass into the running mean (weight 1/8: a few batches follow a load change).
// Executors race here only with each other; a lost update just weighs one pass less.
void Batcher::RecordForward(uint64_t forward_ns) {
  uint64_t mean = forward_ns_.load(std::memory_order_relaxed);
  mean = mean == 0 ? forward_ns : mean - mean / 8 + forward_ns / 8;
  forward_ns_.store(std::max<uint64_t>(mean, 1), std::memory_order_relaxed);
}

// Called with mu_ held, once per gathered batch of `requests`.
void Batcher::RecordCompany(size_t requests) {
  int company = requests >= 2 ? kWholeWindow : company_.load() - 1;
  company_.store(std::max(company, 0));
  if (requests >= peak_requests_) {
    peak_requests_ = requests;
    peak_next_ = 0;
    batches_below_peak_ = 0;
    return;
  }
  // Fewer clients than before: after kPeakBatches batches below it, the peak is theirs.
  peak_next_ = std::max(peak_next_, requests);
  if (++batches_below_peak_ >= kPeakBatches) {
    peak_requests_ = peak_next_;
    peak_next_ = 0;
    batches_below_peak_ = 0;
  }
}

// Blocks until a batch is ready. Returns false when the batcher is stopping and drained.
bool Batcher::NextBatch(PendingList* batch, PendingList* expired) {
  std::unique_lock<std::mutex> lock(mu_);
  if (options_.busy_poll_us > 0 && queue_.empty() && !stopping_) {
    uint64_t seen = arrivals_.load(std::memory_order_acquire);
    lock.unlock();
    PollFor(options_.busy_poll_us,
            [&] { return arrivals_.load(std::memory_order_acquire) != seen; });
    lock.lock();
  }
  cv_.wait(lock, [this] { return stopping_ || (!queue_.empty() && !gathering_); });
  if (queue_.empty()) return !stopping_;
  gathering_ = true;
  int64_t rows = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(WindowNs());
  while (true) {
    TakeFitting(&rows, batch, expired);
    if (size_t preferred = PreferredPrefix(*batch); preferred > 0) {
      // Run the preferred size now; the requests past it go back to the front, in order.
      while (batch->size() > preferred) {
        queue_.push_front(std::move(batch->back()));
        batch->pop_back();
      }
      break;
    }
    bool full = rows >= spec_.max_batch_size || !spec_.dynamic_batching ||
                (!queue_.empty() && !batch->empty());
    bool everyone_came =
        options_.adaptive_window && peak_requests_ >= 2 && batch->size() >= peak_requests_;
    auto now = std::chrono::steady_clock::now();
    if (full || everyone_came || stopping_ || now >= deadline) break;
    // Only wait for more while the queue is empty; re-check after each arrival.
    auto left_us = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now).count();
    if (left_us < options_.busy_poll_us) {
      uint64_t seen = arrivals_.load(std::memory_order_acquire);
      lock.unlock();
      PollFor(left_us + 1, [&] { return arrivals_.load(std::memory_order_acquire) != seen; });
      lock.lock();
      continue;
    }
    cv_.wait_until(lock, deadline, [this] { return stopping_ || !queue_.empty(); });
  }
  if (options_.adaptive_window && spec_.dynamic_batching) RecordCompany(batch->size());
  stats_->batch_window_us.store(static_cast<int64_t>(WindowNs() / 1000));
  gathering_ = false;
  lock.unlock();
  cv_.notify_all();
  return true;
}

void Batcher::Finish(Pending* p, InferResult&& result, uint64_t now_ns) {
  uint64_t elapsed = now_ns - p->enqueue_ns;
  if (result.status.ok()) {
    stats_->RecordSuccess(elapsed);
  } else {
    stats_->RecordFailure(elapsed);
  }
  stats_->pending.fetch_sub(1, std::memory_order_relaxed);
  p->done(std::move(result));
}

// Fails the requests of `batch` that waited past the timeout (in the queue or in the batching
// window) and removes them, so the forward runs on the rest.
void Batcher::DropExpired(PendingList* batch, uint64_t now) {
  if (options_.request_timeout_us <= 0) return;
  uint64_t timeout_ns = static_cast<uint64_t>(options_.request_timeout_us) * 1000;
  PendingList kept;
  for (auto& p : *batch) {
    if (now - p->enqueue_ns <= timeout_ns) {
      kept.push_back(std::move(p));
      continue;
    }
    InferResult r;
    r.status = Status(StatusCode::kDeadlineExceeded,
                      "request timed out after " + std::to_string(options_.request_timeout_us) +
                          " us waiting for a batch");
    Finish(p.get(), std::move(r), now);
  }
  batch->swap(kept);
}

void Batcher::Execute(PendingList* batch) {
  uint64_t start = NowNs();
  DropExpired(batch, start);
  if (batch->empty()) return;
  std::shared_ptr<Runner> runner = current_runner_();
  std::vector<const InferRequest*> requests;
  int64_t rows = 0;
  for (auto& p : *batch) {
    requests.push_back(&p->request);
    rows += p->request.batch_size;
    stats_->queue_count.fetch_add(1, std::memory_order_relaxed);
    stats_->queue_ns.fetch_add(start - p->enqueue_ns, std::memory_order_relaxed);
  }
  std::vector<Tensor> outputs;
  Watermark scored_at;
  Status status = runner ? Status::Ok() : Unavailable("model '" + spec_.name + "' is not loaded");
  uint64_t input_done = start, infer_done = start;
  if (status.ok()) {
    std::vector<Tensor> inputs = batch->size() == 1 ? std::move((*batch)[0]->request.inputs)
                                                    : ConcatenateInputs(spec_, requests);
    input_done = NowNs();
    std::vector<int64_t> unknown;
    runner->TakeUnknownIds(&unknown);  // drops what another pass on this thread left (a failure)
    status = runner->RunScored(inputs, &outputs, &scored_at);
    infer_done = NowNs();
    runner->TakeUnknownIds(&unknown);
    if (status.ok()) status = CheckOutputs(spec_, rows, outputs);
    if (status.ok()) RecordForward(infer_done - input_done);
    // rec_questionable_ids_total{reason="unknown"}; counting 0 declares a ZCH feature.
    if (status.ok() && !unknown.empty()) {
      stats_->CountUnknownIds(spec_.sparse_feature_names, unknown);
    }
  }
  if (scored_at.valid && scored_at.wall_ns > 0) {
    stats_->update_lag_ms.Observe(
        static_cast<double>(static_cast<int64_t>(WallMs()) - scored_at.wall_ns / 1000000));
  }
  stats_->execution_count.fetch_add(1, std::memory_order_relaxed);
  stats_->inference_count.fetch_add(static_cast<uint64_t>(rows), std::memory_order_relaxed);
  stats_->batch_size.Observe(static_cast<double>(rows));
  stats_->compute_input_ns.fetch_add(input_done - start, std::memory_order_relaxed);
  stats_->compute_infer_ns.fetch_add(infer_done - input_done, std::memory_order_relaxed);
  stats_->last_inference_ms.store(WallMs(), std::memory_order_relaxed);
  if (LogVerboseOn(1)) {
    LogVerbose(1, "model '" + spec_.name + "' version " + (runner ? runner->version() : "-") +
                      ": batch of " + std::to_string(rows) + " rows from " +
                      std::to_string(batch->size()) + " request(s) in " +
                      std::to_string((infer_done - input_done) / 1000) +
                      " us: " + (status.ok() ? "ok" : status.message()));
  }
  int64_t begin = 0;
  for (auto& p : *batch) {
    InferResult r;
    r.status = status;
    if (status.ok()) {
      r.model_version = runner->version();
      r.watermark = scored_at;
      r.outputs = SliceOutputs(outputs, begin, p->request.batch_size);
    }
    begin += p->request.batch_size;
    if (Trace* t = p->request.trace.get()) {
      if (runner) t->SetVersion(runner->version());
      t->Stamp("QUEUE_START", p->enqueue_ns);
      t->Stamp("COMPUTE_START", start);
      t->Stamp("COMPUTE_INPUT_END", input_done);
      t->Stamp("COMPUTE_OUTPUT_START", infer_done);
      t->Stamp("COMPUTE_END");
    }
    Finish(p.get(), std::move(r), NowNs());
  }
  stats_->compute_output_ns.fetch_add(NowNs() - infer_done, std::memory_order_relaxed);
}

}  // namespace rec
