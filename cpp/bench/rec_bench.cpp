// rec-bench: a low-overhead load generator for rec-server, and the in-process limit it is
// compared with. Closed loop (the default): each of --concurrency threads sends one request,
// waits for the answer, and sends the next, over one keep-alive connection (HTTP) or channel
// (gRPC). Open loop (--rate R): requests arrive as a Poisson stream of R per second in all,
// spread over the threads; each request's latency counts from its scheduled arrival, so a thread
// still busy with the previous answer adds its lateness (no coordinated omission), and requests
// sent more than 1 ms late are counted ("late"): the threads, or the CPU, could not keep up.
//
//   rec-bench forward --model-repository DIR --batch B [--concurrency C] [--seconds S]
//                     [--intra-op-threads N]
//   rec-bench http    --model-repository DIR --target H:P --batch B [--concurrency C] [--seconds S]
//                     [--call infer|live] [--rate R]
//   rec-bench grpc    --model-repository DIR --target H:P --batch B [--concurrency C] [--seconds S]
//                     [--call infer|live] [--grpc-client generic|stub] [--grpc-arg NAME=INT]...
//                     [--shared-memory none|system] [--rate R]
//
// --candidates N [--form context|flat] (any mode, in place of --batch): each request is one
// user's context and N candidates (#61), sent in the context form (the context once, batch 1)
// or flat (N rows, the context repeated in each), the same pairs either way; "context" is the
// default on a context model (rec.json "context"), which --form context needs (a flat model is
// sent N independent rows). Without it, a context model is sent --batch independent flat rows,
// which the server splits per row.
// --call live: a bare liveness round trip (GET /v2/health/live, ServerLive), no model involved.
// --shared-memory system (http, grpc): each thread's inputs sit in a POSIX shared memory region
// it registers with the server, and the scores are written into another; the request carries
// only their names, so no tensor crosses the socket.
// Prints one JSON object: requests/s, rows/s (pairs/s with --candidates) and latency percentiles
// in microseconds, and request_bytes: the mean over threads of a request's body (HTTP: the JSON
// header and binary tensors; gRPC: the serialized ModelInferRequest; forward: its tensors' bytes).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "bench_io.h"
#include "common/malloc_settings.h"
#include "context_inputs.h"
#include "grpc_service.grpc.pb.h"
#include "model/aoti_model.h"
#include "model/model_spec.h"
#include "model/torch_model.h"

namespace rec::bench {
namespace {

using Clock = std::chrono::steady_clock;
// One request: returns false on failure.
using RequestFn = std::function<bool()>;
using ClientFactory = std::function<RequestFn(int thread)>;

struct Options {
  std::string mode, repository, model = "rec", target;
  std::vector<std::pair<std::string, int>> grpc_args;  // --grpc-arg NAME=INT, repeatable
  std::string call = "infer";           // or "live": a bare liveness round trip, no model involved
  std::string grpc_client = "generic";  // or "stub"
  std::string shared_memory = "none";   // or "system": inputs and scores in shared memory
  int64_t batch = 1;
  int64_t candidates = 0;  // --candidates N: one user's N candidates per request (0: --batch)
  std::string form;        // --candidates' form: "context" or "flat" (CheckForm's default)
  int concurrency = 1;
  int intra_op_threads = 1;  // forward only
  double seconds = 5;
  double rate = 0;  // requests/s in all, Poisson arrivals; 0: closed loop

  // Pairs (rows) per request.
  int64_t rows() const { return candidates > 0 ? candidates : batch; }
};

// Each thread's request bytes (its one request, sent over and over), written by its factory.
using RequestBytes = std::vector<size_t>;

// The --form default and the combinations refused, each with what to do instead.
Status CheckForm(const ModelSpec& spec, Options* o) {
  if (o->form.empty()) o->form = o->candidates > 0 && spec.context.present ? "context" : "flat";
  if (o->form != "context" && o->form != "flat") {
    return InvalidArgument("--form takes context or flat, got '" + o->form + "'");
  }
  if (o->form == "context" && !spec.context.present) {
    return InvalidArgument("--form context: model '" + o->model +
                           "' has no \"context\" section in rec.json (export it with "
                           "features.context)");
  }
  if (o->form == "context" && o->candidates == 0) {
    return InvalidArgument("--form context needs --candidates N");
  }
  return Status::Ok();
}

// What thread `t` sends: --batch B independent rows (to a context model in the flat form, which
// the server splits per row), or --candidates N pairs of one user in o.form.
std::vector<Tensor> RequestInputs(const Options& o, const ModelSpec& spec, int t) {
  const auto seed = static_cast<uint32_t>(1000 + t);
  if (!spec.context.present) return RandomBatch(spec, o.rows(), seed);
  if (o.candidates == 0) return RandomBatch(*spec.context.flat, o.batch, seed);
  std::vector<Tensor> request = RandomContextRequest(spec, o.candidates, seed);
  return o.form == "context" ? request : RepeatContext(spec, request);
}

nlohmann::json RunLoad(const Options& o, const ClientFactory& factory) {
  std::atomic<bool> stop{false};
  // The start, given to every thread at once. Threads block on it rather than poll: a thousand
  // threads polling every 200 us took both cores from the server they were about to measure.
  std::promise<Clock::time_point> go;
  std::shared_future<Clock::time_point> started = go.get_future().share();
  const auto run_for =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  std::atomic<int> warm{0};
  std::vector<std::vector<double>> latencies(static_cast<size_t>(o.concurrency));
  std::atomic<int64_t> failures{0}, late{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < o.concurrency; ++t) {
    threads.emplace_back([&, t] {
      RequestFn send = factory(t);
      for (int i = 0; i < 3; ++i) send();  // connect and warm up; not measured
      warm++;
      const Clock::time_point start = started.get(), end = start + run_for;
      // Open loop: this thread's share of the stream, gaps drawn from its own generator; no
      // arrival is scheduled past the end, so no thread sleeps beyond it.
      std::mt19937_64 rng(static_cast<uint64_t>(7919 * (t + 1)));
      std::exponential_distribution<double> gap(o.rate > 0 ? o.rate / o.concurrency : 1.0);
      Clock::time_point next = start;
      while (!stop.load(std::memory_order_relaxed)) {
        Clock::time_point t0 = Clock::now();
        if (o.rate > 0) {
          next +=
              std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
          if (next >= end) break;
          if (next > t0) {
            std::this_thread::sleep_until(next);
          } else if (t0 - next > std::chrono::milliseconds(1)) {
            late++;
          }
          t0 = next;
        }
        bool ok = send();
        double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        if (ok) {
          latencies[static_cast<size_t>(t)].push_back(us);
        } else {
          failures++;
        }
      }
    });
  }
  // The clock starts once every thread has warmed up: a slow model's warm-up (3 calls of B = 512
  // at 0.25 s each) must not count as measured time.
  while (warm.load() < o.concurrency) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  Clock::time_point start = Clock::now();
  go.set_value(start);
  std::this_thread::sleep_until(start + run_for);
  stop = true;
  for (auto& th : threads) th.join();
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> all;
  for (auto& v : latencies) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) {
    return all.empty() ? 0.0 : all[std::min(all.size() - 1, static_cast<size_t>(p * all.size()))];
  };
  double rps = static_cast<double>(all.size()) / elapsed;
  return {{"mode", o.mode},
          {"batch", o.rows()},
          {"candidates", o.candidates},
          {"form", o.form},
          {"concurrency", o.concurrency},
          {"requests", all.size()},
          {"failures", failures.load()},
          {"offered_per_s", o.rate},
          {"late", late.load()},
          {"seconds", elapsed},
          {"requests_per_s", rps},
          {"rows_per_s", rps * static_cast<double>(o.rows())},
          {"p50_us", pct(0.50)},
          {"p90_us", pct(0.90)},
          {"p99_us", pct(0.99)},
          {"mean_us", all.empty() ? 0.0 : [&] {
             double s = 0;
             for (double x : all) s += x;
             return s / static_cast<double>(all.size());
           }()}};
}

ClientFactory ForwardClients(const Options& o, const ModelSpec& spec,
                             std::shared_ptr<Runner> runner, RequestBytes* bytes) {
  return [&o, &spec, runner, bytes](int t) -> RequestFn {
    std::vector<Tensor> request = RequestInputs(o, spec, t);
    for (const Tensor& tensor : request) (*bytes)[static_cast<size_t>(t)] += tensor.data.size();
    auto inputs = std::make_shared<std::vector<Tensor>>();
    Status st = ModelInputs(spec, std::move(request), inputs.get());
    if (!st.ok()) {
      std::cerr << "rec-bench: " << st.message() << "\n";
      std::exit(1);
    }
    return [runner, inputs] {
      std::vector<Tensor> outputs;
      return runner->Run(*inputs, &outputs).ok();
    };
  };
}

std::shared_ptr<grpc::Channel> GrpcChannel(const Options& o) {
  grpc::ChannelArguments args;
  args.SetInt("grpc.use_local_subchannel_pool", 1);  // one connection per thread
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);           // no retry filter holding on to each request
  args.SetMaxReceiveMessageSize(-1);
  for (const auto& [name, value] : o.grpc_args) args.SetInt(name, value);
  return grpc::CreateCustomChannel(o.target, grpc::InsecureChannelCredentials(), args);
}

inference::ModelInferRequest GrpcInferRequest(const Options& o, const std::vector<Tensor>& inputs,
                                              const SharedMemoryInputs* shm = nullptr) {
  inference::ModelInferRequest request;
  request.set_model_name(o.model);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& tensor = inputs[i];
    auto* in = request.add_inputs();
    in->set_name(tensor.name);
    in->set_datatype(DataTypeName(tensor.dtype));
    for (int64_t d : tensor.shape) in->add_shape(d);
    if (shm == nullptr) {
      request.add_raw_input_contents(tensor.data);
      continue;
    }
    auto& params = *in->mutable_parameters();
    params["shared_memory_region"].set_string_param(shm->in_region());
    params["shared_memory_offset"].set_int64_param(static_cast<int64_t>(shm->offsets()[i]));
    params["shared_memory_byte_size"].set_int64_param(static_cast<int64_t>(tensor.data.size()));
  }
  if (shm != nullptr) {
    auto* out = request.add_outputs();
    out->set_name("scores");
    auto& params = *out->mutable_parameters();
    params["shared_memory_region"].set_string_param(shm->out_region());
    params["shared_memory_byte_size"].set_int64_param(static_cast<int64_t>(shm->output_bytes()));
  }
  return request;
}

// Bytes of the model's outputs for `rows` rows (what the output region must hold).
size_t OutputBytes(const ModelSpec& spec, int64_t rows) {
  size_t bytes = 0;
  for (const IoSpec& io : spec.outputs) {
    int64_t n = rows;
    for (int64_t d : io.dims) n *= d;
    bytes += static_cast<size_t>(n) * ElementSize(io.dtype);
  }
  return bytes;
}

// --shared-memory system: the thread's inputs in regions of its own (kept for the run).
std::shared_ptr<SharedMemoryInputs> ThreadSharedMemory(const Options& o, const ModelSpec& spec,
                                                       const std::vector<Tensor>& inputs, int t,
                                                       SharedMemoryInputs::Registrar registrar) {
  if (o.shared_memory != "system") return nullptr;
  std::string tag = "rec_bench_" + std::to_string(getpid()) + "_" + std::to_string(t);
  auto shm = std::make_shared<SharedMemoryInputs>(std::move(registrar), tag, inputs,
                                                  OutputBytes(spec, o.rows()));
  if (!shm->ok()) {
    std::cerr << "rec-bench: could not set up shared memory " << tag << "\n";
    std::exit(1);
  }
  return shm;
}

// --grpc-client generic (default): like the HTTP client, the request is serialized once and
// sent as bytes, and the answer's status is all that is read (a generic stub on a completion
// queue of the thread's own). --grpc-client stub: the generated sync stub, which serializes the
// request and parses the response on every call.
ClientFactory GrpcClients(const Options& o, const ModelSpec& spec, RequestBytes* bytes) {
  return [&o, &spec, bytes](int t) -> RequestFn {
    auto channel = GrpcChannel(o);
    std::vector<Tensor> inputs = RequestInputs(o, spec, t);
    std::shared_ptr<inference::GRPCInferenceService::Stub> control =
        inference::GRPCInferenceService::NewStub(channel);
    SharedMemoryInputs::Registrar registrar{
        [control](const std::string& region, const std::string& key, size_t offset, size_t size) {
          grpc::ClientContext ctx;
          inference::SystemSharedMemoryRegisterRequest r;
          r.set_name(region);
          r.set_key(key);
          r.set_offset(offset);
          r.set_byte_size(size);
          inference::SystemSharedMemoryRegisterResponse response;
          return control->SystemSharedMemoryRegister(&ctx, r, &response).ok();
        },
        [control](const std::string& region) {
          grpc::ClientContext ctx;
          inference::SystemSharedMemoryUnregisterRequest r;
          r.set_name(region);
          inference::SystemSharedMemoryUnregisterResponse response;
          (void)control->SystemSharedMemoryUnregister(&ctx, r, &response);
        }};
    std::shared_ptr<SharedMemoryInputs> shm = ThreadSharedMemory(o, spec, inputs, t, registrar);
    auto request =
        std::make_shared<inference::ModelInferRequest>(GrpcInferRequest(o, inputs, shm.get()));
    if (o.call != "live") (*bytes)[static_cast<size_t>(t)] = request->ByteSizeLong();
    if (o.grpc_client == "stub" || o.call == "live") {
      auto stub = std::shared_ptr<inference::GRPCInferenceService::Stub>(
          inference::GRPCInferenceService::NewStub(channel));
      if (o.call == "live") {
        return [stub] {
          grpc::ClientContext ctx;
          inference::ServerLiveResponse response;
          return stub->ServerLive(&ctx, inference::ServerLiveRequest(), &response).ok();
        };
      }
      return [stub, request, shm] {
        grpc::ClientContext ctx;
        inference::ModelInferResponse response;
        return stub->ModelInfer(&ctx, *request, &response).ok();
      };
    }
    std::string bytes = request->SerializeAsString();
    grpc::Slice slice(bytes);
    auto payload = std::make_shared<grpc::ByteBuffer>(&slice, 1);
    auto stub = std::make_shared<grpc::GenericStub>(channel);
    auto cq = std::make_shared<grpc::CompletionQueue>();
    return [stub, cq, payload, shm] {
      grpc::ClientContext ctx;
      grpc::ByteBuffer response;
      grpc::Status status;
      auto call = stub->PrepareUnaryCall(&ctx, "/inference.GRPCInferenceService/ModelInfer",
                                         *payload, cq.get());
      call->StartCall();
      call->Finish(&response, &status, nullptr);
      void* tag = nullptr;
      bool ok = false;
      return cq->Next(&tag, &ok) && ok && status.ok();
    };
  };
}

ClientFactory HttpClients(const Options& o, const ModelSpec& spec, RequestBytes* bytes) {
  return [&o, &spec, bytes](int t) -> RequestFn {
    auto conn = std::make_shared<HttpConnection>(o.target);
    std::vector<Tensor> inputs = RequestInputs(o, spec, t);
    std::shared_ptr<SharedMemoryInputs> shm =
        ThreadSharedMemory(o, spec, inputs, t, HttpRegistrar(o.target));
    auto request = std::make_shared<std::string>(
        o.call == "live" ? "GET /v2/health/live HTTP/1.1\r\nHost: " + o.target + "\r\n\r\n"
        : shm            ? HttpSharedMemoryRequest(o.target, o.model, inputs, *shm)
                         : HttpInferRequest(o.target, o.model, inputs));
    (*bytes)[static_cast<size_t>(t)] = request->size() - (request->find("\r\n\r\n") + 4);
    return [conn, request, shm] { return conn->RoundTrip(*request) == 200; };
  };
}

int Main(int argc, char** argv) {
  Options o;
  if (argc < 2) {
    std::cerr << "usage: rec-bench forward|http|grpc --model-repository DIR [--target H:P]"
                 " [--model NAME] [--batch B] [--concurrency C] [--seconds S]"
                 " [--intra-op-threads N] [--call infer|live] [--grpc-client generic|stub]"
                 " [--grpc-arg NAME=INT] [--shared-memory none|system] [--rate R]"
                 " [--candidates N] [--form context|flat]\n";
    return 2;
  }
  o.mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model-repository") o.repository = value;
    if (flag == "--model") o.model = value;
    if (flag == "--target") o.target = value;
    if (flag == "--call") o.call = value;
    if (flag == "--grpc-client") o.grpc_client = value;
    if (flag == "--shared-memory") o.shared_memory = value;
    if (flag == "--intra-op-threads") o.intra_op_threads = std::stoi(value);
    if (flag == "--grpc-arg") {
      size_t eq = value.find('=');
      o.grpc_args.emplace_back(value.substr(0, eq), std::stoi(value.substr(eq + 1)));
    }
    if (flag == "--batch") o.batch = std::stoll(value);
    if (flag == "--candidates") o.candidates = std::stoll(value);
    if (flag == "--form") o.form = value;
    if (flag == "--concurrency") o.concurrency = std::stoi(value);
    if (flag == "--seconds") o.seconds = std::stod(value);
    if (flag == "--rate") o.rate = std::stod(value);
  }
  ModelSpec spec;
  Status st = LoadModelSpec(o.repository + "/" + o.model, o.model, &spec);
  if (st.ok()) st = CheckForm(spec, &o);
  if (!st.ok()) {
    std::cerr << st.message() << "\n";
    return 1;
  }
  ClientFactory factory;
  std::shared_ptr<Runner> runner;
  RequestBytes bytes(static_cast<size_t>(o.concurrency), 0);
  if (o.mode == "forward") {
    int loaded = 0;
    st = LoadFbgemmLibraries(DefaultFbgemmDir(), &loaded);
    if (st.ok()) st = LoadOpsLibrary(DefaultOpsLibrary());  // rec::linear, the dense layers
    ConfigureTorchThreads(o.intra_op_threads);
    std::string version = NewestVersion(o.repository + "/" + o.model);
    const std::string dir = o.repository + "/" + o.model + "/" + version;
    if (st.ok() && std::filesystem::exists(dir + "/model.pt2")) {  // rec export --format aoti
      st = LoadAotiModel(dir + "/model.pt2", dir + "/rec.json", spec, version, 1, &runner);
    } else if (st.ok()) {
      st = LoadTorchModel(dir + "/model.pt", spec, version, &runner);
    }
    factory = ForwardClients(o, spec, runner, &bytes);
  } else if (o.mode == "grpc") {
    factory = GrpcClients(o, spec, &bytes);
  } else if (o.mode == "http") {
    factory = HttpClients(o, spec, &bytes);
  } else {
    st = InvalidArgument("unknown mode " + o.mode);
  }
  if (!st.ok()) {
    std::cerr << st.message() << "\n";
    return 1;
  }
  nlohmann::json result = RunLoad(o, factory);
  size_t total = 0;
  for (size_t b : bytes) total += b;
  result["request_bytes"] = total / bytes.size();
  std::cout << result.dump() << std::endl;
  return 0;
}

}  // namespace
}  // namespace rec::bench

int main(int argc, char** argv) {
  rec::KeepFreedMemory();  // as rec-server does: forward times are the server's
  return rec::bench::Main(argc, argv);
}
