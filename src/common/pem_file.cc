#include "common/pem_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace holdfast {

absl::Status CheckPemFile(const std::string& path) {
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, why));
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return refuse(absl::StrCat(": cannot read: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return refuse(" is not a file");
  std::ifstream in(path);
  if (!in) return refuse(absl::StrCat(": cannot read: ", std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return refuse(" is not PEM (no \"-----BEGIN\" line)");
  }
  return absl::OkStatus();
}

}  // namespace holdfast
