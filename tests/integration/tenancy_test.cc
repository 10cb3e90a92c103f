// Authentication and per-tenant policy over loopback: bearer tokens checked against the
// tenants file's SHA-256 digests, devices and formats per tenant, isolation per tenant
// (the daemon's process for trusted tenants only), every handle of another tenant NOT_FOUND, graph caches per tenant, and reloads
// that keep sessions.
#include <gmock/gmock.h>

#include <unistd.h>

#include <fstream>
#include <functional>

#include "absl/time/clock.h"

#include "tests/integration/daemon_fixture.h"
#include "tests/support/tenants_file.h"

namespace replayd::client {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class TenancyTest : public DaemonFixture {
 protected:
  void SetUp() override {
    file_ = cache_.path() / "tenants.textproto";
    Write(TenantText("alice", "alice-token", "  trusted: true\n") +
          TenantText("bob", "bob-token", "  devices: \"cuda:0\"\n") +
          TenantText("carol", "carol-token", "  formats: \"cuda-c\"\n  trusted: true\n") +
          TenantText("erin", "erin-token", "  trusted: true\n"));
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
  EXPECT_EQ(stub().ListDevices(&ctx, v1::ListDevicesRequest(), &reply).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // The unary calls served on the completion queue check the token the same way.
  grpc::ClientContext launch_ctx, replay_ctx;
  v1::LaunchReply launch_reply;
  v1::ReplayGraphReply replay_reply;
  EXPECT_EQ(stub().Launch(&launch_ctx, v1::LaunchRequest(), &launch_reply).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stub().ReplayGraph(&replay_ctx, v1::ReplayGraphRequest(), &replay_reply).error_code(),
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

// The process a tenant's cpu-c kernels run in: this test's (the daemon's) or another.
pid_t KernelProcess(Client& tenant) {
  auto s = tenant.OpenSession("cpu:0");
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return 0;
  auto program = s->Load({"cpu-c", "int getpid(void);\nvoid pid(int *out) { out[0] = getpid(); }", "pid",
                          *ParseSignature("out"), {}});
  EXPECT_TRUE(program.ok()) << program.status();
  auto out = s->Alloc(4);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!program.ok() || !out.ok()) return 0;
  EXPECT_TRUE(s->Launch(*program, {View{&*out}}, {1, 1, 1}, {1, 1, 1}, true).ok());
  auto got = s->ReadVector<int32_t>(*out, 1);
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() ? (*got)[0] : 0;
}

TEST_F(TenancyTest, EveryTenantMayLoadCpuCAndOnlyTrustedOnesRunInTheDaemon) {
  Write(TenantText("alice", "alice-token", "  trusted: true\n") +
        TenantText("dave", "dave-token", "") +
        TenantText("frank", "frank-token", "  trusted: true\n  isolation: ISOLATION_SHARED\n") +
        TenantText("grace", "grace-token", "  trusted: true\n  isolation: ISOLATION_PROCESS\n"));
  ASSERT_TRUE(daemon_->ReloadTenants().ok());
  const bool shared_default = std::getenv("REPLAYD_TEST_ISOLATION") != nullptr &&
                              std::string(std::getenv("REPLAYD_TEST_ISOLATION")) == "shared";
  Client dave = As("dave-token"), alice = As("alice-token"), frank = As("frank-token"), grace = As("grace-token");
  // Untrusted: a process of its own, whatever the daemon's default.
  const pid_t dave_pid = KernelProcess(dave);
  EXPECT_NE(dave_pid, 0);
  EXPECT_NE(dave_pid, getpid());
  // Trusted with no say: the daemon's default.
  EXPECT_EQ(KernelProcess(alice) == getpid(), shared_default);
  EXPECT_EQ(KernelProcess(frank), getpid());
  EXPECT_NE(KernelProcess(grace), getpid());
  Client carol = As("carol-token");  // carol is gone after the reload
  EXPECT_EQ(carol.OpenSession("cpu:0").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(TenancyTest, SharedIsolationForAnUntrustedTenantIsRefusedAndTheOldPolicyStays) {
  Write(TenantText("alice", "alice-token", "  isolation: ISOLATION_SHARED\n"));
  absl::Status refused = daemon_->ReloadTenants();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()),
              AllOf(HasSubstr("alice"), HasSubstr("ISOLATION_SHARED"), HasSubstr("trusted: true")));
  Write(TenantText("alice", "alice-token", "  max_launch_seconds: 604801\n"));
  refused = daemon_->ReloadTenants();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("max_launch_seconds 604801"));
  Client bob = As("bob-token");  // the policy in force still has bob
  EXPECT_TRUE(bob.ListDevices().ok());
}

TEST_F(TenancyTest, AFormatOutsideThePolicyIsPermissionDenied) {
  Client carol = As("carol-token");  // trusted, but only cuda-c
  auto s = carol.OpenSession("cpu:0");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->Load(AddSpec()).status().code(), absl::StatusCode::kPermissionDenied);
}

// Erin's session holds one object of every kind; alice names them all.
TEST_F(TenancyTest, EveryKindOfHandleOfAnotherTenantIsNotFound) {
  Client erin = As("erin-token");
  auto theirs = erin.OpenSession("cpu:0");
  ASSERT_TRUE(theirs.ok());
  auto program = theirs->Load(AddSpec());
  auto a = theirs->Alloc(64), out = theirs->Alloc(64);
  ASSERT_TRUE(program.ok() && a.ok() && out.ok());
  ASSERT_TRUE(theirs->WriteVector(*a, std::vector<float>(16, 2.f)).ok());
  const std::vector<KernelArg> add_args = {View{&*out}, View{&*a}, View{&*a}, int64_t{16}, int64_t{1}};
  ASSERT_TRUE(theirs->BeginCapture({&*a}, {}).ok());
  ASSERT_TRUE(theirs->Launch(*program, add_args, {1, 1, 1}).ok());
  auto graph = theirs->EndCapture({&*out});
  ASSERT_TRUE(graph.ok()) << graph.status();

  const uint64_t session = theirs->id(), buffer = a->handle(), prog = program->handle(), g = graph->handle();
  using Call = std::function<grpc::Status(grpc::ClientContext&, uint64_t)>;
  auto& rpc = stub();
  const std::vector<std::pair<std::string, Call>> calls = {
      {"KeepAlive",
       [&](auto& ctx, uint64_t s) {
         v1::KeepAliveRequest r;
         r.set_session(s);
         v1::KeepAliveReply y;
         return rpc.KeepAlive(&ctx, r, &y);
       }},
      {"CloseSession",
       [&](auto& ctx, uint64_t s) {
         v1::CloseSessionRequest r;
         r.set_session(s);
         v1::CloseSessionReply y;
         return rpc.CloseSession(&ctx, r, &y);
       }},
      {"AllocBuffer",
       [&](auto& ctx, uint64_t s) {
         v1::AllocBufferRequest r;
         r.set_session(s);
         r.set_bytes(64);
         v1::AllocBufferReply y;
         return rpc.AllocBuffer(&ctx, r, &y);
       }},
      {"FreeBuffer",
       [&](auto& ctx, uint64_t s) {
         v1::FreeBufferRequest r;
         r.set_session(s);
         r.set_buffer(buffer);
         v1::FreeBufferReply y;
         return rpc.FreeBuffer(&ctx, r, &y);
       }},
      {"WriteBuffer",
       [&](auto& ctx, uint64_t s) {
         v1::WriteBufferReply y;
         auto writer = rpc.WriteBuffer(&ctx, &y);
         v1::WriteChunk c;
         c.set_session(s);
         c.set_buffer(buffer);
         c.set_data(std::string(64, '\0'));
         writer->Write(c);
         writer->WritesDone();
         return writer->Finish();
       }},
      {"ReadBuffer",
       [&](auto& ctx, uint64_t s) {
         v1::ReadBufferRequest r;
         r.set_session(s);
         r.set_buffer(buffer);
         auto reader = rpc.ReadBuffer(&ctx, r);
         v1::ReadChunk c;
         while (reader->Read(&c)) ADD_FAILURE() << "a chunk of another tenant's buffer came back";
         return reader->Finish();
       }},
      {"LoadProgram",
       [&](auto& ctx, uint64_t s) {
         v1::LoadProgramRequest r;
         r.set_session(s);
         r.set_format("cpu-c");
         r.set_code(kAddSource);
         r.set_entry("add");
         v1::LoadProgramReply y;
         return rpc.LoadProgram(&ctx, r, &y);
       }},
      {"FreeProgram",
       [&](auto& ctx, uint64_t s) {
         v1::FreeProgramRequest r;
         r.set_session(s);
         r.set_program(prog);
         v1::FreeProgramReply y;
         return rpc.FreeProgram(&ctx, r, &y);
       }},
      {"Launch",
       [&](auto& ctx, uint64_t s) {
         v1::LaunchRequest r;
         r.set_session(s);
         r.set_program(prog);
         for (int i = 0; i < 3; ++i) r.add_args()->mutable_view()->set_buffer(buffer);
         r.add_args()->set_int_value(16);
         r.add_args()->set_int_value(1);
         v1::LaunchReply y;
         return rpc.Launch(&ctx, r, &y);
       }},
      {"CopyBuffer",
       [&](auto& ctx, uint64_t s) {
         v1::CopyBufferRequest r;
         r.set_session(s);
         r.mutable_dst()->set_buffer(buffer);  // erin's 2s, which a zeroed copy would show
         r.mutable_src()->set_buffer(out->handle());
         v1::CopyBufferReply y;
         return rpc.CopyBuffer(&ctx, r, &y);
       }},
      {"Synchronize",
       [&](auto& ctx, uint64_t s) {
         v1::SynchronizeRequest r;
         r.set_session(s);
         v1::SynchronizeReply y;
         return rpc.Synchronize(&ctx, r, &y);
       }},
      {"BeginCapture",
       [&](auto& ctx, uint64_t s) {
         v1::BeginCaptureRequest r;
         r.set_session(s);
         v1::BeginCaptureReply y;
         return rpc.BeginCapture(&ctx, r, &y);
       }},
      {"EndCapture",
       [&](auto& ctx, uint64_t s) {
         v1::EndCaptureRequest r;
         r.set_session(s);
         r.set_discard(true);
         v1::GraphReply y;
         return rpc.EndCapture(&ctx, r, &y);
       }},
      {"DefineGraph",
       [&](auto& ctx, uint64_t s) {
         v1::DefineGraphRequest r;
         r.set_session(s);
         v1::Slot* slot = r.mutable_graph()->add_slots();
         slot->set_kind(v1::Slot::CONSTANT);
         slot->set_buffer(buffer);
         v1::GraphCall* call = r.mutable_graph()->add_calls();
         call->set_program(prog);
         v1::GraphReply y;
         return rpc.DefineGraph(&ctx, r, &y);
       }},
      {"ReplayGraph",
       [&](auto& ctx, uint64_t s) {
         v1::ReplayGraphRequest r;
         r.set_session(s);
         r.set_graph(g);
         r.add_params()->set_buffer(buffer);
         r.add_params()->set_buffer(out->handle());
         r.add_reads()->set_buffer(buffer);
         v1::ReplayGraphReply y;
         return rpc.ReplayGraph(&ctx, r, &y);
       }},
      {"FreeGraph",
       [&](auto& ctx, uint64_t s) {
         v1::FreeGraphRequest r;
         r.set_session(s);
         r.set_graph(g);
         v1::FreeGraphReply y;
         return rpc.FreeGraph(&ctx, r, &y);
       }},
      {"GraphInfo",
       [&](auto& ctx, uint64_t s) {
         v1::GraphInfoRequest r;
         r.set_session(s);
         r.set_graph(g);
         v1::GraphReply y;
         return rpc.GraphInfo(&ctx, r, &y);
       }},
      {"Session stream",
       [&](auto& ctx, uint64_t s) {
         auto stream = rpc.Session(&ctx);
         v1::SessionRequest r;
         r.set_seq(1);
         r.set_session(s);
         r.mutable_read()->set_buffer(buffer);
         stream->Write(r);
         stream->WritesDone();
         v1::SessionReply reply;
         grpc::Status answer;
         while (stream->Read(&reply)) {
           EXPECT_FALSE(reply.has_read()) << "another tenant's bytes came back";
           answer = grpc::Status(static_cast<grpc::StatusCode>(reply.code()), reply.message());
         }
         grpc::Status finished = stream->Finish();
         return finished.ok() ? answer : finished;
       }},
  };

  // Alice names erin's session in every RPC; then her own session with erin's handles.
  Client alice = As("alice-token");
  auto mine = alice.OpenSession("cpu:0");
  ASSERT_TRUE(mine.ok());
  for (uint64_t in_session : {session, mine->id()}) {
    for (const auto& [name, call] : calls) {
      if (in_session == mine->id() &&
          (name == "KeepAlive" || name == "CloseSession" || name == "AllocBuffer" || name == "LoadProgram" ||
           name == "Synchronize" || name == "BeginCapture" || name == "EndCapture"))
        continue;  // these name no handle but the session
      grpc::ClientContext ctx;
      Authorize(ctx, "alice-token");
      grpc::Status st = call(ctx, in_session);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND)
          << name << (in_session == session ? " in erin's session: " : " in alice's session: ") << st.error_message();
    }
  }

  // Erin's objects are as she left them.
  EXPECT_TRUE(theirs->KeepAlive().ok());
  auto info = theirs->DescribeGraph(*graph);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->replays(), 0u) << "alice's replay did not run";
  EXPECT_EQ((*theirs->ReadVector<float>(*a, 16)), std::vector<float>(16, 2.f)) << "alice's write did not land";
  auto replayed = theirs->Replay(*graph, {&*a, &*out}, true, {View{&*out}});
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_EQ((*theirs->ReadVector<float>(*out, 1))[0], 4.f);
  EXPECT_TRUE(theirs->Launch(*program, add_args, {1, 1, 1}, {1, 1, 1}, true).ok());
}

TEST_F(TenancyTest, GraphCachesArePerTenantAndTheCompileCacheIsShared) {
  struct Captured {
    bool program_cache_hit = false;
    bool graph_cache_hit = false;
  };
  // Sessions stay open: a closed session's instances leave its tenant's cache.
  std::vector<Client> clients;
  std::vector<Session> sessions;
  auto capture = [&](const std::string& token) -> absl::StatusOr<Captured> {
    clients.push_back(As(token));
    auto s = clients.back().OpenSession("cpu:0");
    if (!s.ok()) return s.status();
    sessions.push_back(std::move(*s));
    Session& session = sessions.back();
    auto p = session.Load(AddSpec());
    auto a = session.Alloc(64), out = session.Alloc(64);
    if (!p.ok() || !a.ok() || !out.ok()) return absl::InternalError("setup failed");
    if (absl::Status b = session.BeginCapture({&*a}, {}); !b.ok()) return b;
    auto l = session.Launch(*p, {View{&*out}, View{&*a}, View{&*a}, int64_t{16}, int64_t{1}}, {1, 1, 1});
    if (!l.ok()) return l.status();
    auto g = session.EndCapture({&*out});
    if (!g.ok()) return g.status();
    return Captured{p->info().cache_hit(), g->info().cache_hit()};
  };
  auto alice_first = capture("alice-token");
  auto erin_first = capture("erin-token");
  auto alice_again = capture("alice-token");
  ASSERT_TRUE(alice_first.ok() && erin_first.ok() && alice_again.ok());
  EXPECT_FALSE(alice_first->graph_cache_hit);
  EXPECT_TRUE(erin_first->program_cache_hit) << "the compile cache is shared: same key, same code";
  EXPECT_FALSE(erin_first->graph_cache_hit) << "erin's graph cache does not hold alice's graph";
  EXPECT_TRUE(alice_again->graph_cache_hit) << "alice's own cache does";
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

TEST_F(TenancyTest, ATenantHoldingItsWorkersDoesNotHoldUpAnother) {
  Options options;
  options.tenants_file = file_;
  options.adjust = [](DaemonOptions& d) { d.streams.workers_per_tenant = 1; };
  Start(options);
  Client alice = As("alice-token");
  auto s = alice.OpenSession("cpu:0");
  ASSERT_TRUE(s.ok()) << s.status();
  auto affine = s->Load({"cpu-c", kAffineSource, "affine", *ParseSignature("out,in,int32,int32"), {}});
  auto in = s->Alloc(256 << 10), out = s->Alloc(256 << 10);
  ASSERT_TRUE(affine.ok() && in.ok() && out.ok());
  const Variable pos{"pos", 1, 1000000, 1};
  ASSERT_TRUE(s->BeginCapture({&*in}, {pos}).ok());
  LaunchSpec spec;
  spec.args = {View{&*out}, View{&*in}, int64_t{16}, Expr{"pos"}};
  spec.variables = {{pos, 1}};
  ASSERT_TRUE(s->Launch(*affine, spec).ok());
  auto graph = s->EndCapture({&*out});
  ASSERT_TRUE(graph.ok()) << graph.status();

  // Alice's sequence streams 256 KiB per replay to a stream that never reads: it holds a
  // worker, her one, until the stream ends.
  grpc::ClientContext stalled;
  Authorize(stalled, "alice-token");
  auto stream = stub().Session(&stalled);
  v1::SessionRequest r;
  r.set_seq(1);
  r.set_session(s->id());
  v1::ReplaySequenceRequest* sequence = r.mutable_replay_sequence();
  sequence->set_graph(graph->handle());
  sequence->add_base()->set_buffer(in->handle());
  sequence->add_base()->set_buffer(out->handle());
  sequence->add_base()->set_int_value(1);
  sequence->set_step_param(2);
  sequence->set_count(100000);
  sequence->set_stream_reads(true);
  sequence->add_reads()->set_buffer(out->handle());
  ASSERT_TRUE(stream->Write(r));
  absl::SleepFor(absl::Milliseconds(200));

  // With an operation running, requests go to workers: alice has none left, erin has hers.
  auto refused = s->KeepAlive();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("tenant alice"));
  auto erin = As("erin-token").OpenSession("cpu:0");
  ASSERT_TRUE(erin.ok()) << erin.status();
  EXPECT_TRUE(erin->KeepAlive().ok());
  stalled.TryCancel();
  stream->Finish();
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
  d.executor_binary = REPLAYD_EXECUTOR_BINARY;
  d.tenants_file = dir.path() / "missing";
  EXPECT_EQ(Daemon::Start(d).status().code(), absl::StatusCode::kInvalidArgument);
  std::ofstream(dir.path() / "bad") << "tenant {";
  d.tenants_file = dir.path() / "bad";
  EXPECT_EQ(Daemon::Start(d).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace replayd::client
