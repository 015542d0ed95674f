// TlsFiles against files on disk, with certificates of a CA made here; no server.
#include "common/tls_files.h"

#include <cstdio>
#include <filesystem>
#include <set>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dev/certs.h"
#include "dev/temp_dir.h"

namespace holdfast {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class TlsFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = dev::MakeTempDir("hf-tls-files");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    auto ca = dev::MakeCa("tls-files-test");
    ASSERT_TRUE(ca.ok()) << ca.status();
    ca_ = *ca;
    ASSERT_TRUE(dev::WritePem(dir_, "ca", ca_).ok());
    first_ = Leaf();
    ASSERT_TRUE(dev::WritePem(dir_, "server", first_).ok());
    paths_ = {dir_ + "/server_key.pem", dir_ + "/server.pem", dir_ + "/ca.pem"};
  }

  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  dev::Pem Leaf() {
    dev::LeafOptions o;
    o.uris = {"spiffe://test.holdfast/holdfastd"};
    auto leaf = dev::MakeLeaf(ca_, o);
    EXPECT_TRUE(leaf.ok()) << leaf.status();
    return leaf.ok() ? *leaf : dev::Pem{};
  }

  std::unique_ptr<TlsFiles> Start() {
    TlsFiles::Options o;
    o.configured = paths_;
    o.check = std::chrono::milliseconds(0);  // passes only when the test asks
    o.told = [this](TlsFiles::Outcome outcome, const std::string& reason) {
      told_.emplace_back(outcome, reason);
    };
    auto files = TlsFiles::Start(std::move(o));
    EXPECT_TRUE(files.ok()) << files.status();
    return files.ok() ? *std::move(files) : nullptr;
  }

  // What gRPC would read now: the key file (which is the certificate file too)
  // and the CA file.
  std::vector<std::string> Served(const TlsFiles& files) {
    EXPECT_EQ(files.served().key, files.served().cert);
    return {Read(files.served().key), Read(files.served().ca)};
  }

  // The one file that serves as both the key file and the certificate file.
  static std::string Pair(const dev::Pem& pem) { return pem.key + pem.cert; }

  std::string dir_;
  dev::Pem ca_, first_;
  TlsFiles::Paths paths_;
  std::vector<std::pair<TlsFiles::Outcome, std::string>> told_;
};

// The set given at start is served from memory (nothing is written to disk),
// and a rotation of the whole set is taken at the next pass.
TEST_F(TlsFilesTest, ServesTheFilesAndTakesAWholeRotation) {
  auto files = Start();
  ASSERT_NE(files, nullptr);
  EXPECT_EQ(files->served().key.rfind("/proc/self/fd/", 0), 0u) << files->served().key;
  EXPECT_EQ(Served(*files), (std::vector<std::string>{Pair(first_), ca_.cert}));
  EXPECT_EQ(files->Check(), TlsFiles::Outcome::kUnchanged);

  const dev::Pem second = Leaf();
  ASSERT_TRUE(dev::WritePem(dir_, "server", second).ok());
  EXPECT_EQ(files->Check(), TlsFiles::Outcome::kTaken);
  EXPECT_EQ(Served(*files), (std::vector<std::string>{Pair(second), ca_.cert}));
  ASSERT_EQ(told_.size(), 1u);
  EXPECT_EQ(told_[0].first, TlsFiles::Outcome::kTaken);
  EXPECT_EQ(files->Check(), TlsFiles::Outcome::kUnchanged);
  EXPECT_EQ(told_.size(), 1u);
}

// A rotation that writes the certificate and then its key, caught between the
// two: the half-written set is not served, nor told as refused; the whole one is
// taken at the next pass.
TEST_F(TlsFilesTest, ARotationCaughtBetweenItsWritesIsServedWholeAndNotRefused) {
  auto files = Start();
  ASSERT_NE(files, nullptr);
  const dev::Pem second = Leaf();
  ASSERT_TRUE(dev::WriteFileAtomically(paths_.cert, second.cert, 0644).ok());
  EXPECT_EQ(files->Check(), TlsFiles::Outcome::kPending);
  EXPECT_EQ(Served(*files), (std::vector<std::string>{Pair(first_), ca_.cert}));
  ASSERT_TRUE(dev::WriteFileAtomically(paths_.key, second.key, 0600).ok());
  EXPECT_EQ(files->Check(), TlsFiles::Outcome::kTaken);
  EXPECT_EQ(Served(*files), (std::vector<std::string>{Pair(second), ca_.cert}));
  ASSERT_EQ(told_.size(), 1u);
  EXPECT_EQ(told_[0].first, TlsFiles::Outcome::kTaken);
}

// A certificate left without its key is not served: the previous pair goes on,
// the reason is told once (at the second pass that finds it) however many passes
// see it, and the pair is taken once the key follows.
TEST_F(TlsFilesTest, ACertificateWithoutItsKeyIsNotServedUntilTheKeyFollows) {
  auto files = Start();
  ASSERT_NE(files, nullptr);
  const dev::Pem second = Leaf();
  ASSERT_TRUE(dev::WriteFileAtomically(paths_.cert, second.cert, 0644).ok());
  EXPECT_EQ(files->Check(), TlsFiles::Outcome::kPending);
  EXPECT_TRUE(told_.empty());
  EXPECT_EQ(files->Check(), TlsFiles::Outcome::kRefused);
  EXPECT_EQ(Served(*files), (std::vector<std::string>{Pair(first_), ca_.cert}));
  ASSERT_EQ(told_.size(), 1u);
  EXPECT_EQ(told_[0].first, TlsFiles::Outcome::kRefused);
  EXPECT_NE(told_[0].second.find("config: tls.cert_file and tls.key_file do not belong together: " +
                                 paths_.key + " is not the key of the certificate in " +
                                 paths_.cert),
            std::string::npos)
      << told_[0].second;
  EXPECT_EQ(files->Check(), TlsFiles::Outcome::kUnchanged);
  EXPECT_EQ(told_.size(), 1u);

  ASSERT_TRUE(dev::WriteFileAtomically(paths_.key, second.key, 0600).ok());
  EXPECT_EQ(files->Check(), TlsFiles::Outcome::kTaken);
  EXPECT_EQ(Served(*files), (std::vector<std::string>{Pair(second), ca_.cert}));
}

// A CA file that holds no certificate, a CA bundle cut off mid-write, a key that
// is not PEM, and a file gone in the middle of a rotation are refused with their
// reasons; the served set stays the first one throughout. Going back to it is
// said (the error logged is over).
TEST_F(TlsFilesTest, AnUnreadableOrBrokenSetIsRefusedAndTheServedOneStays) {
  auto files = Start();
  ASSERT_NE(files, nullptr);
  const std::vector<std::string> served = Served(*files);
  auto refused_with = [&](const std::string& reason) {
    EXPECT_EQ(files->Check(), TlsFiles::Outcome::kPending);
    EXPECT_EQ(files->Check(), TlsFiles::Outcome::kRefused);
    ASSERT_FALSE(told_.empty());
    EXPECT_EQ(told_.back().first, TlsFiles::Outcome::kRefused);
    EXPECT_NE(told_.back().second.find(reason), std::string::npos) << told_.back().second;
    EXPECT_EQ(Served(*files), served);
  };

  ASSERT_TRUE(dev::WriteFileAtomically(paths_.ca, "not a certificate\n", 0644).ok());
  refused_with("config: tls.ca_file " + paths_.ca + " holds no PEM certificate");
  const std::string bundle = ca_.cert + Leaf().cert;
  ASSERT_TRUE(dev::WriteFileAtomically(paths_.ca, bundle.substr(0, bundle.size() - 100), 0644).ok());
  refused_with("config: tls.ca_file " + paths_.ca +
               " holds no PEM certificate, or a block that is not a whole certificate");
  ASSERT_TRUE(dev::WriteFileAtomically(paths_.ca, ca_.cert, 0644).ok());
  EXPECT_EQ(files->Check(), TlsFiles::Outcome::kTaken);  // back to the served set

  ASSERT_TRUE(dev::WriteFileAtomically(paths_.key, "garbage\n", 0600).ok());
  refused_with("the private key cannot be read");
  ASSERT_EQ(std::remove(paths_.key.c_str()), 0);
  refused_with("cannot read " + paths_.key);
  ASSERT_TRUE(dev::WriteFileAtomically(paths_.key, first_.key, 0600).ok());
  EXPECT_EQ(files->Check(), TlsFiles::Outcome::kTaken);
  EXPECT_EQ(Served(*files), served);
  EXPECT_EQ(told_.size(), 6u);  // four refusals, two returns
}

// A CA bundle in OpenSSL's TRUSTED CERTIFICATE form (openssl x509 -trustout) is
// a CA bundle like any other, as at holdfastd's start.
TEST_F(TlsFilesTest, ATrustedCertificateBundleIsServed) {
  BIO* in = BIO_new_mem_buf(ca_.cert.data(), static_cast<int>(ca_.cert.size()));
  X509* ca = PEM_read_bio_X509(in, nullptr, nullptr, nullptr);
  BIO_free(in);
  ASSERT_NE(ca, nullptr);
  BIO* out = BIO_new(BIO_s_mem());
  ASSERT_EQ(PEM_write_bio_X509_AUX(out, ca), 1);
  char* data = nullptr;
  const long n = BIO_get_mem_data(out, &data);
  const std::string trusted(data, static_cast<size_t>(n));
  BIO_free(out);
  X509_free(ca);
  ASSERT_NE(trusted.find("-----BEGIN TRUSTED CERTIFICATE-----"), std::string::npos) << trusted;
  ASSERT_TRUE(dev::WriteFileAtomically(paths_.ca, trusted, 0644).ok());
  auto files = Start();
  ASSERT_NE(files, nullptr);
  EXPECT_EQ(Read(files->served().ca), trusted);
}

// A client without a certificate (etcd's client TLS with a CA alone): the CA is
// served and rotated, and messages name the setting they were given.
TEST_F(TlsFilesTest, ACaAloneIsServedAndRotatedAndMessagesNameTheSetting) {
  TlsFiles::Options o;
  o.configured = {"", "", paths_.ca};
  o.where = "clusters[1].tls.";
  o.check = std::chrono::milliseconds(0);
  o.told = [this](TlsFiles::Outcome outcome, const std::string& reason) {
    told_.emplace_back(outcome, reason);
  };
  auto files = TlsFiles::Start(o);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_TRUE((*files)->served().key.empty());
  EXPECT_TRUE((*files)->served().cert.empty());
  EXPECT_EQ(Read((*files)->served().ca), ca_.cert);
  auto other = dev::MakeCa("tls-files-test, rotated");
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE(dev::WriteFileAtomically(paths_.ca, other->cert, 0644).ok());
  EXPECT_EQ((*files)->Check(), TlsFiles::Outcome::kTaken);
  EXPECT_EQ(Read((*files)->served().ca), other->cert);
  ASSERT_TRUE(dev::WriteFileAtomically(paths_.ca, "cut off\n", 0644).ok());
  EXPECT_EQ((*files)->Check(), TlsFiles::Outcome::kPending);
  EXPECT_EQ((*files)->Check(), TlsFiles::Outcome::kRefused);
  EXPECT_NE(told_.back().second.find("config: clusters[1].tls.ca_file " + paths_.ca),
            std::string::npos)
      << told_.back().second;
  EXPECT_EQ(Read((*files)->served().ca), other->cert);

  // A key without its certificate is not a setting.
  o.configured = {paths_.key, "", paths_.ca};
  auto half = TlsFiles::Start(o);
  ASSERT_FALSE(half.ok());
  EXPECT_EQ(half.status().message(),
            "config: clusters[1].tls.cert_file and key_file go together");
}

// A set that does not pass at start is refused at start: holdfastd does not
// begin with files it cannot serve.
TEST_F(TlsFilesTest, ASetThatDoesNotPassIsRefusedAtStart) {
  ASSERT_TRUE(dev::WriteFileAtomically(paths_.cert, Leaf().cert, 0644).ok());
  TlsFiles::Options o;
  o.configured = paths_;
  auto files = TlsFiles::Start(std::move(o));
  ASSERT_FALSE(files.ok());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(files.status().message().find("do not belong together"), std::string::npos)
      << files.status();
}

// The key and its certificate are one file, so no read sees one without the
// other; each copy is modified a whole second after the one it replaces at
// least (gRPC compares whole seconds around its reads), however fast rotations
// come.
TEST_F(TlsFilesTest, TheKeyAndItsCertificateAreReplacedAtOnceAndLaterEachTime) {
  auto files = Start();
  ASSERT_NE(files, nullptr);
  ASSERT_EQ(files->served().key, files->served().cert);
  auto modified = [&](const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return st.st_mtim.tv_sec;
  };
  auto pair_at = modified(files->served().key), ca_at = modified(files->served().ca);
  for (int i = 0; i < 3; ++i) {  // well within a second
    const dev::Pem next = Leaf();
    ASSERT_TRUE(dev::WritePem(dir_, "server", next).ok());
    auto other_ca = dev::MakeCa("tls-files-test " + std::to_string(i));
    ASSERT_TRUE(other_ca.ok()) << other_ca.status();
    ASSERT_TRUE(dev::WriteFileAtomically(paths_.ca, other_ca->cert + ca_.cert, 0644).ok());
    ASSERT_EQ(files->Check(), TlsFiles::Outcome::kTaken);
    EXPECT_EQ(Served(*files), (std::vector<std::string>{Pair(next), other_ca->cert + ca_.cert}));
    EXPECT_GT(modified(files->served().key), pair_at);
    EXPECT_GT(modified(files->served().ca), ca_at);
    pair_at = modified(files->served().key);
    ca_at = modified(files->served().ca);
  }
}

// A client's files (wait_for_files): ones not there at start are waited for,
// with empty copies served and the wait told as a refusal with its reason; the
// first whole set is taken. Files that are there and do not pass are refused at
// start all the same, named as a client's options name them.
TEST_F(TlsFilesTest, AClientWaitsForFilesNotThereButRefusesASetThatIsThereAndNotWhole) {
  ASSERT_EQ(std::remove(paths_.key.c_str()), 0);
  TlsFiles::Options o;
  o.configured = paths_;
  o.prefix = "";
  o.where = "";
  o.reader = "libholdfast";
  o.wait_for_files = true;
  o.check = std::chrono::milliseconds(0);
  o.told = [this](TlsFiles::Outcome outcome, const std::string& reason) {
    told_.emplace_back(outcome, reason);
  };
  auto files = TlsFiles::Start(o);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(Served(**files), (std::vector<std::string>{"", ""}));
  EXPECT_EQ((*files)->Check(), TlsFiles::Outcome::kPending);
  EXPECT_EQ((*files)->Check(), TlsFiles::Outcome::kRefused);
  ASSERT_EQ(told_.size(), 1u);
  EXPECT_EQ(told_[0].second.rfind("cannot read " + paths_.key, 0), 0u) << told_[0].second;
  EXPECT_EQ(Served(**files), (std::vector<std::string>{"", ""}));
  ASSERT_TRUE(dev::WriteFileAtomically(paths_.key, first_.key, 0600).ok());
  EXPECT_EQ((*files)->Check(), TlsFiles::Outcome::kTaken);
  EXPECT_EQ(Served(**files), (std::vector<std::string>{Pair(first_), ca_.cert}));

  ASSERT_TRUE(dev::WriteFileAtomically(paths_.cert, Leaf().cert, 0644).ok());
  auto mismatched = TlsFiles::Start(o);
  ASSERT_FALSE(mismatched.ok());
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mismatched.status().message(),
            "cert_file and key_file do not belong together: " + paths_.key +
                " is not the key of the certificate in " + paths_.cert +
                " (a certificate renewed without its key, or the other way round?)");
}

// gRPC may read a provider's paths after the channels that used it are gone:
// the numbers a TlsFiles served are left on empty files when it ends (never
// closed, so never another file's), and the next one serves under them.
TEST_F(TlsFilesTest, TheNumbersServedAreLeftOnEmptyFilesAndServedAgain) {
  auto first = Start();
  ASSERT_NE(first, nullptr);
  const TlsFiles::Paths served = first->served();
  EXPECT_EQ(Read(served.key), Pair(first_));
  first.reset();
  EXPECT_EQ(Read(served.key), "");
  EXPECT_EQ(Read(served.ca), "");
  auto second = Start();
  ASSERT_NE(second, nullptr);
  EXPECT_EQ((std::set<std::string>{second->served().key, second->served().ca}),
            (std::set<std::string>{served.key, served.ca}));
  EXPECT_EQ(Served(*second), (std::vector<std::string>{Pair(first_), ca_.cert}));
}

// The pair holds only the key file's keys and the certificate file's
// certificates: a key file that holds a certificate too (before its key, or a
// combined file named as both) does not put another certificate first. The
// copies are sealed: not even this process can write to them.
TEST_F(TlsFilesTest, ThePairIsTheKeyFilesKeyAndTheCertificateFilesChainOnlyAndSealed) {
  const dev::Pem stray = Leaf();
  ASSERT_TRUE(dev::WriteFileAtomically(paths_.key, stray.cert + first_.key, 0600).ok());
  auto files = Start();
  ASSERT_NE(files, nullptr);
  EXPECT_EQ(Served(*files), (std::vector<std::string>{Pair(first_), ca_.cert}));
  const std::string combined = dir_ + "/combined.pem";
  ASSERT_TRUE(dev::WriteFileAtomically(combined, first_.cert + first_.key, 0600).ok());
  paths_.key = paths_.cert = combined;
  auto from_one_file = Start();
  ASSERT_NE(from_one_file, nullptr);
  EXPECT_EQ(Served(*from_one_file), (std::vector<std::string>{Pair(first_), ca_.cert}));

  const int fd = ::open(files->served().key.c_str(), O_WRONLY);
  if (fd >= 0) {
    EXPECT_LT(::write(fd, "x", 1), 0);
    EXPECT_EQ(errno, EPERM);
    ::close(fd);
  } else {
    EXPECT_EQ(errno, EPERM);
  }
  EXPECT_EQ(Served(*files), (std::vector<std::string>{Pair(first_), ca_.cert}));
}

// A client's files caught between a rotation's writes at its start (the
// certificate renewed, its key not yet): read again a moment later, and
// served once whole, not refused.
TEST_F(TlsFilesTest, AClientStartedBetweenARotationsWritesServesTheWholeSet) {
  const dev::Pem second = Leaf();
  ASSERT_TRUE(dev::WriteFileAtomically(paths_.cert, second.cert, 0644).ok());
  std::thread key_follows([&] {
    std::this_thread::sleep_for(TlsFiles::kRecheckAtStart / 5);
    ASSERT_TRUE(dev::WriteFileAtomically(paths_.key, second.key, 0600).ok());
  });
  TlsFiles::Options o;
  o.configured = paths_;
  o.prefix = o.where = "";
  o.wait_for_files = true;
  o.check = std::chrono::milliseconds(0);
  auto files = TlsFiles::Start(o);
  key_follows.join();
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(Served(**files), (std::vector<std::string>{Pair(second), ca_.cert}));
}

}  // namespace
}  // namespace holdfast
