// The one place absl::Status and grpc::Status are translated into each other.
// Codes map one to one (both use the canonical code space); messages are kept,
// but for the length an answer may carry (ToGrpcStatus).
#pragma once

#include <cstddef>
#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace holdfast {

// The longest status message holdfastd sends. It travels in the grpc-message
// trailer, and a client refuses trailers past its metadata limit (8 KiB by
// default) with an error of its own in place of the answer; messages echo what
// callers sent (names, keys, reasons, request ids) before checking its length.
inline constexpr size_t kMaxStatusMessageBytes = 2048;

// `message`, cut to kMaxStatusMessageBytes if longer (at a UTF-8 character
// boundary), saying how much was left out.
inline std::string BoundedStatusMessage(std::string message) {
  if (message.size() <= kMaxStatusMessageBytes) return message;
  size_t cut = kMaxStatusMessageBytes - 40;  // room for the note
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
  const size_t left_out = message.size() - cut;
  message.resize(cut);
  absl::StrAppend(&message, "... (", left_out, " more bytes)");
  return message;
}

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      BoundedStatusMessage(std::string(s.message())));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace holdfast
