// Whether a file can be used where a PEM file is asked for (a CA bundle, a
// certificate chain, a key): checked where it is named, so a typo in a path is
// refused with the path and the reason before anything connects, rather than
// showing up later as handshakes that fail (gRPC's certificate watcher only logs
// a file it cannot read).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace holdfast {

// OK when `path` is a regular file that can be read and holds a "-----BEGIN "
// line. Otherwise INVALID_ARGUMENT: "PATH: cannot read: <the OS's reason>",
// "PATH is not a file" or "PATH is not PEM (no "-----BEGIN" line)". Reads the
// file (whole: PEM files are small).
absl::Status CheckPemFile(const std::string& path);

}  // namespace holdfast
