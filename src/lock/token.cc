#include "lock/token.h"

#include "absl/strings/str_cat.h"

namespace holdfast::token {

absl::StatusOr<int64_t> Make(int32_t epoch, int64_t grant_revision) {
  if (epoch < 1 || epoch > kMaxEpoch) {
    return absl::FailedPreconditionError(
        absl::StrCat("epoch ", epoch, " is outside [1, ", kMaxEpoch, "]: no token can be minted"));
  }
  if (grant_revision < 1 || grant_revision > kMaxRevision) {
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd revision ", grant_revision, " is outside [1, 2^48): this cluster can mint no more "
        "tokens; move the namespaces to a fresh cluster (holdfast ns rehome)"));
  }
  return (static_cast<int64_t>(epoch) << kRevisionBits) | grant_revision;
}

}  // namespace holdfast::token
