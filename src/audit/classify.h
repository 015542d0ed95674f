// Turns etcd watch events under /holdfast/ into audit rows (ARCHITECTURE §7).
// Pure: no I/O, unit-tested in classify_test.cc.
//
// Per revision:
//   a hold key created                          -> grant  (time: the hold's granted_at)
//   (a hold whose record cannot be read is recorded all the same, with no holder
//    and token 0, at `now_unix_ms`; counted in `malformed`)
//   a hold key deleted, the revision carries
//     an AuditMark of kind "release"            -> release (time: the mark's)
//     an AuditMark of kind "force"              -> force, plus a force_release row
//   a hold key deleted with its session key,
//     whose record was marked `closing`         -> release (a deliberate close)
//   any other deletion of a hold key            -> expire  (time: `now_unix_ms`, the
//                                                  auditor's clock: etcd keeps none)
// `unprotected` is the hold's `advisory` flag. Events of other keys are ignored.
#pragma once

#include <cstdint>
#include <vector>

#include "audit/store.h"
#include "etcd/mvcc/mvccpb/kv.pb.h"

namespace holdfast::audit {

struct Classified {
  std::vector<AuditEvent> events;
  std::vector<ForceReleaseRow> forces;
  int64_t last_revision = 0;  // highest revision among the input events (0 if none)
  int malformed = 0;          // hold events without a parsable record or prev_kv
};

// `events` must hold whole revisions (as one etcd watch response does), in
// revision order, with prev_kv on deletions of hold and session keys (the
// auditor fills them, prev_values.h).
Classified Classify(uint64_t cluster_id, const std::vector<mvccpb::Event>& events,
                    int64_t now_unix_ms);

}  // namespace holdfast::audit
