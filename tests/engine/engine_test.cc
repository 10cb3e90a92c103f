// The engine over the fake device: sessions open only on devices it owns and are found
// only by their tenant; a tenant's quotas refuse past them naming the quota and closing
// gives the account back; an expired session is reaped, one running an operation once it
// ends; the admin's close names the owner; two sessions of one tenant share a cached
// graph; and whatever is left open, the engine's end frees every allocation.
#include "engine/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "absl/synchronization/notification.h"
#include "tests/support/fake_driver.h"
#include "tests/support/status_macros.h"
#include "tests/support/temp_dir.h"

namespace replayd {
namespace {

using ::testing::HasSubstr;
using testing::FakeDevice;

constexpr int kN = 16;  // int32 elements of the buffers the kernel computes on
constexpr uint64_t kBytes = kN * 4;
const VariableDecl kK{"k", 0, 100, 1};

// What the device held when the engine that owns it let it go, after every session closed.
struct FinalCounts {
  size_t live_allocations = SIZE_MAX;
  int bad_frees = -1;
};

class WatchedDevice : public FakeDevice {
 public:
  explicit WatchedDevice(FinalCounts* final) : FakeDevice(1 << 20), final_(final) {}
  ~WatchedDevice() override {
    final_->live_allocations = live_allocations();
    final_->bad_frees = bad_frees();
  }

 private:
  FinalCounts* const final_;
};

Signature AddSignature() {
  Signature sig;
  sig.params = {{"out", ParamKind::kBuffer, Access::kOut},
                {"in", ParamKind::kBuffer, Access::kIn},
                {"k", ParamKind::kInt64, Access::kNone}};
  return sig;
}

Quotas WithQuotas(uint64_t sessions, uint64_t memory) {
  Quotas q = {};
  q[static_cast<size_t>(Resource::kSessions)] = sessions;
  q[static_cast<size_t>(Resource::kMemory)] = memory;
  return q;
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = std::make_unique<WatchedDevice>(&final_);
    device_ = device.get();
    // out[i] = in[i] + k for i < global[0], on int32.
    device_->AddKernel("add", [](std::span<const ArgValue> args, const Dim3& global) {
      auto* out = reinterpret_cast<int32_t*>(args[0].address);
      const auto* in = reinterpret_cast<const int32_t*>(args[1].address);
      for (uint64_t i = 0; i < global[0]; ++i) out[i] = in[i] + static_cast<int32_t>(args[2].integer);
    });
    // Holds its launch (and so its session) until the test releases it.
    device_->AddKernel("wait", [this](std::span<const ArgValue>, const Dim3&) {
      started_.Notify();
      release_.WaitForNotification();
    });
    std::vector<std::unique_ptr<Device>> devices;
    devices.push_back(std::move(device));
    EngineOptions options;
    options.cache_dir = cache_dir_.path();
    // Long enough that the engine's own reaper expires nothing while a test runs; the
    // tests reap at a time past it.
    options.lease = absl::Seconds(10);
    ASSERT_OK_AND_ASSIGN(engine_, Engine::Create(options, std::move(devices)));
  }

  // Every test ends with the engine: by then every allocation is freed.
  void TearDown() override {
    if (!release_.HasBeenNotified()) release_.Notify();
    engine_.reset();
    if (device_ == nullptr) return;
    EXPECT_EQ(final_.live_allocations, 0u);
    EXPECT_EQ(final_.bad_frees, 0);
  }

  absl::Time PastTheLease() const { return absl::Now() + 2 * engine_->lease(); }

  uint64_t Used(const std::string& tenant, Resource r) const {
    for (const TenantReport& t : engine_->Tenants())
      if (t.name == tenant) return t.usage.used[static_cast<size_t>(r)];
    ADD_FAILURE() << "no tenant " << tenant;
    return 0;
  }

  // Loads "add", writes `in` with 0, 1, 2, ..., and captures out = in + k, k a variable.
  absl::StatusOr<GraphInfo> CaptureAdd(DeviceSession& session, Handle& in, Handle& out) {
    absl::StatusOr<ProgramInfo> add = session.LoadProgram({"fake", "add", "add", AddSignature(), {}});
    if (!add.ok()) return add.status();
    for (Handle* h : {&in, &out}) {
      absl::StatusOr<Handle> b = session.AllocBuffer(kBytes);
      if (!b.ok()) return b.status();
      *h = *b;
    }
    std::vector<int32_t> values(kN);
    for (int i = 0; i < kN; ++i) values[i] = i;
    if (absl::Status s = session.WriteBuffer(
            in, 0, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(values.data()), kBytes));
        !s.ok())
      return s;
    if (absl::Status s = session.BeginCapture({in}, {kK}); !s.ok()) return s;
    LaunchOp op;
    op.program = add->handle;
    op.variables = {{kK, 1}};
    op.args = {ViewArg{out, 0, 0}, ViewArg{in, 0, 0}, Expression::Var(0)};
    op.global = {Expression::Constant(kN)};
    if (absl::Status s = session.Launch(op).status(); !s.ok()) return s;
    return session.EndCapture({out});
  }

  // Starts a launch of "wait" on `session` on its own thread and returns once it runs.
  std::thread StartWaiting(std::shared_ptr<DeviceSession> session, absl::Status& result) {
    absl::StatusOr<ProgramInfo> wait = session->LoadProgram({"fake", "wait", "wait", Signature{}, {}});
    EXPECT_TRUE(wait.ok()) << wait.status();
    const Handle program = wait.ok() ? wait->handle : 0;
    std::thread running([session, program, &result] {
      LaunchOp op;
      op.program = program;
      op.wait = true;  // runs now, not when the stream is next needed
      result = session->Launch(op).status();
    });
    if (wait.ok()) started_.WaitForNotification();
    return running;
  }

  TempDir cache_dir_;
  FinalCounts final_;
  WatchedDevice* device_ = nullptr;  // owned by the engine
  absl::Notification started_, release_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineTest, ASessionOnAnUnknownDeviceIsNotFound) {
  absl::StatusOr<std::shared_ptr<DeviceSession>> s = engine_->OpenSession("a", "cuda:7");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("cuda:7"));
  EXPECT_EQ(engine_->session_count(), 0u);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceSession> on_fake, engine_->OpenSession("a", "fake:0"));
  EXPECT_EQ(on_fake->device().id, "fake:0");
  EXPECT_EQ(Used("a", Resource::kSessions), 1u) << "the refused open took nothing";
}

TEST_F(EngineTest, AnotherTenantsSessionIsNotFound) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceSession> mine, engine_->OpenSession("a", "fake:0"));
  const SessionId id = mine->id();
  absl::StatusOr<std::shared_ptr<DeviceSession>> theirs = engine_->FindSession("b", id);
  EXPECT_EQ(theirs.status().code(), absl::StatusCode::kNotFound);
  // Said as for a session that does not exist.
  absl::StatusOr<std::shared_ptr<DeviceSession>> none = engine_->FindSession("b", id + 1);
  EXPECT_EQ(theirs.status().message(), absl::StrCat("session ", id, " not found"));
  EXPECT_EQ(none.status().message(), absl::StrCat("session ", id + 1, " not found"));
  EXPECT_EQ(engine_->CloseSession("b", id).code(), absl::StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceSession> found, engine_->FindSession("a", id));
  EXPECT_EQ(found, mine) << "the other tenant's close changed nothing";
}

TEST_F(EngineTest, AClosedSessionIsNotFound) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceSession> s, engine_->OpenSession("a", "fake:0"));
  ASSERT_OK_AND_ASSIGN(Handle b, s->AllocBuffer(kBytes));
  ASSERT_TRUE(engine_->CloseSession("a", s->id()).ok());
  EXPECT_EQ(engine_->FindSession("a", s->id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->CloseSession("a", s->id()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->session_count(), 0u);
  EXPECT_EQ(device_->live_allocations(), 0u);
  EXPECT_EQ(s->FreeBuffer(b).code(), absl::StatusCode::kNotFound) << "a handle kept past the close";
}

TEST_F(EngineTest, ATenantsQuotasRefuseNamingTheQuotaAndClosingGivesThemBack) {
  engine_->ConfigureTenants({{"a", TenantLimits{WithQuotas(1, 4 * kBytes)}}});
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceSession> s, engine_->OpenSession("a", "fake:0"));
  absl::StatusOr<std::shared_ptr<DeviceSession>> second = engine_->OpenSession("a", "fake:0");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("sessions quota of 1"));
  EXPECT_TRUE(engine_->OpenSession("b", "fake:0").ok()) << "another tenant's quota is its own";

  // A program, a graph and its two buffers, then one more buffer: 3 * kBytes of 4.
  Handle in = 0, out = 0;
  ASSERT_TRUE(CaptureAdd(*s, in, out).ok());
  ASSERT_TRUE(s->AllocBuffer(kBytes).ok());
  absl::StatusOr<Handle> past = s->AllocBuffer(2 * kBytes);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kResourceExhausted) << past.status();
  EXPECT_THAT(std::string(past.status().message()), HasSubstr("memory_bytes quota of 256"));
  EXPECT_EQ(Used("a", Resource::kMemory), 3 * kBytes) << "the refused allocation took nothing";
  EXPECT_EQ(Used("a", Resource::kSessions), 1u);
  EXPECT_EQ(Used("a", Resource::kPrograms), 1u);
  EXPECT_EQ(Used("a", Resource::kGraphs), 1u);

  ASSERT_TRUE(engine_->CloseSession("a", s->id()).ok());
  for (Resource r : {Resource::kMemory, Resource::kSessions, Resource::kPrograms, Resource::kGraphs})
    EXPECT_EQ(Used("a", r), 0u) << ResourceName(r);
  EXPECT_TRUE(engine_->OpenSession("a", "fake:0").ok());
}

TEST_F(EngineTest, AnExpiredSessionIsReapedAndOneRunningOnceItEnds) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceSession> idle, engine_->OpenSession("a", "fake:0"));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceSession> busy, engine_->OpenSession("a", "fake:0"));
  ASSERT_TRUE(idle->AllocBuffer(kBytes).ok());
  ASSERT_TRUE(busy->AllocBuffer(kBytes).ok());
  EXPECT_EQ(engine_->ReapExpired(absl::Now()), 0) << "both leases run";
  absl::Status launched;
  std::thread running = StartWaiting(busy, launched);

  EXPECT_EQ(engine_->ReapExpired(PastTheLease()), 2);
  EXPECT_EQ(engine_->session_count(), 0u);
  EXPECT_EQ(engine_->FindSession("a", busy->id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(idle->AllocBuffer(kBytes).status().code(), absl::StatusCode::kNotFound) << "closed at once";
  EXPECT_EQ(device_->live_allocations(), 1u) << "the running session's buffer stays while its launch runs";
  EXPECT_EQ(busy->memory_in_use(), kBytes);

  release_.Notify();
  running.join();
  EXPECT_TRUE(launched.ok()) << launched;
  EXPECT_EQ(engine_->ReapExpired(PastTheLease()), 0) << "nothing newly expired";
  // Taking the session's lock waits for a close the reaper thread may be making.
  EXPECT_EQ(busy->AllocBuffer(kBytes).status().code(), absl::StatusCode::kNotFound) << "closed once it ended";
  EXPECT_EQ(device_->live_allocations(), 0u);
  EXPECT_EQ(Used("a", Resource::kSessions), 0u);
}

// A session whose context is lost (its executor ended) is closed by the reaper, so its
// memory and counts go back to its tenant, and says why until its owner closes it.
TEST_F(EngineTest, ASessionWhoseContextIsLostIsClosedAndSaysWhy) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceSession> s, engine_->OpenSession("a", "fake:0"));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceSession> other, engine_->OpenSession("b", "fake:0"));
  ASSERT_TRUE(s->AllocBuffer(kBytes).ok());
  EXPECT_EQ(Used("a", Resource::kMemory), kBytes);
  device_->Lose(absl::FailedPreconditionError("executor of tenant a on fake:0 died: SIGSEGV"));
  EXPECT_EQ(engine_->ReapExpired(absl::Now()), 0) << "none expired";
  EXPECT_EQ(engine_->session_count(), 0u) << "both contexts were lost";
  EXPECT_EQ(Used("a", Resource::kMemory), 0u);
  EXPECT_EQ(Used("a", Resource::kSessions), 0u);
  absl::StatusOr<std::shared_ptr<DeviceSession>> found = engine_->FindSession("a", s->id());
  EXPECT_EQ(found.status().code(), absl::StatusCode::kFailedPrecondition) << found.status();
  EXPECT_THAT(std::string(found.status().message()), HasSubstr("died: SIGSEGV"));
  EXPECT_EQ(engine_->FindSession("b", s->id()).status().code(), absl::StatusCode::kNotFound)
      << "another tenant learns nothing";
  // The owner's close acknowledges it.
  EXPECT_TRUE(engine_->CloseSession("a", s->id()).ok());
  EXPECT_EQ(engine_->FindSession("a", s->id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->CloseSession("a", s->id()).code(), absl::StatusCode::kNotFound);
  device_->Lose(absl::OkStatus());
}

TEST_F(EngineTest, AnAdminCloseReturnsTheOwner) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceSession> s, engine_->OpenSession("research", "fake:0"));
  ASSERT_TRUE(s->AllocBuffer(kBytes).ok());
  ASSERT_OK_AND_ASSIGN(std::string owner, engine_->AdminCloseSession(s->id()));
  EXPECT_EQ(owner, "research");
  EXPECT_EQ(engine_->FindSession("research", s->id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(device_->live_allocations(), 0u);
  EXPECT_EQ(engine_->AdminCloseSession(s->id()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(EngineTest, TwoSessionsOfATenantShareACapturedGraph) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceSession> first, engine_->OpenSession("a", "fake:0"));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceSession> second, engine_->OpenSession("a", "fake:0"));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceSession> other, engine_->OpenSession("b", "fake:0"));
  Handle in1 = 0, out1 = 0, in2 = 0, out2 = 0, in3 = 0, out3 = 0;
  ASSERT_OK_AND_ASSIGN(GraphInfo made, CaptureAdd(*first, in1, out1));
  ASSERT_OK_AND_ASSIGN(GraphInfo hit, CaptureAdd(*second, in2, out2));
  EXPECT_FALSE(made.cache_hit);
  EXPECT_TRUE(hit.cache_hit);
  EXPECT_EQ(hit.key, made.key);
  GraphCacheStats stats = engine_->graph_cache_stats("a", "fake:0");
  EXPECT_EQ(stats.hits, 1u);
  EXPECT_EQ(stats.misses, 1u);
  EXPECT_EQ(stats.instantiations, 1u);
  EXPECT_EQ(stats.graphs, 1u);
  // Another tenant's cache is its own.
  ASSERT_OK_AND_ASSIGN(GraphInfo theirs, CaptureAdd(*other, in3, out3));
  EXPECT_FALSE(theirs.cache_hit);
  EXPECT_EQ(engine_->graph_cache_stats("b", "fake:0").hits, 0u);
  EXPECT_EQ(engine_->graph_cache_stats("nobody", "fake:0").misses, 0u);

  // The shared instance replays on the second session's buffers, also once its maker closed.
  ASSERT_TRUE(engine_->CloseSession("a", first->id()).ok());
  ReplayOp op{hit.handle, {BufferParam{in2}, BufferParam{out2}, int64_t{40}}, true, {ViewArg{out2, 0, 0}}};
  ASSERT_OK_AND_ASSIGN(ReplayOutcome r, second->ReplayGraph(op));
  ASSERT_EQ(r.reads.size(), 1u);
  ASSERT_EQ(r.reads[0].size(), kBytes);
  std::vector<int32_t> got(kN);
  std::memcpy(got.data(), r.reads[0].data(), kBytes);
  for (int i = 0; i < kN; ++i) EXPECT_EQ(got[i], i + 40) << i;
}

TEST_F(EngineTest, TheEnginesEndFreesEverySessionsMemory) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceSession> a, engine_->OpenSession("a", "fake:0"));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceSession> b, engine_->OpenSession("b", "fake:0"));
  Handle in = 0, out = 0;
  ASSERT_TRUE(CaptureAdd(*a, in, out).ok());
  ASSERT_TRUE(b->AllocBuffer(kBytes).ok());
  // A capture left open, holding a buffer freed inside it.
  ASSERT_TRUE(b->BeginCapture({}, {}).ok());
  ASSERT_OK_AND_ASSIGN(Handle inside, b->AllocBuffer(kBytes));
  ASSERT_TRUE(b->CopyBuffer({ViewArg{inside, 0, kBytes / 2}, ViewArg{inside, kBytes / 2, 0}}).ok());
  ASSERT_TRUE(b->FreeBuffer(inside).ok());
  ASSERT_EQ(device_->live_allocations(), 4u);

  engine_.reset();  // TearDown checks what the device held when the engine let it go
  EXPECT_EQ(final_.live_allocations, 0u);
  EXPECT_EQ(final_.bad_frees, 0);
  // A session kept past the engine is closed.
  EXPECT_EQ(a->AllocBuffer(kBytes).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace replayd
