#include "server/rehome.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "lock/keyspace.h"
#include "lock/records.pb.h"
#include "lock/txn_util.h"

namespace holdfast::server {

namespace pb = ::etcdserverpb;
using lock::AddCompare;

namespace {

constexpr std::chrono::seconds kStepTimeout{10};

etcd::Deadline Step() { return etcd::DeadlineIn(kStepTimeout); }

const char* PhaseName(int32_t phase) {
  switch (phase) {
    case kRehomeDraining: return "draining";
    case kRehomeSealed: return "sealed";
    case kRehomeEpochReady: return "epoch-ready";
    case kRehomeCopied: return "copied";
    case kRehomeFlipped: return "flipped";
    case kRehomeAbortMarked: return "abort-marked";
    default: return "unknown";
  }
}

// The namespace record and class records of `ns` on one cluster, at one revision.
struct NsState {
  bool exists = false;
  records::NamespaceRecord rec;
  int64_t mod_revision = 0;
  std::vector<mvccpb::KeyValue> classes;
  int64_t revision = 0;
};

absl::StatusOr<NsState> ReadNs(Cluster& c, const std::string& ns, etcd::Deadline d) {
  pb::TxnRequest read;
  read.add_success()->mutable_request_range()->set_key(keyspace::NamespaceKey(ns));
  auto* rc = read.add_success()->mutable_request_range();
  rc->set_key(keyspace::ClassPrefix(ns));
  rc->set_range_end(keyspace::PrefixEnd(keyspace::ClassPrefix(ns)));
  HF_ASSIGN_OR_RETURN(auto t, c.etcd->TxnSync(std::move(read), d));
  NsState s;
  s.revision = t.header().revision();
  const auto& n = t.responses(0).response_range();
  if (n.kvs_size() > 0) {
    if (!s.rec.ParseFromString(n.kvs(0).value())) {
      return absl::DataLossError(absl::StrCat("corrupt namespace record for ", ns));
    }
    s.exists = true;
    s.mod_revision = n.kvs(0).mod_revision();
  }
  for (const auto& kv : t.responses(1).response_range().kvs()) s.classes.push_back(kv);
  return s;
}

// Puts every class record again with its own value: its mod_revision changes, so
// a grant decided on the old one fails its compare and decides again.
void RewriteClasses(const NsState& s, pb::TxnRequest* txn) {
  for (const auto& kv : s.classes) {
    auto* put = txn->add_success()->mutable_request_put();
    put->set_key(kv.key());
    put->set_value(kv.value());
  }
}

absl::Status RevokeSync(etcd::Client& etcd, int64_t lease, etcd::Deadline d) {
  std::promise<absl::Status> p;
  pb::LeaseRevokeRequest r;
  r.set_id(lease);
  etcd.LeaseRevoke(r, d, [&p](absl::StatusOr<pb::LeaseRevokeResponse> x) {
    p.set_value(x.ok() || x.status().code() == absl::StatusCode::kNotFound ? absl::OkStatus()
                                                                          : x.status());
  });
  return p.get_future().get();
}

}  // namespace

struct Rehomer::Placed {
  std::optional<records::PlacementRecord> rec;
  int64_t mod_revision = 0;  // 0: no record
};

void Rehomer::MaybeExit(int32_t phase) const {
  if (options_.exit_after_phase != phase) return;
  std::fprintf(stderr, "holdfastd: HOLDFAST_TEST_REHOME_EXIT_AFTER=%s: exiting now\n",
               PhaseName(phase));
  std::fflush(stderr);
  std::_Exit(3);
}

absl::StatusOr<Rehomer::Placed> Rehomer::ReadPlacement(const std::string& ns, etcd::Deadline d) {
  pb::RangeRequest r;
  r.set_key(keyspace::PlacementKey(ns));
  HF_ASSIGN_OR_RETURN(auto got, clusters_->control().etcd->RangeSync(r, d));
  Placed p;
  if (got.kvs_size() > 0) {
    records::PlacementRecord rec;
    if (!rec.ParseFromString(got.kvs(0).value())) {
      return absl::DataLossError(absl::StrCat("corrupt placement record for ", ns));
    }
    p.rec = rec;
    p.mod_revision = got.kvs(0).mod_revision();
  }
  return p;
}

absl::Status Rehomer::WritePlacement(const std::string& ns, const Placed& was,
                                     const std::optional<records::PlacementRecord>& now,
                                     etcd::Deadline d) {
  pb::TxnRequest txn;
  if (was.rec) {
    AddCompare(&txn, keyspace::PlacementKey(ns), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(was.mod_revision);
  } else {
    AddCompare(&txn, keyspace::PlacementKey(ns), pb::Compare::CREATE, pb::Compare::EQUAL)
        ->set_create_revision(0);
  }
  if (now) {
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(keyspace::PlacementKey(ns));
    put->set_value(now->SerializeAsString());
  } else {
    txn.add_success()->mutable_request_delete_range()->set_key(keyspace::PlacementKey(ns));
  }
  HF_ASSIGN_OR_RETURN(auto t, clusters_->control().etcd->TxnSync(std::move(txn), d));
  if (!t.succeeded()) {
    return absl::AbortedError(absl::StrCat(
        "the placement of namespace \"", ns, "\" changed meanwhile (another rehome?); run the "
        "command again"));
  }
  clusters_->placements()->Note(ns, now, t.header().revision());
  return absl::OkStatus();
}

absl::Status Rehomer::Drain(Cluster& from, const std::string& ns, const std::string& to,
                            etcd::Deadline d) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    HF_ASSIGN_OR_RETURN(NsState s, ReadNs(from, ns, d));
    if (!s.exists) {
      return absl::NotFoundError(absl::StrCat("namespace \"", ns, "\" does not exist on cluster \"",
                                              from.name(), "\""));
    }
    records::NamespaceRecord rec = s.rec;
    rec.set_draining_to(to);
    pb::TxnRequest txn;
    AddCompare(&txn, keyspace::NamespaceKey(ns), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(s.mod_revision);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(keyspace::NamespaceKey(ns));
    put->set_value(rec.SerializeAsString());
    RewriteClasses(s, &txn);
    HF_ASSIGN_OR_RETURN(auto t, from.etcd->TxnSync(std::move(txn), d));
    if (t.succeeded()) return absl::OkStatus();
  }
  return absl::AbortedError(absl::StrCat("namespace \"", ns, "\" kept changing; run the command again"));
}

absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> Rehomer::Holds(
    Cluster& c, const std::string& ns, etcd::Deadline d) {
  const std::string prefix = keyspace::HoldPrefix(ns, "");
  pb::RangeRequest r;
  r.set_key(prefix);
  r.set_range_end(keyspace::PrefixEnd(prefix));
  r.set_keys_only(true);
  HF_ASSIGN_OR_RETURN(auto got, c.etcd->RangeSync(r, d));
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& kv : got.kvs()) out.emplace_back(kv.key(), kv.create_revision());
  return out;
}

absl::Status Rehomer::Seal(Cluster& from, const std::string& ns, const std::string& to,
                           etcd::Deadline d) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    HF_ASSIGN_OR_RETURN(NsState s, ReadNs(from, ns, d));
    if (!s.exists) {
      return absl::NotFoundError(absl::StrCat("namespace \"", ns, "\" does not exist on cluster \"",
                                              from.name(), "\""));
    }
    if (s.rec.moved()) return absl::OkStatus();  // sealed before
    // Rolled back meanwhile (--abort): a seal now would end the queues of a
    // namespace that stays, and leave it marked moved. (The transaction below
    // compares the record read here.)
    if (s.rec.draining_to() != to) {
      return absl::AbortedError(absl::StrCat("namespace \"", ns, "\" is no longer draining to \"",
                                             to, "\": the rehome was rolled back"));
    }
    records::NamespaceRecord rec = s.rec;
    rec.set_moved(true);
    const std::string holds = keyspace::HoldPrefix(ns, "");
    pb::TxnRequest txn;
    AddCompare(&txn, keyspace::NamespaceKey(ns), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(s.mod_revision);
    auto* none = AddCompare(&txn, holds, pb::Compare::CREATE, pb::Compare::EQUAL);
    none->set_range_end(keyspace::PrefixEnd(holds));
    none->set_create_revision(0);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(keyspace::NamespaceKey(ns));
    put->set_value(rec.SerializeAsString());
    RewriteClasses(s, &txn);
    auto* waiters = txn.add_success()->mutable_request_delete_range();
    waiters->set_key(keyspace::WaitPrefix(ns));
    waiters->set_range_end(keyspace::PrefixEnd(keyspace::WaitPrefix(ns)));
    auto* count = txn.add_failure()->mutable_request_range();
    count->set_key(holds);
    count->set_range_end(keyspace::PrefixEnd(holds));
    count->set_count_only(true);
    HF_ASSIGN_OR_RETURN(auto t, from.etcd->TxnSync(std::move(txn), d));
    if (t.succeeded()) return absl::OkStatus();
    if (t.responses(0).response_range().count() > 0) {
      return absl::FailedPreconditionError("holds remain");
    }
  }
  return absl::AbortedError(absl::StrCat("namespace \"", ns, "\" kept changing; run the command again"));
}

absl::StatusOr<std::pair<int32_t, bool>> Rehomer::EnsureEpoch(Cluster& from, Cluster& to,
                                                             const std::string& actor,
                                                             etcd::Deadline d) {
  HF_ASSIGN_OR_RETURN(audit::EpochState f, from.epochs->Read(d));
  HF_ASSIGN_OR_RETURN(audit::EpochState t, to.epochs->Read(d));
  // Every epoch a token of the namespace can carry: the old home's, and any the
  // history knows on another cluster than the target (the namespace may have
  // lived there before). Its earlier tokens on the target itself are below the
  // target's current revision, so they need no advance.
  int32_t bound = f.exists ? f.record.epoch() : 0;
  for (const auto& row : f.history) {
    if (row.cluster_id != t.observed_cluster_id) bound = std::max(bound, row.epoch);
  }
  if (t.exists && t.record.etcd_cluster_id() == t.observed_cluster_id &&
      t.record.epoch() > bound && audit::Epochs::RestoreReason(t).empty()) {
    return std::make_pair(t.record.epoch(), false);
  }
  HF_ASSIGN_OR_RETURN(auto advanced, to.epochs->Advance("rehome", actor, d, bound));
  return std::make_pair(advanced.epoch(), true);
}

absl::Status Rehomer::Copy(Cluster& from, Cluster& to, const std::string& ns, etcd::Deadline d) {
  HF_ASSIGN_OR_RETURN(NsState s, ReadNs(from, ns, d));
  if (!s.exists) {
    return absl::NotFoundError(absl::StrCat("namespace \"", ns, "\" does not exist on cluster \"",
                                            from.name(), "\""));
  }
  // Whatever an earlier attempt (or an earlier stay) left on the target goes
  // first; etcd refuses a put and a delete of one key in one transaction.
  HF_RETURN_IF_ERROR(Remove(to, ns, d));
  records::NamespaceRecord rec = s.rec;
  rec.clear_draining_to();
  rec.clear_moved();
  pb::TxnRequest txn;
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(keyspace::NamespaceKey(ns));
  put->set_value(rec.SerializeAsString());
  RewriteClasses(s, &txn);
  HF_ASSIGN_OR_RETURN(auto t, to.etcd->TxnSync(std::move(txn), d));
  (void)t;
  return absl::OkStatus();
}

absl::Status Rehomer::Distinct(Cluster& from, Cluster& to, etcd::Deadline d) {
  auto a = from.etcd->StatusSync(d);
  if (!a.ok()) return a.status();
  auto b = to.etcd->StatusSync(d);
  if (!b.ok()) return b.status();
  if (a->header().cluster_id() != b->header().cluster_id()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "clusters \"", from.name(), "\" and \"", to.name(), "\" are one etcd cluster (cluster id ",
      a->header().cluster_id(),
      "): the config lists its endpoints twice, or the two were made with one "
      "--initial-cluster-token; a rehome between them would delete the namespace. Fix the "
      "config (or give each cluster its own token); nothing changed"));
}

absl::Status Rehomer::Remove(Cluster& c, const std::string& ns, etcd::Deadline d) {
  pb::RangeRequest r;
  r.set_key(keyspace::SessionPrefix(ns));
  r.set_range_end(keyspace::PrefixEnd(keyspace::SessionPrefix(ns)));
  r.set_keys_only(true);
  HF_ASSIGN_OR_RETURN(auto sessions, c.etcd->RangeSync(r, d));
  for (const auto& kv : sessions.kvs()) {
    auto lease = keyspace::ParseSessionKey(kv.key(), ns);
    if (lease) HF_RETURN_IF_ERROR(RevokeSync(*c.etcd, *lease, d));
  }
  pb::TxnRequest txn;
  txn.add_success()->mutable_request_delete_range()->set_key(keyspace::NamespaceKey(ns));
  auto* sub = txn.add_success()->mutable_request_delete_range();
  sub->set_key(keyspace::NamespacePrefix(ns));
  sub->set_range_end(keyspace::PrefixEnd(keyspace::NamespacePrefix(ns)));
  HF_ASSIGN_OR_RETURN(auto t, c.etcd->TxnSync(std::move(txn), d));
  (void)t;
  return absl::OkStatus();
}

absl::Status Rehomer::Undrain(Cluster& from, const std::string& ns, etcd::Deadline d) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    HF_ASSIGN_OR_RETURN(NsState s, ReadNs(from, ns, d));
    if (!s.exists || (s.rec.draining_to().empty() && !s.rec.moved())) return absl::OkStatus();
    records::NamespaceRecord rec = s.rec;
    rec.clear_draining_to();
    rec.clear_moved();
    pb::TxnRequest txn;
    AddCompare(&txn, keyspace::NamespaceKey(ns), pb::Compare::MOD, pb::Compare::EQUAL)
        ->set_mod_revision(s.mod_revision);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(keyspace::NamespaceKey(ns));
    put->set_value(rec.SerializeAsString());
    HF_ASSIGN_OR_RETURN(auto t, from.etcd->TxnSync(std::move(txn), d));
    if (t.succeeded()) return absl::OkStatus();
  }
  return absl::AbortedError(absl::StrCat("namespace \"", ns, "\" kept changing; run the command again"));
}

absl::Status Rehomer::RollBack(const std::string& ns, Placed placed, etcd::Deadline d) {
  if (!placed.rec->rehome().aborting()) {
    // Marked first: from here no forward step of a command still running can
    // commit (each compares the record), so none follows what is undone below.
    records::PlacementRecord marked = *placed.rec;
    marked.mutable_rehome()->set_aborting(true);
    HF_RETURN_IF_ERROR(WritePlacement(ns, placed, marked, d));
    HF_ASSIGN_OR_RETURN(placed, ReadPlacement(ns, d));
    if (!placed.rec || !placed.rec->has_rehome() || !placed.rec->rehome().aborting()) {
      return absl::AbortedError(absl::StrCat(
          "the placement of namespace \"", ns, "\" changed meanwhile; run the command again"));
    }
    MaybeExit(kRehomeAbortMarked);
  }
  const records::RehomeState st = placed.rec->rehome();
  Cluster* from = clusters_->Named(st.from());
  Cluster* to = clusters_->Named(st.to());
  if (from == nullptr || to == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the rehome of \"", ns, "\" names a cluster this holdfastd does not have (\"", st.from(),
        "\" or \"", st.to(), "\"); fix the config"));
  }
  // The target may hold a partial copy from the copy step.
  if (st.phase() >= kRehomeEpochReady) HF_RETURN_IF_ERROR(Remove(*to, ns, d));
  HF_RETURN_IF_ERROR(Undrain(*from, ns, d));
  std::optional<records::PlacementRecord> back;
  if (!st.placement_was_absent()) {
    back.emplace();
    back->set_home(st.from());
  }
  return WritePlacement(ns, placed, back, d);
}

absl::StatusOr<v1::RehomeNamespaceResponse> Rehomer::Rehome(
    const lock::Caller& caller, const v1::RehomeNamespaceRequest& req,
    const std::function<bool()>& cancelled, std::chrono::steady_clock::time_point call_deadline) {
  const std::string& ns = req.name();
  HF_RETURN_IF_ERROR(keyspace::ValidateNamespaceName(ns));
  if (req.deadline_ms() < 0 || req.deadline_ms() > 24 * 3600 * 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("deadline ", req.deadline_ms(), "ms is out of range (0 to 24h)"));
  }
  if (req.force()) {
    // Force needs two people (ARCHITECTURE §8), and a rehome is asked by one.
    return absl::InvalidArgumentError(absl::StrCat(
        "a rehome does not force holds open: force-release needs two admins. Release a hold "
        "that will not end with `holdfast force request ", ns,
        "/KEY --reason ...` and a second admin's `holdfast force approve ID`, then run the "
        "rehome again; nothing changed"));
  }
  v1::RehomeNamespaceResponse out;
  out.set_name(ns);
  if (clusters_->placements() == nullptr) {
    // One cluster: there is nowhere to move to. Still say which error applies.
    HF_RETURN_IF_ERROR(
        clusters_->control().registry->GetNamespace(ns, Step()).status());
    if (req.abort()) {
      return absl::FailedPreconditionError(
          absl::StrCat("no rehome of namespace \"", ns, "\" is in progress; nothing to abort"));
    }
    if (req.to() == clusters_->control().name()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "namespace \"", ns, "\" is already homed on cluster \"", req.to(), "\"; nothing changed"));
    }
    return absl::NotFoundError(absl::StrCat("no etcd cluster named \"", req.to(),
                                            "\" (this holdfastd has one: \"",
                                            clusters_->control().name(), "\"); nothing changed"));
  }
  HF_ASSIGN_OR_RETURN(Placed placed, ReadPlacement(ns, Step()));
  const bool in_progress = placed.rec && placed.rec->has_rehome();

  if (req.abort()) {
    if (!in_progress) {
      return absl::FailedPreconditionError(
          absl::StrCat("no rehome of namespace \"", ns, "\" is in progress; nothing to abort"));
    }
    const auto& st = placed.rec->rehome();
    if (st.phase() >= kRehomeFlipped) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the rehome of \"", ns, "\" to \"", st.to(), "\" has already flipped the home; finish it "
          "with `holdfast ns rehome ", ns, " --to ", st.to(), "`"));
    }
    out.set_from(st.from());
    out.set_to(st.to());
    HF_RETURN_IF_ERROR(RollBack(ns, placed, Step()));
    out.set_aborted(true);
    return out;
  }

  if (in_progress) {
    const auto& st = placed.rec->rehome();
    if (st.aborting()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the rehome of \"", ns, "\" to \"", st.to(), "\" is being rolled back (an abort began "
          "and did not finish): finish the roll-back with `holdfast ns rehome ", ns, " --to ",
          st.to(), " --abort`, then start again; nothing changed"));
    }
    if (st.to() != req.to()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a rehome of \"", ns, "\" to \"", st.to(), "\" is in progress (", PhaseName(st.phase()),
          "); finish it with `holdfast ns rehome ", ns, " --to ", st.to(),
          "` or roll it back with `holdfast ns rehome ", ns, " --to ", st.to(), " --abort`"));
    }
    out.set_resumed(true);
  } else {
    const std::string home = placed.rec && !placed.rec->home().empty()
                                 ? placed.rec->home()
                                 : clusters_->control().name();
    Cluster* from = clusters_->Named(home);
    if (from == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "namespace \"", ns, "\" is homed on cluster \"", home,
          "\", which this holdfastd's config does not list"));
    }
    // The namespace must exist (checked before the target: NOT_FOUND either way).
    HF_RETURN_IF_ERROR(from->registry->GetNamespace(ns, Step()).status());
    if (clusters_->Named(req.to()) == nullptr) {
      return absl::NotFoundError(absl::StrCat("no etcd cluster named \"", req.to(),
                                              "\" (clusters: ", clusters_->Names(),
                                              "); nothing changed"));
    }
    if (req.to() == home) {
      return absl::InvalidArgumentError(absl::StrCat(
          "namespace \"", ns, "\" is already homed on cluster \"", home, "\"; nothing changed"));
    }
    HF_RETURN_IF_ERROR(Distinct(*from, *clusters_->Named(req.to()), Step()));
    records::PlacementRecord rec;
    rec.set_home(home);
    auto* st = rec.mutable_rehome();
    st->set_from(home);
    st->set_to(req.to());
    st->set_phase(kRehomeDraining);
    st->set_actor(caller.identity);
    st->set_started_at_unix_ms(lock::NowUnixMs());
    st->set_placement_was_absent(!placed.rec.has_value());
    HF_RETURN_IF_ERROR(WritePlacement(ns, placed, rec, Step()));
    HF_ASSIGN_OR_RETURN(placed, ReadPlacement(ns, Step()));
  }

  records::RehomeState st = placed.rec->rehome();
  Cluster* from = clusters_->Named(st.from());
  Cluster* to = clusters_->Named(st.to());
  if (from == nullptr || to == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the rehome of \"", ns, "\" names a cluster this holdfastd does not have (\"", st.from(),
        "\" or \"", st.to(), "\"); fix the config"));
  }
  // A resumed rehome too (a new one was checked before its first write): the
  // config may have changed since it began (after the flip, removing the old home
  // would delete the namespace just the same).
  if (out.resumed()) HF_RETURN_IF_ERROR(Distinct(*from, *to, Step()));
  out.set_from(st.from());
  out.set_to(st.to());
  // Advances to the next phase: the record first, so a crash resumes from it.
  auto advance = [&](int32_t phase, std::optional<std::string> home = std::nullopt)
      -> absl::Status {
    records::PlacementRecord rec = *placed.rec;
    rec.mutable_rehome()->set_phase(phase);
    if (home) rec.set_home(*home);
    HF_RETURN_IF_ERROR(WritePlacement(ns, placed, rec, Step()));
    HF_ASSIGN_OR_RETURN(placed, ReadPlacement(ns, Step()));
    st = placed.rec->rehome();
    MaybeExit(phase);
    return absl::OkStatus();
  };

  if (st.phase() == kRehomeDraining) {
    HF_RETURN_IF_ERROR(Drain(*from, ns, st.to(), Step()));
    MaybeExit(kRehomeDraining);
    const auto wait = req.deadline_ms() > 0 ? std::chrono::milliseconds(req.deadline_ms())
                                            : options_.default_deadline;
    const auto started = std::chrono::steady_clock::now();
    auto until = started + wait;
    // The call's own deadline comes first when it waited for a thread.
    const bool call_first = call_deadline - started < wait + kAfterTheDrain;
    if (call_first) until = std::max(started, call_deadline - kAfterTheDrain);
    while (true) {
      // Still this rehome's turn: not rolled back (--abort) or finished by
      // another call meanwhile.
      HF_ASSIGN_OR_RETURN(Placed now, ReadPlacement(ns, Step()));
      if (now.mod_revision != placed.mod_revision) {
        // Rolled back (or being rolled back): this command's drain may have
        // landed after the abort undrained `from`, and would stay. Undrained
        // again, unless another rehome has begun since.
        if (!now.rec || !now.rec->has_rehome() || now.rec->rehome().aborting()) {
          (void)Undrain(*from, ns, Step());
        }
        return absl::AbortedError(absl::StrCat(
            "the rehome of \"", ns, "\" to \"", st.to(),
            "\" was rolled back or taken over by another command while it waited for holds; "
            "this one stopped (`holdfast ns get ", ns, "` shows where it stands)"));
      }
      if (cancelled()) {
        return absl::CancelledError(absl::StrCat(
            "the rehome of \"", ns, "\" stopped waiting for holds: its caller has gone. It stays "
            "draining; run the same command again to finish it, or add --abort to roll it back"));
      }
      HF_ASSIGN_OR_RETURN(auto holds, Holds(*from, ns, Step()));
      if (holds.empty()) {
        absl::Status sealed = Seal(*from, ns, st.to(), Step());
        if (sealed.ok()) break;
        if (sealed.code() != absl::StatusCode::kFailedPrecondition) return sealed;
        continue;  // a hold committed meanwhile: wait for it too
      }
      if (std::chrono::steady_clock::now() >= until) {
        HF_RETURN_IF_ERROR(RollBack(ns, placed, Step()));
        const std::string waited =
            call_first ? absl::StrCat(
                             "after ",
                             std::chrono::duration_cast<std::chrono::milliseconds>(until - started)
                                 .count(),
                             "ms, all the time the call's own deadline left for the wait (a "
                             "rehome call needs its deadline_ms and 15s more, for the steps "
                             "after the wait: the caller's deadline was shorter, or the call "
                             "waited for a thread behind eight rehomes)")
                       : absl::StrCat("after the deadline of ", wait.count(), "ms");
        return absl::FailedPreconditionError(absl::StrCat(
            holds.size(), " hold(s) of namespace \"", ns, "\" remain on cluster \"", st.from(),
            "\" ", waited,
            "; the rehome is rolled back and nothing changed. Wait for them to end (`holdfast "
            "holders ", ns, "/KEY` shows who holds), or have them force-released (`holdfast "
            "force request`, approved by a second admin), then run it again"));
      }
      std::this_thread::sleep_for(options_.poll);
    }
    HF_RETURN_IF_ERROR(advance(kRehomeSealed));
  }
  if (st.phase() == kRehomeSealed) {
    HF_ASSIGN_OR_RETURN(auto epoch, EnsureEpoch(*from, *to, caller.identity, Step()));
    placed.rec->mutable_rehome()->set_target_epoch(epoch.first);
    out.set_epoch_advanced(epoch.second);
    HF_RETURN_IF_ERROR(advance(kRehomeEpochReady));
  }
  if (st.phase() == kRehomeEpochReady) {
    HF_RETURN_IF_ERROR(Copy(*from, *to, ns, Step()));
    HF_RETURN_IF_ERROR(advance(kRehomeCopied));
  }
  if (st.phase() == kRehomeCopied) {
    HF_RETURN_IF_ERROR(advance(kRehomeFlipped, st.to()));
  }
  if (st.phase() == kRehomeFlipped) {
    HF_RETURN_IF_ERROR(Remove(*from, ns, Step()));
    std::optional<records::PlacementRecord> done;
    if (st.to() != clusters_->control().name()) {
      done.emplace();
      done->set_home(st.to());
    }
    out.set_epoch(st.target_epoch());
    HF_RETURN_IF_ERROR(WritePlacement(ns, placed, done, Step()));
  }
  return out;
}

}  // namespace holdfast::server
