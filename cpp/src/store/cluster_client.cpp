#include "store/cluster_client.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <string>
#include <thread>

#include "contract/store_spec.h"

namespace rec {
namespace {

timeval ToTimeval(std::chrono::milliseconds ms) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

std::string Address(const std::string& host, int port) { return host + ":" + std::to_string(port); }

bool StartsWith(const char* s, size_t len, const char* prefix) {
  const size_t n = std::char_traits<char>::length(prefix);
  return len >= n && std::char_traits<char>::compare(s, prefix, n) == 0;
}

}  // namespace

ClusterClient::ClusterClient(std::string name, std::vector<std::pair<std::string, int>> seeds,
                             std::chrono::milliseconds timeout, std::chrono::milliseconds retry_for)
    : name_(std::move(name)), seeds_(std::move(seeds)), timeout_(timeout), retry_for_(retry_for) {}

ClusterClient::~ClusterClient() {
  for (auto& [address, node] : nodes_) DropLocked(&node);
}

Status ClusterClient::Connect() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string why;
  if (RefreshSlotsLocked(&why)) return Status::Ok();
  return Unavailable("embedding store " + name_ + ": " + why);
}

Status ClusterClient::ConnectLocked(Node* node) {
  if (node->ctx != nullptr) return Status::Ok();
  const timeval tv = ToTimeval(timeout_);
  redisContext* ctx = redisConnectWithTimeout(node->host.c_str(), node->port, tv);
  if (ctx == nullptr || ctx->err) {
    std::string why = ctx ? ctx->errstr : "out of memory";
    if (ctx) redisFree(ctx);
    // Without the store's name: each caller puts it in front once.
    return Unavailable("node " + Address(node->host, node->port) + " unreachable (" + why + ")");
  }
  redisSetTimeout(ctx, tv);
  node->ctx = ctx;
  return Status::Ok();
}

void ClusterClient::DropLocked(Node* node) {
  if (node->ctx != nullptr) redisFree(node->ctx);
  node->ctx = nullptr;
}

ClusterClient::Node* ClusterClient::NodeLocked(const std::string& address) {
  auto it = nodes_.find(address);
  if (it != nodes_.end()) return &it->second;
  const size_t colon = address.rfind(':');
  Node node;
  node.host = address.substr(0, colon);
  node.port = std::stoi(address.substr(colon + 1));
  return &nodes_.emplace(address, std::move(node)).first->second;
}

bool ClusterClient::RefreshSlotsLocked(std::string* why) {
  // Ask the nodes we know (a failed master's replica may own its slots now), then the seeds.
  std::vector<std::string> candidates;
  for (const auto& [address, node] : nodes_) candidates.push_back(address);
  for (const auto& [host, port] : seeds_) candidates.push_back(Address(host, port));
  std::string last = "no node to ask";
  for (const std::string& address : candidates) {
    Node* node = NodeLocked(address);
    Status st = ConnectLocked(node);
    if (!st.ok()) {
      last = st.message();
      continue;
    }
    auto* reply = static_cast<redisReply*>(redisCommand(node->ctx, "CLUSTER SLOTS"));
    if (reply == nullptr) {
      last = "node " + address + ": " + node->ctx->errstr;
      DropLocked(node);
      continue;
    }
    if (reply->type == REDIS_REPLY_ERROR &&
        std::string(reply->str, reply->len).find("cluster support disabled") != std::string::npos) {
      freeReplyObject(reply);
      // A plain Redis serves every key itself (rec/logs/route.py's single node); several such
      // nodes are no cluster, and which holds a key is unknown.
      if (seeds_.size() > 1) {
        *why = "node " + address +
               " is a plain Redis (cluster support disabled); a URL of several nodes names a "
               "Redis Cluster's";
        return false;
      }
      slot_owner_.fill(address);
      return true;
    }
    bool ok = reply->type == REDIS_REPLY_ARRAY;
    std::array<std::string, 16384> owners{};
    size_t covered = 0;
    for (size_t i = 0; ok && i < reply->elements; ++i) {
      const redisReply* range = reply->element[i];
      ok = range->type == REDIS_REPLY_ARRAY && range->elements >= 3 &&
           range->element[0]->type == REDIS_REPLY_INTEGER &&
           range->element[1]->type == REDIS_REPLY_INTEGER &&
           range->element[2]->type == REDIS_REPLY_ARRAY && range->element[2]->elements >= 2;
      if (!ok) break;
      const redisReply* master = range->element[2];
      std::string host = master->element[0]->type == REDIS_REPLY_STRING
                             ? std::string(master->element[0]->str, master->element[0]->len)
                             : std::string();
      if (host.empty() || host == "?") host = node->host;  // "the address you asked"
      const std::string owner = Address(host, static_cast<int>(master->element[1]->integer));
      for (long long s = range->element[0]->integer; s <= range->element[1]->integer; ++s) {
        if (s >= 0 && s < 16384) {
          covered += owners[s].empty();
          owners[s] = owner;
        }
      }
    }
    freeReplyObject(reply);
    if (!ok) {
      last = "node " + address + ": malformed CLUSTER SLOTS reply";
      continue;
    }
    if (covered < 16384) {
      last =
          "node " + address + ": the cluster serves " + std::to_string(covered) + " of 16384 slots";
      continue;
    }
    slot_owner_ = owners;
    return true;
  }
  *why = "no slot map (" + last + ")";
  return false;
}

void ClusterClient::AppendGet(Node* node, const HashGet& get, bool asking) {
  if (asking) redisAppendCommand(node->ctx, "ASKING");
  std::vector<const char*> argv = {"HMGET", get.key.c_str()};
  std::vector<size_t> lens = {5, get.key.size()};
  for (const std::string& f : get.fields) {
    argv.push_back(f.c_str());
    lens.push_back(f.size());
  }
  redisAppendCommandArgv(node->ctx, static_cast<int>(argv.size()), argv.data(), lens.data());
}

ClusterClient::Attempt ClusterClient::SendLocked(
    const std::map<std::string, std::vector<size_t>>& shares, const std::vector<HashGet>& gets,
    bool asking, std::map<std::string, uint64_t>* per_node, std::string* why) {
  // Every node's pipeline goes out before any reply is read, so the nodes work in parallel.
  for (const auto& [address, indices] : shares) {
    Node* node = NodeLocked(address);
    if (Status st = ConnectLocked(node); !st.ok()) {
      *why = st.message();
      return Attempt::kRetry;
    }
    for (size_t i : indices) AppendGet(node, gets[i], asking);
    int done = 0;
    while (!done) {
      if (redisBufferWrite(node->ctx, &done) != REDIS_OK) {
        *why = "node " + address + ": " + node->ctx->errstr;
        DropLocked(node);
        return Attempt::kRetry;
      }
    }
    if (per_node) (*per_node)[address] += indices.size();
  }
  return Attempt::kDone;
}

ClusterClient::Attempt ClusterClient::ReadLocked(const std::string& address, Node* node,
                                                 const HashGet& get,
                                                 std::vector<FieldValue>* values, std::string* ask,
                                                 std::string* why, Status* failed) {
  void* raw = nullptr;
  if (redisGetReply(node->ctx, &raw) != REDIS_OK || raw == nullptr) {
    *why = "node " + address + ": " + node->ctx->errstr;
    DropLocked(node);
    return Attempt::kRetry;
  }
  auto* reply = static_cast<redisReply*>(raw);
  Attempt result = Attempt::kDone;
  if (reply->type == REDIS_REPLY_ERROR) {
    const std::string error(reply->str, reply->len);
    *why = "node " + address + ": " + error;
    if (ask != nullptr && StartsWith(reply->str, reply->len, "ASK ")) {
      // "ASK <slot> <host:port>": this key only, this once, from the node importing its slot.
      *ask = error.substr(error.rfind(' ') + 1);
    } else if (StartsWith(reply->str, reply->len, "MOVED") ||
               StartsWith(reply->str, reply->len, "ASK") ||
               StartsWith(reply->str, reply->len, "TRYAGAIN") ||
               StartsWith(reply->str, reply->len, "CLUSTERDOWN")) {
      result = Attempt::kRetry;
    } else {
      *failed = Unavailable("embedding store " + name_ + ": " + *why);
      result = Attempt::kFailed;
    }
  } else if (reply->type != REDIS_REPLY_ARRAY || reply->elements != get.fields.size()) {
    *failed =
        Unavailable("embedding store " + name_ + ": node " + address + ": HMGET of " + get.key +
                    " answered with no array of " + std::to_string(get.fields.size()) + " values");
    result = Attempt::kFailed;
  } else {
    values->assign(reply->elements, FieldValue{});
    for (size_t j = 0; j < reply->elements; ++j) {
      const redisReply* e = reply->element[j];
      if (e->type == REDIS_REPLY_STRING) {
        (*values)[j].found = true;
        (*values)[j].value.assign(e->str, e->len);
      }
    }
  }
  freeReplyObject(reply);
  return result;
}

ClusterClient::Attempt ClusterClient::TryLocked(const std::vector<HashGet>& gets,
                                                std::vector<std::vector<FieldValue>>* out,
                                                std::map<std::string, uint64_t>* per_node,
                                                std::string* why, Status* failed) {
  // Each node's share, in the order its replies will come.
  std::map<std::string, std::vector<size_t>> by_node;
  for (size_t i = 0; i < gets.size(); ++i) {
    const std::string& owner = slot_owner_[KeySlot(gets[i].key)];
    if (owner.empty()) {
      *why = "no slot map";
      return Attempt::kRetry;
    }
    by_node[owner].push_back(i);
  }
  if (SendLocked(by_node, gets, /*asking=*/false, per_node, why) != Attempt::kDone) {
    return Attempt::kRetry;
  }
  Attempt result = Attempt::kDone;
  // Keys of a slot being migrated that have left their node already: (target, index).
  std::map<std::string, std::vector<size_t>> asks;
  for (auto& [address, indices] : by_node) {
    Node* node = NodeLocked(address);
    for (size_t i : indices) {
      if (node->ctx == nullptr) break;  // dropped below: its remaining replies are lost
      std::string ask;
      const Attempt a = ReadLocked(address, node, gets[i], &(*out)[i], &ask, why, failed);
      if (!ask.empty()) asks[ask].push_back(i);
      if (a == Attempt::kFailed || (a == Attempt::kRetry && result == Attempt::kDone)) result = a;
    }
  }
  if (result != Attempt::kDone || asks.empty()) return result;
  // The slot map stays as it is: the source node still owns the slot until the move ends.
  if (SendLocked(asks, gets, /*asking=*/true, per_node, why) != Attempt::kDone) {
    return Attempt::kRetry;
  }
  for (auto& [address, indices] : asks) {
    Node* node = NodeLocked(address);
    for (size_t i : indices) {
      if (node->ctx == nullptr) break;
      void* ok = nullptr;  // ASKING's +OK
      if (redisGetReply(node->ctx, &ok) != REDIS_OK || ok == nullptr) {
        *why = "node " + address + ": " + node->ctx->errstr;
        DropLocked(node);
        return Attempt::kRetry;
      }
      freeReplyObject(ok);
      const Attempt a = ReadLocked(address, node, gets[i], &(*out)[i], nullptr, why, failed);
      if (a == Attempt::kFailed || (a == Attempt::kRetry && result == Attempt::kDone)) result = a;
    }
  }
  return result;
}

Status ClusterClient::HashGets(const std::vector<HashGet>& gets,
                               std::vector<std::vector<FieldValue>>* out,
                               std::map<std::string, uint64_t>* per_node) {
  std::lock_guard<std::mutex> lock(mu_);
  out->assign(gets.size(), {});
  const auto deadline = std::chrono::steady_clock::now() + retry_for_;
  std::string why;
  for (int attempt = 0;; ++attempt) {
    Status failed;
    const Attempt a = TryLocked(gets, out, per_node, &why, &failed);
    if (a == Attempt::kDone) return Status::Ok();
    if (a == Attempt::kFailed) {
      // A node's replies may be unread after a failure: start its connection afresh.
      for (auto& [address, node] : nodes_) DropLocked(&node);
      return failed;
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    // Unread replies of a retried batch would be read as the next batch's: reconnect all.
    for (auto& [address, node] : nodes_) DropLocked(&node);
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::min(200, 10 << std::min(attempt, 4))));
    RefreshSlotsLocked(&why);
  }
  return Unavailable("embedding store " + name_ + ": " + why + " (retried for " +
                     std::to_string(retry_for_.count()) + " ms)");
}

Status ClusterClient::Exists(const std::string& key, bool* exists) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string why;
  if (slot_owner_[KeySlot(key)].empty() && !RefreshSlotsLocked(&why)) {
    return Unavailable("embedding store " + name_ + ": " + why);
  }
  Node* node = NodeLocked(slot_owner_[KeySlot(key)]);
  if (Status st = ConnectLocked(node); !st.ok()) {
    return Unavailable("embedding store " + name_ + ": " + st.message());
  }
  auto* reply =
      static_cast<redisReply*>(redisCommand(node->ctx, "EXISTS %b", key.data(), key.size()));
  if (reply == nullptr) {
    const std::string why = node->ctx->errstr;
    DropLocked(node);
    return Unavailable("embedding store " + name_ + ": " + why);
  }
  const bool ok = reply->type == REDIS_REPLY_INTEGER;
  *exists = ok && reply->integer > 0;
  const std::string error =
      reply->type == REDIS_REPLY_ERROR ? std::string(reply->str, reply->len) : "";
  freeReplyObject(reply);
  if (!ok) return Unavailable("embedding store " + name_ + ": EXISTS " + key + ": " + error);
  return Status::Ok();
}

}  // namespace rec
