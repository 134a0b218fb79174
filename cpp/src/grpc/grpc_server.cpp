#include "grpc/grpc_server.h"

#include <grpcpp/alarm.h>

#include <atomic>
#include <condition_variable>
#include <deque>

#include "common/busy_poll.h"

namespace rec {
namespace {

using Svc = inference::GRPCInferenceService;

// Every method is asynchronous (a service with any sync method brings the sync server's thread
// pool along); the ones rec-server does not implement answer UNIMPLEMENTED.
using AsyncBase = Svc::AsyncService;

// Every completion-queue tag is a Tag; the polling thread calls Proceed with the event's `ok`.
class Tag {
 public:
  virtual ~Tag() = default;
  virtual void Proceed(bool ok) = 0;
};

constexpr const char* kNoCuda =
    "CUDA shared memory is not supported on this server (it has no GPU); use system shared "
    "memory";

}  // namespace

class GrpcServer::Service final : public AsyncBase {};

// One completion queue and the gate that stops new calls from being requested on it: a request
// for the next call is made only while open, so nothing starts on the queue after Shutdown.
//
// Post() hands a tag from another thread (a batcher's) to the polling thread, which runs it as if
// it had completed: an alarm that is already due wakes the poller, and one wake serves every tag
// posted until the poller takes them, so the 16 answers of a batch cost the executor one wake,
// not 16. Starting the write on the batcher's thread instead contends with the poller for the
// transport, and gRPC then moves the work to its executor thread (measured at B = 1, one client:
// p50 ~340 us this way against 355-400 us).
struct GrpcServer::Queue {
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  std::mutex mu;
  bool open = true;

  template <typename F>
  void Arm(F request_next) {
    std::lock_guard<std::mutex> lock(mu);
    if (open) request_next();
  }

  // ModelInfer requests with the batcher: while there are any, the poller polls for their answers
  // rather than sleeping (--busy-poll-us).
  std::atomic<int> answers_due{0};

  void Post(Tag* tag) {
    std::lock_guard<std::mutex> lock(post_mu);
    posted.push_back(tag);
    has_posted.store(true, std::memory_order_release);
    if (waking || spinning) return;  // a spinning poller takes it without a wake (TakePosted)
    waking = true;
    alarm = std::make_unique<grpc::Alarm>();
    alarm->Set(cq.get(), gpr_time_0(GPR_CLOCK_MONOTONIC), &woken);
  }

  // The busy-polling poller, between its checks of the queue: runs what was posted. An alarm is
  // what wakes a poller asleep in Next, and it is the larger part of a posted answer's cost
  // (allocated, set, delivered through the queue); a poller that is spinning needs none.
  bool TakePosted() {
    if (!has_posted.load(std::memory_order_acquire)) return false;
    RunPosted();
    return true;
  }

  // The poller starts and stops spinning. Under post_mu, so a Post either sees it spinning and
  // is taken by TakePosted, or sets the alarm: none is left behind when it sleeps. Once the
  // queue is closing it does not start (StartSpinning returns false).
  bool StartSpinning() {
    std::lock_guard<std::mutex> lock(post_mu);
    if (closing) return false;
    spinning = true;
    return true;
  }
  void StopSpinning() {
    {
      std::lock_guard<std::mutex> lock(post_mu);
      spinning = false;
      if (!posted.empty() && !waking) {
        waking = true;
        alarm = std::make_unique<grpc::Alarm>();
        alarm->Set(cq.get(), gpr_time_0(GPR_CLOCK_MONOTONIC), &woken);
      }
    }
    spin_stopped.notify_all();
  }

  // Before the queue shuts down: waits until the poller is not spinning and keeps it from
  // spinning again, so every answer still posted goes through an alarm, which holds the queue
  // open until the poller has run it. (A tag posted to a spinning poller holds nothing: the
  // queue could shut down first, and gRPC aborts on an operation started on a dead queue.)
  void Close() {
    std::unique_lock<std::mutex> lock(post_mu);
    closing = true;
    spin_stopped.wait(lock, [this] { return !spinning; });
  }

 private:
  void RunPosted() {
    std::vector<Tag*> tags;
    {
      std::lock_guard<std::mutex> lock(post_mu);
      tags.swap(posted);
      has_posted.store(false, std::memory_order_relaxed);
    }
    for (Tag* t : tags) t->Proceed(true);
  }

  class Woken final : public Tag {
   public:
    explicit Woken(Queue* q) : q_(q) {}
    void Proceed(bool) override {
      {
        std::lock_guard<std::mutex> lock(q_->post_mu);
        q_->waking = false;
      }
      q_->RunPosted();
    }

   private:
    Queue* q_;
  };

  std::mutex post_mu;
  std::vector<Tag*> posted;
  std::atomic<bool> has_posted{false};
  bool waking = false;    // alarm is set and has not been taken yet
  bool spinning = false;  // the poller is busy-polling and checks `posted` (TakePosted)
  bool closing = false;   // Close: the poller spins no more
  std::condition_variable spin_stopped;
  std::unique_ptr<grpc::Alarm> alarm;
  Woken woken{this};
};

namespace {

// A unary call: requested, then handled, then deleted when its finish completes (a request that
// fails, at shutdown, deletes it at once). handle() answers with Finish on the polling thread or
// with FinishOnQueue from any other thread.
template <class Req, class Resp>
class UnaryCall final : public Tag {
 public:
  using Writer = grpc::ServerAsyncResponseWriter<Resp>;
  using RequestFn = void (AsyncBase::*)(grpc::ServerContext*, Req*, Writer*, grpc::CompletionQueue*,
                                        grpc::ServerCompletionQueue*, void*);
  using HandleFn = std::function<void(UnaryCall*)>;
  struct Method {
    GrpcServer::Service* service;
    RequestFn request;
    HandleFn handle;
  };

  static void Listen(const Method* m, GrpcServer::Queue* q) {
    q->Arm([m, q] {
      auto* call = new UnaryCall(m, q);
      grpc::ServerCompletionQueue* cq = q->cq.get();
      ((*m->service).*(m->request))(&call->context_, &call->request_, &call->writer_, cq, cq, call);
    });
  }

  void Proceed(bool ok) override {
    switch (state_) {
      case State::kRequested:
        if (!ok) break;
        state_ = State::kFinishing;
        Listen(method_, queue_);
        method_->handle(this);  // may already be deleted when this returns
        return;
      case State::kWaking:  // posted by FinishOnQueue: now on the polling thread
        state_ = State::kFinishing;
        if (trace_) trace_->Stamp("GRPC_SEND_START");
        writer_.Finish(response_, status_, this);
        return;
      case State::kFinishing:  // the answer is written (or the call broke)
        if (trace_) {
          trace_->Stamp("GRPC_SEND_END");
          Tracer::Get().Finish(trace_);
        }
        break;
    }
    delete this;
  }

  GrpcServer::Queue* queue() { return queue_; }
  Req* request() { return &request_; }
  Resp* response() { return &response_; }
  // On the polling thread.
  void Finish(const grpc::Status& status) { writer_.Finish(response_, status, this); }
  // From any thread: the polling thread writes the answer (Queue::Post). A traced request's
  // trace gets the write's start and end, then is finished.
  void FinishOnQueue(const grpc::Status& status, std::shared_ptr<Trace> trace = nullptr) {
    status_ = status;
    trace_ = std::move(trace);
    state_ = State::kWaking;
    queue_->Post(this);
  }

 private:
  enum class State { kRequested, kWaking, kFinishing };

  UnaryCall(const Method* m, GrpcServer::Queue* q) : method_(m), queue_(q) {}

  const Method* method_;
  GrpcServer::Queue* queue_;
  grpc::ServerContext context_;
  Req request_;
  Resp response_;
  Writer writer_{&context_};
  State state_ = State::kRequested;
  grpc::Status status_;
  std::shared_ptr<Trace> trace_;
};

// ModelStreamInfer: one read in flight; each request read goes to the batcher, and its response
// joins a write queue when its batch finishes (responses come in completion order); one write in
// flight. The call finishes once the client has half-closed (or the call broke), every request
// read has been answered and the last write is done. Every operation starts on the polling
// thread (a finished batch posts woken_ to it, see Queue::Post), under mu_
// (the completion-queue API never runs a completion inline, so holding it there is safe).
class StreamCall final {
 public:
  using Stream = grpc::ServerAsyncReaderWriter<inference::ModelStreamInferResponse,
                                               inference::ModelInferRequest>;

  static void Listen(GrpcServer::Service* service, GrpcApi* api, GrpcServer::Queue* q) {
    q->Arm([service, api, q] {
      auto* call = new StreamCall(service, api, q);
      grpc::ServerCompletionQueue* cq = q->cq.get();
      service->RequestModelStreamInfer(&call->context_, &call->stream_, cq, cq, &call->accepted_);
    });
  }

 private:
  enum class Event { kAccepted, kRead, kWoken, kWritten, kFinished };
  class EventTag final : public Tag {
   public:
    EventTag(StreamCall* call, Event event) : call_(call), event_(event) {}
    void Proceed(bool ok) override { call_->On(event_, ok); }

   private:
    StreamCall* call_;
    Event event_;
  };

  StreamCall(GrpcServer::Service* service, GrpcApi* api, GrpcServer::Queue* q)
      : service_(service), api_(api), queue_(q) {}

  void On(Event event, bool ok) {
    switch (event) {
      case Event::kAccepted:
        return Accepted(ok);
      case Event::kRead:
        return ReadDone(ok);
      case Event::kWoken: {
        std::lock_guard<std::mutex> lock(mu_);
        waking_ = false;
        WriteNextLocked();
        MaybeFinishLocked();
        return;
      }
      case Event::kWritten:
        return WriteDone(ok);
      case Event::kFinished: {
        // A batcher thread's callback may still be unlocking mu_ after posting woken_.
        std::lock_guard<std::mutex> wait(mu_);
      }
        delete this;
        return;
    }
  }

  void Accepted(bool ok) {
    if (!ok) {  // shutting down: no call came
      delete this;
      return;
    }
    Listen(service_, api_, queue_);
    std::lock_guard<std::mutex> lock(mu_);
    stream_.Read(&request_, &read_);
  }

  void ReadDone(bool ok) {
    if (!ok) {  // half-close, cancellation or a broken connection: no more requests
      std::lock_guard<std::mutex> lock(mu_);
      reading_ = false;
      MaybeFinishLocked();
      return;
    }
    auto out = std::make_shared<inference::ModelStreamInferResponse>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++pending_;
    }
    // ModelInfer is done with request_ when it returns, so the next read may reuse it; the call
    // cannot finish before `done` runs (pending_ > 0).
    queue_->answers_due.fetch_add(1);
    GrpcServer::Queue* q = queue_;  // outlives the call, which may end once mu_ is released
    auto done = [this, q, out](const Status& st, std::shared_ptr<Trace> trace) {
      if (!st.ok()) out->set_error_message(st.message());
      if (trace) {  // the stream's writes are not tracked per response: stamped as queued
        trace->Stamp("GRPC_SEND_START");
        Tracer::Get().Finish(trace);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        --pending_;
        if (!broken_) writes_.push_back(out);
        if (!waking_) {  // the polling thread starts the write (or the finish)
          waking_ = true;
          queue_->Post(&woken_);
        }
      }
      q->answers_due.fetch_sub(1);
    };
    api_->ModelInfer(&request_, out->mutable_infer_response(), std::move(done));
    std::lock_guard<std::mutex> lock(mu_);
    stream_.Read(&request_, &read_);
  }

  void WriteDone(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    writes_.pop_front();
    writing_ = false;
    if (!ok) {  // the client is gone: drop the remaining responses
      broken_ = true;
      writes_.clear();
    }
    WriteNextLocked();
    MaybeFinishLocked();
  }

  void WriteNextLocked() {
    if (writing_ || writes_.empty()) return;
    writing_ = true;
    stream_.Write(*writes_.front(), &written_);
  }

  void MaybeFinishLocked() {
    if (finishing_ || reading_ || writing_ || waking_ || pending_ > 0) return;
    finishing_ = true;
    stream_.Finish(grpc::Status::OK, &finished_);
  }

  GrpcServer::Service* service_;
  GrpcApi* api_;
  GrpcServer::Queue* queue_;
  grpc::ServerContext context_;
  Stream stream_{&context_};
  inference::ModelInferRequest request_;
  EventTag accepted_{this, Event::kAccepted};
  EventTag read_{this, Event::kRead};
  EventTag woken_{this, Event::kWoken};
  EventTag written_{this, Event::kWritten};
  EventTag finished_{this, Event::kFinished};

  std::mutex mu_;
  int pending_ = 0;       // requests read and not yet answered by the batcher
  bool reading_ = true;   // a read is (or is about to be) in flight
  bool writing_ = false;  // writes_.front() is being written
  bool waking_ = false;   // woken_ is posted to the polling thread
  bool broken_ = false;   // a write failed
  bool finishing_ = false;
  std::deque<std::shared_ptr<inference::ModelStreamInferResponse>> writes_;
};

template <class Req, class Resp>
using Call = UnaryCall<Req, Resp>;

// Serves one unary method on every queue with `handle`.
template <class Req, class Resp>
std::shared_ptr<void> ServeUnary(GrpcServer::Service* service,
                                 typename Call<Req, Resp>::RequestFn request,
                                 typename Call<Req, Resp>::HandleFn handle,
                                 const std::vector<std::unique_ptr<GrpcServer::Queue>>& queues) {
  auto method = std::make_shared<typename Call<Req, Resp>::Method>();
  *method = {service, request, std::move(handle)};
  for (const auto& q : queues) Call<Req, Resp>::Listen(method.get(), q.get());
  return method;
}

// A unary method answered at once by a GrpcApi member, on the polling thread.
template <class Req, class Resp>
std::shared_ptr<void> ServeQuick(GrpcServer::Service* service,
                                 typename Call<Req, Resp>::RequestFn request, GrpcApi* api,
                                 grpc::Status (GrpcApi::*answer)(const Req&, Resp*),
                                 const std::vector<std::unique_ptr<GrpcServer::Queue>>& queues) {
  auto handle = [api, answer](Call<Req, Resp>* c) {
    c->Finish((api->*answer)(*c->request(), c->response()));
  };
  return ServeUnary<Req, Resp>(service, request, handle, queues);
}

// A polling thread. This unit is built without UBSan's vptr check (cpp/CMakeLists.txt): out of
// descriptors, the check misreports a valid grpc::CompletionQueue as a wrong type.
// While answers are due from the batcher it polls the queue for up to busy_poll_us (busy_poll.h)
// before it sleeps in Next.
void Poll(GrpcServer::Queue* q, int64_t busy_poll_us) {
  using Status = grpc::CompletionQueue::NextStatus;
  grpc::ServerCompletionQueue* cq = q->cq.get();
  void* tag = nullptr;
  bool ok = false;
  while (true) {
    Status st = Status::TIMEOUT;
    if (busy_poll_us > 0 && q->answers_due.load(std::memory_order_relaxed) > 0 &&
        q->StartSpinning()) {
      bool took = false;
      PollFor(busy_poll_us, [&] {
        took = q->TakePosted();
        if (took) return true;
        st = cq->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
        return st != Status::TIMEOUT;
      });
      q->StopSpinning();
      if (took) continue;
    }
    if (st == Status::TIMEOUT) st = cq->Next(&tag, &ok) ? Status::GOT_EVENT : Status::SHUTDOWN;
    if (st == Status::SHUTDOWN) return;
    static_cast<Tag*>(tag)->Proceed(ok);
  }
}

// A method rec-server does not implement (shared memory, trace and log settings, unload).
template <class Base, class Req, class Resp>
std::shared_ptr<void> ServeUnimplemented(
    GrpcServer::Service* service,
    void (Base::*request)(grpc::ServerContext*, Req*, grpc::ServerAsyncResponseWriter<Resp>*,
                          grpc::CompletionQueue*, grpc::ServerCompletionQueue*, void*),
    const std::vector<std::unique_ptr<GrpcServer::Queue>>& queues,
    const char* message = "not implemented by rec-server") {
  auto handle = [message](Call<Req, Resp>* c) {
    c->Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, message));
  };
  return ServeUnary<Req, Resp>(service, request, handle, queues);
}

}  // namespace

GrpcServer::GrpcServer(GrpcApi* api, GrpcServerOptions options)
    : api_(api), options_(std::move(options)), service_(std::make_unique<Service>()) {}

GrpcServer::~GrpcServer() {
  if (!joined_) {
    Shutdown(std::chrono::system_clock::now());
    Join();
  }
}

Status GrpcServer::Start(int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.address, grpc::InsecureServerCredentials(), port);
  builder.SetMaxReceiveMessageSize(options_.max_receive_bytes);
  builder.SetMaxSendMessageSize(INT32_MAX);
  builder.RegisterService(service_.get());
  for (int i = 0; i < std::max(1, options_.threads); ++i) {
    queues_.push_back(std::make_unique<Queue>());
    queues_.back()->cq = builder.AddCompletionQueue();
  }
  server_ = builder.BuildAndStart();
  if (!server_ || *port == 0) return Unavailable("cannot listen for gRPC on " + options_.address);

  using S = Service;
  Service* s = service_.get();
  const auto& q = queues_;
  methods_ = {
      ServeQuick(s, &S::RequestServerLive, api_, &GrpcApi::ServerLive, q),
      ServeQuick(s, &S::RequestServerReady, api_, &GrpcApi::ServerReady, q),
      ServeQuick(s, &S::RequestModelReady, api_, &GrpcApi::ModelReady, q),
      ServeQuick(s, &S::RequestServerMetadata, api_, &GrpcApi::ServerMetadata, q),
      ServeQuick(s, &S::RequestModelMetadata, api_, &GrpcApi::ModelMetadata, q),
      ServeQuick(s, &S::RequestModelConfig, api_, &GrpcApi::ModelConfig, q),
      ServeQuick(s, &S::RequestModelStatistics, api_, &GrpcApi::ModelStatistics, q),
      ServeQuick(s, &S::RequestRepositoryIndex, api_, &GrpcApi::RepositoryIndex, q),
      ServeUnary<inference::RepositoryModelLoadRequest, inference::RepositoryModelLoadResponse>(
          s, &S::RequestRepositoryModelLoad,
          [this](auto* c) {  // a load and warm-up take seconds: not on a polling thread
            Spawn([this, c] {
              c->FinishOnQueue(api_->RepositoryModelLoad(*c->request(), c->response()));
            });
          },
          q),
      ServeUnary<inference::ModelInferRequest, inference::ModelInferResponse>(
          s, &S::RequestModelInfer,
          [this](auto* c) {
            GrpcServer::Queue* q = c->queue();
            q->answers_due.fetch_add(1);
            api_->ModelInfer(c->request(), c->response(),
                             [c, q](const Status& st, std::shared_ptr<Trace> trace) {
                               c->FinishOnQueue(ToGrpc(st), std::move(trace));
                               q->answers_due.fetch_sub(1);
                             });
          },
          q),
      ServeUnimplemented(s, &S::RequestRepositoryModelUnload, q),
      ServeQuick(s, &S::RequestSystemSharedMemoryStatus, api_, &GrpcApi::SystemSharedMemoryStatus,
                 q),
      ServeQuick(s, &S::RequestSystemSharedMemoryRegister, api_,
                 &GrpcApi::SystemSharedMemoryRegister, q),
      ServeQuick(s, &S::RequestSystemSharedMemoryUnregister, api_,
                 &GrpcApi::SystemSharedMemoryUnregister, q),
      ServeUnimplemented(s, &S::RequestCudaSharedMemoryStatus, q, kNoCuda),
      ServeUnimplemented(s, &S::RequestCudaSharedMemoryRegister, q, kNoCuda),
      ServeUnimplemented(s, &S::RequestCudaSharedMemoryUnregister, q, kNoCuda),
      ServeQuick(s, &S::RequestTraceSetting, api_, &GrpcApi::TraceSetting, q),
      ServeQuick(s, &S::RequestLogSettings, api_, &GrpcApi::LogSettings, q),
  };
  for (const auto& queue : queues_) StreamCall::Listen(s, api_, queue.get());
  for (const auto& queue : queues_) {
    pollers_.emplace_back(Poll, queue.get(), options_.busy_poll_us);
  }
  return Status::Ok();
}

void GrpcServer::Spawn(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(spawn_mu_);
  spawned_.emplace_back(std::move(fn));
}

void GrpcServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  for (const auto& q : queues_) {
    std::lock_guard<std::mutex> lock(q->mu);
    q->open = false;
  }
  if (server_) server_->Shutdown(deadline);
}

void GrpcServer::Join() {
  joined_ = true;
  {
    std::lock_guard<std::mutex> lock(spawn_mu_);
    for (std::thread& t : spawned_) t.join();
    spawned_.clear();
  }
  for (const auto& q : queues_) {
    q->Close();
    q->cq->Shutdown();
  }
  bool polled = !pollers_.empty();
  for (std::thread& t : pollers_) t.join();
  pollers_.clear();
  if (!polled) {  // Start failed: drain the queues here
    for (const auto& q : queues_) {
      void* tag = nullptr;
      bool ok = false;
      while (q->cq->Next(&tag, &ok)) {
      }
    }
  }
}

}  // namespace rec
