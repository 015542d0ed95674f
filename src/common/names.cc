#include "common/names.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace holdfast::names {

namespace {

bool NameChar(char c, bool first) {
  if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) return true;
  return !first && (c == '.' || c == '_' || c == '-');
}

absl::Status ValidateName(absl::string_view what, absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", name.size(), " bytes; at most ", kMaxNameBytes));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    if (!NameChar(name[i], i == 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " \"", absl::CHexEscape(name),
          "\" is invalid: use lower-case letters, digits, '.', '_' and '-', "
          "starting with a letter or digit"));
    }
  }
  return absl::OkStatus();
}

// Returns the length of the UTF-8 sequence at s[i] and its code point, or 0.
size_t DecodeUtf8(absl::string_view s, size_t i, uint32_t* cp) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  size_t n;
  uint32_t v;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    n = 2;
    v = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    v = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    v = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b(i + k) & 0x3F);
  }
  // Reject overlong forms, surrogates and values past U+10FFFF.
  if ((n == 2 && v < 0x80) || (n == 3 && v < 0x800) || (n == 4 && v < 0x10000) ||
      (v >= 0xD800 && v <= 0xDFFF) || v > 0x10FFFF) {
    return 0;
  }
  *cp = v;
  return n;
}

bool IsControl(uint32_t cp) { return cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F); }

// OK, or INVALID_ARGUMENT naming the first byte of invalid UTF-8 or the first
// control character; `control` formats the latter from (what, code point, byte).
template <class F>
absl::Status CheckUtf8Text(absl::string_view what, absl::string_view text, F control) {
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    size_t n = DecodeUtf8(text, i, &cp);
    if (n == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is not valid UTF-8 at byte ", i));
    }
    if (IsControl(cp)) return absl::InvalidArgumentError(control(what, cp, i));
    i += n;
  }
  return absl::OkStatus();
}

absl::Status ValidateKeyBytes(absl::string_view what, absl::string_view key) {
  if (key.size() > kMaxLockKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", key.size(), " bytes; at most ", kMaxLockKeyBytes));
  }
  return CheckUtf8Text(what, key, [](absl::string_view w, uint32_t cp, size_t i) {
    return absl::StrFormat("%s has a control character (U+%04X) at byte %d", w, cp, i);
  });
}

}  // namespace

absl::Status ValidateNamespaceName(absl::string_view ns) { return ValidateName("namespace", ns); }
absl::Status ValidateClassId(absl::string_view id) { return ValidateName("class id", id); }

absl::Status ValidateLockKey(absl::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("lock key is empty");
  return ValidateKeyBytes("lock key", key);
}

absl::Status ValidateKeyPrefix(absl::string_view prefix) {
  return ValidateKeyBytes("key prefix", prefix);
}

absl::Status ValidatePlainText(absl::string_view what, absl::string_view text) {
  return CheckUtf8Text(what, text, [](absl::string_view w, uint32_t cp, size_t i) {
    return absl::StrFormat("%s contains control character U+%04X at byte %d: use plain text", w,
                           cp, i);
  });
}

}  // namespace holdfast::names
