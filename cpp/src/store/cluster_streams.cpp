// ClusterClient's update log reads: pipelined XREADs per node and the layout record's GET. A
// routing error or a lost node is not retried here, unlike HashGets: the update subscriber's loop
// reads again from the same cursors, reporting the outage as it always did.
#include <hiredis/hiredis.h>

#include <map>
#include <string>

#include "contract/store_spec.h"
#include "store/cluster_client.h"

namespace rec {
namespace {

std::string Text(const redisReply* r) {
  return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ||
               r->type == REDIS_REPLY_ERROR)
             ? std::string(r->str, r->len)
             : std::string();
}

// An XREAD reply ([[key, [[id, [field, value, ...]], ...]]] or nil) as entries.
void TakeEntries(const redisReply* reply, std::vector<StreamEntry>* out) {
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 1) return;
  const redisReply* stream = reply->element[0];
  if (stream->type != REDIS_REPLY_ARRAY || stream->elements < 2) return;
  const redisReply* entries = stream->element[1];
  for (size_t i = 0; entries->type == REDIS_REPLY_ARRAY && i < entries->elements; ++i) {
    const redisReply* entry = entries->element[i];
    if (entry->type != REDIS_REPLY_ARRAY || entry->elements < 2) continue;
    StreamEntry e;
    e.id = Text(entry->element[0]);
    const redisReply* kv = entry->element[1];
    for (size_t k = 0; kv->type == REDIS_REPLY_ARRAY && k + 1 < kv->elements; k += 2) {
      e.fields.emplace_back(Text(kv->element[k]), Text(kv->element[k + 1]));
    }
    out->push_back(std::move(e));
  }
}

void AppendXread(redisContext* ctx, const StreamRead& read, int count, int block_ms) {
  const std::string n = std::to_string(count), b = std::to_string(block_ms);
  std::vector<const char*> argv = {"XREAD", "COUNT", n.c_str()};
  if (block_ms >= 0) {
    argv.push_back("BLOCK");
    argv.push_back(b.c_str());
  }
  argv.push_back("STREAMS");
  argv.push_back(read.key.c_str());
  argv.push_back(read.after.c_str());
  std::vector<size_t> lens;
  for (const char* a : argv) lens.push_back(std::char_traits<char>::length(a));
  redisAppendCommandArgv(ctx, static_cast<int>(argv.size()), argv.data(), lens.data());
}

}  // namespace

bool ClusterClient::ReadStreamsLocked(const std::string& address, Node* node,
                                      const std::vector<size_t>& indices,
                                      std::vector<std::vector<StreamEntry>>* out,
                                      std::string* why) {
  bool ok = true;
  for (size_t i : indices) {  // every reply is read, so none is left for the next call
    void* raw = nullptr;
    if (redisGetReply(node->ctx, &raw) != REDIS_OK || raw == nullptr) {
      *why = "node " + address + ": " + node->ctx->errstr;
      DropLocked(node);
      return false;
    }
    auto* reply = static_cast<redisReply*>(raw);
    if (reply->type == REDIS_REPLY_ERROR) {
      *why = "node " + address + ": " + Text(reply);
      ok = false;
    } else {
      TakeEntries(reply, &(*out)[i]);
    }
    freeReplyObject(reply);
  }
  return ok;
}

Status ClusterClient::StreamReads(const std::vector<StreamRead>& reads, int count, int block_ms,
                                  std::vector<std::vector<StreamEntry>>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  out->assign(reads.size(), {});
  std::string why;
  std::map<std::string, std::vector<size_t>> by_node;
  bool routed = true;
  for (size_t i = 0; routed && i < reads.size(); ++i) {
    const std::string& owner = slot_owner_[KeySlot(reads[i].key)];
    routed = !owner.empty();
    by_node[owner].push_back(i);
  }
  bool ok = routed || RefreshSlotsLocked(&why);
  if (routed) {
    for (const auto& [address, indices] : by_node) {  // all pipelines out first
      Node* node = NodeLocked(address);
      Status st = ConnectLocked(node);
      if (!st.ok()) {
        why = st.message();
        ok = false;
        break;
      }
      for (size_t i : indices) AppendXread(node->ctx, reads[i], count, block_ms);
      int done = 0;  // sent now, so the nodes work while the first one's replies are read
      while (ok && !done) {
        if (redisBufferWrite(node->ctx, &done) != REDIS_OK) {
          why = "node " + address + ": " + node->ctx->errstr;
          ok = false;
        }
      }
      if (!ok) break;
    }
    for (const auto& [address, indices] : by_node) {
      Node* node = NodeLocked(address);
      if (ok && node->ctx != nullptr) ok = ReadStreamsLocked(address, node, indices, out, &why);
    }
  } else if (ok) {
    why = "no slot map";
    ok = false;
  }
  if (ok) return Status::Ok();
  // Unread replies would be taken as the next call's: every connection starts afresh, and the
  // slot map is asked again (a moved slot, a replica promoted).
  for (auto& [address, node] : nodes_) DropLocked(&node);
  std::string refreshed;
  RefreshSlotsLocked(&refreshed);
  return Unavailable(name_ + ": " + why);
}

Status ClusterClient::Get(const std::string& key, bool* found, std::string* value) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string why;
  if (slot_owner_[KeySlot(key)].empty() && !RefreshSlotsLocked(&why)) {
    return Unavailable(name_ + ": " + why);
  }
  Node* node = NodeLocked(slot_owner_[KeySlot(key)]);
  if (Status st = ConnectLocked(node); !st.ok()) return Unavailable(name_ + ": " + st.message());
  auto* reply = static_cast<redisReply*>(redisCommand(node->ctx, "GET %b", key.data(), key.size()));
  if (reply == nullptr) {
    why = node->ctx->errstr;
    DropLocked(node);
    return Unavailable(name_ + ": " + why);
  }
  *found = reply->type == REDIS_REPLY_STRING;
  if (*found) value->assign(reply->str, reply->len);
  const bool error = reply->type == REDIS_REPLY_ERROR;
  why = Text(reply);
  freeReplyObject(reply);
  if (!error) return Status::Ok();
  for (auto& [address, n] : nodes_) DropLocked(&n);
  std::string refreshed;  // MOVED and the like: the next call routes afresh
  RefreshSlotsLocked(&refreshed);
  return Unavailable(name_ + ": GET " + key + ": " + why);
}

}  // namespace rec
