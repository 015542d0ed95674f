// Identity and tenancy over real mTLS (ARCHITECTURE §9): certificates from a test
// CA carry SPIFFE IDs; holdfastd refuses what the SVID rules and the namespace
// policy refuse, and a session serves only the identity that opened it.
#include <atomic>
#include <fstream>
#include <future>
#include <limits>
#include <thread>

#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "absl/strings/str_cat.h"
#include "dev/certs.h"
#include "dev/http_get.h"
#include "harness/cluster.h"
#include "holdfast/v1/lock.grpc.pb.h"
#include "lock/keyspace.h"
#include "lock/records.pb.h"
#include "server/auth.h"
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include "holdfast/v1/session.grpc.pb.h"

namespace holdfast {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
namespace pb = ::etcdserverpb;

class IdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::TestCluster::Options o;
    o.tls = true;
    o.replicas = replicas_;
    auto c = testing::TestCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    ASSERT_TRUE(cluster_->CreateNamespace("default").ok());
    ASSERT_TRUE(cluster_->MakeIdentity("alice", "spiffe://test.holdfast/team/alice").ok());
    ASSERT_TRUE(cluster_->MakeIdentity("bob", "spiffe://test.holdfast/team/bob").ok());
  }

  std::unique_ptr<Client> As(const std::string& who) { return std::move(*cluster_->NewClientAs(who)); }

  // A TLS channel to holdfastd with `who`'s certificate, made like the client
  // library makes it, for the raw API.
  std::shared_ptr<grpc::Channel> RawChannel(const std::string& who, int replica = 0) {
    grpc::experimental::TlsChannelCredentialsOptions topts;
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        cluster_->certs_dir() + "/" + who + "_key.pem", cluster_->certs_dir() + "/" + who + ".pem",
        cluster_->certs_dir() + "/ca.pem", 10);
    topts.set_certificate_provider(provider);
    topts.watch_root_certs();
    topts.watch_identity_key_cert_pairs();
    return grpc::CreateChannel(cluster_->endpoint(replica),
                               grpc::experimental::TlsCredentials(topts));
  }

  // One KeepAlive request on a new stream, and its answer.
  static v1::KeepAliveResponse KeepAliveOnce(v1::Session::Stub* stub, const std::string& ns,
                                             int64_t session) {
    grpc::ClientContext ctx;
    auto stream = stub->KeepAlive(&ctx);
    v1::KeepAliveRequest ka;
    ka.set_namespace_(ns);
    ka.set_session_id(session);
    ka.set_sequence(1);
    v1::KeepAliveResponse answer;
    EXPECT_TRUE(stream->Write(ka));
    EXPECT_TRUE(stream->Read(&answer));
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
    return answer;
  }

  int64_t Revision() {
    pb::RangeRequest r;
    r.set_key("/holdfast/epoch");
    auto resp = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    return resp.ok() ? resp->header().revision() : -1;
  }

  int replicas_ = 1;
  std::unique_ptr<testing::TestCluster> cluster_;
};

TEST_F(IdentityTest, CallersWithoutAnAcceptableCertificateAreRefused) {
  ASSERT_TRUE(cluster_->MakeIdentity("stranger", "spiffe://test.holdfast/x", /*other_ca=*/true).ok());
  ASSERT_TRUE(cluster_->MakeIdentity("expired", "spiffe://test.holdfast/x", false, /*expired=*/true).ok());
  ASSERT_TRUE(cluster_->MakeIdentity("evil", "spiffe://evil.org/x").ok());
  ASSERT_TRUE(cluster_->MakeIdentity("nouri", "").ok());
  int64_t rev = Revision();
  for (const std::string who : {"", "stranger", "expired"}) {
    // The TLS handshake fails; the call gives up at its deadline.
    auto s = (*cluster_->NewClientAs(who, 0, std::chrono::seconds(1)))->OpenSession("default");
    ASSERT_FALSE(s.ok()) << who;
  }
  auto evil = As("evil")->OpenSession("default");
  EXPECT_EQ(evil.status().code(), absl::StatusCode::kUnauthenticated) << evil.status();
  EXPECT_NE(evil.status().message().find("trust domain \"evil.org\""), std::string::npos);
  auto nouri = As("nouri")->OpenSession("default");
  EXPECT_EQ(nouri.status().code(), absl::StatusCode::kUnauthenticated) << nouri.status();
  EXPECT_NE(nouri.status().message().find("exactly one URI SAN"), std::string::npos);
  EXPECT_EQ(Revision(), rev);
  // A plaintext client gets nowhere either.
  ClientOptions plain;
  plain.endpoints = {cluster_->endpoint()};
  plain.rpc_timeout = seconds(2);
  EXPECT_FALSE((*Client::Connect(plain))->OpenSession("default").ok());
}

TEST_F(IdentityTest, ASessionServesOnlyTheIdentityThatOpenedIt) {
  auto alice = As("alice");
  auto bob = As("bob");
  auto session = std::move(*alice->OpenSession("default"));
  auto hold = session->Acquire("db");
  ASSERT_TRUE(hold.ok()) << hold.status();
  EXPECT_EQ(hold->info().identity(), "spiffe://test.holdfast/team/alice");

  // Bob, with alice's session id and token, through the raw API.
  auto creds_client = As("bob");  // (keeps bob's channel credentials in use below)
  int64_t rev = Revision();
  v1::ReleaseRequest rel;
  rel.set_namespace_("default");
  rel.set_session_id(session->id());
  rel.set_lock_key("db");
  rel.set_token(hold->token());
  // Bob's Session API cannot name alice's session, so use Describe/CheckToken and
  // the Lock stub through a TLS channel made like the client library makes it.
  auto channel = RawChannel("bob");
  auto lock_stub = v1::Lock::NewStub(channel);
  auto session_stub = v1::Session::NewStub(channel);
  {
    grpc::ClientContext ctx;
    v1::ReleaseResponse resp;
    auto s = lock_stub->Release(&ctx, rel, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_NE(s.error_message().find("belongs to another identity"), std::string::npos);
  }
  {
    grpc::ClientContext ctx;
    v1::AcquireRequest acq;
    acq.set_namespace_("default");
    acq.set_session_id(session->id());
    acq.set_lock_key("other");
    v1::AcquireResponse resp;
    EXPECT_EQ(lock_stub->Acquire(&ctx, acq, &resp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext ctx;
    v1::CloseSessionRequest close;
    close.set_namespace_("default");
    close.set_session_id(session->id());
    v1::CloseSessionResponse resp;
    EXPECT_EQ(session_stub->Close(&ctx, close, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    auto answer = KeepAliveOnce(session_stub.get(), "default", session->id());
    EXPECT_TRUE(answer.lost());  // not renewed for bob
    EXPECT_EQ(answer.ttl_ms(), 0);
    EXPECT_NE(answer.reason().find("belongs to another identity"), std::string::npos);
  }
  EXPECT_EQ(Revision(), rev);  // nothing changed
  EXPECT_FALSE(hold->lost());
  EXPECT_TRUE(hold->Release().ok());  // alice can
}

// Through a replica that has not seen the session, a caller naming another
// identity's session is refused after reading it, and that session's place in the
// queue is not touched.
class IdentityReplicasTest : public IdentityTest {
 protected:
  IdentityReplicasTest() { replicas_ = 2; }
};

TEST_F(IdentityReplicasTest, ACallerNamingAnothersSessionLeavesItsWaiterInPlace) {
  auto alice = As("alice");
  auto held = std::move(*alice->OpenSession("default"));
  auto waiting = std::move(*alice->OpenSession("default"));
  auto h = held->Acquire("q");
  ASSERT_TRUE(h.ok()) << h.status();
  auto w = std::async(std::launch::async,
                      [&] { return waiting->Acquire("q", testing::Waiting(seconds(30))); });
  auto queued = [&] {
    auto d = alice->Describe("default", "q");
    return d.ok() && d->waiters_size() == 1 ? d->waiters(0).create_revision() : int64_t{0};
  };
  int64_t at = 0;
  for (int i = 0; i < 500 && at == 0; ++i) {
    at = queued();
    if (at == 0) std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_GT(at, 0) << "the waiter never queued";

  auto lock_stub = v1::Lock::NewStub(RawChannel("bob", /*replica=*/1));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  v1::AcquireRequest acq;
  acq.set_namespace_("default");
  acq.set_session_id(waiting->id());
  acq.set_lock_key("q");
  acq.set_wait_ms(5000);
  v1::AcquireResponse resp;
  auto s = lock_stub->Acquire(&ctx, acq, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_EQ(queued(), at);  // the same waiter, still queued
  ASSERT_TRUE(h->Release().ok());  // alice's waiter gets the key
  auto got = w.get();
  EXPECT_TRUE(got.ok()) << got.status();
}

// holdfastd knows the sessions it opened (lock/session_owners.h) and renews them
// without reading etcd; a keepalive that names another namespace than the
// session's, or a session that has ended, still renews nothing.
TEST_F(IdentityTest, AKeepAliveRenewsOnlyALiveSessionInItsOwnNamespace) {
  ASSERT_TRUE(cluster_->CreateNamespace("other").ok());
  auto alice = As("alice");
  auto session = std::move(*alice->OpenSession("default"));
  auto stub = v1::Session::NewStub(RawChannel("alice"));
  const int64_t rev = Revision();

  auto elsewhere = KeepAliveOnce(stub.get(), "other", session->id());
  EXPECT_TRUE(elsewhere.lost());
  EXPECT_EQ(elsewhere.ttl_ms(), 0);
  EXPECT_NE(elsewhere.reason().find("not found in namespace \"other\""), std::string::npos)
      << elsewhere.reason();
  EXPECT_EQ(Revision(), rev);  // nothing changed
  EXPECT_FALSE(session->lost());

  auto own = KeepAliveOnce(stub.get(), "default", session->id());
  EXPECT_FALSE(own.lost()) << own.reason();
  EXPECT_FALSE(own.etcd_unavailable()) << own.reason();
  EXPECT_GT(own.ttl_ms(), 0);

  const int64_t id = session->id();
  ASSERT_TRUE(session->Close().ok());
  auto closed = KeepAliveOnce(stub.get(), "default", id);
  EXPECT_TRUE(closed.lost()) << closed.reason();
  EXPECT_EQ(closed.ttl_ms(), 0);
}

TEST_F(IdentityTest, NamespacePolicyAdmitsMembersAndAdminsOnly) {
  auto admin = cluster_->NewClient();
  v1::CreateNamespaceRequest req;
  req.mutable_namespace_()->set_name("team");
  req.mutable_namespace_()->add_members("spiffe://test.holdfast/team/alice");
  ASSERT_TRUE((*admin)->CreateNamespace(req).ok());
  EXPECT_TRUE(As("alice")->OpenSession("team").ok());
  int64_t rev = Revision();
  auto bob = As("bob")->OpenSession("team");
  EXPECT_EQ(bob.status().code(), absl::StatusCode::kPermissionDenied) << bob.status();
  EXPECT_NE(bob.status().message().find("spiffe://test.holdfast/team/bob may not use namespace "
                                        "\"team\": it does not exist, or it does not list "
                                        "this identity as a member"),
            std::string::npos)
      << bob.status();
  auto d = As("bob")->Describe("team", "k");
  EXPECT_EQ(d.status().code(), absl::StatusCode::kPermissionDenied);
  auto unknown = As("bob")->OpenSession("nope");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kPermissionDenied);
  // The Admin API is for admins.
  auto not_admin = As("alice")->ListNamespaces();
  EXPECT_EQ(not_admin.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(not_admin.status().message().find("is not an admin"), std::string::npos);
  EXPECT_EQ(Revision(), rev);
  EXPECT_TRUE((*admin)->OpenSession("team").ok());  // admins may use every namespace
  // A bad member pattern is refused.
  v1::CreateNamespaceRequest bad;
  bad.mutable_namespace_()->set_name("bad");
  bad.mutable_namespace_()->add_members("team/*");
  EXPECT_EQ((*admin)->CreateNamespace(bad).status().code(), absl::StatusCode::kInvalidArgument);
  // So is one in a trust domain this holdfastd does not accept: no caller from
  // there gets as far as the member list, so it would admit nobody.
  rev = Revision();
  const std::string foreign =
      "member pattern \"spiffe://partner.org/team/*\" is in trust domain \"partner.org\", which "
      "this holdfastd does not accept (tls.trust_domains: test.holdfast): it would admit nobody";
  bad.mutable_namespace_()->clear_members();
  bad.mutable_namespace_()->add_members("spiffe://test.holdfast/team/*");
  bad.mutable_namespace_()->add_members("spiffe://partner.org/team/*");
  auto created = (*admin)->CreateNamespace(bad);
  EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(created.status().message(), foreign);
  v1::UpdateNamespaceRequest update;
  update.set_name("team");
  update.set_set_members(true);
  update.add_members("spiffe://partner.org/team/*");
  auto updated = (*admin)->UpdateNamespace(update);
  EXPECT_EQ(updated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(updated.status().message(), foreign);
  EXPECT_EQ(Revision(), rev);
  auto team = (*admin)->GetNamespace("team");
  ASSERT_TRUE(team.ok()) << team.status();
  ASSERT_EQ(team->members_size(), 1);
  EXPECT_EQ(team->members(0), "spiffe://test.holdfast/team/alice");
  EXPECT_EQ((*admin)->GetNamespace("bad").status().code(), absl::StatusCode::kNotFound);
}

// A hand-over checks the waiter's identity against the namespace's members as
// they are at the release. A list changed since the waiter queued (a member
// removed with end_sessions_of_removed, in the moment before its waits are
// withdrawn: held still here by writing the new list straight into etcd) does
// not hand the key to an identity it leaves out: that waiter is refused on its
// own read, as a new ask would be, and leaves the queue; the key is left free.
// An admin waiting is handed the key whatever the list says.
TEST_F(IdentityTest, AHandOverChecksTheWaitersIdentityAgainstTheMembersAtTheRelease) {
  auto admin = cluster_->NewClient();
  ASSERT_TRUE(admin.ok()) << admin.status();
  v1::CreateNamespaceRequest req;
  req.mutable_namespace_()->set_name("team");
  req.mutable_namespace_()->add_members("spiffe://test.holdfast/team/alice");
  req.mutable_namespace_()->add_members("spiffe://test.holdfast/team/bob");
  ASSERT_TRUE((*admin)->CreateNamespace(req).ok());
  auto alice_client = As("alice"), bob_client = As("bob");
  auto bob = bob_client->OpenSession("team");
  auto alice = alice_client->OpenSession("team");
  auto admins = (*admin)->OpenSession("team");
  ASSERT_TRUE(bob.ok() && alice.ok() && admins.ok());
  auto held = (*bob)->Acquire("db");
  ASSERT_TRUE(held.ok()) << held.status();
  auto waited = std::async(std::launch::async,
                           [&] { return (*alice)->Acquire("db", {.wait = seconds(30)}); });
  auto queued = [&](int n) {
    for (int i = 0; i < 250; ++i) {
      auto d = (*admin)->Describe("team", "db");
      if (d.ok() && d->waiters_size() == n) return true;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  };
  ASSERT_TRUE(queued(1));

  pb::RangeRequest r;
  r.set_key(keyspace::NamespaceKey("team"));
  auto got = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(got.ok() && got->kvs_size() == 1) << got.status();
  records::NamespaceRecord rec;
  ASSERT_TRUE(rec.ParseFromString(got->kvs(0).value()));
  rec.clear_members();
  rec.add_members("spiffe://test.holdfast/team/bob");
  pb::PutRequest put;
  put.set_key(keyspace::NamespaceKey("team"));
  put.set_value(rec.SerializeAsString());
  ASSERT_TRUE(cluster_->etcd_client().PutSync(put, etcd::DeadlineIn(seconds(5))).ok());

  ASSERT_TRUE(held->Release().ok());
  auto answer = waited.get();
  ASSERT_FALSE(answer.ok()) << "handed to an identity the members leave out";
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kPermissionDenied) << answer.status();
  EXPECT_NE(answer.status().message().find(
                "spiffe://test.holdfast/team/alice may not use namespace \"team\""),
            std::string::npos)
      << answer.status();
  auto d = (*admin)->Describe("team", "db");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->holders_size(), 0);
  EXPECT_EQ(d->waiters_size(), 0);

  // An admin (not a member) waiting behind bob is handed the key: granted in
  // the release's commit (the one that put the audit mark), not on its own read.
  held = (*bob)->Acquire("db");
  ASSERT_TRUE(held.ok()) << held.status();
  auto admin_waited = std::async(std::launch::async,
                                 [&] { return (*admins)->Acquire("db", {.wait = seconds(30)}); });
  ASSERT_TRUE(queued(1));
  ASSERT_TRUE(held->Release().ok());
  auto admin_answer = admin_waited.get();
  ASSERT_TRUE(admin_answer.ok()) << admin_answer.status();
  d = (*admin)->Describe("team", "db");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->holders_size(), 1);
  EXPECT_EQ(d->holders(0).session_id(), (*admins)->id());
  pb::RangeRequest mark;
  mark.set_key(keyspace::AuditMarkKey());
  auto marked = cluster_->etcd_client().RangeSync(mark, etcd::DeadlineIn(seconds(5)));
  ASSERT_TRUE(marked.ok() && marked->kvs_size() == 1) << marked.status();
  EXPECT_EQ(d->holders(0).grant_revision(), marked->kvs(0).mod_revision())
      << "not handed over in the release's commit";
}

// A caller learns nothing of a namespace it may not use, not even whether it
// exists: every call naming one is answered alike for a namespace that exists and
// one that does not (the same code, the same message but for the name). Admins,
// who may use every namespace, are told that one does not exist.
TEST_F(IdentityTest, NamespacesACallerMayNotUseLookTheSameWhetherTheyExistOrNot) {
  auto admin = cluster_->NewClient();
  v1::CreateNamespaceRequest req;
  req.mutable_namespace_()->set_name("team");
  req.mutable_namespace_()->add_members("spiffe://test.holdfast/team/alice");
  ASSERT_TRUE((*admin)->CreateNamespace(req).ok());
  auto alice = As("alice");
  auto session = alice->OpenSession("team");
  ASSERT_TRUE(session.ok()) << session.status();
  auto hold = (*session)->Acquire("k");
  ASSERT_TRUE(hold.ok()) << hold.status();
  const int64_t rev = Revision();

  auto channel = RawChannel("bob");
  auto lock_stub = v1::Lock::NewStub(channel);
  auto session_stub = v1::Session::NewStub(channel);
  // Each call bob can make naming `ns`: its code and its message with the name
  // taken out.
  auto answers = [&](const std::string& ns) {
    std::vector<std::pair<grpc::StatusCode, std::string>> out;
    auto note = [&](const std::string& call, const grpc::Status& s) {
      std::string msg = s.error_message();
      const std::string quoted = "\"" + ns + "\"";
      for (size_t at; (at = msg.find(quoted)) != std::string::npos;) msg.replace(at, quoted.size(), "NS");
      out.emplace_back(s.error_code(), call + ": " + msg);
    };
    {
      grpc::ClientContext ctx;
      v1::OpenSessionRequest open;
      open.set_namespace_(ns);
      open.set_ttl_ms(10000);
      v1::OpenSessionResponse resp;
      note("open", session_stub->Open(&ctx, open, &resp));
    }
    {
      grpc::ClientContext ctx;
      v1::AcquireRequest acq;
      acq.set_namespace_(ns);
      acq.set_session_id((*session)->id() + 1);  // no such session
      acq.set_lock_key("k");
      v1::AcquireResponse resp;
      note("acquire", lock_stub->Acquire(&ctx, acq, &resp));
    }
    {
      // A session that does not exist: the release reads the key to say why
      // nothing was released, and must not say more than the other calls.
      grpc::ClientContext ctx;
      v1::ReleaseRequest rel;
      rel.set_namespace_(ns);
      rel.set_session_id((*session)->id() + 1);
      rel.set_lock_key("k");
      rel.set_token(hold->token());
      v1::ReleaseResponse resp;
      note("release", lock_stub->Release(&ctx, rel, &resp));
    }
    // Naming alice's session (whose id bob may have guessed), and one that does
    // not exist: answered alike too, where the namespace does not exist.
    for (const int64_t id : {(*session)->id(), (*session)->id() + 1}) {
      const std::string which = id == (*session)->id() ? " (alice's)" : " (none)";
      {
        grpc::ClientContext ctx;
        v1::ReleaseRequest rel;
        rel.set_namespace_(ns);
        rel.set_session_id(id);
        rel.set_lock_key("k");
        rel.set_token(hold->token());
        v1::ReleaseResponse resp;
        note("release" + which, lock_stub->Release(&ctx, rel, &resp));
      }
      {
        grpc::ClientContext ctx;
        v1::CloseSessionRequest close;
        close.set_namespace_(ns);
        close.set_session_id(id);
        v1::CloseSessionResponse resp;
        note("close" + which, session_stub->Close(&ctx, close, &resp));
      }
      // A keepalive is answered on its stream: lost, with the reason.
      auto answer = KeepAliveOnce(session_stub.get(), ns, id);
      note("keepalive" + which,
           answer.lost() ? grpc::Status(grpc::StatusCode::PERMISSION_DENIED, answer.reason())
                         : grpc::Status(grpc::StatusCode::UNKNOWN, "not lost"));
    }
    {
      grpc::ClientContext ctx;
      v1::CheckTokenRequest check;
      check.set_namespace_(ns);
      check.set_lock_key("k");
      check.set_token(hold->token());
      v1::CheckTokenResponse resp;
      note("check", lock_stub->CheckToken(&ctx, check, &resp));
    }
    {
      grpc::ClientContext ctx;
      v1::DescribeRequest describe;
      describe.set_namespace_(ns);
      describe.set_lock_key("k");
      v1::DescribeResponse resp;
      note("describe", lock_stub->Describe(&ctx, describe, &resp));
    }
    return out;
  };
  const auto existing = answers("team");
  const auto missing = answers("nope");
  ASSERT_EQ(existing.size(), 11u);
  EXPECT_EQ(existing, missing);
  for (const auto& [code, msg] : existing) {
    EXPECT_EQ(code, grpc::StatusCode::PERMISSION_DENIED) << msg;
    EXPECT_NE(msg.find("spiffe://test.holdfast/team/bob may not use namespace NS: it does not "
                       "exist, or it does not list this identity as a member"),
              std::string::npos)
        << msg;
  }
  EXPECT_EQ(Revision(), rev);  // nothing changed
  auto still = alice->Describe("team", "k");
  ASSERT_TRUE(still.ok()) << still.status();
  ASSERT_EQ(still->holders_size(), 1);
  EXPECT_EQ(still->holders(0).token(), hold->token());

  // An admin is told plainly.
  auto told = (*admin)->OpenSession("nope");
  EXPECT_EQ(told.status().code(), absl::StatusCode::kNotFound) << told.status();
  EXPECT_NE(told.status().message().find("namespace \"nope\" does not exist"), std::string::npos)
      << told.status();
  auto described = (*admin)->Describe("nope", "k");
  EXPECT_EQ(described.status().code(), absl::StatusCode::kNotFound) << described.status();
}

// Taking an identity out of a namespace's members: refused while that identity
// has live sessions there (the error names it; nothing changes), unless the
// change is asked to end them. Even then one admin never forces a lock open: a
// session of that identity that holds a lock makes the change fail, naming the
// hold, and nothing changes. Once two admins have force-released the hold, the
// change ends the session: its wait is withdrawn (its waiting call ends), its
// record, claims and quota slot go, and its lease is revoked. The other
// members' and the admins' sessions stay, and the removed identity's own calls
// are refused.
TEST_F(IdentityTest, RemovingAMemberEndsItsSessionsOnlyWhenAskedAndNeverForcesALockOpen) {
  auto admin = std::move(*cluster_->NewClient());
  ASSERT_TRUE(cluster_->MakeIdentity("admin2", "spiffe://test.holdfast/ops/second").ok());
  auto admin2 = As("admin2");
  v1::CreateNamespaceRequest create;
  create.mutable_namespace_()->set_name("team");
  create.mutable_namespace_()->set_held_lease_quota(10);
  create.mutable_namespace_()->add_members("spiffe://test.holdfast/team/alice");
  create.mutable_namespace_()->add_members("spiffe://test.holdfast/team/bob");
  ASSERT_TRUE(admin->CreateNamespace(create).ok());
  auto alice_client = As("alice");
  auto alice = std::move(*alice_client->OpenSession("team"));
  auto alice_hold = alice->Acquire("db");
  ASSERT_TRUE(alice_hold.ok()) << alice_hold.status();
  auto bob_client = As("bob");
  auto bob = std::move(*bob_client->OpenSession("team"));
  auto bob_hold = bob->Acquire("queue");
  ASSERT_TRUE(bob_hold.ok()) << bob_hold.status();
  auto admins = std::move(*admin->OpenSession("team"));  // admins are no members
  // Alice also waits for bob's key.
  absl::Status alice_wait_ended;
  std::thread alice_waits([&] {
    alice_wait_ended = alice->Acquire("queue", {.wait = seconds(60)}).status();
  });
  auto waiters_of_queue = [&] {
    auto d = admin->Describe("team", "queue");
    return d.ok() ? d->waiters_size() : -1;
  };
  for (int i = 0; i < 400 && waiters_of_queue() != 1; ++i) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_EQ(waiters_of_queue(), 1);

  v1::UpdateNamespaceRequest only_bob;
  only_bob.set_name("team");
  only_bob.set_set_members(true);
  only_bob.add_members("spiffe://test.holdfast/team/bob");
  int64_t rev = Revision();
  auto refused = admin->UpdateNamespace(only_bob);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find(
                "1 live session of namespace \"team\" belong to identities the new members do "
                "not admit (spiffe://test.holdfast/team/alice)"),
            std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("--end-sessions-of-removed"), std::string::npos);
  // The flag alone, without a new list, is refused too.
  v1::UpdateNamespaceRequest flag_alone;
  flag_alone.set_name("team");
  flag_alone.set_end_sessions_of_removed(true);
  auto bad = admin->UpdateNamespace(flag_alone);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_EQ(Revision(), rev);
  EXPECT_EQ((*admin->GetNamespace("team")).members_size(), 2);

  // With the flag, alice's hold of "db" still stops it: one admin may not force it open.
  only_bob.set_end_sessions_of_removed(true);
  auto holds_a_lock = admin->UpdateNamespace(only_bob);
  EXPECT_EQ(holds_a_lock.status().code(), absl::StatusCode::kFailedPrecondition)
      << holds_a_lock.status();
  EXPECT_NE(holds_a_lock.status().message().find(absl::StrCat(
                "(session ", alice->id(), " of spiffe://test.holdfast/team/alice holds \"db\"); "
                "ending them would force those locks open, which takes two admins")),
            std::string::npos)
      << holds_a_lock.status();
  EXPECT_NE(holds_a_lock.status().message().find("nothing changed"), std::string::npos);
  EXPECT_EQ(Revision(), rev);
  EXPECT_EQ((*admin->GetNamespace("team")).members_size(), 2);
  EXPECT_FALSE(alice_hold->lost());
  EXPECT_EQ(waiters_of_queue(), 1);

  auto keys_under = [&](const std::string& prefix) {
    pb::RangeRequest r;
    r.set_key(prefix);
    r.set_range_end(keyspace::PrefixEnd(prefix));
    auto got = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    EXPECT_TRUE(got.ok()) << got.status();
    std::vector<std::pair<std::string, std::string>> out;
    if (got.ok()) {
      for (const auto& kv : got->kvs()) out.emplace_back(kv.key(), kv.value());
    }
    return out;
  };
  // A waiter of alice's session for the key it holds (as a call from a stale
  // view puts), and a claim of neither a hold nor a waiter, both by hand.
  auto put_on_alices_lease = [&](const std::string& key, const std::string& value) {
    pb::PutRequest put;
    put.set_key(key);
    put.set_value(value);
    put.set_lease(alice->id());
    ASSERT_TRUE(cluster_->etcd_client().PutSync(put, etcd::DeadlineIn(seconds(5))).ok());
  };
  records::WaiterRecord stray;
  stray.set_identity("spiffe://test.holdfast/team/alice");
  stray.set_deadline_unix_ms(std::numeric_limits<int64_t>::max() / 2);
  put_on_alices_lease(keyspace::WaitKey("team", "db", alice->id()), stray.SerializeAsString());
  put_on_alices_lease(keyspace::ClaimKey("team", "ghost", alice->id()), "");

  // Two admins force it open; then the change goes through.
  v1::RequestForceReleaseRequest force;
  force.set_namespace_("team");
  force.set_lock_key("db");
  force.set_reason("alice leaves the team, ticket OPS-7");
  auto asked = admin->RequestForceRelease(force);
  ASSERT_TRUE(asked.ok()) << asked.status();
  v1::ApproveForceReleaseRequest approve;
  approve.set_request_id(asked->request_id());
  auto approved = admin2->ApproveForceRelease(approve);
  ASSERT_TRUE(approved.ok()) << approved.status();
  // The force took the session's waiter for the key with the hold and its claim
  // (a hand-over to it would give the session a hold without a claim).
  EXPECT_TRUE(keys_under(keyspace::WaitKey("team", "db", alice->id())).empty());

  auto changed = admin->UpdateNamespace(only_bob);
  ASSERT_TRUE(changed.ok()) << changed.status();
  ASSERT_EQ(changed->members_size(), 1);
  EXPECT_EQ(changed->members(0), "spiffe://test.holdfast/team/bob");
  // Alice's session, wait, claim and quota slot are gone from etcd at once.
  EXPECT_TRUE(keys_under(keyspace::SessionKey("team", alice->id())).empty());
  EXPECT_TRUE(keys_under(keyspace::ClaimPrefix("team", alice->id())).empty());
  auto waits = keys_under(keyspace::WaitPrefix("team"));
  EXPECT_TRUE(waits.empty()) << waits.size() << " waiters left";
  auto slots = keys_under(keyspace::SlotPrefix("team"));
  EXPECT_EQ(slots.size(), 2u);  // bob's and the admin's
  for (const auto& [key, value] : slots) EXPECT_NE(value, absl::StrCat(alice->id())) << key;
  auto holds = keys_under(keyspace::HoldPrefix("team", ""));
  ASSERT_EQ(holds.size(), 1u);  // bob's
  EXPECT_EQ(keyspace::ParseHoldKey(holds[0].first)->lease, bob->id());
  // Its lease is revoked: a renewal finds it gone.
  auto stub = v1::Session::NewStub(RawChannel("alice"));
  EXPECT_TRUE(KeepAliveOnce(stub.get(), "team", alice->id()).lost());
  // Alice's waiting call ends; bob's and the admin's sessions live on.
  alice_waits.join();
  EXPECT_FALSE(alice_wait_ended.ok());
  EXPECT_FALSE(bob_hold->lost());
  EXPECT_TRUE(bob->Acquire("db").ok());  // alice's key is free
  EXPECT_TRUE(admins->Acquire("other").ok());
  auto again = alice_client->OpenSession("team");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kPermissionDenied) << again.status();
}

// Sessions opened while the members change: once the change that takes an
// identity out returns, no session of that identity is left in the namespace,
// however the opens and the change interleave.
TEST_F(IdentityTest, ASessionOpenedDuringAMemberRemovalIsNotMissed) {
  auto admin = std::move(*cluster_->NewClient());
  auto alice_client = As("alice");
  for (int round = 0; round < 10; ++round) {
    const std::string ns = absl::StrCat("race-", round);
    v1::CreateNamespaceRequest create;
    create.mutable_namespace_()->set_name(ns);
    create.mutable_namespace_()->add_members("spiffe://test.holdfast/team/alice");
    ASSERT_TRUE(admin->CreateNamespace(create).ok());
    std::atomic<int> opened{0};
    std::vector<std::thread> openers;
    std::vector<std::vector<std::unique_ptr<Session>>> kept(2);
    for (int t = 0; t < 2; ++t) {
      openers.emplace_back([&, t] {
        for (;;) {
          auto s = alice_client->OpenSession(ns);
          if (!s.ok()) return;  // refused: the change is in
          kept[t].push_back(std::move(*s));
          ++opened;
        }
      });
    }
    while (opened.load() < 2 + round) std::this_thread::sleep_for(milliseconds(1));
    v1::UpdateNamespaceRequest only_bob;
    only_bob.set_name(ns);
    only_bob.set_set_members(true);
    only_bob.add_members("spiffe://test.holdfast/team/bob");
    only_bob.set_end_sessions_of_removed(true);
    auto changed = admin->UpdateNamespace(only_bob);
    ASSERT_TRUE(changed.ok()) << changed.status();
    pb::RangeRequest r;
    r.set_key(keyspace::SessionPrefix(ns));
    r.set_range_end(keyspace::PrefixEnd(keyspace::SessionPrefix(ns)));
    auto left = cluster_->etcd_client().RangeSync(r, etcd::DeadlineIn(seconds(5)));
    ASSERT_TRUE(left.ok());
    EXPECT_EQ(left->kvs_size(), 0) << "round " << round;
    for (auto& t : openers) t.join();
  }
}

// SVIDs are short-lived: holdfastd re-reads its certificate files every
// tls.refresh (1 s here) and new handshakes get the rotated certificate, with no
// restart; a client connecting afresh is served.
TEST_F(IdentityTest, ARotatedServerCertificateServesNewHandshakesAndAHalfRotationDoesNot) {
  const std::string dir = cluster_->certs_dir();
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto admin = dev::ReadPem(dir, "admin");
  ASSERT_TRUE(admin.ok()) << admin.status();
  const dev::HttpsClient tls{read(dir + "/ca.pem"), admin->cert, admin->key};
  const int port = cluster_->holdfastd().port();
  auto presented = [&] {
    auto got = dev::TlsServerCertificate(port, tls);
    return got.ok() ? *got : "error: " + got.status().ToString();
  };
  auto first = dev::ReadPem(dir, "server");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(presented(), first->cert);

  auto ca = dev::ReadPem(dir, "ca");
  ASSERT_TRUE(ca.ok()) << ca.status();
  dev::LeafOptions server;
  server.common_name = "holdfastd-rotated";
  server.dns = {"localhost"};
  server.ips = {"127.0.0.1"};
  server.uris = {"spiffe://test.holdfast/holdfastd"};
  auto second = dev::MakeLeaf(*ca, server);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(dev::WritePem(dir, "server", *second).ok());
  const auto until = std::chrono::steady_clock::now() + seconds(30);
  while (presented() != second->cert && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(presented(), second->cert);
  auto fresh = cluster_->NewClientAs("admin");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE((*fresh)->GetEpoch().ok());

  // A certificate written without its key (a rotation caught half done, or
  // one that went wrong) is not served: gRPC would take the pair as it is and
  // fail every new handshake. The previous pair serves on; holdfastd says why
  // and counts it; once the key follows, the new pair is served.
  auto third = dev::MakeLeaf(*ca, server);
  ASSERT_TRUE(third.ok()) << third.status();
  ASSERT_TRUE(dev::WriteFileAtomically(dir + "/server.pem", third->cert, 0644).ok());
  const std::string log = cluster_->dir() + "/holdfastd-0.log";
  const size_t log_before = read(log).size();  // what comes after the third cert
  auto said = [&] { return read(log).substr(log_before); };
  const auto said_until = std::chrono::steady_clock::now() + seconds(30);
  while (said().find("holdfastd: TLS: ERROR: the certificate files changed and cannot be "
                        "served, serving the previous ones until they are fixed: config: "
                        "tls.cert_file and tls.key_file do not belong together") ==
             std::string::npos &&
         std::chrono::steady_clock::now() < said_until) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_NE(said().find("tls.cert_file and tls.key_file do not belong together"),
            std::string::npos)
      << said();
  std::this_thread::sleep_for(seconds(3));  // past gRPC's own re-read (tls.refresh: 1 s)
  EXPECT_EQ(presented(), second->cert);
  auto again = cluster_->NewClientAs("admin");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->GetEpoch().ok());
  ASSERT_TRUE(dev::WriteFileAtomically(dir + "/server_key.pem", third->key, 0600).ok());
  const auto third_until = std::chrono::steady_clock::now() + seconds(30);
  while (presented() != third->cert && std::chrono::steady_clock::now() < third_until) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(presented(), third->cert);
}

// A client's certificate rotates under it: libholdfast reads its files every
// 2 s and gives gRPC copies that only a whole set replaces. A certificate
// written without its key is told (ClientOptions::on_tls_files) and not used:
// the client's next connection (holdfastd restarted) is made with the previous
// pair, where gRPC reading the files itself would present the new certificate
// with the old key and fail the handshake. Once the key follows, the next
// connection is made with the new pair (another identity here, so the server's
// answer tells which pair it saw).
TEST_F(IdentityTest, AClientsHalfRotatedCertificateIsNotUsedForItsNextConnection) {
  const std::string dir = cluster_->certs_dir();
  auto ca = dev::ReadPem(dir, "ca");
  ASSERT_TRUE(ca.ok()) << ca.status();
  dev::LeafOptions alice, admin;
  alice.uris = {"spiffe://test.holdfast/team/alice"};
  admin.uris = {"spiffe://test.holdfast/ops/rotated"};  // admin_ids: spiffe://test.holdfast/ops/*
  auto first = dev::MakeLeaf(*ca, alice), next = dev::MakeLeaf(*ca, admin);
  ASSERT_TRUE(first.ok() && next.ok());
  ASSERT_TRUE(dev::WritePem(dir, "rotating", *first).ok());

  absl::Mutex mu;
  std::vector<absl::Status> told;
  auto told_with = [&](const std::string& text, bool ok) {
    absl::MutexLock l(&mu);
    for (const auto& s : told) {
      if (s.ok() == ok && s.ToString().find(text) != std::string::npos) return true;
    }
    return false;
  };
  auto wait_told = [&](const std::string& text, bool ok) {
    const auto until = std::chrono::steady_clock::now() + seconds(30);
    while (!told_with(text, ok) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(100));
    }
    return told_with(text, ok);
  };
  ClientOptions o;
  o.endpoints = {cluster_->endpoint(0)};
  o.ca_file = dir + "/ca.pem";
  o.cert_file = dir + "/rotating.pem";
  o.key_file = dir + "/rotating_key.pem";
  o.on_tls_files = [&](const absl::Status& s) {
    absl::MutexLock l(&mu);
    told.push_back(s);
  };
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  auto create = [&](const std::string& name) {
    v1::CreateNamespaceRequest req;
    req.mutable_namespace_()->set_name(name);
    return (*client)->CreateNamespace(req).status();
  };
  EXPECT_EQ(create("rotated-a").code(), absl::StatusCode::kPermissionDenied);  // alice

  ASSERT_TRUE(dev::WriteFileAtomically(o.cert_file, next->cert, 0644).ok());
  ASSERT_TRUE(wait_told("cert_file and key_file do not belong together: " + o.key_file, false))
      << "the half rotation was not told";
  std::this_thread::sleep_for(seconds(3));  // past gRPC's re-read of the copies (2 s)
  ASSERT_TRUE(cluster_->holdfastd().Restart().ok());
  // A new connection, made with alice's pair: refused as alice, not unreachable.
  EXPECT_EQ(create("rotated-b").code(), absl::StatusCode::kPermissionDenied) << create("rotated-b");

  ASSERT_TRUE(dev::WriteFileAtomically(o.key_file, next->key, 0600).ok());
  ASSERT_TRUE(wait_told("OK", true)) << "the whole rotation was not told";
  std::this_thread::sleep_for(seconds(3));
  ASSERT_TRUE(cluster_->holdfastd().Restart().ok());
  EXPECT_TRUE(create("rotated-c").ok()) << create("rotated-c");  // the new identity, an admin
  client->reset();
}

// Production config: holdfastd reaches etcd over TLS with a client certificate,
// and etcd (--client-cert-auth) refuses anyone without one.
TEST(EtcdTlsTest, HoldfastdTalksToEtcdWithAClientCertificate) {
  testing::TestCluster::Options o;
  o.etcd_tls = true;
  auto c = testing::TestCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto& cluster = **c;
  ASSERT_TRUE(cluster.CreateNamespace().ok());
  auto client = std::move(*cluster.NewClient());
  auto session = client->OpenSession("default");
  ASSERT_TRUE(session.ok()) << session.status();
  auto hold = (*session)->Acquire("k");
  ASSERT_TRUE(hold.ok()) << hold.status();
  EXPECT_GT(hold->token(), 0);
  // Without a client certificate etcd refuses the connection.
  auto timers = std::make_shared<TimerQueue>();
  etcd::ClientOptions eo;
  eo.endpoints = {cluster.etcd().endpoint()};
  grpc::SslCredentialsOptions no_cert;
  std::ifstream ca(cluster.certs_dir() + "/etcd-ca.pem");
  no_cert.pem_root_certs.assign(std::istreambuf_iterator<char>(ca), {});
  eo.credentials = grpc::SslCredentials(no_cert);
  auto anonymous = std::move(*etcd::Client::Create(eo, timers));
  pb::RangeRequest r;
  r.set_key("/holdfast/epoch");
  EXPECT_FALSE(anonymous->RangeSync(r, etcd::DeadlineIn(seconds(3))).ok());
}

// etcd's certificates are rotated too, CA and all: holdfastd re-reads its etcd
// client files (every tls.refresh, 10 s by default) and its next connection to
// etcd, once etcd restarts on the new certificates and trusts only the new CA,
// presents the new client certificate and trusts the new server's. Read once at
// start, as before, holdfastd could not reach etcd again without a restart.
TEST(EtcdTlsTest, ARotatedEtcdCaAndClientCertificateAreUsedWithoutARestart) {
  testing::TestCluster::Options o;
  o.etcd_tls = true;
  auto c = testing::TestCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto& cluster = **c;
  ASSERT_TRUE(cluster.CreateNamespace().ok());
  auto client = std::move(*cluster.NewClient());

  const std::string dir = cluster.certs_dir();
  auto ca = dev::MakeCa("etcd test CA, rotated");
  ASSERT_TRUE(ca.ok()) << ca.status();
  dev::LeafOptions server;
  server.common_name = "etcd";
  server.dns = {"localhost"};
  server.ips = {"127.0.0.1"};
  dev::LeafOptions holdfastd;
  holdfastd.common_name = "holdfastd";
  auto server_pem = dev::MakeLeaf(*ca, server);
  auto client_pem = dev::MakeLeaf(*ca, holdfastd);
  ASSERT_TRUE(server_pem.ok() && client_pem.ok());
  const std::string log = cluster.dir() + "/holdfastd-0.log";
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const size_t log_before = read(log).size();
  ASSERT_TRUE(dev::WritePem(dir, "etcd-client", *client_pem).ok());
  ASSERT_TRUE(dev::WriteFileAtomically(dir + "/etcd-ca.pem", ca->cert, 0644).ok());
  ASSERT_TRUE(dev::WritePem(dir, "etcd-server", *server_pem).ok());
  // holdfastd takes the new files (its connection to etcd, made before, stays
  // up meanwhile), and then etcd restarts on them.
  const std::string taken = "holdfastd: TLS to etcd: new certificate files taken";
  const auto until = std::chrono::steady_clock::now() + seconds(60);
  while (read(log).substr(log_before).find(taken) == std::string::npos &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_NE(read(log).substr(log_before).find(taken), std::string::npos) << read(log);
  ASSERT_TRUE(cluster.etcd().Restart().ok());

  absl::Status last;
  const auto served_until = std::chrono::steady_clock::now() + seconds(60);
  while (std::chrono::steady_clock::now() < served_until) {
    auto session = client->OpenSession("default");
    if (session.ok()) {
      auto hold = (*session)->Acquire("after-rotation");
      last = hold.status();
      if (hold.ok()) break;
    } else {
      last = session.status();
    }
    std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_TRUE(last.ok()) << last;
}

// The etcd server's certificate must name the endpoint's host, as with the
// static credentials before: etcd restarted on a certificate of the right CA
// for another host ("etcd.example" only, no 127.0.0.1) is not talked to; back on
// one for 127.0.0.1, it is again.
TEST(EtcdTlsTest, AnEtcdCertificateForAnotherHostIsRefused) {
  testing::TestCluster::Options o;
  o.etcd_tls = true;
  auto c = testing::TestCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto& cluster = **c;
  ASSERT_TRUE(cluster.CreateNamespace().ok());
  auto client = std::move(*cluster.NewClient());
  const std::string dir = cluster.certs_dir();
  auto ca = dev::ReadPem(dir, "etcd-ca");
  ASSERT_TRUE(ca.ok()) << ca.status();
  auto good = dev::ReadPem(dir, "etcd-server");
  ASSERT_TRUE(good.ok()) << good.status();
  dev::LeafOptions elsewhere;
  elsewhere.common_name = "etcd.example";
  elsewhere.dns = {"etcd.example"};
  auto wrong = dev::MakeLeaf(*ca, elsewhere);
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  auto acquire = [&](const std::string& key) {
    auto session = client->OpenSession("default");
    if (!session.ok()) return session.status();
    return (*session)->Acquire(key).status();
  };

  ASSERT_TRUE(dev::WritePem(dir, "etcd-server", *wrong).ok());
  ASSERT_TRUE(cluster.etcd().Restart().ok());
  // Calls fail, and once holdfastd's connection attempts to the restarted etcd
  // have been answered, they say why (gRPC's reason, passed on).
  const std::string why = "Hostname Verification Check failed";
  absl::Status refused;
  const auto until_refused = std::chrono::steady_clock::now() + seconds(30);
  do {
    refused = acquire("elsewhere");
    if (refused.message().find(why) != std::string::npos) break;
    std::this_thread::sleep_for(milliseconds(200));
  } while (std::chrono::steady_clock::now() < until_refused);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_NE(refused.message().find(why), std::string::npos) << refused;

  ASSERT_TRUE(dev::WritePem(dir, "etcd-server", *good).ok());
  ASSERT_TRUE(cluster.etcd().Restart().ok());
  absl::Status last;
  const auto until = std::chrono::steady_clock::now() + seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    last = acquire("here");
    if (last.ok()) break;
    std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_TRUE(last.ok()) << last;
}

TEST(AuthenticatorTest, TakesTheSpiffeIdFromTheCertificate) {
  auto ca = dev::MakeCa("ca");
  ASSERT_TRUE(ca.ok());
  server::Authenticator::Options ao;
  ao.trust_domains = {"acme.org"};
  ao.admin_ids = {"spiffe://acme.org/ops/*"};
  server::Authenticator auth(ao);
  dev::LeafOptions o;
  o.uris = {"spiffe://acme.org/ops/oncall"};
  o.dns = {"ignored.example"};
  auto caller = auth.CallerOfCertificate(dev::MakeLeaf(*ca, o)->cert);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->identity, "spiffe://acme.org/ops/oncall");
  EXPECT_TRUE(caller->admin);
  o.uris = {"spiffe://acme.org/a", "spiffe://acme.org/b"};
  EXPECT_EQ(auth.CallerOfCertificate(dev::MakeLeaf(*ca, o)->cert).status().code(),
            absl::StatusCode::kUnauthenticated);
  o.uris = {"spiffe://acme.org:8443/a"};
  EXPECT_NE(auth.CallerOfCertificate(dev::MakeLeaf(*ca, o)->cert).status().message().find("no port"),
            std::string::npos);
  for (const char* junk : {"", "not a certificate"}) {
    auto refused = auth.CallerOfCertificate(junk);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << junk;
    EXPECT_EQ(refused.status().message(), "the client certificate cannot be parsed") << junk;
  }
}

// With several trust domains, each has its own CAs (tls.trust_bundles): a CA of
// one domain signs no ID of another, although the handshake's bundle (ca_file)
// holds both. A bundle file that changes is read again, and the answers kept
// for certificates go with the old bundle.
TEST(AuthenticatorTest, EachTrustDomainsIdsMustChainToItsOwnBundle) {
  testing::TempDir dir;
  auto acme_ca = dev::MakeCa("acme CA");
  auto partner_ca = dev::MakeCa("partner CA");
  ASSERT_TRUE(acme_ca.ok() && partner_ca.ok());
  const std::string acme_file = dir.path() + "/acme.pem";
  const std::string partner_file = dir.path() + "/partner.pem";
  ASSERT_TRUE(dev::WriteFileAtomically(acme_file, acme_ca->cert, 0644).ok());
  ASSERT_TRUE(dev::WriteFileAtomically(partner_file, partner_ca->cert, 0644).ok());
  server::Authenticator::Options ao;
  ao.trust_domains = {"acme.org", "partner.org"};
  ao.admin_ids = {"spiffe://acme.org/ops/*"};
  ao.trust_bundles = {{"acme.org", acme_file}, {"partner.org", partner_file}};
  server::Authenticator auth(ao);
  ASSERT_TRUE(auth.Load().ok());
  auto leaf = [](const dev::Pem& ca, const std::string& id) {
    dev::LeafOptions o;
    o.uris = {id};
    return dev::MakeLeaf(ca, o)->cert;
  };

  // The partner's CA minting an acme admin: refused, with the reason.
  auto forged = auth.CallerOfCertificate(leaf(*partner_ca, "spiffe://acme.org/ops/oncall"));
  EXPECT_EQ(forged.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(forged.status().message().find(
                "spiffe://acme.org/ops/oncall: the client certificate is not signed by a CA of "
                "trust domain acme.org (tls.trust_bundles)"),
            std::string::npos)
      << forged.status();
  const std::string acme_admin = leaf(*acme_ca, "spiffe://acme.org/ops/oncall");
  auto admin = auth.CallerOfCertificate(acme_admin);
  ASSERT_TRUE(admin.ok()) << admin.status();
  EXPECT_TRUE(admin->admin);
  auto partner = auth.CallerOfCertificate(leaf(*partner_ca, "spiffe://partner.org/svc"));
  ASSERT_TRUE(partner.ok()) << partner.status();
  EXPECT_FALSE(partner->admin);

  // acme's bundle now names the partner's CA only: its old certificate no longer
  // chains to it (seen at the next certificate not met before).
  std::this_thread::sleep_for(milliseconds(20));  // a modification time of its own
  ASSERT_TRUE(dev::WriteFileAtomically(acme_file, partner_ca->cert, 0644).ok());
  EXPECT_TRUE(auth.CallerOfCertificate(leaf(*partner_ca, "spiffe://acme.org/w")).ok());
  EXPECT_EQ(auth.CallerOfCertificate(acme_admin).status().code(),
            absl::StatusCode::kUnauthenticated);

  // A bundle with a block that is not a certificate stops the start: the CAs
  // after it would be lost without a word.
  const std::string broken = dir.path() + "/broken.pem";
  ASSERT_TRUE(dev::WriteFileAtomically(
                  broken,
                  absl::StrCat(acme_ca->cert,
                               "-----BEGIN CERTIFICATE-----\nnot!base64\n-----END CERTIFICATE-----\n",
                               partner_ca->cert),
                  0644)
                  .ok());
  ao.trust_bundles["partner.org"] = broken;
  auto half = server::Authenticator(ao).Load();
  EXPECT_EQ(half.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(half.message().find("the trust bundle of partner.org (" + broken +
                                ") has a block after its certificate 1 that cannot be read as a "
                                "certificate"),
            std::string::npos)
      << half;

  // A bundle that cannot be read stops the start.
  ao.trust_bundles["partner.org"] = dir.path() + "/missing.pem";
  auto load = server::Authenticator(ao).Load();
  EXPECT_EQ(load.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(load.message().find("missing.pem"), std::string::npos) << load;
}

// A bundle may hold its CAs in the TRUSTED CERTIFICATE form OpenSSL's tools
// write (openssl x509 -trustout): they are read as CAs like the others.
TEST(AuthenticatorTest, ABundleOfTrustedCertificatesIsRead) {
  testing::TempDir dir;
  auto ca = dev::MakeCa("acme CA");
  ASSERT_TRUE(ca.ok());
  std::string trusted;
  {
    std::unique_ptr<BIO, decltype(&BIO_free)> in(
        BIO_new_mem_buf(ca->cert.data(), static_cast<int>(ca->cert.size())), BIO_free);
    std::unique_ptr<X509, decltype(&X509_free)> x(
        PEM_read_bio_X509(in.get(), nullptr, nullptr, nullptr), X509_free);
    ASSERT_TRUE(x);
    std::unique_ptr<BIO, decltype(&BIO_free)> out(BIO_new(BIO_s_mem()), BIO_free);
    ASSERT_EQ(PEM_write_bio_X509_AUX(out.get(), x.get()), 1);
    char* data = nullptr;
    const long n = BIO_get_mem_data(out.get(), &data);
    trusted.assign(data, static_cast<size_t>(n));
  }
  ASSERT_NE(trusted.find("-----BEGIN TRUSTED CERTIFICATE-----"), std::string::npos);
  const std::string bundle = dir.path() + "/acme.pem";
  ASSERT_TRUE(dev::WriteFileAtomically(bundle, trusted, 0644).ok());
  server::Authenticator::Options ao;
  ao.trust_domains = {"acme.org"};
  ao.trust_bundles = {{"acme.org", bundle}};
  server::Authenticator auth(ao);
  ASSERT_TRUE(auth.Load().ok());
  dev::LeafOptions o;
  o.uris = {"spiffe://acme.org/app"};
  auto caller = auth.CallerOfCertificate(dev::MakeLeaf(*ca, o)->cert);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->identity, "spiffe://acme.org/app");
}

// gRPC reports a server's peer chain without its leaf, so callers whose leaves
// share an issuer present the same chain: each is still known by its own leaf,
// never by an answer kept for another's.
TEST(AuthenticatorTest, CallersPresentingOneChainAreToldApartByTheirLeaves) {
  testing::TempDir dir;
  auto ca = dev::MakeCa("acme CA");
  ASSERT_TRUE(ca.ok());
  const std::string bundle = dir.path() + "/acme.pem";
  ASSERT_TRUE(dev::WriteFileAtomically(bundle, ca->cert, 0644).ok());
  server::Authenticator::Options ao;
  ao.trust_domains = {"acme.org"};
  ao.admin_ids = {"spiffe://acme.org/ops/*"};
  ao.trust_bundles = {{"acme.org", bundle}};
  server::Authenticator auth(ao);
  ASSERT_TRUE(auth.Load().ok());
  dev::LeafOptions o;
  o.uris = {"spiffe://acme.org/ops/oncall"};
  const std::string admin = dev::MakeLeaf(*ca, o)->cert;
  o.uris = {"spiffe://acme.org/app"};
  const std::string app = dev::MakeLeaf(*ca, o)->cert;
  const std::string chain = ca->cert;  // what follows each leaf on the wire

  auto first = auth.CallerOfCertificate(admin, chain);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->admin);
  auto second = auth.CallerOfCertificate(app, chain);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->identity, "spiffe://acme.org/app");
  EXPECT_FALSE(second->admin);
  EXPECT_EQ(auth.cached_certificates(), 2u);
  // Each kept answer is its own leaf's.
  EXPECT_EQ(auth.CallerOfCertificate(admin, chain)->identity, "spiffe://acme.org/ops/oncall");
  EXPECT_EQ(auth.CallerOfCertificate(app, chain)->identity, "spiffe://acme.org/app");
}

// A certificate whose SPIFFE ID is the bare trust domain names no workload: refused
// (an admin pattern such as spiffe://acme.org/* never matched it either).
TEST(AuthenticatorTest, ABareTrustDomainIsNoCaller) {
  auto ca = dev::MakeCa("ca");
  ASSERT_TRUE(ca.ok());
  server::Authenticator::Options ao;
  ao.trust_domains = {"acme.org"};
  ao.admin_ids = {"spiffe://acme.org/*"};
  server::Authenticator auth(ao);
  dev::LeafOptions o;
  o.uris = {"spiffe://acme.org"};
  auto refused = auth.CallerOfCertificate(dev::MakeLeaf(*ca, o)->cert);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(refused.status().message(),
            "spiffe://acme.org names a trust domain, not a workload: a client SVID's SPIFFE ID "
            "needs a path");
  o.uris = {"spiffe://acme.org/w"};
  EXPECT_TRUE(auth.CallerOfCertificate(dev::MakeLeaf(*ca, o)->cert).ok());
}

// Each certificate's answer is kept (a connection presents the same one on every
// call), refusals included, and the cache stays within its bound.
TEST(AuthenticatorTest, KeepsEachCertificatesAnswerWithinItsBound) {
  auto ca = dev::MakeCa("ca");
  ASSERT_TRUE(ca.ok());
  server::Authenticator::Options ao;
  ao.trust_domains = {"acme.org"};
  ao.admin_ids = {"spiffe://acme.org/ops/*"};
  ao.max_cached_certificates = 2;
  server::Authenticator auth(ao);
  dev::LeafOptions o;
  o.uris = {"spiffe://acme.org/ops/oncall"};
  const std::string admin = dev::MakeLeaf(*ca, o)->cert;
  o.uris = {"spiffe://evil.org/x"};
  const std::string foreign = dev::MakeLeaf(*ca, o)->cert;
  o.uris = {"spiffe://acme.org/billing/worker"};
  const std::string worker = dev::MakeLeaf(*ca, o)->cert;
  EXPECT_EQ(auth.cached_certificates(), 0u);
  for (int i = 0; i < 3; ++i) {
    auto caller = auth.CallerOfCertificate(admin);
    ASSERT_TRUE(caller.ok()) << caller.status();
    EXPECT_EQ(caller->identity, "spiffe://acme.org/ops/oncall");
    EXPECT_TRUE(caller->admin);
    EXPECT_EQ(auth.cached_certificates(), 1u);
  }
  for (int i = 0; i < 2; ++i) {
    auto refused = auth.CallerOfCertificate(foreign);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(refused.status().message(),
              "trust domain \"evil.org\" of spiffe://evil.org/x is not accepted");
    EXPECT_EQ(auth.cached_certificates(), 2u);
  }
  // Full: emptied, then the new one kept; the others are worked out again.
  auto caller = auth.CallerOfCertificate(worker);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->identity, "spiffe://acme.org/billing/worker");
  EXPECT_FALSE(caller->admin);
  EXPECT_EQ(auth.cached_certificates(), 1u);
  caller = auth.CallerOfCertificate(admin);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_TRUE(caller->admin);
  EXPECT_EQ(auth.cached_certificates(), 2u);
  // A certificate over the size bound is answered, and not kept.
  o.uris = {"spiffe://acme.org/big"};
  for (int i = 0; i < 600; ++i) o.dns.push_back(absl::StrCat("name-", i, ".big.example.org"));
  const std::string big = dev::MakeLeaf(*ca, o)->cert;
  ASSERT_GT(big.size(), server::Authenticator::kMaxCachedPemBytes);
  caller = auth.CallerOfCertificate(big);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->identity, "spiffe://acme.org/big");
  EXPECT_EQ(auth.cached_certificates(), 2u);
}

}  // namespace
}  // namespace holdfast
