// Parsing of human durations ("250ms", "10s", "5m", "1h", "1h30m", "90d") used by the
// config file and the CLI.
#pragma once

#include <chrono>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace holdfast {

// Accepts one or more <number><unit> groups, unit in ms|s|m|h|d (a day is 24h); a bare "0" is zero.
// Errors: INVALID_ARGUMENT naming the bad text.
absl::StatusOr<std::chrono::milliseconds> ParseDuration(absl::string_view text);

}  // namespace holdfast
