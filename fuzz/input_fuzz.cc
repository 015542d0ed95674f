// libFuzzer target for the code that first touches untrusted input: name, key and
// SPIFFE ID validation, duration parsing, and the key encoding (keyspace.h).
// Built with clang (-fsanitize=fuzzer,address,undefined) by fuzz/CMakeLists.txt.
//
// Properties checked on every input (a violation aborts, which libFuzzer reports):
//   - validators never crash and accept only what their rules allow;
//   - a valid (namespace, lock key) round-trips through HoldKey/ParseHoldKey;
//   - K1: the hold range of a key contains its own hold keys and never those of a
//     key that extends it ("a" vs "a/b", "a0", ...).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/duration.h"
#include "common/names.h"
#include "common/spiffe.h"
#include "lock/keyspace.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

bool InRange(const std::string& k, const std::string& begin, const std::string& end) {
  return k >= begin && k < end;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  using namespace holdfast;

  (void)ParseDuration(input);
  if (auto id = spiffe::Parse(input); id.ok()) {
    Check(id->ToString() == input);  // a valid ID is already canonical
    Check(spiffe::Matches(input, input));
  }
  (void)spiffe::ValidatePattern(input);

  // First byte splits the input into a namespace and a lock key.
  const size_t cut = size == 0 ? 0 : std::min<size_t>(data[0] % 64, size - 1);
  const std::string ns = input.substr(size == 0 ? 0 : 1, cut);
  const std::string key = input.substr(std::min(size, cut + 1));
  const bool ns_ok = names::ValidateNamespaceName(ns).ok();
  const bool key_ok = names::ValidateLockKey(key).ok();
  if (key_ok) {
    Check(!key.empty() && key.size() <= names::kMaxLockKeyBytes);
    Check(key.find('\0') == std::string::npos);
  }
  if (!ns_ok || !key_ok) return 0;

  const int64_t lease = static_cast<int64_t>(size) * 0x9e3779b97f4a7c15LL;
  const std::string hold = keyspace::HoldKey(ns, key, lease);
  auto parsed = keyspace::ParseHoldKey(hold);
  Check(parsed.has_value());
  Check(parsed->ns == ns && parsed->lock_key == key && parsed->lease == lease);
  Check(InRange(hold, keyspace::HoldRangeBegin(ns, key), keyspace::HoldRangeEnd(ns, key)));
  for (const char* suffix : {"/b", "0", " ", "\x7e", "\xc3\xa9"}) {
    const std::string longer = key + suffix;
    if (!names::ValidateLockKey(longer).ok()) continue;
    Check(!InRange(keyspace::HoldKey(ns, longer, lease), keyspace::HoldRangeBegin(ns, key),
                   keyspace::HoldRangeEnd(ns, key)));
  }
  return 0;
}
