#include "common/duration.h"

#include <cctype>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace holdfast {

absl::StatusOr<std::chrono::milliseconds> ParseDuration(absl::string_view text) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid duration \"", text, "\": ", why,
                     " (examples: 500ms, 10s, 5m, 1h30m, 90d)"));
  };
  if (text == "0") return std::chrono::milliseconds(0);
  if (text.empty()) return bad("empty");
  if (text[0] == '-') return bad("a duration cannot be negative");
  int64_t total_ms = 0;
  size_t i = 0;
  while (i < text.size()) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return bad("expected a number");
    int64_t n = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      n = n * 10 + (text[i] - '0');
      if (n > 1'000'000'000) return bad("too large");
      ++i;
    }
    if (i < text.size() && (text[i] == '.' || text[i] == ',')) {
      return bad("no fractions: use a smaller unit (1500ms, not 1.5s; 90m, not 1.5h)");
    }
    size_t u = i;
    while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
    absl::string_view unit = text.substr(u, i - u);
    int64_t scale;
    if (unit == "ms") scale = 1;
    else if (unit == "s") scale = 1000;
    else if (unit == "m") scale = 60'000;
    else if (unit == "h") scale = 3'600'000;
    else if (unit == "d") scale = 86'400'000;
    else if (unit.empty()) return bad("missing unit");
    else return bad(absl::StrCat("unknown unit \"", unit, "\""));
    total_ms += n * scale;
    if (total_ms > int64_t{1'000'000'000'000}) return bad("too large");
  }
  return std::chrono::milliseconds(total_ms);
}

}  // namespace holdfast
