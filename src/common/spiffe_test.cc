#include "common/spiffe.h"

#include <gtest/gtest.h>

namespace holdfast::spiffe {
namespace {

TEST(SpiffeTest, ParsesValidIds) {
  auto id = Parse("spiffe://acme.org/payments/api");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->trust_domain, "acme.org");
  EXPECT_EQ(id->path, "/payments/api");
  EXPECT_EQ(id->ToString(), "spiffe://acme.org/payments/api");
  EXPECT_TRUE(Parse("spiffe://holdfast.dev").ok());
}

TEST(SpiffeTest, RejectsWhatTheSvidRulesForbid) {
  struct Case {
    const char* uri;
    const char* reason;
  } cases[] = {
      {"https://acme.org/x", "scheme must be spiffe://"},
      {"spiffe:///x", "trust domain is empty"},
      {"spiffe://acme.org:443/x", "no port"},
      {"spiffe://user@acme.org/x", "no user info"},
      {"spiffe://acme.org/x?q=1", "no query or fragment"},
      {"spiffe://acme.org/x#f", "no query or fragment"},
      {"spiffe://Acme.org/x", "lower-case"},
      {"spiffe://acme.org/x/", "must not end with '/'"},
      {"spiffe://acme.org//x", "empty segment"},
      {"spiffe://acme.org/a/../b", "'..' segment"},
      {"spiffe://acme.org/a b", "only letters"},
  };
  for (const auto& c : cases) {
    auto id = Parse(c.uri);
    ASSERT_FALSE(id.ok()) << c.uri;
    EXPECT_NE(id.status().message().find(c.reason), std::string::npos) << id.status();
  }
  EXPECT_FALSE(Parse(std::string("spiffe://a.org/") + std::string(2100, 'x')).ok());
}

TEST(SpiffeTest, PatternsMatchExactlyOrBelowAPrefix) {
  EXPECT_TRUE(Matches("spiffe://acme.org/payments/api", "spiffe://acme.org/payments/*"));
  EXPECT_TRUE(Matches("spiffe://acme.org/payments/a/b", "spiffe://acme.org/payments/*"));
  EXPECT_FALSE(Matches("spiffe://acme.org/payments", "spiffe://acme.org/payments/*"));
  EXPECT_FALSE(Matches("spiffe://acme.org/payments-old/x", "spiffe://acme.org/payments/*"));
  EXPECT_TRUE(Matches("spiffe://acme.org/x", "spiffe://acme.org/x"));
  EXPECT_FALSE(Matches("spiffe://acme.org/xy", "spiffe://acme.org/x"));
  EXPECT_TRUE(ValidatePattern("spiffe://acme.org/ops/*").ok());
  EXPECT_FALSE(ValidatePattern("spiffe://acme.org/ops*").ok());
  EXPECT_FALSE(ValidatePattern("acme.org/*").ok());
  // A trust domain alone is no caller's ID: refused, saying what would admit it.
  EXPECT_TRUE(ValidatePattern("spiffe://acme.org/*").ok());
  EXPECT_EQ(ValidatePattern("spiffe://acme.org").message(),
            "\"spiffe://acme.org\" names a trust domain, which no caller's SPIFFE ID is (each "
            "has a path): \"spiffe://acme.org/*\" admits the whole trust domain");
}

}  // namespace
}  // namespace holdfast::spiffe
