// Status helpers shared by every holdfast library. holdfast code reports errors as
// absl::Status / absl::StatusOr<T>, never by exceptions. Which code to pick:
//   UNAVAILABLE          transient (etcd unreachable, leader change): retry the call.
//   ABORTED              a race was lost (compare failed): retry one level up.
//   FAILED_PRECONDITION  the system is not in a state to do this: do not retry.
//   INVALID_ARGUMENT     the request is malformed: do not retry.
//   DEADLINE_EXCEEDED    the caller's deadline passed; for a write the outcome is
//                        unknown and the caller converges by re-reading.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define HF_CONCAT_INNER(a, b) a##b
#define HF_CONCAT(a, b) HF_CONCAT_INNER(a, b)

// Returns from the current function if `expr` is not OK.
#define HF_RETURN_IF_ERROR(expr)              \
  do {                                        \
    ::absl::Status hf_status_ = (expr);       \
    if (!hf_status_.ok()) return hf_status_;  \
  } while (0)

// `HF_ASSIGN_OR_RETURN(auto x, StatusOrExpr());`
#define HF_ASSIGN_OR_RETURN(lhs, expr) \
  HF_ASSIGN_OR_RETURN_IMPL(HF_CONCAT(hf_statusor_, __LINE__), lhs, expr)
#define HF_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
