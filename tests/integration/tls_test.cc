// TLS and mutual TLS over loopback, with certificates this test makes with the openssl
// command: a CA, a server certificate for localhost signed by it, a client certificate
// signed by it, and a client certificate from another CA.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "tests/integration/daemon_fixture.h"

namespace replayd::client {
namespace {

std::string Read(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("openssl version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl command";
    const std::string d = dir_.path().string();
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    std::ofstream(dir_.path() / "san.ext") << "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
    const std::string script = absl::StrCat(
        "cd ", d, " && ",
        "openssl req -x509 ", key, " -keyout ca.key -out ca.pem -days 2 -subj /CN=replayd-test-ca && ",
        "openssl req -x509 ", key, " -keyout other.key -out other.pem -days 2 -subj /CN=other-ca && ",
        "openssl req ", key, " -keyout server.key -out server.csr -subj /CN=localhost && ",
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem "
        "-days 2 -extfile san.ext && ",
        "openssl req ", key, " -keyout client.key -out client.csr -subj /CN=client && ",
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 && ",
        "openssl req ", key, " -keyout rogue.key -out rogue.csr -subj /CN=rogue && ",
        "openssl x509 -req -in rogue.csr -CA other.pem -CAkey other.key -CAcreateserial -out rogue.pem -days 2",
        " > openssl.log 2>&1");
    ASSERT_EQ(std::system(script.c_str()), 0) << Read(dir_.path() / "openssl.log");
  }

  void Start(bool mutual) {
    DaemonOptions d;
    d.listen = "127.0.0.1:0";  // the certificate names the IP too
    d.engine.cache_dir = dir_.path() / "cache";
    d.executor_binary = REPLAYD_EXECUTOR_BINARY;
    d.tls_cert = dir_.path() / "server.pem";
    d.tls_key = dir_.path() / "server.key";
    if (mutual) d.tls_client_ca = dir_.path() / "ca.pem";
    auto started = Daemon::Start(d);
    ASSERT_TRUE(started.ok()) << started.status();
    daemon_ = std::move(*started);
  }

  absl::Status Call(const ClientOptions& options) {
    Client c = Client::Connect(daemon_->address(), options);
    return c.ListDevices().status();
  }
  ClientOptions Tls(const std::string& cert = "", const std::string& key = "") {
    ClientOptions o;
    o.tls_root_ca = Read(dir_.path() / "ca.pem");
    if (!cert.empty()) o.tls_cert = Read(dir_.path() / cert);
    if (!key.empty()) o.tls_key = Read(dir_.path() / key);
    return o;
  }

  TempDir dir_;
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(TlsTest, ATlsClientTalksAndAPlaintextOneCannot) {
  Start(/*mutual=*/false);
  EXPECT_TRUE(Call(Tls()).ok()) << Call(Tls());
  EXPECT_EQ(Call(ClientOptions()).code(), absl::StatusCode::kUnavailable);
  ClientOptions wrong_ca;
  wrong_ca.tls_root_ca = Read(dir_.path() / "other.pem");
  EXPECT_EQ(Call(wrong_ca).code(), absl::StatusCode::kUnavailable) << "the server is not trusted";
}

TEST_F(TlsTest, MutualTlsNeedsAClientCertificateFromTheClientCa) {
  Start(/*mutual=*/true);
  EXPECT_TRUE(Call(Tls("client.pem", "client.key")).ok());
  EXPECT_EQ(Call(Tls()).code(), absl::StatusCode::kUnavailable) << "no client certificate";
  EXPECT_EQ(Call(Tls("rogue.pem", "rogue.key")).code(), absl::StatusCode::kUnavailable)
      << "a client certificate from the wrong CA";
}

TEST_F(TlsTest, IncompleteTlsSettingsStopTheDaemonFromStarting) {
  DaemonOptions d;
  d.listen = "127.0.0.1:0";  // the certificate names the IP too
  d.engine.cache_dir = dir_.path() / "cache";
  d.executor_binary = REPLAYD_EXECUTOR_BINARY;
  d.tls_cert = dir_.path() / "server.pem";
  EXPECT_EQ(Daemon::Start(d).status().code(), absl::StatusCode::kInvalidArgument);
  d.tls_key = dir_.path() / "missing.key";
  EXPECT_EQ(Daemon::Start(d).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace replayd::client
