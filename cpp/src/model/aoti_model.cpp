#include "model/aoti_model.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "model/aoti_manifest.h"
#include "model/torch_io.h"
#include "model/torch_model.h"

namespace rec {
namespace {

// tables.bin, mapped: pages come from the page cache as ids touch them, so a server holds no
// second copy of the tables. Private: with the update log (`writable`) a page the log writes
// into becomes this process's own copy, and the file is never changed.
class MappedFile {
 public:
  static Status Open(const std::string& path, bool writable, std::unique_ptr<MappedFile>* out) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NotFound("cannot open " + path + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      return Internal("cannot stat " + path);
    }
    auto file = std::unique_ptr<MappedFile>(new MappedFile());
    file->size_ = static_cast<int64_t>(st.st_size);
    if (file->size_ > 0) {
      const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
      void* p = ::mmap(nullptr, static_cast<size_t>(file->size_), prot, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        return Internal("cannot map " + path + ": " + std::strerror(errno));
      }
      file->data_ = p;
    }
    ::close(fd);
    *out = std::move(file);
    return Status::Ok();
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(data_, static_cast<size_t>(size_));
  }
  char* data() const { return static_cast<char*>(data_); }
  int64_t size() const { return size_; }

 private:
  MappedFile() = default;
  void* data_ = nullptr;
  int64_t size_ = 0;
};

class AotiRunner : public Runner {
 public:
  AotiRunner(std::unique_ptr<MappedFile> file, std::vector<at::Tensor> tables,
             std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader, const ModelSpec& spec,
             std::string version)
      : file_(std::move(file)),
        tables_(std::move(tables)),
        loader_(std::move(loader)),
        spec_(spec),
        version_(std::move(version)) {}

  const std::string& version() const override { return version_; }

  Status Run(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    Watermark unused;
    return RunScored(inputs, outputs, &unused);
  }

  Status RunScored(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs,
                   Watermark* scored_at) override {
    if (!updates_) {
      *scored_at = Watermark{};
      return RunOnce(inputs, outputs);
    }
    EmbeddingTables::Reading still(updates_.get());  // no row changes under this pass
    *scored_at = still.watermark();
    return RunOnce(inputs, outputs);
  }

  void TakeUnknownIds(std::vector<int64_t>* per_column) override {
    TakeZchUnknowns(spec_.sparse_feature_names.size(), per_column);
  }

  std::shared_ptr<EmbeddingTables> tables() const override { return updates_; }

  // rec.json's "updates" names the served module's storage buffers, which tables.bin holds.
  Status AttachTables(const UpdatesSpec& updates, const std::vector<AotiTable>& index) {
    if (!updates.present) return Status::Ok();
    std::map<std::string, EmbeddingTables::Buffer> buffers;
    for (const AotiTable& t : index) {
      buffers[t.name] = {reinterpret_cast<uint8_t*>(file_->data() + t.offset), t.bytes};
    }
    return EmbeddingTables::Create(updates, std::move(buffers), nullptr, &updates_);
  }

 private:
  Status RunOnce(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) {
    try {
      c10::InferenceMode guard;
      std::vector<at::Tensor> args;
      args.reserve(inputs.size() + tables_.size());
      for (const Tensor& t : inputs) args.push_back(WrapInput(t));
      args.insert(args.end(), tables_.begin(), tables_.end());
      std::vector<at::Tensor> result = loader_->run(args);
      outputs->resize(result.size());
      for (size_t i = 0; i < result.size(); ++i) {
        std::string name = i < spec_.outputs.size() ? spec_.outputs[i].name : "output";
        REC_RETURN_IF_ERROR(ToTensor(name, result[i], &(*outputs)[i]));
      }
      return Status::Ok();
    } catch (const std::exception& e) {
      return Internal("forward failed: " + FirstLine(e));
    }
  }

  std::unique_ptr<MappedFile> file_;  // declared first: unmapped after everything reading it
  std::shared_ptr<EmbeddingTables> updates_;  // its reader stops before this runner goes
  std::vector<at::Tensor> tables_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  const ModelSpec& spec_;
  std::string version_;
};

}  // namespace

Status LoadAotiModel(const std::string& package_path, const std::string& manifest_path,
                     const ModelSpec& spec, const std::string& version, int concurrency,
                     std::shared_ptr<Runner>* runner, const UpdatesSpec& updates) {
  AotiManifest manifest;
  REC_RETURN_IF_ERROR(ReadAotiManifest(manifest_path, &manifest));
  // Before the package's library is loaded: code for an ISA this CPU lacks dies with SIGILL.
  REC_RETURN_IF_ERROR(CheckAotiCpu(manifest, CpuFlags(), package_path));
  const std::string tables_path =
      (std::filesystem::path(package_path).parent_path() / manifest.tables_file).string();
  std::unique_ptr<MappedFile> file;
  REC_RETURN_IF_ERROR(MappedFile::Open(tables_path, updates.present, &file));
  std::vector<at::Tensor> tables;
  for (const AotiTable& t : manifest.tables) {
    if (t.offset > file->size() || t.bytes > file->size() - t.offset) {
      return InvalidArgument(tables_path + " is " + std::to_string(file->size()) +
                             " bytes, too short for table " + t.name + " (bytes " +
                             std::to_string(t.offset) + " + " + std::to_string(t.bytes) +
                             " in rec.json)");
    }
    tables.push_back(
        at::from_blob(file->data() + t.offset, {t.bytes}, at::TensorOptions().dtype(at::kByte)));
  }
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  try {
    loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        package_path, "model", /*run_single_threaded=*/false,
        static_cast<size_t>(std::max(1, concurrency)));
  } catch (const std::exception& e) {
    return InvalidArgument("cannot load " + package_path + ": " + FirstLine(e));
  }
  auto candidate = std::make_shared<AotiRunner>(std::move(file), std::move(tables),
                                                std::move(loader), spec, version);
  Status attached = candidate->AttachTables(updates, manifest.tables);
  if (!attached.ok()) return InvalidArgument(package_path + ": " + attached.message());
  REC_RETURN_IF_ERROR(WarmUp(candidate.get(), spec, package_path));
  *runner = std::move(candidate);
  return Status::Ok();
}

}  // namespace rec
