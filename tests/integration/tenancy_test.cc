// Authentication and per-tenant policy over loopback: bearer tokens checked against the
// tenants file's SHA-256 digests, devices and formats per tenant, cpu-c only for trusted
// tenants, sessions hidden from other tenants, and reloads that keep sessions.
#include <gmock/gmock.h>

#include <fstream>

#include "tests/integration/daemon_fixture.h"
#include "tests/support/tenants_file.h"

namespace replayd::client {
namespace {

using ::testing::HasSubstr;

class TenancyTest : public DaemonFixture {
 protected:
  void SetUp() override {
    file_ = cache_.path() / "tenants.textproto";
    Write(TenantText("alice", "alice-token", "  trusted: true\n") +
          TenantText("bob", "bob-token", "  devices: \"cuda:0\"\n") +
          TenantText("carol", "carol-token", "  formats: \"cuda-c\"\n  trusted: true\n"));
    Options options;
    options.tenants_file = file_;
    Start(options);
  }
  void Write(const std::string& text) { std::ofstream(file_, std::ios::trunc) << text; }
  Client As(const std::string& token) {
    ClientOptions o;
    o.token = token;
    return Client::Connect(daemon_->address(), o);
  }
  std::filesystem::path file_;
};

TEST_F(TenancyTest, NoTokenOrAWrongOneIsUnauthenticated) {
  EXPECT_EQ(client().ListDevices().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(client().OpenSession("cpu:0").status().code(), absl::StatusCode::kUnauthenticated);
  Client wrong = As("not-a-token");
  EXPECT_EQ(wrong.OpenSession("cpu:0").status().code(), absl::StatusCode::kUnauthenticated);
  // A malformed header, not "Bearer <token>".
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "alice-token");
  v1::ListDevicesReply reply;
  EXPECT_EQ(stub().ListDevices(&ctx, v1::ListDevicesRequest(), &reply).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(TenancyTest, TheRightTokenWorksEndToEnd) {
  Client alice = As("alice-token");
  auto s = alice.OpenSession("cpu:0");
  ASSERT_TRUE(s.ok()) << s.status();
  auto p = s->Load(AddSpec());
  ASSERT_TRUE(p.ok()) << p.status();
  auto a = s->Alloc(64), out = s->Alloc(64);
  ASSERT_TRUE(s->WriteVector(*a, std::vector<float>(16, 2.f)).ok());
  ASSERT_TRUE(s->Launch(*p, {View{&*out}, View{&*a}, View{&*a}, int64_t{16}, int64_t{1}}, {1, 1, 1}).ok());
  EXPECT_EQ((*s->ReadVector<float>(*out, 1))[0], 4.f);
  EXPECT_TRUE(s->KeepAlive().ok());
}

TEST_F(TenancyTest, AForbiddenDeviceIsPermissionDeniedAndNotListed) {
  Client bob = As("bob-token");
  auto devices = bob.ListDevices();
  ASSERT_TRUE(devices.ok());
  EXPECT_TRUE(devices->empty()) << "bob may use cuda:0 only";
  absl::Status s = bob.OpenSession("cpu:0").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()), HasSubstr("bob"));
}

TEST_F(TenancyTest, CpuCNeedsATrustedTenantAndAnAllowedFormat) {
  Write(TenantText("alice", "alice-token", "  trusted: true\n") + TenantText("dave", "dave-token", ""));
  ASSERT_TRUE(daemon_->ReloadTenants().ok());
  Client dave = As("dave-token");
  auto s = dave.OpenSession("cpu:0");
  ASSERT_TRUE(s.ok());
  absl::Status refused = s->Load(AddSpec()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("not trusted"));
  Client carol = As("carol-token");  // carol is gone after the reload
  EXPECT_EQ(carol.OpenSession("cpu:0").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(TenancyTest, AFormatOutsideThePolicyIsPermissionDenied) {
  Client carol = As("carol-token");  // trusted, but only cuda-c
  auto s = carol.OpenSession("cpu:0");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->Load(AddSpec()).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(TenancyTest, AnotherTenantsSessionIsNotFound) {
  Client alice = As("alice-token");
  Client carol = As("carol-token");
  auto theirs = carol.OpenSession("cpu:0");
  ASSERT_TRUE(theirs.ok());
  auto buffer = theirs->Alloc(64);
  // Alice names carol's session and buffer directly.
  for (auto* rpc : {"keepalive", "read", "close"}) {
    grpc::ClientContext ctx;
    Authorize(ctx, "alice-token");
    grpc::Status st;
    if (std::string(rpc) == "keepalive") {
      v1::KeepAliveRequest r;
      r.set_session(theirs->id());
      v1::KeepAliveReply reply;
      st = stub().KeepAlive(&ctx, r, &reply);
    } else if (std::string(rpc) == "read") {
      v1::ReadBufferRequest r;
      r.set_session(theirs->id());
      r.set_buffer(buffer->handle());
      auto reader = stub().ReadBuffer(&ctx, r);
      v1::ReadChunk c;
      while (reader->Read(&c)) {
      }
      st = reader->Finish();
    } else {
      v1::CloseSessionRequest r;
      r.set_session(theirs->id());
      v1::CloseSessionReply reply;
      st = stub().CloseSession(&ctx, r, &reply);
    }
    EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << rpc;
  }
  EXPECT_TRUE(theirs->KeepAlive().ok()) << "carol's session is untouched";
  (void)alice;
}

TEST_F(TenancyTest, AReloadRevokesATokenButKeepsOpenSessions) {
  Client alice = As("alice-token");
  auto s = alice.OpenSession("cpu:0");
  ASSERT_TRUE(s.ok());
  Write(TenantText("alice", "alice-new-token", "  trusted: true\n"));
  ASSERT_TRUE(daemon_->ReloadTenants().ok());
  EXPECT_EQ(alice.OpenSession("cpu:0").status().code(), absl::StatusCode::kUnauthenticated);
  Client renewed = As("alice-new-token");
  auto s2 = renewed.OpenSession("cpu:0");
  EXPECT_TRUE(s2.ok());
  EXPECT_EQ(daemon_->engine().session_count(), 2u) << "the reload dropped no session";
}

TEST_F(TenancyTest, AFileThatDoesNotParseIsRejectedWithItsLineAndTheOldPolicyStays) {
  Write("tenant {\n  name: \"alice\"\n  token_sha256: 12\n}\n");
  absl::Status s = daemon_->ReloadTenants();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("line 3"));
  Write(TenantText("alice", "alice-token", "") + TenantText("alice", "other", ""));
  EXPECT_THAT(std::string(daemon_->ReloadTenants().message()), HasSubstr("name used twice"));
  Write("tenant { name: \"x\" token_sha256: \"abc\" }\n");
  EXPECT_THAT(std::string(daemon_->ReloadTenants().message()), HasSubstr("64 hex digits"));
  EXPECT_TRUE(As("alice-token").OpenSession("cpu:0").ok()) << "the old policy is still in force";
}

TEST_F(TenancyTest, TheStreamIsAuthenticatedToo) {
  grpc::ClientContext ctx;  // no token
  auto stream = stub().Session(&ctx);
  v1::SessionRequest r;
  r.set_seq(1);
  r.mutable_keep_alive();
  stream->Write(r);
  stream->WritesDone();
  v1::SessionReply reply;
  EXPECT_FALSE(stream->Read(&reply));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST(TenantsFileTest, AMissingOrBadFileStopsTheDaemonFromStarting) {
  TempDir dir;
  DaemonOptions d;
  d.listen = "127.0.0.1:0";
  d.engine.cache_dir = dir.path();
  d.tenants_file = dir.path() / "missing";
  EXPECT_EQ(Daemon::Start(d).status().code(), absl::StatusCode::kInvalidArgument);
  std::ofstream(dir.path() / "bad") << "tenant {";
  d.tenants_file = dir.path() / "bad";
  EXPECT_EQ(Daemon::Start(d).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace replayd::client
