#include "batching/batcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>

#include "test_util.h"

namespace rec {
namespace {

// Scores each row with its first dense feature, so every request can check it got its rows.
class EchoRunner : public Runner {
 public:
  const std::string& version() const override { return version_; }
  Status Run(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    calls++;
    max_rows = std::max<int64_t>(max_rows, inputs[0].shape[0]);
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
};

TEST(Batcher, EachRequestGetsItsOwnRows) {
  ModelSpec spec = testing::MakeSpec();
  auto runner = std::make_shared<EchoRunner>();
  ModelStats stats;
  Batcher batcher(
      spec, {2, 1000, 0}, [&] { return runner; }, &stats);
  std::vector<std::future<InferResult>> futures;
  std::vector<int64_t> rows;
  for (int i = 0; i < 40; ++i) {
    InferRequest r = testing::MakeRequest(1 + i % 4, static_cast<float>(100 * i));
    ASSERT_TRUE(ValidateRequest(spec, &r).ok());
    rows.push_back(r.batch_size);
    auto promise = std::make_shared<std::promise<InferResult>>();
    futures.push_back(promise->get_future());
    ASSERT_TRUE(batcher
                    .Enqueue(std::move(r),
                             [promise](InferResult&& res) { promise->set_value(std::move(res)); })
                    .ok());
  }
  for (int i = 0; i < 40; ++i) {
    InferResult res = futures[i].get();
    ASSERT_TRUE(res.status.ok()) << res.status.message();
    ASSERT_EQ(res.outputs[0].shape[0], rows[i]);
    for (int64_t k = 0; k < rows[i]; ++k) {
      EXPECT_EQ(res.outputs[0].As<float>()[k], static_cast<float>(100 * i + k));
    }
  }
  EXPECT_LE(runner->max_rows.load(), 8);
  EXPECT_LT(runner->calls.load(), 40);  // requests were batched
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

}  // namespace
}  // namespace rec
