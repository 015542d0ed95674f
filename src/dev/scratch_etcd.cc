#include "dev/scratch_etcd.h"

#include <unistd.h>

#include <atomic>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace holdfast::dev {

absl::StatusOr<std::unique_ptr<ScratchEtcd>> ScratchEtcd::Start(const std::string& tag) {
  static std::atomic<int> next{0};
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              absl::StrCat("holdfast-", tag, "-", ::getpid(), "-", next++);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!std::filesystem::create_directories(dir, ec)) {
    return absl::InternalError(
        absl::StrCat("cannot make ", dir.string(), ": ", ec ? ec.message() : "exists"));
  }
  std::unique_ptr<ScratchEtcd> scratch(new ScratchEtcd(dir));
  EtcdOptions o;
  o.data_dir = (dir / "etcd").string();
  auto etcd = EtcdProcess::Start(o);
  if (!etcd.ok()) return etcd.status();  // the destructor removes the directory
  scratch->etcd_ = std::move(*etcd);
  return scratch;
}

ScratchEtcd::~ScratchEtcd() {
  etcd_.reset();  // stops it before its data goes
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace holdfast::dev
