// A lock holder in its own process, for tests that kill or pause a holder:
//   hf_test_holder ENDPOINT NS KEY TTL_MS
// Opens a session, acquires KEY (waiting up to 60 s), prints "TOKEN <token>" and
// then holds until killed. Exits 3 if the acquire fails, 4 if the hold is lost.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "holdfast/client.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s ENDPOINT NS KEY TTL_MS\n", argv[0]);
    return 2;
  }
  holdfast::ClientOptions o;
  o.endpoints = {argv[1]};
  auto client = holdfast::Client::Connect(o);
  if (!client.ok()) return 3;
  holdfast::SessionOptions so;
  so.ttl = std::chrono::milliseconds(std::atoll(argv[4]));
  auto session = (*client)->OpenSession(argv[2], so);
  if (!session.ok()) {
    std::fprintf(stderr, "open: %s\n", session.status().ToString().c_str());
    return 3;
  }
  holdfast::AcquireOptions ao;
  ao.wait = std::chrono::seconds(60);
  auto hold = (*session)->Acquire(argv[3], ao);
  if (!hold.ok()) {
    std::fprintf(stderr, "acquire: %s\n", hold.status().ToString().c_str());
    return 3;
  }
  std::printf("TOKEN %lld\n", static_cast<long long>(hold->token()));
  std::fflush(stdout);
  while (!hold->lost()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::printf("LOST\n");
  std::fflush(stdout);
  return 4;
}
