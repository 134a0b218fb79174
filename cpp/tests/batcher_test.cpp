#include "batching/batcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>

#include "test_util.h"

namespace rec {
namespace {

// Scores each row with its first dense feature, so every request can check it got its rows.
class EchoRunner : public Runner {
 public:
  const std::string& version() const override { return version_; }
  Status Run(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    if (calls++ == 0 && hold_first) hold_first->wait();
    if (hold_all) hold_all->wait();
    max_rows = std::max<int64_t>(max_rows, inputs[0].shape[0]);
    {
      std::lock_guard<std::mutex> lock(mu);
      batch_rows.push_back(inputs[0].shape[0]);
    }
    if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    if (fail) return Internal("boom");
    const Tensor& dense = inputs[0];
    Tensor scores;
    scores.name = "scores";
    scores.dtype = DataType::kFp32;
    scores.shape = {dense.shape[0], 1};
    scores.data.resize(static_cast<size_t>(dense.shape[0]) * 4);
    for (int64_t i = 0; i < dense.shape[0]; ++i) {
      scores.MutableAs<float>()[i] = dense.As<float>()[i * 2];
    }
    outputs->assign({scores});
    return Status::Ok();
  }
  std::string version_ = "1";
  std::atomic<int> calls{0};
  std::atomic<int64_t> max_rows{0};
  bool fail = false;
  int sleep_ms = 0;                                // each forward pass takes this long
  std::shared_future<void>* hold_first = nullptr;  // the first pass waits for it
  std::shared_future<void>* hold_all = nullptr;    // every pass waits for it
  std::mutex mu;
  std::vector<int64_t> batch_rows;  // rows of each pass, in order
  std::vector<int64_t> Batches() {
    std::lock_guard<std::mutex> lock(mu);
    return batch_rows;
  }
};

// Enqueues a request of `rows` rows whose first dense feature is `first`; its answer goes to
// the returned future.
std::future<InferResult> Send(Batcher* batcher, const ModelSpec& spec, int64_t rows, float first) {
  InferRequest r = testing::MakeRequest(rows, first);
  EXPECT_TRUE(ValidateRequest(spec, &r).ok());
  auto promise = std::make_shared<std::promise<InferResult>>();
  auto future = promise->get_future();
  EXPECT_TRUE(batcher
                  ->Enqueue(std::move(r),
                            [promise](InferResult&& res) { promise->set_value(std::move(res)); })
                  .ok());
  return future;
}

// The answer, failing the test if it takes longer than `seconds` (far less than any window
// these tests would wait out by mistake).
InferResult Await(std::future<InferResult>* f, int seconds = 30) {
  EXPECT_EQ(f->wait_for(std::chrono::seconds(seconds)), std::future_status::ready);
  InferResult res = f->get();
  EXPECT_TRUE(res.status.ok()) << res.status.message();
  return res;
}

TEST(Batcher, EachRequestGetsItsOwnRows) {
  ModelSpec spec = testing::MakeSpec();
  auto runner = std::make_shared<EchoRunner>();
  ModelStats stats;
  // Both executors' passes wait until all 40 are queued, so the rest must be batched: without
  // the gate a loaded CPU can let the executors take each request as it comes.
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  runner->hold_all = &gate;
  Batcher batcher(
      spec, {2, 1000, 0}, [&] { return runner; }, &stats);
  std::vector<std::future<InferResult>> futures;
  std::vector<int64_t> rows;
  bool enqueued = [&] {
    for (int i = 0; i < 40; ++i) {
      InferRequest r = testing::MakeRequest(1 + i % 4, static_cast<float>(100 * i));
      if (!ValidateRequest(spec, &r).ok()) return false;
      rows.push_back(r.batch_size);
      auto promise = std::make_shared<std::promise<InferResult>>();
      futures.push_back(promise->get_future());
      auto done = [promise](InferResult&& res) { promise->set_value(std::move(res)); };
      if (!batcher.Enqueue(std::move(r), done).ok()) return false;
    }
    return true;
  }();
  release.set_value();  // before any ASSERT can return: the batcher's shutdown waits on the passes
  ASSERT_TRUE(enqueued);
  for (int i = 0; i < 40; ++i) {
    InferResult res = futures[i].get();
    ASSERT_TRUE(res.status.ok()) << res.status.message();
    ASSERT_EQ(res.outputs[0].shape[0], rows[i]);
    for (int64_t k = 0; k < rows[i]; ++k) {
      EXPECT_EQ(res.outputs[0].As<float>()[k], static_cast<float>(100 * i + k));
    }
  }
  EXPECT_LE(runner->max_rows.load(), 8);
  EXPECT_LT(runner->calls.load(), 40);  // requests were batched (at most 2 + 38 / 2)
  EXPECT_EQ(stats.success_count.load(), 40u);
  EXPECT_EQ(stats.pending.load(), 0);
}

// With a poll longer than the test, the executor never sleeps: each request, sent after the
// previous answer, is taken by the polling executor, and Shutdown ends the poll at once.
TEST(Batcher, PollingExecutorTakesEachRequestAndStopsOnShutdown) {
  ModelSpec spec = testing::MakeSpec();
  auto runner = std::make_shared<EchoRunner>();
  ModelStats stats;
  BatcherOptions options;
  options.executor_threads = 1;
  options.busy_poll_us = 60'000'000;
  Batcher batcher(
      spec, options, [&] { return runner; }, &stats);
  for (int i = 0; i < 20; ++i) {
    InferRequest r = testing::MakeRequest(1 + i % 3, static_cast<float>(10 * i));
    ASSERT_TRUE(ValidateRequest(spec, &r).ok());
    int64_t rows = r.batch_size;
    std::promise<InferResult> promise;
    ASSERT_TRUE(
        batcher.Enqueue(std::move(r), [&](InferResult&& res) { promise.set_value(std::move(res)); })
            .ok());
    InferResult res = promise.get_future().get();
    ASSERT_TRUE(res.status.ok()) << res.status.message();
    ASSERT_EQ(res.outputs[0].shape[0], rows);
    EXPECT_EQ(res.outputs[0].As<float>()[0], static_cast<float>(10 * i));
  }
  auto start = std::chrono::steady_clock::now();
  batcher.Shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_EQ(runner->calls.load(), 20);
}

// Triton's preferred_batch_sizes: a batch that can make a preferred size runs at once with the
// largest it can make, and the requests past it stay queued for the next batch.
TEST(Batcher, PreferredBatchSizeRunsAtOnceAndLeavesTheRestQueued) {
  ModelSpec spec = testing::MakeSpec();
  spec.preferred_batch_sizes = {2, 4};
  spec.max_queue_delay_us = 200'000;
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  auto runner = std::make_shared<EchoRunner>();
  runner->hold_first = &gate;
  ModelStats stats;
  BatcherOptions options{1, 1000, 0};
  options.adaptive_window = false;  // the configured window, so only a preferred size closes it
  Batcher batcher(
      spec, options, [&] { return runner; }, &stats);
  std::vector<std::future<InferResult>> answers;
  answers.push_back(Send(&batcher, spec, 4, 0));  // a preferred size alone: runs, held
  while (runner->calls.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (int i = 1; i <= 6; ++i) answers.push_back(Send(&batcher, spec, 1, 100.0f * i));
  release.set_value();
  for (int i = 0; i <= 6; ++i) {
    InferResult res = Await(&answers[i]);
    EXPECT_EQ(res.outputs[0].As<float>()[0], 100.0f * i);
  }
  // 6 queued rows: 4 at once (not 6 after the window), then the 2 left, a preferred size too.
  EXPECT_EQ(runner->Batches(), (std::vector<int64_t>{4, 4, 2}));
}

// Adaptive: no window until requests come together; then about one recent forward pass (not the
// minute configured), within which requests still share a pass, and which closes once the batch
// holds as many requests as the recent largest; halved by each lone request, none after six. The
// metric says the window in use.
TEST(Batcher, AdaptiveWindowFollowsTheRecentForwardPassAndCompany) {
  ModelSpec spec = testing::MakeSpec();
  spec.max_queue_delay_us = 60'000'000;
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  auto runner = std::make_shared<EchoRunner>();
  runner->sleep_ms = 100;
  runner->hold_first = &gate;
  ModelStats stats;
  Batcher batcher(
      spec, {1, 1000, 0}, [&] { return runner; }, &stats);
  EXPECT_EQ(stats.batch_window_us.load(), 0);
  // A lone first request runs at once (held at the gate); two queue behind it and share a pass.
  auto lone = Send(&batcher, spec, 1, 7.0f);
  while (runner->calls.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(stats.batch_window_us.load(), 0);
  auto a = Send(&batcher, spec, 1, 1.0f), b = Send(&batcher, spec, 1, 2.0f);
  release.set_value();
  EXPECT_EQ(Await(&lone).outputs[0].As<float>()[0], 7.0f);
  EXPECT_EQ(Await(&a).outputs[0].As<float>()[0], 1.0f);
  EXPECT_EQ(Await(&b).outputs[0].As<float>()[0], 2.0f);
  const int64_t whole = stats.batch_window_us.load();
  EXPECT_GE(whole, 100'000);  // the mean pass: each sleeps 100 ms
  EXPECT_LT(whole, 60'000'000);
  // Requests 10 ms apart fall in that window and share a pass. The second makes 2 requests, the
  // largest batch so far, so that pass starts at once: a third 10 ms later is not pulled in (with
  // a fixed window it would be).
  auto first = Send(&batcher, spec, 1, 1.0f);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto second = Send(&batcher, spec, 2, 2.0f);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto third = Send(&batcher, spec, 4, 4.0f);
  EXPECT_EQ(Await(&first).outputs[0].As<float>()[0], 1.0f);
  EXPECT_EQ(Await(&second).outputs[0].As<float>()[0], 2.0f);
  EXPECT_EQ(Await(&third).outputs[0].As<float>()[0], 4.0f);
  // Each lone request halves the window (the third was one); the sixth closes it.
  for (int i = 0; i < 6; ++i) {
    auto alone = Send(&batcher, spec, 1, 3.0f);
    EXPECT_EQ(Await(&alone).outputs[0].As<float>()[0], 3.0f);
    if (i == 0) {
      EXPECT_LE(stats.batch_window_us.load(), whole / 2 + 1);
    }
  }
  EXPECT_EQ(stats.batch_window_us.load(), 0);
  EXPECT_EQ(runner->Batches(), (std::vector<int64_t>{1, 2, 3, 4, 1, 1, 1, 1, 1, 1}));
}

TEST(Batcher, FailedBatchFailsItsRequestsAndFullQueueRejects) {
  ModelSpec spec = testing::MakeSpec();
  auto runner = std::make_shared<EchoRunner>();
  runner->fail = true;
  ModelStats stats;
  {
    Batcher batcher(
        spec, {1, 1000, 0}, [&] { return runner; }, &stats);
    std::promise<InferResult> p;
    InferRequest r = testing::MakeRequest(1, 0);
    ASSERT_TRUE(ValidateRequest(spec, &r).ok());
    ASSERT_TRUE(
        batcher.Enqueue(std::move(r), [&](InferResult&& res) { p.set_value(std::move(res)); })
            .ok());
    EXPECT_EQ(p.get_future().get().status.code(), StatusCode::kInternal);
  }
  std::shared_ptr<Runner> none;
  Batcher idle(
      spec, {1, 0, 0}, [&] { return none; }, &stats);
  InferRequest r = testing::MakeRequest(1, 0);
  EXPECT_EQ(idle.Enqueue(std::move(r), [](InferResult&&) {}).code(), StatusCode::kUnavailable);
}

// As the served model's remap does: a pass tallies its unknown ids per request column on the
// thread that ran it (here y has 3 per pass, x and z are modulo features), and a failed pass
// leaves its tally behind.
class UnknownIdsRunner : public EchoRunner {
 public:
  Status Run(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    tally = {-1, 3, -1};
    return EchoRunner::Run(inputs, outputs);
  }
  void TakeUnknownIds(std::vector<int64_t>* per_column) override {
    per_column->swap(tally);
    tally.clear();
  }
  static thread_local std::vector<int64_t> tally;
};
thread_local std::vector<int64_t> UnknownIdsRunner::tally;

TEST(Batcher, UnknownIdsAreCountedPerFeatureForPassesThatSucceed) {
  ModelSpec spec = testing::MakeSpecWithFeatureSpec();
  auto runner = std::make_shared<UnknownIdsRunner>();
  Metrics metrics;
  ModelStats* stats = metrics.ForModel("m");
  {
    Batcher batcher(
        spec, {1, 1000, 0}, [&] { return runner; }, stats);
    for (int i = 0; i < 2; ++i) {
      auto f = Send(&batcher, spec, 1, 0);
      Await(&f);
    }
    runner->fail = true;  // a failed pass counts nothing
    auto failed = Send(&batcher, spec, 1, 0);
    EXPECT_FALSE(failed.get().status.ok());
  }
  const std::string text = metrics.Prometheus();
  EXPECT_NE(text.find("rec_questionable_ids_total{model=\"m\",version=\"\",feature=\"y\","
                      "reason=\"unknown\"} 6\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("feature=\"x\",reason=\"unknown\""), std::string::npos);  // modulo
}

// A context model's runner: candidate b's score is its context's first dense value * 1000 plus
// its own dense value, the context found through candidate_offsets; it records each pass's
// contexts and candidates.
class ContextEchoRunner : public Runner {
 public:
  const std::string& version() const override { return version_; }
  Status Run(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    if (hold_all) hold_all->wait();
    const Tensor& context = inputs[0];    // context_dense [R, 2]
    const Tensor& candidate = inputs[3];  // candidate_dense [B, 1]
    const Tensor& offsets = inputs[6];    // [R + 1], Fn = 2
    const int64_t contexts = offsets.shape[0] - 1, rows = candidate.shape[0];
    if (context.shape[0] != contexts || offsets.As<int32_t>()[contexts] != 2 * rows) {
      return Internal("offsets do not match the batch");
    }
    std::vector<float> scores;
    for (int64_t r = 0; r < contexts; ++r) {
      for (int32_t k = offsets.As<int32_t>()[r] / 2; k < offsets.As<int32_t>()[r + 1] / 2; ++k) {
        scores.push_back(context.As<float>()[r * 2] * 1000 + candidate.As<float>()[k]);
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      passes.emplace_back(contexts, rows);
    }
    outputs->assign(1, testing::MakeTensor("scores", DataType::kFp32, {rows, 1}, scores));
    return Status::Ok();
  }
  std::string version_ = "1";
  std::shared_future<void>* hold_all = nullptr;
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> passes;  // (contexts, candidates) of each pass
};

// Requests of 1 to 7 candidates and flat ones of 2 rows, batched by pairs: no pass above
// max_batch_size (8) candidates, each request answered with its own candidates' scores.
TEST(Batcher, ContextRequestsBatchByCandidatesWithShiftedOffsets) {
  ModelSpec spec = testing::MakeContextSpec();
  auto runner = std::make_shared<ContextEchoRunner>();
  ModelStats stats;
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  runner->hold_all = &gate;
  Batcher batcher(
      spec, {1, 1000, 0}, [&] { return runner; }, &stats);
  std::vector<std::future<InferResult>> futures;
  std::vector<std::vector<float>> expected;
  bool enqueued = [&] {
    for (int i = 0; i < 20; ++i) {
      const float base = static_cast<float>(i + 1);
      InferRequest r;
      std::vector<float> want;
      if (i % 5 == 4) {  // flat: 2 rows, each its own context
        r.inputs.push_back(testing::MakeTensor<float>("dense_features", DataType::kFp32, {2, 3},
                                                      {base, 7, 0, base + 1, 9, 0}));
        r.inputs.push_back(testing::MakeTensor("sparse_lengths", DataType::kInt32, {2, 4},
                                               std::vector<int32_t>(8, 0)));
        r.inputs.push_back(
            testing::MakeTensor("sparse_values", DataType::kInt64, {0}, std::vector<int64_t>{}));
        want = {base * 1000 + 7, (base + 1) * 1000 + 9};
      } else {
        const int64_t n = 1 + (i * 3) % 7;
        r = testing::MakeContextRequest(n, base);
        for (int64_t k = 0; k < n; ++k) want.push_back(base * 1000 + base + static_cast<float>(k));
      }
      if (!ValidateRequest(spec, &r).ok()) return false;
      expected.push_back(want);
      auto promise = std::make_shared<std::promise<InferResult>>();
      futures.push_back(promise->get_future());
      auto done = [promise](InferResult&& res) { promise->set_value(std::move(res)); };
      if (!batcher.Enqueue(std::move(r), done).ok()) return false;
    }
    return true;
  }();
  release.set_value();
  ASSERT_TRUE(enqueued);
  for (size_t i = 0; i < futures.size(); ++i) {
    InferResult res = Await(&futures[i]);
    ASSERT_EQ(res.outputs[0].shape[0], static_cast<int64_t>(expected[i].size())) << i;
    const float* got = res.outputs[0].As<float>();
    EXPECT_EQ(std::vector<float>(got, got + expected[i].size()), expected[i]) << i;
  }
  std::lock_guard<std::mutex> lock(runner->mu);
  EXPECT_LT(runner->passes.size(), futures.size());  // requests were batched
  for (const auto& [contexts, candidates] : runner->passes) {
    EXPECT_LE(candidates, 8);
    EXPECT_LE(contexts, candidates);
  }
}

}  // namespace
}  // namespace rec
