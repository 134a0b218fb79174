#include "common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace rec {

SharedMemoryRegion::SharedMemoryRegion(std::string name_, std::string key_, uint64_t offset_,
                                       uint64_t byte_size_, int fd, void* map, size_t map_size,
                                       size_t delta)
    : name(std::move(name_)),
      key(std::move(key_)),
      offset(offset_),
      byte_size(byte_size_),
      fd_(fd),
      map_(map),
      map_size_(map_size),
      delta_(delta) {}

SharedMemoryRegion::~SharedMemoryRegion() {
  munmap(map_, map_size_);
  close(fd_);
}

Status SharedMemoryRegion::Bytes(char** data) const {
  struct stat st {};
  if (fstat(fd_, &st) != 0 || static_cast<uint64_t>(st.st_size) < offset + byte_size) {
    return InvalidArgument("shared memory region '" + name + "': the object '" + key +
                           "' no longer holds its " + std::to_string(byte_size) +
                           " bytes at offset " + std::to_string(offset) + " (it was shrunk)");
  }
  *data = static_cast<char*>(map_) + delta_;
  return Status::Ok();
}

SharedMemoryRegistry& SharedMemoryRegistry::Get() {
  static SharedMemoryRegistry* registry = new SharedMemoryRegistry();  // outlives every request
  return *registry;
}

Status SharedMemoryRegistry::Register(const std::string& name, const std::string& key,
                                      uint64_t offset, uint64_t byte_size) {
  if (name.empty()) return InvalidArgument("a shared memory region needs a name");
  if (byte_size == 0) {
    return InvalidArgument("shared memory region '" + name + "': byte_size must be > 0");
  }
  if (offset > UINT64_MAX - byte_size) {
    return InvalidArgument("shared memory region '" + name + "': offset + byte_size overflows");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (regions_.count(name)) {
      return InvalidArgument("shared memory region '" + name + "' is already registered");
    }
  }
  int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return InvalidArgument("shared memory region '" + name + "': cannot open key '" + key +
                           "': " + std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < offset + byte_size) {
    uint64_t size = static_cast<uint64_t>(st.st_size);
    close(fd);
    return InvalidArgument("shared memory region '" + name + "': offset " + std::to_string(offset) +
                           " + byte_size " + std::to_string(byte_size) + " runs past the end of '" +
                           key + "' (" + std::to_string(size) + " bytes)");
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t aligned = offset / page * page;
  const size_t delta = static_cast<size_t>(offset - aligned);
  const size_t map_size = static_cast<size_t>(byte_size) + delta;
  void* map =
      mmap(nullptr, map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(aligned));
  if (map == MAP_FAILED) {
    int err = errno;
    close(fd);
    return InvalidArgument("shared memory region '" + name + "': cannot map '" + key +
                           "': " + std::strerror(err));
  }
  auto region =
      std::make_shared<SharedMemoryRegion>(name, key, offset, byte_size, fd, map, map_size, delta);
  std::lock_guard<std::mutex> lock(mu_);
  if (!regions_.emplace(name, std::move(region)).second) {  // registered meanwhile
    return InvalidArgument("shared memory region '" + name + "' is already registered");
  }
  return Status::Ok();
}

Status SharedMemoryRegistry::Unregister(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (name.empty()) {
    regions_.clear();
    return Status::Ok();
  }
  if (regions_.erase(name) == 0) {
    return NotFound("no shared memory region '" + name + "' is registered");
  }
  return Status::Ok();
}

Status SharedMemoryRegistry::List(const std::string& name,
                                  std::vector<std::shared_ptr<const SharedMemoryRegion>>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [n, region] : regions_) {
    if (name.empty() || n == name) out->push_back(region);
  }
  if (!name.empty() && out->empty()) {
    return NotFound("no shared memory region '" + name + "' is registered");
  }
  return Status::Ok();
}

Status SharedMemoryRegistry::Slice(const std::string& name, uint64_t offset, uint64_t byte_size,
                                   const std::string& what, SharedMemorySlice* out) {
  std::shared_ptr<const SharedMemoryRegion> region;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(name);
    if (it == regions_.end()) {
      return InvalidArgument(what + ": no shared memory region '" + name + "' is registered");
    }
    region = it->second;
  }
  if (offset > region->byte_size || byte_size > region->byte_size - offset) {
    return InvalidArgument(what + ": offset " + std::to_string(offset) + " + byte_size " +
                           std::to_string(byte_size) + " runs past the end of shared memory " +
                           "region '" + name + "' (" + std::to_string(region->byte_size) +
                           " bytes)");
  }
  out->region = std::move(region);
  out->offset = offset;
  out->byte_size = byte_size;
  return Status::Ok();
}

Status ReadSlice(const SharedMemorySlice& slice, std::string* out) {
  char* data = nullptr;
  REC_RETURN_IF_ERROR(slice.region->Bytes(&data));
  out->assign(data + slice.offset, static_cast<size_t>(slice.byte_size));
  return Status::Ok();
}

Status WriteSlice(const SharedMemorySlice& slice, const std::string& what,
                  const std::string& data) {
  if (data.size() > slice.byte_size) {
    return InvalidArgument(what + " is " + std::to_string(data.size()) + " bytes, more than the " +
                           std::to_string(slice.byte_size) +
                           " bytes given in shared memory region '" + slice.region->name + "'");
  }
  char* base = nullptr;
  REC_RETURN_IF_ERROR(slice.region->Bytes(&base));
  std::memcpy(base + slice.offset, data.data(), data.size());
  return Status::Ok();
}

}  // namespace rec
