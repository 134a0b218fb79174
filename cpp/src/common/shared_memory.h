// Triton's system shared memory extension: regions a client on the same host registers by name
// (a POSIX shared memory object's key, an offset into it and a size), from which inputs are read
// and into which outputs are written, so a large request's tensors do not cross a socket.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace rec {

// One registration, mapped read-write; unmapped when the last holder lets go, so a request still
// queued keeps the region it was decoded against even if the client unregisters it.
class SharedMemoryRegion {
 public:
  SharedMemoryRegion(std::string name, std::string key, uint64_t offset, uint64_t byte_size, int fd,
                     void* map, size_t map_size, size_t delta);
  ~SharedMemoryRegion();
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;

  const std::string name, key;
  const uint64_t offset, byte_size;
  // The registered bytes, [offset, offset + byte_size) of the object. Checks first that the
  // object still holds them: a client that shrinks it must get an error, not a SIGBUS here.
  Status Bytes(char** data) const;

 private:
  int fd_;
  void* map_;
  size_t map_size_, delta_;
};

// A slice of a region an input is read from or an output written into.
struct SharedMemorySlice {
  std::shared_ptr<const SharedMemoryRegion> region;
  uint64_t offset = 0, byte_size = 0;  // within the region
};

class SharedMemoryRegistry {
 public:
  static SharedMemoryRegistry& Get();

  Status Register(const std::string& name, const std::string& key, uint64_t offset,
                  uint64_t byte_size);
  // `name` empty: every region. An unknown name is NotFound.
  Status Unregister(const std::string& name);
  Status List(const std::string& name, std::vector<std::shared_ptr<const SharedMemoryRegion>>* out);
  // [offset, offset + byte_size) of region `name` for `what` (an input or output, for messages),
  // checked to lie inside the region.
  Status Slice(const std::string& name, uint64_t offset, uint64_t byte_size,
               const std::string& what, SharedMemorySlice* out);

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const SharedMemoryRegion>> regions_;
};

// Copies a slice's bytes into `out` (an input's data).
Status ReadSlice(const SharedMemorySlice& slice, std::string* out);
// Writes `data` (an output's bytes) at the start of the slice; the slice must hold it.
Status WriteSlice(const SharedMemorySlice& slice, const std::string& what, const std::string& data);

}  // namespace rec
