// Fencing tokens: token = epoch << 48 | grant_revision (ARCHITECTURE §3).
// DO NOT CHANGE: tokens are stored by every resource that checks them.
//
// A token is a positive signed 64-bit integer: epoch < 2^15, revision < 2^48.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace holdfast::token {

inline constexpr int kRevisionBits = 48;
inline constexpr int64_t kMaxRevision = (int64_t{1} << kRevisionBits) - 1;
inline constexpr int32_t kMaxEpoch = (1 << 15) - 1;

// Errors: FAILED_PRECONDITION when the epoch is outside [1, 2^15) or the revision
// outside [1, 2^48): grants on such a cluster are refused, never wrapped.
absl::StatusOr<int64_t> Make(int32_t epoch, int64_t grant_revision);

inline int32_t EpochOf(int64_t token) { return static_cast<int32_t>(token >> kRevisionBits); }
inline int64_t RevisionOf(int64_t token) { return token & kMaxRevision; }

}  // namespace holdfast::token
