// Versioned schema migrations of the audit store, one list for both SQL dialects.
// A migration is applied once, in its own transaction, and recorded in
// `schema_migrations`; applied migrations are never edited: a change is a new
// migration with the next version.
#pragma once

#include <span>

namespace holdfast::audit {

struct Migration {
  int version;
  const char* name;
  const char* sqlite;    // statements separated by ';'
  const char* postgres;  // statements separated by ';'
};

std::span<const Migration> Migrations();

}  // namespace holdfast::audit
