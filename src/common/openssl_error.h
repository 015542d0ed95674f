// OpenSSL's error queue as one line for an error message. Header only, like
// loopback.h: holdfastd's metrics endpoint and the dev tools' HTTPS client use
// it, and each links OpenSSL itself.
#pragma once

#include <openssl/err.h>

#include <string>

namespace holdfast {

// Takes every error queued on this thread, oldest first, joined by "; ";
// `if_none` when there is none (a peer that just closed, say).
inline std::string TakeOpenSslErrors(const char* if_none) {
  std::string out;
  for (unsigned long e; (e = ERR_get_error()) != 0;) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? if_none : out;
}

}  // namespace holdfast
