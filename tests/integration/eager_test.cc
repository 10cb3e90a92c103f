// The eager flow end to end over loopback gRPC: devices, sessions, buffers, programs,
// launches, the compile cache across restarts, leases, and concurrent clients.
#include <gmock/gmock.h>

#include <thread>

#include "tests/integration/daemon_fixture.h"

namespace replayd::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class EagerTest : public DaemonFixture {};

std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(i) * scale;
  return v;
}

TEST_F(EagerTest, ListDevicesReportsCpu0) {
  auto devices = client().ListDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 1u);
  const v1::Device& d = (*devices)[0];
  EXPECT_EQ(d.id(), "cpu:0");
  EXPECT_EQ(d.kind(), "cpu");
  EXPECT_EQ(d.total_memory(), 256u << 20);
  EXPECT_EQ(d.free_memory(), 256u << 20);
  EXPECT_THAT(d.formats(), ElementsAre("cpu-c"));
  EXPECT_EQ(d.limits().max_local_total(), 1u);
  EXPECT_GT(d.limits().max_global_total(), 1u);
  EXPECT_FALSE(d.driver_version().empty());
}

TEST_F(EagerTest, AddKernelComputesTheSum) {
  Session s = Open();
  EXPECT_GT(s.lease_seconds(), 0u);
  const int n = 1000;
  auto a = s.Alloc(n * 4), b = s.Alloc(n * 4), out = s.Alloc(n * 4);
  ASSERT_TRUE(a.ok() && b.ok() && out.ok());
  ASSERT_TRUE(s.WriteVector(*a, Ramp(n, 1)).ok());
  ASSERT_TRUE(s.WriteVector(*b, Ramp(n, 0.5)).ok());
  auto program = s.Load(AddSpec());
  ASSERT_TRUE(program.ok()) << program.status();
  EXPECT_EQ(program->info().key().size(), 64u);
  EXPECT_FALSE(program->info().cache_hit());
  EXPECT_GT(program->info().compile_seconds(), 0);
  auto r = s.Launch(*program, {View{&*out}, View{&*a}, View{&*b}, int64_t{n}, int64_t{7}},
                    {7, 1, 1}, {1, 1, 1}, /*wait=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->device_seconds(), 0);
  auto result = s.ReadVector<float>(*out, n);
  ASSERT_TRUE(result.ok());
  for (int i = 0; i < n; ++i) ASSERT_EQ((*result)[i], 1.5f * i) << i;
  EXPECT_TRUE(s.Synchronize().ok());
}

TEST_F(EagerTest, ViewsApplyTheirOffsets) {
  Session s = Open();
  auto a = s.Alloc(64), out = s.Alloc(64);
  ASSERT_TRUE(s.WriteVector(*a, Ramp(16, 1)).ok());
  auto program = s.Load(AddSpec());
  ASSERT_TRUE(program.ok());
  // out[8..12) = a[4..8) + a[0..4)
  ASSERT_TRUE(s.Launch(*program,
                       {View{&*out, 32, 16}, View{&*a, 16, 16}, View{&*a, 0, 16}, int64_t{4}, int64_t{1}},
                       {1, 1, 1}, {1, 1, 1}, true)
                  .ok());
  auto result = s.ReadVector<float>(*out, 16);
  EXPECT_THAT(std::vector<float>(result->begin() + 8, result->begin() + 12),
              ElementsAre(4.f, 6.f, 8.f, 10.f));
  EXPECT_EQ((*result)[7], 0.f);
  EXPECT_EQ((*result)[12], 0.f);
}

TEST_F(EagerTest, SecondLoadHitsTheCompileCache) {
  Session s = Open();
  auto first = s.Load(AddSpec());
  auto second = s.Load(AddSpec());
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_TRUE(second->info().cache_hit());
  EXPECT_EQ(second->info().compile_seconds(), 0);
  EXPECT_EQ(first->info().key(), second->info().key());
  EXPECT_NE(first->handle(), second->handle());
  ProgramSpec other = AddSpec();
  other.options = {"-O3"};
  auto third = s.Load(other);
  ASSERT_TRUE(third.ok());
  EXPECT_FALSE(third->info().cache_hit());
  EXPECT_NE(third->info().key(), first->info().key());
}

TEST_F(EagerTest, ARestartedDaemonReusesCompiledArtifacts) {
  std::string key;
  {
    Session s = Open();
    auto p = s.Load(AddSpec());
    ASSERT_TRUE(p.ok());
    key = p->info().key();
  }
  Start(Options());
  Session s = Open();
  auto p = s.Load(AddSpec());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->info().cache_hit());
  EXPECT_EQ(p->info().key(), key);
  auto out = s.Alloc(16), a = s.Alloc(16);
  ASSERT_TRUE(s.WriteVector(*a, Ramp(4, 1)).ok());
  ASSERT_TRUE(s.Launch(*p, {View{&*out}, View{&*a}, View{&*a}, int64_t{4}, int64_t{1}}, {1, 1, 1}).ok());
  EXPECT_THAT(*s.ReadVector<float>(*out, 4), ElementsAre(0.f, 2.f, 4.f, 6.f));
}

TEST_F(EagerTest, FreedHandlesAreGoneAndTheirMemoryReturns) {
  const uint64_t baseline = FreeMemory();
  Session s = Open();
  auto b = s.Alloc(1 << 20);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(FreeMemory(), baseline - (1 << 20));
  uint64_t handle = b->handle();
  *b = Buffer();  // frees it
  EXPECT_EQ(FreeMemory(), baseline);
  grpc::ClientContext ctx;
  v1::FreeBufferRequest req;
  req.set_session(s.id());
  req.set_buffer(handle);
  v1::FreeBufferReply reply;
  EXPECT_EQ(stub().FreeBuffer(&ctx, req, &reply).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(EagerTest, ClosingASessionFreesEverythingItOwned) {
  const uint64_t baseline = FreeMemory();
  uint64_t id;
  {
    Session s = Open();
    id = s.id();
    std::vector<Buffer> small;
    for (int i = 0; i < 10; ++i) small.push_back(*s.Alloc(100000));
    auto keep = s.Alloc(4 << 20);
    ASSERT_TRUE(keep.ok());
    ASSERT_TRUE(s.Load(AddSpec()).ok());
    EXPECT_LT(FreeMemory(), baseline);
    ASSERT_TRUE(s.Close().ok());
    EXPECT_EQ(FreeMemory(), baseline);
    EXPECT_EQ(s.KeepAlive().code(), absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(daemon_->engine().session_count(), 0u);
  grpc::ClientContext ctx;
  v1::CloseSessionRequest req;
  req.set_session(id);
  v1::CloseSessionReply reply;
  EXPECT_EQ(stub().CloseSession(&ctx, req, &reply).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(EagerTest, AnExpiredLeaseClosesTheSessionAndFreesItsMemory) {
  Start({absl::Seconds(1), 256 << 20});
  const uint64_t baseline = FreeMemory();
  Session s = Open();
  EXPECT_EQ(s.lease_seconds(), 1u);
  auto b = s.Alloc(8 << 20);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(FreeMemory(), baseline - (8 << 20));
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (daemon_->engine().session_count() > 0 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(daemon_->engine().session_count(), 0u);
  EXPECT_EQ(FreeMemory(), baseline);
  EXPECT_EQ(s.KeepAlive().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.Alloc(16).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(EagerTest, KeepAliveHoldsTheLease) {
  Start({absl::Seconds(1), 256 << 20});
  Session s = Open();
  auto b = s.Alloc(64);
  for (int i = 0; i < 10; ++i) {
    absl::SleepFor(absl::Milliseconds(250));
    ASSERT_TRUE(s.KeepAlive().ok()) << "renewal " << i;
  }
  EXPECT_EQ(daemon_->engine().session_count(), 1u);
  EXPECT_TRUE(s.ReadVector<float>(*b, 16).ok());
}

TEST_F(EagerTest, EightConcurrentClientsEachGetTheirOwnCorrectResults) {
  const uint64_t baseline = FreeMemory();
  constexpr int kClients = 8, kRounds = 20, kN = 4096;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      Client own = Client::Connect(daemon_->address());
      auto s = own.OpenSession("cpu:0");
      if (!s.ok()) return void(++failures);
      auto a = s->Alloc(kN * 4), b = s->Alloc(kN * 4), out = s->Alloc(kN * 4);
      auto p = s->Load(AddSpec());
      if (!a.ok() || !b.ok() || !out.ok() || !p.ok()) return void(++failures);
      for (int r = 0; r < kRounds; ++r) {
        float scale = float(c * 100 + r);
        if (!s->WriteVector(*a, Ramp(kN, scale)).ok() || !s->WriteVector(*b, Ramp(kN, 1)).ok())
          return void(++failures);
        auto l = s->Launch(*p, {View{&*out}, View{&*a}, View{&*b}, int64_t{kN}, int64_t{4}}, {4, 1, 1});
        auto got = s->ReadVector<float>(*out, kN);
        if (!l.ok() || !got.ok()) return void(++failures);
        for (int i = 0; i < kN; ++i)
          if ((*got)[i] != float(i) * scale + float(i)) return void(++failures);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(FreeMemory(), baseline);
  EXPECT_EQ(daemon_->engine().session_count(), 0u);
}

TEST_F(EagerTest, CompileErrorsReturnTheCompilerDiagnostics) {
  Session s = Open();
  ProgramSpec spec;
  spec.code = "void k(float *x) {\n  x[0] = 1.0f\n}\n";
  spec.entry = "k";
  spec.signature = *ParseSignature("out");
  auto p = s.Load(spec);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("program.c:2"));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("error"));
}

}  // namespace
}  // namespace replayd::client
