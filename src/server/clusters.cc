#include "server/clusters.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "etcd/watch_hub.h"
#include "lock/keyspace.h"

namespace holdfast::server {

namespace pb = ::etcdserverpb;

// --- Placements --------------------------------------------------------------

absl::Status Placements::Load(etcd::Deadline d) {
  pb::RangeRequest r;
  r.set_key(keyspace::PlacementPrefix());
  r.set_range_end(keyspace::PrefixEnd(keyspace::PlacementPrefix()));
  auto got = etcd_->RangeSync(r, d);
  if (!got.ok()) return got.status();
  uint64_t generation;
  etcd::WatchId old = 0;
  {
    absl::MutexLock l(&mu_);
    entries_.clear();
    deletions_.clear();
    for (const auto& kv : got->kvs()) {
      auto ns = keyspace::ParsePlacementKey(kv.key());
      records::PlacementRecord rec;
      if (!ns || !rec.ParseFromString(kv.value())) continue;
      entries_[*ns] = Entry{rec, kv.mod_revision()};
    }
    generation = ++generation_;
    stale_ = false;
    cluster_id_ = got->header().cluster_id();
    watched_ = got->header().revision();
    std::swap(old, watch_);
  }
  if (old != 0) etcd_->watches().Cancel(old);
  etcd::WatchSpec spec;
  spec.key = keyspace::PlacementPrefix();
  spec.range_end = keyspace::PrefixEnd(keyspace::PlacementPrefix());
  spec.start_revision = got->header().revision() + 1;
  etcd::WatchId id = etcd_->watches().Watch(
      spec, [this, generation](absl::StatusOr<etcd::WatchBatch> batch) {
        OnWatch(generation, std::move(batch));
      });
  bool cancel = false;
  {
    absl::MutexLock l(&mu_);
    if (generation_ != generation) {
      cancel = true;
    } else {
      watch_ = id;
    }
  }
  if (cancel) etcd_->watches().Cancel(id);
  return absl::OkStatus();
}

void Placements::OnWatch(uint64_t generation, absl::StatusOr<etcd::WatchBatch> batch) {
  absl::MutexLock l(&mu_);
  if (generation != generation_) return;
  if (!batch.ok() || (batch->cluster_id != 0 && batch->cluster_id != cluster_id_)) {
    stale_ = true;  // the replica's guard loop loads again
    return;
  }
  for (const auto& ev : batch->events) {
    watched_ = std::max(watched_, ev.kv().mod_revision());
    auto ns = keyspace::ParsePlacementKey(ev.kv().key());
    if (!ns) continue;
    if (ev.type() == mvccpb::Event::DELETE) {
      ApplyLocked(*ns, std::nullopt, ev.kv().mod_revision());
      continue;
    }
    records::PlacementRecord rec;
    if (rec.ParseFromString(ev.kv().value())) ApplyLocked(*ns, rec, ev.kv().mod_revision());
  }
  while (!deletions_.empty() && deletions_.begin()->first <= watched_) {
    auto it = entries_.find(deletions_.begin()->second);
    if (it != entries_.end() && !it->second.rec && it->second.revision <= watched_) {
      entries_.erase(it);
    }
    deletions_.erase(deletions_.begin());
  }
}

void Placements::ApplyLocked(const std::string& ns, std::optional<records::PlacementRecord> rec,
                             int64_t revision) {
  auto& e = entries_[ns];
  if (revision < e.revision) return;  // older than what this replica noted
  if (rec && !rec->home().empty() && !known_.count(rec->home()) &&
      !(e.rec && e.rec->home() == rec->home())) {
    std::fprintf(stderr,
                 "holdfastd: WARNING: namespace \"%s\" is homed on cluster \"%s\", which this "
                 "holdfastd's config does not list: its calls reach the control cluster, which "
                 "answers that it does not exist. List that cluster (every replica must list "
                 "the same clusters under the same names)\n",
                 ns.c_str(), rec->home().c_str());
  }
  if (!rec) deletions_.emplace(revision, ns);
  e.rec = std::move(rec);
  e.revision = revision;
}

void Placements::Note(const std::string& ns, std::optional<records::PlacementRecord> rec,
                      int64_t revision) {
  absl::MutexLock l(&mu_);
  if (revision <= watched_) return;  // applied already, or something later
  ApplyLocked(ns, std::move(rec), revision);
}

size_t Placements::kept() const {
  absl::MutexLock l(&mu_);
  return entries_.size();
}

void Placements::MarkStale() {
  absl::MutexLock l(&mu_);
  stale_ = true;
  // The restored cluster's revisions went back: this replica's own writes
  // until the next Load come at revisions below those the watch passed, and
  // are noted (those of a namespace whose entry is of a higher, lost revision
  // still wait for the Load).
  watched_ = 0;
}

bool Placements::stale() const {
  absl::MutexLock l(&mu_);
  return stale_;
}

void Placements::Stop() {
  etcd::WatchId id = 0;
  {
    absl::MutexLock l(&mu_);
    ++generation_;
    std::swap(id, watch_);
  }
  if (id != 0) etcd_->watches().Cancel(id);
}

std::string Placements::HomeOf(const std::string& ns) const {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(ns);
  if (it == entries_.end() || !it->second.rec || it->second.rec->home().empty()) {
    return control_name_;
  }
  return it->second.rec->home();
}

std::optional<records::PlacementRecord> Placements::Get(const std::string& ns) const {
  absl::MutexLock l(&mu_);
  auto it = entries_.find(ns);
  if (it == entries_.end()) return std::nullopt;
  return it->second.rec;
}

std::map<std::string, records::PlacementRecord> Placements::All() const {
  absl::MutexLock l(&mu_);
  std::map<std::string, records::PlacementRecord> out;
  for (const auto& [ns, e] : entries_) {
    if (e.rec) out[ns] = *e.rec;
  }
  return out;
}

// --- ClusterSet --------------------------------------------------------------

ClusterSet::ClusterSet(std::vector<std::unique_ptr<Cluster>> clusters,
                       std::unique_ptr<Placements> placements)
    : clusters_(std::move(clusters)), placements_(std::move(placements)) {
  for (auto& c : clusters_) {
    if (c->config.control && control_ == nullptr) control_ = c.get();
  }
  if (control_ == nullptr) control_ = clusters_.front().get();
}

Cluster* ClusterSet::Named(const std::string& name) const {
  for (const auto& c : clusters_) {
    if (c->name() == name) return c.get();
  }
  return nullptr;
}

Cluster& ClusterSet::Home(const std::string& ns) const {
  if (placements_ == nullptr) return *control_;
  Cluster* c = Named(placements_->HomeOf(ns));
  return c != nullptr ? *c : *control_;
}

Route ClusterSet::RouteFor(const std::string& ns) const {
  Cluster& c = Home(ns);
  return Route{c.engine.get(), c.op_quota.get()};
}

absl::StatusOr<Cluster*> ClusterSet::ForTier(const std::string& tier) const {
  // (With one cluster too: a tier it does not have is a mistake in the request,
  // and a record naming it would send the namespace nowhere once more clusters
  // are configured.)
  if (tier.empty()) return control_;
  for (const auto& c : clusters_) {
    if (c->config.tier == tier) return c.get();
  }
  std::vector<std::string> tiers;
  for (const auto& c : clusters_) {
    if (!c->config.tier.empty()) tiers.push_back(c->config.tier);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "no etcd cluster of tier \"", tier, "\" is configured (tiers: ",
      tiers.empty() ? "none" : absl::StrJoin(tiers, ", "), ")"));
}

std::string ClusterSet::Names() const {
  std::vector<std::string> names;
  for (const auto& c : clusters_) names.push_back(c->name());
  return absl::StrJoin(names, ", ");
}

}  // namespace holdfast::server
