// A fresh private directory for a tool's or a test's files.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace holdfast::dev {

// Makes $TMPDIR/<prefix>-XXXXXX (/tmp without TMPDIR), mode 0700, and returns its
// path; the caller removes it. INTERNAL when it cannot be made.
inline absl::StatusOr<std::string> MakeTempDir(std::string_view prefix) {
  std::error_code ec;
  std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string tmpl = absl::StrCat((base / std::string(prefix)).string(), "-XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot make a directory like ", tmpl));
  }
  return tmpl;
}

}  // namespace holdfast::dev
