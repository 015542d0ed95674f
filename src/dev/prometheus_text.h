// Reads one sample out of Prometheus' text exposition format, for tests of the
// metrics endpoint.
#pragma once

#include <map>
#include <sstream>
#include <string>

namespace holdfast::dev {

// The value of the first sample of metric `name` whose labels include every one
// of `labels` (other labels may be there too); -1 when there is none.
inline double PrometheusSample(const std::string& text, const std::string& name,
                               const std::map<std::string, std::string>& labels = {}) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    if (space == std::string::npos) continue;
    const std::string series = line.substr(0, space);
    if (series != name && series.rfind(name + "{", 0) != 0) continue;
    bool all = true;
    for (const auto& [k, v] : labels) {
      const std::string pair = k + "=\"" + v + "\"";
      all = all && (series.find("{" + pair) != std::string::npos ||
                    series.find("," + pair) != std::string::npos);
    }
    if (all) return std::stod(line.substr(space + 1));
  }
  return -1;
}

}  // namespace holdfast::dev
