// What holdfast accepts as namespace names, class ids and lock keys. Pure logic,
// shared by the server (which enforces it) and the client library (which
// refuses bad input before sending it).
//
//   namespace, class id: [a-z0-9][a-z0-9._-]{0,62}   (so never a '/')
//   lock key:            1..512 bytes of UTF-8 without control characters
//                        (C0, DEL, C1), so never a NUL
//   class key prefix:    like a lock key, but may be empty
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace holdfast::names {

inline constexpr size_t kMaxLockKeyBytes = 512;
inline constexpr size_t kMaxNameBytes = 63;

// Each returns INVALID_ARGUMENT with the reason, or OK.
absl::Status ValidateNamespaceName(absl::string_view ns);
absl::Status ValidateClassId(absl::string_view class_id);
absl::Status ValidateLockKey(absl::string_view key);
absl::Status ValidateKeyPrefix(absl::string_view prefix);
// Free text shown in tables and stored as text (a tenant id, a force-release
// reason): valid UTF-8 without control characters (C0, DEL, C1). `what` leads
// the message: `<what> contains control character U+001B at byte 3: use plain text`.
absl::Status ValidatePlainText(absl::string_view what, absl::string_view text);

}  // namespace holdfast::names
