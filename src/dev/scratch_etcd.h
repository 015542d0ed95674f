// A single-member etcd in a fresh directory of its own, for a test that needs a
// real etcd and nothing else (the etcd client's, group commit's and the health
// probe's tests). The directory, $TMPDIR/holdfast-<tag>-<pid>-<n>, goes with it.
//
// Thread-compatible.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "dev/etcd_process.h"

namespace holdfast::dev {

class ScratchEtcd {
 public:
  // Starts etcd and waits until it is healthy. Errors: those of EtcdProcess::Start,
  // INTERNAL when the directory cannot be made.
  static absl::StatusOr<std::unique_ptr<ScratchEtcd>> Start(const std::string& tag);
  // Stops etcd and removes the directory.
  ~ScratchEtcd();

  EtcdProcess& etcd() { return *etcd_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  explicit ScratchEtcd(std::filesystem::path dir) : dir_(std::move(dir)) {}

  std::filesystem::path dir_;
  std::unique_ptr<EtcdProcess> etcd_;
};

}  // namespace holdfast::dev
