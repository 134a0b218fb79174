#include "http/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/busy_poll.h"
#include "common/log.h"

namespace rec {
namespace {

constexpr uint64_t kListenId = 0;
constexpr uint64_t kWakeId = 1;

using Clock = std::chrono::steady_clock;

struct Conn {
  int fd = -1;
  // Idle timeout: counts from the last byte moved either way, or the last response queued (a
  // slow execution must not make its connection look idle the moment it is answered).
  Clock::time_point last_activity = Clock::now();
  // Request timeout: counts from the first byte of a request the server is waiting to complete;
  // not moved by later bytes, so dribbling cannot extend it.
  Clock::time_point request_started;
  bool receiving = false;  // a partial request is buffered and nothing is with the handler
  std::string in;
  size_t in_off = 0;
  std::string out;
  size_t out_off = 0;
  bool busy = false;         // a request is with the handler; later ones wait in `in`
  bool close_after = false;  // close once `out` is written
  bool want_out = false;     // EPOLLOUT registered
  bool paused = false;       // EPOLLIN dropped: enough read ahead while nothing can be parsed
  bool continue_sent = false;
  uint64_t first_byte_ns = 0;  // of the request being received (0: none yet)
};

struct Done {
  uint64_t conn_id;
  std::string bytes;
  bool close;
  std::function<void(uint64_t, uint64_t)> on_sent;
};

thread_local HttpServer::Loop* current_loop = nullptr;

// While a request is with the handler (or an error answer is pending) nothing more is parsed, so
// a client pipelining or flooding bytes would grow `in` without bound. Past this much read-ahead
// the connection stops being read and the kernel's socket buffers push back on the client.
constexpr size_t kMaxReadAhead = 64 << 10;

}  // namespace

class HttpServer::Loop {
 public:
  Loop(const HttpServerOptions& options, const HttpHandler& handler, int listen_fd, int index,
       std::atomic<int>* connections)
      : options_(options),
        handler_(handler),
        listen_fd_(listen_fd),
        next_id_(2 + index),
        connections_(connections) {}

  ~Loop() {
    for (auto& [id, c] : conns_) {
      ::close(c->fd);
      connections_->fetch_sub(1);
    }
    if (epfd_ >= 0) ::close(epfd_);
    if (wakefd_ >= 0) ::close(wakefd_);
    if (spare_fd_ >= 0) ::close(spare_fd_);
  }

  Status Start() {
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    wakefd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (epfd_ < 0 || wakefd_ < 0) return Internal("epoll/eventfd: " + std::string(strerror(errno)));
    Add(wakefd_, kWakeId, EPOLLIN);
    Add(listen_fd_, kListenId, EPOLLIN | EPOLLEXCLUSIVE);
    thread_ = std::thread([this] { Run(); });
    return Status::Ok();
  }

  void StopAccepting() { epoll_ctl(epfd_, EPOLL_CTL_DEL, listen_fd_, nullptr); }

  int in_flight() const { return in_flight_.load(); }

  void Stop() {
    stop_ = true;
    Wake();
    if (thread_.joinable()) thread_.join();
  }

  void Complete(uint64_t conn_id, HttpResponse&& response, bool keep_alive) {
    Done d{conn_id, SerializeHttpResponse(response, keep_alive), !keep_alive,
           std::move(response.on_sent)};
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_.push_back(std::move(d));
    }
    // The loop drains done_ after every event batch; only other threads must wake it.
    if (current_loop != this) Wake();
  }

 private:
  void Add(int fd, uint64_t id, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
  }

  void Wake() {
    uint64_t one = 1;
    ssize_t n = ::write(wakefd_, &one, sizeof(one));
    (void)n;
  }

  void Run() {
    current_loop = this;
    epoll_event events[64];
    // Timeouts are checked by one sweep a second rather than per-connection timers: they may fire
    // up to a second late, which costs nothing on the request path.
    const bool sweep = options_.idle_timeout_s > 0 || options_.request_timeout_s > 0;
    Clock::time_point next_sweep = Clock::now() + std::chrono::seconds(1);
    while (!stop_) {
      int timeout_ms = -1;
      if (sweep) {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(next_sweep - Clock::now());
        timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000));
      }
      int n = 0;
      if (options_.busy_poll_us > 0 && in_flight_.load(std::memory_order_relaxed) > 0) {
        // An answer is due: poll for it (Complete's eventfd write) rather than sleep.
        PollFor(options_.busy_poll_us, [&] {
          n = epoll_wait(epfd_, events, 64, 0);
          return n != 0 || stop_;
        });
      }
      if (n == 0) n = epoll_wait(epfd_, events, 64, timeout_ms);
      for (int i = 0; i < n; ++i) Dispatch(events[i]);
      ProcessDone();
      if (sweep && Clock::now() >= next_sweep) {
        Sweep();
        next_sweep = Clock::now() + std::chrono::seconds(1);
      }
    }
  }

  void Sweep() {
    const Clock::time_point now = Clock::now();
    const auto idle_limit = std::chrono::seconds(options_.idle_timeout_s);
    const auto request_limit = std::chrono::seconds(options_.request_timeout_s);
    std::vector<uint64_t> idle, late;
    for (const auto& [id, c] : conns_) {
      if (c->busy) continue;  // with the handler: --request-timeout-ms bounds that, not this
      if (c->receiving) {
        if (options_.request_timeout_s > 0 && now - c->request_started >= request_limit) {
          late.push_back(id);
        }
      } else if (options_.idle_timeout_s > 0 && now - c->last_activity >= idle_limit) {
        idle.push_back(id);
      }
    }
    for (uint64_t id : late) TimeOutRequest(id);
    for (uint64_t id : idle) {
      CloseConn(id);
      Count(HttpCloseReason::kIdleTimeout);
    }
  }

  void TimeOutRequest(uint64_t id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    Conn* c = it->second.get();
    HttpResponse resp;
    resp.status = 408;
    resp.body = "{\"error\":\"request not received within " +
                std::to_string(options_.request_timeout_s) + " s\"}";
    c->out += SerializeHttpResponse(resp, false);
    c->close_after = true;
    c->receiving = false;
    Count(HttpCloseReason::kRequestTimeout);
    // A client that stalls its request may not read either: one attempt to write, then close
    // rather than wait on it again.
    if (Flush(id, c)) CloseConn(id);
  }

  void Count(HttpCloseReason reason) {
    if (options_.on_close) options_.on_close(reason);
  }

  void Dispatch(const epoll_event& ev) {
    uint64_t id = ev.data.u64;
    if (id == kListenId) return AcceptAll();
    if (id == kWakeId) {
      uint64_t count;
      ssize_t r = ::read(wakefd_, &count, sizeof(count));
      (void)r;
      return;
    }
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    Conn* c = it->second.get();
    if (ev.events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
      if (!ReadConn(id, c)) return;
    }
    if (ev.events & EPOLLOUT) Flush(id, c);
  }

  void AcceptAll() {
    while (true) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0 && (errno == EMFILE || errno == ENFILE) && spare_fd_ >= 0) {
        // Out of descriptors, the pending connection would keep the listening socket readable
        // and spin this loop: the spare descriptor makes room to accept it and turn it away.
        ::close(spare_fd_);
        fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) Reject(fd, "too many connections (out of file descriptors)");
        spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0) return;  // nothing was pending: accept4 checks descriptors before the queue
        continue;
      }
      if (fd < 0) return;  // EAGAIN, or another loop took it
      if (connections_->fetch_add(1) >= options_.max_connections && options_.max_connections > 0) {
        connections_->fetch_sub(1);
        Reject(fd, "too many connections (limit " + std::to_string(options_.max_connections) + ")");
        continue;
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      uint64_t id = next_id_;
      next_id_ += 1024;  // ids stay unique across loops (each loop has its own residue)
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      conns_[id] = std::move(c);
      Add(fd, id, EPOLLIN);
    }
  }

  // A connection turned away (over the limit, out of descriptors): no Conn and no buffer is spent
  // on it, and the answer is written only if the socket takes it at once.
  void Reject(int fd, const std::string& error) {
    // Reading what already arrived lets close() send FIN, not RST (which could discard the 503).
    char buf[4096];
    ssize_t r = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    (void)r;
    HttpResponse resp;
    resp.status = 503;
    resp.body = "{\"error\":\"" + error + "\"}";
    std::string bytes = SerializeHttpResponse(resp, false);
    ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n;
    ::close(fd);
    Count(HttpCloseReason::kConnectionLimit);
  }

  void CloseConn(uint64_t id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    ::close(it->second->fd);
    conns_.erase(it);
    connections_->fetch_sub(1);
  }

  // Returns false if the connection was closed.
  bool ReadConn(uint64_t id, Conn* c) {
    char buf[65536];
    size_t unparsed = 0;  // read by this call since the last TryParse
    while (true) {
      ssize_t n = ::recv(c->fd, buf, sizeof(buf), 0);
      if (n > 0) {
        if (c->first_byte_ns == 0) c->first_byte_ns = NowNs();
        c->in.append(buf, static_cast<size_t>(n));
        c->last_activity = Clock::now();
        unparsed += static_cast<size_t>(n);
        // Parse while reading, not only once the socket is drained: a client that sends faster
        // than this loop reads never lets recv() say EAGAIN, and a request read but not yet
        // parsed does not make the connection busy, so the bytes behind it were read without
        // bound (seen under ASan: 160 MB of a flood behind a request the model held).
        if (unparsed >= kMaxReadAhead && !c->busy && !c->close_after) {
          unparsed = 0;
          if (!TryParse(id, c)) return false;
        }
        if ((c->busy || c->close_after) && c->in.size() - c->in_off >= kMaxReadAhead) {
          c->paused = true;
          UpdateInterest(id, c);
          break;
        }
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0 && errno == EINTR) continue;
      CloseConn(id);  // peer closed or error; a late response for it is dropped
      return false;
    }
    return TryParse(id, c);
  }

  bool TryParse(uint64_t id, Conn* c) {
    while (!c->busy && !c->close_after && c->in_off < c->in.size()) {
      HttpRequest req;
      size_t consumed = 0;
      int error_status = 0;
      std::string error;
      ParseResult r =
          ParseHttpRequest(c->in.data() + c->in_off, c->in.size() - c->in_off,
                           options_.max_body_bytes, &req, &consumed, &error_status, &error);
      if (r == ParseResult::kIncomplete) {
        MaybeSendContinue(id, c);
        break;
      }
      if (r == ParseResult::kError) {
        c->receiving = false;
        HttpResponse resp;
        resp.status = error_status;
        resp.body = "{\"error\":\"" + error + "\"}";
        c->out += SerializeHttpResponse(resp, false);
        c->close_after = true;
        return Flush(id, c);
      }
      c->in_off += consumed;
      req.recv_end_ns = NowNs();
      req.recv_start_ns = c->first_byte_ns != 0 ? c->first_byte_ns : req.recv_end_ns;
      // Pipelined bytes behind it start the next request's receiving now.
      c->first_byte_ns = c->in_off < c->in.size() ? req.recv_end_ns : 0;
      c->continue_sent = false;
      c->receiving = false;
      c->busy = true;
      in_flight_.fetch_add(1);
      bool keep_alive = req.keep_alive;
      handler_(std::move(req), [this, id, keep_alive](HttpResponse&& resp) {
        Complete(id, std::move(resp), keep_alive);
      });
    }
    // Bytes waiting behind a request with the handler are not the client's delay: the clock of the
    // next request starts when the server is ready to parse it.
    bool waiting = !c->busy && !c->close_after && c->in_off < c->in.size();
    if (waiting && !c->receiving) c->request_started = Clock::now();
    c->receiving = waiting;
    if (c->in_off == c->in.size()) {
      c->in.clear();
      c->in_off = 0;
    } else if (c->in_off > 65536) {
      c->in.erase(0, c->in_off);
      c->in_off = 0;
    }
    return true;
  }

  // curl and others wait for "100 Continue" before sending a large body.
  void MaybeSendContinue(uint64_t id, Conn* c) {
    if (c->continue_sent) return;
    const char* data = c->in.data() + c->in_off;
    size_t size = c->in.size() - c->in_off;
    const char* end = static_cast<const char*>(memmem(data, size, "\r\n\r\n", 4));
    if (end == nullptr) return;
    std::string head(data, static_cast<size_t>(end - data));
    for (char& ch : head) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (head.find("expect: 100-continue") == std::string::npos) return;
    c->continue_sent = true;
    c->out += "HTTP/1.1 100 Continue\r\n\r\n";
    Flush(id, c);
  }

  // Writes what it can; returns false if the connection was closed.
  bool Flush(uint64_t id, Conn* c) {
    while (c->out_off < c->out.size()) {
      ssize_t n =
          ::send(c->fd, c->out.data() + c->out_off, c->out.size() - c->out_off, MSG_NOSIGNAL);
      if (n > 0) {
        c->out_off += static_cast<size_t>(n);
        c->last_activity = Clock::now();
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!c->want_out) {
          c->want_out = true;
          UpdateInterest(id, c);
        }
        return true;
      }
      CloseConn(id);
      return false;
    }
    c->out.clear();
    c->out_off = 0;
    if (c->want_out) {
      c->want_out = false;
      UpdateInterest(id, c);
    }
    if (c->close_after) {
      CloseConn(id);
      return false;
    }
    return true;
  }

  void UpdateInterest(uint64_t id, Conn* c) {
    epoll_event ev{};
    ev.events = (c->paused ? 0u : EPOLLIN) | (c->want_out ? EPOLLOUT : 0u);
    ev.data.u64 = id;
    epoll_ctl(epfd_, EPOLL_CTL_MOD, c->fd, &ev);
  }

  void ProcessDone() {
    std::vector<Done> done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done.swap(done_);
    }
    for (Done& d : done) {
      in_flight_.fetch_sub(1);
      auto it = conns_.find(d.conn_id);
      if (it == conns_.end()) continue;
      Conn* c = it->second.get();
      c->out += d.bytes;
      c->busy = false;
      c->last_activity = Clock::now();
      c->close_after = c->close_after || d.close;
      uint64_t send_start = d.on_sent ? NowNs() : 0;
      bool open = Flush(d.conn_id, c);
      if (d.on_sent) d.on_sent(send_start, NowNs());
      if (!open) continue;
      if (c->paused && !c->close_after) {
        c->paused = false;
        UpdateInterest(d.conn_id, c);
      }
      TryParse(d.conn_id, c);
    }
  }

  const HttpServerOptions& options_;
  const HttpHandler& handler_;
  int listen_fd_;
  int epfd_ = -1;
  int wakefd_ = -1;
  int spare_fd_ = -1;  // released to accept-and-reject when the process is out of descriptors
  uint64_t next_id_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<int>* connections_;  // shared by the loops of one HttpServer
  std::mutex mu_;
  std::vector<Done> done_;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
};

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : options_(std::move(options)), handler_(std::move(handler)) {}

HttpServer::~HttpServer() {
  Stop(0);
  loops_.clear();
}

Status HttpServer::Start() {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options_.port));
  std::string host = options_.host == "localhost" ? "127.0.0.1" : options_.host;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return InvalidArgument("bad --host '" + options_.host + "' (an IPv4 address is expected)");
  }
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listen_fd_, 1024) != 0) {
    return Unavailable("cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                       ": " + strerror(errno));
  }
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  for (int i = 0; i < std::max(1, options_.io_threads); ++i) {
    loops_.push_back(std::make_unique<Loop>(options_, handler_, listen_fd_, i, &connections_));
    REC_RETURN_IF_ERROR(loops_.back()->Start());
  }
  accepting_ = true;
  return Status::Ok();
}

void HttpServer::StopAccepting() {
  if (!accepting_.exchange(false)) return;
  for (auto& loop : loops_) loop->StopAccepting();
  ::close(listen_fd_);
  listen_fd_ = -1;
}

void HttpServer::Stop(int drain_timeout_ms) {
  StopAccepting();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(drain_timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    int busy = 0;
    for (auto& loop : loops_) busy += loop->in_flight();
    if (busy == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // The loops' threads stop, the loops stay: a request still with the batcher when the drain
  // ran out of time completes into its loop later (ModelManager::Shutdown), and must find it
  // alive. They are freed with the server, after the batchers have stopped.
  for (auto& loop : loops_) loop->Stop();
}

}  // namespace rec
