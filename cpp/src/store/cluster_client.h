// ClusterClient: HMGETs (and the update log's XREADs) against a Redis Cluster, or one plain Redis
// serving every slot, with Debian's hiredis. Keys are routed by their
// hash slot (CLUSTER SLOTS); each node's share of a batch goes out as one pipeline, every
// node's pipeline is sent before any reply is read, so the nodes work in parallel. A moved
// slot, a failed-over master or a dropped connection refreshes the slot map and retries the
// batch, within a deadline; after it, the batch fails as Unavailable naming the store. A key
// whose slot is being migrated (ASK) is read from the importing node, ASKING first.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

struct redisContext;

namespace rec {

struct HashGet {
  std::string key;
  std::vector<std::string> fields;
};

struct FieldValue {
  bool found = false;
  std::string value;
};

// One XREAD: the stream `key` after entry `after` ("0": from its start).
struct StreamRead {
  std::string key;
  std::string after;
};

struct StreamEntry {
  std::string id;
  std::vector<std::pair<std::string, std::string>> fields;
};

class ClusterClient {
 public:
  // `name` (the store's URL) is what errors call the store.
  ClusterClient(std::string name, std::vector<std::pair<std::string, int>> seeds,
                std::chrono::milliseconds timeout, std::chrono::milliseconds retry_for);
  ~ClusterClient();
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  // Reads the slot map from the first seed that answers.
  Status Connect();
  // (*out)[i][j]: field j of gets[i]. per_node: requests sent to each node ("host:port"), added.
  // Safe to call from several threads (one batch at a time).
  Status HashGets(const std::vector<HashGet>& gets, std::vector<std::vector<FieldValue>>* out,
                  std::map<std::string, uint64_t>* per_node);
  // Whether `key` exists (on the node that owns it).
  Status Exists(const std::string& key, bool* exists);

  // The update log's reads (cluster_streams.cpp); errors name the client as `name` alone.
  // (*out)[i]: up to `count` entries of reads[i]. Each node's reads go out as one pipeline, all
  // nodes' before any reply is read. block_ms >= 0 (one read only) blocks that long for news.
  // A lost node, MOVED, ASK, TRYAGAIN, CLUSTERDOWN, READONLY or UNBLOCKED refreshes the slot map
  // and fails this call as Unavailable: the caller reads again from the same cursors.
  Status StreamReads(const std::vector<StreamRead>& reads, int count, int block_ms,
                     std::vector<std::vector<StreamEntry>>* out);
  // GET `key` on its node: *found false when it does not exist.
  Status Get(const std::string& key, bool* found, std::string* value);

 private:
  struct Node {
    std::string host;
    int port = 0;
    redisContext* ctx = nullptr;
  };
  // An attempt's outcome: done, retry after refreshing the slot map, or give up.
  enum class Attempt { kDone, kRetry, kFailed };

  // Reads the slot map from the first node that gives a whole one; else false and *why.
  bool RefreshSlotsLocked(std::string* why);
  Status ConnectLocked(Node* node);
  void DropLocked(Node* node);
  Node* NodeLocked(const std::string& address);
  // The HMGET of `get` (after ASKING, for a key whose slot is being imported) into the pipeline.
  static void AppendGet(Node* node, const HashGet& get, bool asking);
  // Sends each node (by address) the HMGETs of its share of `gets`, as one pipeline; a
  // connection or write error drops the connection and asks for a retry.
  Attempt SendLocked(const std::map<std::string, std::vector<size_t>>& shares,
                     const std::vector<HashGet>& gets, bool asking,
                     std::map<std::string, uint64_t>* per_node, std::string* why);
  // One HMGET reply into *values. With `ask`, an ASK redirect is kDone with *ask its target;
  // without, it is a kRetry like MOVED.
  Attempt ReadLocked(const std::string& address, Node* node, const HashGet& get,
                     std::vector<FieldValue>* values, std::string* ask, std::string* why,
                     Status* failed);
  // Reads one node's XREAD replies for `indices` into *out; false (the node dropped) if any
  // failed, *why saying how.
  bool ReadStreamsLocked(const std::string& address, Node* node, const std::vector<size_t>& indices,
                         std::vector<std::vector<StreamEntry>>* out, std::string* why);
  Attempt TryLocked(const std::vector<HashGet>& gets, std::vector<std::vector<FieldValue>>* out,
                    std::map<std::string, uint64_t>* per_node, std::string* why, Status* failed);

  const std::string name_;
  const std::vector<std::pair<std::string, int>> seeds_;
  const std::chrono::milliseconds timeout_, retry_for_;
  std::mutex mu_;
  std::map<std::string, Node> nodes_;            // by "host:port"
  std::array<std::string, 16384> slot_owner_{};  // "host:port" of each slot's master
};

}  // namespace rec
