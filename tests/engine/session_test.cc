// A session on the fake device: buffers round-trip and are refused past the device's
// memory, a view out of range or an unknown handle; a launch computes; a capture replays
// what eager launches computed; every device failure (an allocation, an instantiation, an
// update, a launch mid-replay) comes back as the error with nothing leaked and the next
// operation right; a replay sequence steps, stops at its callback's error or when its
// requester is gone; Close frees everything, and TryClose leaves a running operation be.
#include "engine/session.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <thread>

#include "absl/synchronization/notification.h"
#include "engine/accounted_context.h"
#include "tests/support/fake_driver.h"
#include "tests/support/status_macros.h"
#include "tests/support/temp_dir.h"

namespace replayd {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing::FakeDevice;

constexpr int kN = 16;  // int32 elements of the buffers the kernels compute on
constexpr uint64_t kBytes = kN * 4;
const VariableDecl kK{"k", 0, 100, 1};

Signature AddSignature() {
  Signature sig;
  sig.params = {{"out", ParamKind::kBuffer, Access::kOut},
                {"in", ParamKind::kBuffer, Access::kIn},
                {"k", ParamKind::kInt64, Access::kNone}};
  return sig;
}

// out[i] = in[i] + k for i < global[0], on int32.
void Add(std::span<const ArgValue> args, const Dim3& global) {
  auto* out = reinterpret_cast<int32_t*>(args[0].address);
  const auto* in = reinterpret_cast<const int32_t*>(args[1].address);
  for (uint64_t i = 0; i < global[0]; ++i) out[i] = in[i] + static_cast<int32_t>(args[2].integer);
}

std::vector<int32_t> Decode(const std::string& bytes) {
  std::vector<int32_t> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// in[i] + k for each i.
std::vector<int32_t> Plus(const std::vector<int32_t>& in, int64_t k) {
  std::vector<int32_t> v = in;
  for (int32_t& x : v) x += static_cast<int32_t>(k);
  return v;
}

uint64_t Used(const TenantAccount& account, Resource r) { return account.usage().used[static_cast<size_t>(r)]; }

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    device_.AddKernel("add", Add);
    // Holds its launch (and so the session) until the test releases it.
    device_.AddKernel("wait", [this](std::span<const ArgValue> args, const Dim3&) {
      started_.Notify();
      release_.WaitForNotification();
      *reinterpret_cast<int32_t*>(args[0].address) = 42;
    });
    ASSERT_OK_AND_ASSIGN(compile_cache_, CompileCache::Open(cache_dir_.path()));
    ASSERT_TRUE(account_.Reserve(Resource::kSessions, 1).ok());  // as the engine does; Close gives it back
    auto context = std::make_unique<testing::FakeContext>(&device_);
    // Batches of 1, 2, 4, ... calls, so a two-call graph has two device graphs.
    SessionEnv env{&device_, compile_cache_.get(), &graph_cache_, BatchOptions{1}, &account_, &scheduler_, queue_};
    session_ = std::make_unique<DeviceSession>(
        1, "t", env, std::make_shared<AccountedContext>(std::move(context), &account_), absl::Seconds(60));
    for (int i = 0; i < kN; ++i) input_.push_back(i * 3 - 7);
  }

  // Another session of the tenant, with a context of its own, sharing the graph cache.
  std::unique_ptr<DeviceSession> OpenAnother(Handle id) {
    EXPECT_TRUE(account_.Reserve(Resource::kSessions, 1).ok());
    SessionEnv env{&device_, compile_cache_.get(), &graph_cache_, BatchOptions{1}, &account_, &scheduler_, queue_};
    return std::make_unique<DeviceSession>(
        id, "t", env, std::make_shared<AccountedContext>(std::make_unique<testing::FakeContext>(&device_), &account_),
        absl::Seconds(60));
  }

  absl::StatusOr<Handle> Load(const std::string& name, Signature sig) { return Load(*session_, name, std::move(sig)); }
  static absl::StatusOr<Handle> Load(DeviceSession& session, const std::string& name, Signature sig) {
    absl::StatusOr<ProgramInfo> p = session.LoadProgram({"fake", name, name, std::move(sig), {}});
    if (!p.ok()) return p.status();
    return p->handle;
  }

  // A buffer of kN ints holding `values`, or zeroed.
  absl::StatusOr<Handle> Buffer(const std::vector<int32_t>& values = {}) { return Buffer(*session_, values); }
  static absl::StatusOr<Handle> Buffer(DeviceSession& session, const std::vector<int32_t>& values = {}) {
    absl::StatusOr<Handle> b = session.AllocBuffer(kBytes);
    if (!b.ok() || values.empty()) return b;
    absl::Status s = session.WriteBuffer(
        *b, 0, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(values.data()), values.size() * 4));
    if (!s.ok()) return s;
    return b;
  }
  absl::StatusOr<std::vector<int32_t>> Read(Handle buffer) { return Read(*session_, buffer); }
  static absl::StatusOr<std::vector<int32_t>> Read(DeviceSession& session, Handle buffer) {
    std::vector<int32_t> v(kN);
    absl::Status s = session.ReadBuffer(buffer, 0, std::span<uint8_t>(reinterpret_cast<uint8_t*>(v.data()), kBytes));
    if (!s.ok()) return s;
    return v;
  }

  // add(out, in, k) with k the bound variable kK at `k`.
  static LaunchOp AddVar(Handle program, Handle out, Handle in, int64_t k) {
    LaunchOp op;
    op.program = program;
    op.variables = {{kK, k}};
    op.args = {ViewArg{out, 0, 0}, ViewArg{in, 0, 0}, Expression::Var(0)};
    op.global = {Expression::Constant(kN)};
    return op;
  }
  // add(out, in, k) with k a constant.
  static LaunchOp AddConst(Handle program, Handle out, Handle in, int64_t k) {
    LaunchOp op = AddVar(program, out, in, 0);
    op.variables.clear();
    op.args[2] = Expression::Constant(k);
    return op;
  }

  // Records out = (in + k) + 1 in a capture left open: the middle buffer, allocated and
  // freed inside, becomes an internal. The graph's parameters: in, out, k.
  absl::Status RecordChain(Handle program, Handle in, Handle out) { return RecordChain(*session_, program, in, out); }
  static absl::Status RecordChain(DeviceSession& session, Handle program, Handle in, Handle out) {
    if (absl::Status s = session.BeginCapture({in}, {kK}); !s.ok()) return s;
    absl::StatusOr<Handle> mid = Buffer(session);
    if (!mid.ok()) return mid.status();
    if (absl::Status s = session.Launch(AddVar(program, *mid, in, 5)).status(); !s.ok()) return s;
    if (absl::Status s = session.Launch(AddConst(program, out, *mid, 1)).status(); !s.ok()) return s;
    return session.FreeBuffer(*mid);
  }

  // A replay of `graph` with `params`, not waited for, reading nothing.
  static ReplayOp Op(Handle graph, std::vector<ParamValue> params) {
    ReplayOp op;
    op.graph = graph;
    op.params = std::move(params);
    return op;
  }
  // A replay of the chain (or of add) with k, waited for, reading out.
  static ReplayOp Replay(Handle graph, Handle in, Handle out, int64_t k) {
    return ReplayOp{graph, {BufferParam{in}, BufferParam{out}, k}, /*wait=*/true, {ViewArg{out, 0, 0}}};
  }

  // Replays `graph` with k and expects out = in + k + 1, read back with the replay.
  void ExpectChain(Handle graph, Handle in, Handle out, int64_t k) {
    absl::StatusOr<ReplayOutcome> r = session_->ReplayGraph(Replay(graph, in, out, k));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->reads.size(), 1u);
    EXPECT_THAT(Decode(r->reads[0]), ElementsAreArray(Plus(input_, k + 1))) << "k = " << k;
  }

  TempDir cache_dir_;
  FakeDevice device_{1 << 20};
  TenantAccount account_{"t", Quotas{}};
  Scheduler scheduler_{SchedulerOptions{}};
  Scheduler::Queue* queue_ = scheduler_.QueueFor(&account_, TenantLimits{});
  GraphCache graph_cache_{GraphCacheOptions{}};
  std::unique_ptr<CompileCache> compile_cache_;
  absl::Notification started_, release_;
  std::vector<int32_t> input_;
  // Last, so it is destroyed first.
  std::unique_ptr<DeviceSession> session_;
};

TEST_F(SessionTest, ABufferRoundTripsAndIsFreed) {
  ASSERT_OK_AND_ASSIGN(Handle b, Buffer(input_));
  EXPECT_EQ(session_->memory_in_use(), kBytes);
  EXPECT_EQ(Used(account_, Resource::kMemory), kBytes);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> back, Read(b));
  EXPECT_EQ(back, input_);
  // A part at an offset.
  const int32_t two[] = {100, 200};
  ASSERT_TRUE(session_->WriteBuffer(b, 8, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(two), 8)).ok());
  ASSERT_OK_AND_ASSIGN(back, Read(b));
  EXPECT_EQ(back[1], input_[1]);
  EXPECT_EQ(back[2], 100);
  EXPECT_EQ(back[3], 200);
  EXPECT_EQ(back[4], input_[4]);
  ASSERT_TRUE(session_->FreeBuffer(b).ok());
  EXPECT_EQ(session_->memory_in_use(), 0u);
  EXPECT_EQ(Used(account_, Resource::kMemory), 0u);
  EXPECT_EQ(device_.live_allocations(), 0u);
  EXPECT_EQ(session_->FreeBuffer(b).code(), absl::StatusCode::kNotFound) << "a handle is never reused";
}

TEST_F(SessionTest, AZeroByteBufferIsInvalid) {
  absl::StatusOr<Handle> b = session_->AllocBuffer(0);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
  EXPECT_EQ(device_.counts().allocations, 0);
}

TEST_F(SessionTest, ABufferPastTheDevicesMemoryIsExhaustedAndAllocatesNothing) {
  absl::StatusOr<Handle> huge = session_->AllocBuffer(uint64_t{2} << 20);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("fake:0"));
  // Fits the device, not what is left of it.
  ASSERT_OK_AND_ASSIGN(Handle b, session_->AllocBuffer(768 << 10));
  absl::StatusOr<Handle> more = session_->AllocBuffer(512 << 10);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted) << more.status();
  EXPECT_EQ(device_.live_allocations(), 1u);
  EXPECT_EQ(device_.memory_in_use(), uint64_t{768} << 10);
  EXPECT_EQ(session_->memory_in_use(), uint64_t{768} << 10);
  EXPECT_EQ(Used(account_, Resource::kMemory), uint64_t{768} << 10) << "the refused reservation is given back";
  ASSERT_TRUE(session_->FreeBuffer(b).ok());
  EXPECT_TRUE(session_->AllocBuffer(512 << 10).ok());
}

TEST_F(SessionTest, AnAllocationFaultIsReturnedAndLeaksNothing) {
  device_.faults().allocate = 0;
  absl::StatusOr<Handle> b = session_->AllocBuffer(kBytes);
  EXPECT_EQ(b.status(), device_.faults().status);
  EXPECT_EQ(device_.live_allocations(), 0u);
  EXPECT_EQ(session_->memory_in_use(), 0u);
  EXPECT_EQ(Used(account_, Resource::kMemory), 0u);
  ASSERT_OK_AND_ASSIGN(Handle next, session_->AllocBuffer(kBytes));
  EXPECT_NE(next, 0u);
  EXPECT_EQ(device_.live_allocations(), 1u);
}

TEST_F(SessionTest, ARangeOutsideItsBufferIsInvalid) {
  ASSERT_OK_AND_ASSIGN(Handle b, session_->AllocBuffer(64));
  using Range = std::pair<uint64_t, uint64_t>;
  ASSERT_OK_AND_ASSIGN(Range whole, session_->ResolveRange(b, 0, 0));
  EXPECT_EQ(whole, Range(0, 64));
  ASSERT_OK_AND_ASSIGN(Range tail, session_->ResolveRange(b, 48, 0));
  EXPECT_EQ(tail, Range(48, 16)) << "a zero length reaches the end";
  ASSERT_OK_AND_ASSIGN(Range last, session_->ResolveRange(b, 63, 1));
  EXPECT_EQ(last, Range(63, 1));
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  const Range refused[] = {{64, 0}, {64, 1}, {kMax, 1}, {0, 65}, {8, 57}, {8, kMax}, {1, kMax}, {63, kMax - 62}};
  for (auto [offset, length] : refused) {
    absl::StatusOr<Range> r = session_->ResolveRange(b, offset, length);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << offset << " + " << length << ": " << r.status();
  }
  // Transfers check the same way, before anything moves.
  std::vector<uint8_t> bytes(16, 0xff);
  EXPECT_EQ(session_->WriteBuffer(b, 56, bytes).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session_->ReadBuffer(b, kMax - 4, bytes).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(session_->ReadBuffer(b, 48, bytes).ok());
  EXPECT_EQ(bytes, std::vector<uint8_t>(16, 0)) << "the refused write changed nothing";
}

TEST_F(SessionTest, UnknownHandlesAreNotFound) {
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  ASSERT_OK_AND_ASSIGN(Handle b, Buffer());
  constexpr Handle kUnknown = 99;
  std::vector<uint8_t> bytes(4);
  EXPECT_EQ(session_->FreeBuffer(kUnknown).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->ResolveRange(kUnknown, 0, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->WriteBuffer(kUnknown, 0, bytes).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->ReadBuffer(kUnknown, 0, bytes).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->FreeProgram(kUnknown).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->FreeGraph(kUnknown).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->DescribeGraph(kUnknown).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->ReplayGraph(Op(kUnknown, {})).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->Launch(AddConst(kUnknown, b, b, 1)).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<LaunchResult> launch = session_->Launch(AddConst(add, b, kUnknown, 1));
  EXPECT_EQ(launch.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(launch.status().message()), HasSubstr("argument 1"));
  EXPECT_EQ(session_->CopyBuffer({ViewArg{b}, ViewArg{kUnknown}}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->BeginCapture({kUnknown}, {}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(device_.counts().launches, 0) << "nothing ran";
}

TEST_F(SessionTest, AProgramRefusedTakesNothing) {
  absl::StatusOr<Handle> unknown = Load("nosuch", AddSignature());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument) << unknown.status();
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("nosuch"));
  absl::StatusOr<ProgramInfo> format = session_->LoadProgram({"cuda-ptx", "add", "add", AddSignature(), {}});
  EXPECT_EQ(format.status().code(), absl::StatusCode::kInvalidArgument) << format.status();
  EXPECT_EQ(session_->program_count(), 0u);
  EXPECT_EQ(Used(account_, Resource::kPrograms), 0u);
  // Past the programs quota, until one is freed.
  Quotas quotas = {};
  quotas[static_cast<size_t>(Resource::kPrograms)] = 1;
  account_.set_quotas(quotas);
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  absl::StatusOr<Handle> past = Load("add", AddSignature());
  EXPECT_EQ(past.status().code(), absl::StatusCode::kResourceExhausted) << past.status();
  EXPECT_THAT(std::string(past.status().message()), HasSubstr("programs quota of 1"));
  EXPECT_EQ(session_->program_count(), 1u);
  ASSERT_TRUE(session_->FreeProgram(add).ok());
  EXPECT_EQ(Used(account_, Resource::kPrograms), 0u);
  EXPECT_TRUE(Load("add", AddSignature()).ok());
}

TEST_F(SessionTest, ALaunchComputes) {
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  ASSERT_OK_AND_ASSIGN(Handle in, Buffer(input_));
  ASSERT_OK_AND_ASSIGN(Handle out, Buffer());
  ASSERT_OK_AND_ASSIGN(LaunchResult r, session_->Launch(AddVar(add, out, in, 11)));
  EXPECT_FALSE(r.device_time.has_value()) << "not waited for";
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, Read(out));
  EXPECT_EQ(got, Plus(input_, 11));
  EXPECT_EQ(device_.counts().launches, 1);
  // A value outside its variable's range runs nothing.
  absl::StatusOr<LaunchResult> refused = session_->Launch(AddVar(add, out, in, 101));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_EQ(device_.counts().launches, 1);
}

TEST_F(SessionTest, ACapturedGraphReplaysWhatEagerLaunchesCompute) {
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  ASSERT_OK_AND_ASSIGN(Handle in, Buffer(input_));
  ASSERT_OK_AND_ASSIGN(Handle out, Buffer());
  ASSERT_TRUE(session_->BeginCapture({in}, {kK}).ok());
  ASSERT_TRUE(session_->Launch(AddVar(add, out, in, 5)).ok());
  EXPECT_EQ(session_->ReplayGraph(Op(1, {})).status().code(), absl::StatusCode::kFailedPrecondition)
      << "no replay while capturing";
  ASSERT_OK_AND_ASSIGN(GraphInfo graph, session_->EndCapture({out}));
  EXPECT_FALSE(graph.cache_hit);
  EXPECT_EQ(graph.calls, 1u);
  ASSERT_EQ(graph.params.size(), 3u);  // in, out, k
  EXPECT_TRUE(graph.params[0].is_buffer);
  EXPECT_TRUE(graph.params[1].is_buffer);
  EXPECT_FALSE(graph.params[2].is_buffer);
  EXPECT_EQ(graph.params[2].variable.name, "k");
  EXPECT_EQ(session_->graph_count(), 1u);

  ASSERT_OK_AND_ASSIGN(Handle eager, Buffer());
  for (int64_t k : {0, 7, 100, 7}) {
    ASSERT_TRUE(session_->Launch(AddVar(add, eager, in, k)).ok());
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> want, Read(eager));
    ASSERT_OK_AND_ASSIGN(ReplayOutcome r, session_->ReplayGraph(Op(graph.handle, {BufferParam{in}, BufferParam{out}, k})));
    EXPECT_FALSE(r.device_time.has_value()) << "not waited for";
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, Read(out));
    EXPECT_EQ(got, want) << "k = " << k;
    EXPECT_EQ(got, Plus(input_, k)) << "k = " << k;
  }
  ASSERT_OK_AND_ASSIGN(GraphInfo described, session_->DescribeGraph(graph.handle));
  EXPECT_EQ(described.replays, 4u);
  // The same structure again is the cached instance.
  ASSERT_TRUE(session_->BeginCapture({in}, {kK}).ok());
  ASSERT_TRUE(session_->Launch(AddVar(add, out, in, 9)).ok());
  ASSERT_OK_AND_ASSIGN(GraphInfo again, session_->EndCapture({out}));
  EXPECT_TRUE(again.cache_hit);
  EXPECT_EQ(again.key, graph.key);
  EXPECT_NE(again.handle, graph.handle);
  EXPECT_EQ(device_.counts().instantiations, 1);
}

TEST_F(SessionTest, ALaunchOrCopyTheDeviceRefusesIsNotCaptured) {
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  ASSERT_OK_AND_ASSIGN(Handle in, Buffer(input_));
  ASSERT_OK_AND_ASSIGN(Handle out, Buffer());
  ASSERT_TRUE(session_->BeginCapture({in}, {kK}).ok());
  // Refused with a variable the capture has not seen: neither the call nor the variable stays.
  LaunchOp refused = AddVar(add, out, in, 5);
  refused.variables.push_back({VariableDecl{"j", 0, 8, 1}, 2});
  device_.faults().launch = 0;
  EXPECT_EQ(session_->Launch(refused).status(), device_.faults().status);
  device_.faults().copy = 0;
  EXPECT_EQ(session_->CopyBuffer({ViewArg{out, 0, kBytes / 2}, ViewArg{out, kBytes / 2, 0}}).status(),
            device_.faults().status);
  ASSERT_TRUE(session_->Launch(AddVar(add, out, in, 5)).ok());
  ASSERT_OK_AND_ASSIGN(GraphInfo graph, session_->EndCapture({out}));
  EXPECT_EQ(graph.calls, 1u) << "only the launch that ran";
  EXPECT_EQ(graph.params.size(), 3u) << "in, out and k; no j";
  ASSERT_OK_AND_ASSIGN(ReplayOutcome r, session_->ReplayGraph(Replay(graph.handle, in, out, 7)));
  ASSERT_EQ(r.reads.size(), 1u);
  EXPECT_EQ(Decode(r.reads[0]), Plus(input_, 7));
}

TEST_F(SessionTest, AnInstantiationFaultAtEndCaptureLeavesNoGraphAndTheCaptureOpen) {
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  ASSERT_OK_AND_ASSIGN(Handle in, Buffer(input_));
  ASSERT_OK_AND_ASSIGN(Handle out, Buffer());
  ASSERT_TRUE(RecordChain(add, in, out).ok());
  const size_t live = device_.live_allocations();  // in, out and the freed middle the capture holds
  const uint64_t memory = Used(account_, Resource::kMemory);
  device_.faults().instantiate = 1;  // the second batch's device graph
  absl::StatusOr<GraphInfo> failed = session_->EndCapture({out});
  EXPECT_EQ(failed.status(), device_.faults().status);
  EXPECT_EQ(session_->graph_count(), 0u);
  EXPECT_EQ(Used(account_, Resource::kGraphs), 0u);
  EXPECT_EQ(device_.live_allocations(), live) << "the arena is freed";
  EXPECT_EQ(Used(account_, Resource::kMemory), memory);
  EXPECT_EQ(graph_cache_.stats().graphs, 0u);
  EXPECT_EQ(device_.bad_frees(), 0);
  // The capture is still open as it was: ending it again makes the graph.
  ASSERT_OK_AND_ASSIGN(GraphInfo graph, session_->EndCapture({out}));
  EXPECT_EQ(graph.batches, 2u);
  EXPECT_EQ(session_->graph_count(), 1u);
  ExpectChain(graph.handle, in, out, 20);
}

TEST_F(SessionTest, AnInstantiationFaultAtDefineGraphLeavesNoGraph) {
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  // copy = out = in + k: a copy on parameters is built on a placeholder allocation.
  GraphDef def;
  def.variables = {kK};
  def.slots = {{SlotKind::kParameter, kBytes, 0}, {SlotKind::kParameter, kBytes, 0}, {SlotKind::kParameter, kBytes, 0}};
  CallDef call;
  call.program = add;
  call.args = {SlotView{1, 0, 0}, SlotView{0, 0, 0}, Expression::Var(0)};
  call.global = {Expression::Constant(kN)};
  CallDef copy;
  copy.copy = true;
  copy.args = {SlotView{2, 0, 0}, SlotView{1, 0, 0}};
  def.calls = {call, copy};
  for (int countdown : {0, 1}) {
    device_.faults().instantiate = countdown;
    absl::StatusOr<GraphInfo> failed = session_->DefineGraph(def);
    EXPECT_EQ(failed.status(), device_.faults().status) << countdown;
    EXPECT_EQ(session_->graph_count(), 0u);
    EXPECT_EQ(Used(account_, Resource::kGraphs), 0u);
    EXPECT_EQ(device_.live_allocations(), 0u) << countdown << ": the placeholder is freed";
    EXPECT_EQ(Used(account_, Resource::kMemory), 0u);
  }
  EXPECT_EQ(device_.bad_frees(), 0);
  ASSERT_OK_AND_ASSIGN(GraphInfo graph, session_->DefineGraph(def));
  ASSERT_OK_AND_ASSIGN(Handle in, Buffer(input_));
  ASSERT_OK_AND_ASSIGN(Handle out, Buffer());
  ASSERT_OK_AND_ASSIGN(Handle copied, Buffer());
  ASSERT_TRUE(session_->ReplayGraph(Op(graph.handle, {BufferParam{in}, BufferParam{out}, BufferParam{copied}, int64_t{4}})).ok());
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, Read(copied));
  EXPECT_EQ(got, Plus(input_, 4));
}

TEST_F(SessionTest, ALaunchFaultMidReplayFailsItAndTheNextReplayIsRight) {
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  ASSERT_OK_AND_ASSIGN(Handle in, Buffer(input_));
  ASSERT_OK_AND_ASSIGN(Handle out, Buffer());
  ASSERT_TRUE(RecordChain(add, in, out).ok());
  ASSERT_OK_AND_ASSIGN(GraphInfo graph, session_->EndCapture({out}));
  ASSERT_EQ(graph.batches, 2u);
  ExpectChain(graph.handle, in, out, 1);
  const int launches = device_.counts().graph_launches;
  device_.faults().graph_launch = 1;  // the first batch runs, the second fails
  absl::StatusOr<ReplayOutcome> failed = session_->ReplayGraph(Replay(graph.handle, in, out, 30));
  EXPECT_EQ(failed.status(), device_.faults().status);
  EXPECT_EQ(device_.counts().graph_launches, launches + 2);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, Read(out));
  EXPECT_EQ(got, Plus(input_, 2)) << "the last batch did not run";
  ASSERT_OK_AND_ASSIGN(GraphInfo described, session_->DescribeGraph(graph.handle));
  EXPECT_EQ(described.replays, 1u) << "a failed replay is not counted";
  ExpectChain(graph.handle, in, out, 30);
}

TEST_F(SessionTest, AnUpdateFaultFailsThatReplayAndTheNextIsRight) {
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  ASSERT_OK_AND_ASSIGN(Handle in, Buffer(input_));
  ASSERT_OK_AND_ASSIGN(Handle out, Buffer());
  ASSERT_TRUE(RecordChain(add, in, out).ok());
  ASSERT_OK_AND_ASSIGN(GraphInfo graph, session_->EndCapture({out}));
  ExpectChain(graph.handle, in, out, 3);
  const int launches = device_.counts().graph_launches;
  device_.faults().update = 1;
  absl::StatusOr<ReplayOutcome> failed = session_->ReplayGraph(Replay(graph.handle, in, out, 50));
  EXPECT_EQ(failed.status(), device_.faults().status);
  EXPECT_EQ(device_.counts().graph_launches, launches) << "nothing launched";
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, Read(out));
  EXPECT_EQ(got, Plus(input_, 4)) << "out as the last good replay left it";
  ExpectChain(graph.handle, in, out, 60);
}

TEST_F(SessionTest, ASteppingSequenceRunsEveryReplay) {
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  ASSERT_OK_AND_ASSIGN(Handle in, Buffer(input_));
  ASSERT_OK_AND_ASSIGN(Handle out, Buffer());
  ASSERT_TRUE(RecordChain(add, in, out).ok());
  ASSERT_OK_AND_ASSIGN(GraphInfo graph, session_->EndCapture({out}));
  ReplaySequenceOp op;
  op.graph = graph.handle;
  op.base = {BufferParam{in}, BufferParam{out}, int64_t{10}};
  op.step_param = 2;
  op.step = 3;
  op.count = 5;
  op.reads = {ViewArg{out, 0, 0}};
  op.stream_reads = true;
  // Each replay's index and what it read.
  std::vector<std::pair<uint64_t, std::vector<int32_t>>> seen;
  const ReplayCallback record = [&](uint64_t i, const ReplayOutcome& r) {
    seen.push_back({i, r.reads.empty() ? std::vector<int32_t>() : Decode(r.reads[0])});
    return absl::OkStatus();
  };
  ASSERT_OK_AND_ASSIGN(SequenceOutcome done, session_->ReplaySequence(op, record));
  EXPECT_EQ(done.replays, 5u);
  ASSERT_EQ(seen.size(), 5u);
  for (uint64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(seen[i].first, i);
    EXPECT_EQ(seen[i].second, Plus(input_, 10 + 3 * static_cast<int64_t>(i) + 1)) << "replay " << i;
  }
  ASSERT_OK_AND_ASSIGN(GraphInfo described, session_->DescribeGraph(graph.handle));
  EXPECT_EQ(described.replays, 5u);
  // Without stream_reads only the last replay reports.
  op.stream_reads = false;
  seen.clear();
  ASSERT_OK_AND_ASSIGN(done, session_->ReplaySequence(op, record));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].first, 4u);
  EXPECT_EQ(seen[0].second, Plus(input_, 10 + 3 * 4 + 1));
}

// The tenant's sessions share graph instances, and an instance runs on the context of the
// session that created it. The fake device queues work without wait on its context's
// stream, as a GPU does, so a read through the replaying session's own context that is
// not ordered after the replay reads stale bytes.
TEST_F(SessionTest, AReplayOfAnInstanceAnotherSessionCreatedIsDoneBeforeTheReplayersReads) {
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  ASSERT_OK_AND_ASSIGN(Handle in, Buffer(input_));
  ASSERT_OK_AND_ASSIGN(Handle out, Buffer());
  ASSERT_TRUE(RecordChain(add, in, out).ok());
  ASSERT_OK_AND_ASSIGN(GraphInfo created, session_->EndCapture({out}));

  std::unique_ptr<DeviceSession> other = OpenAnother(2);
  ASSERT_OK_AND_ASSIGN(Handle other_add, Load(*other, "add", AddSignature()));
  ASSERT_OK_AND_ASSIGN(Handle other_in, Buffer(*other, input_));
  ASSERT_OK_AND_ASSIGN(Handle other_out, Buffer(*other));
  ASSERT_TRUE(RecordChain(*other, other_add, other_in, other_out).ok());
  ASSERT_OK_AND_ASSIGN(GraphInfo shared, other->EndCapture({other_out}));
  ASSERT_TRUE(shared.cache_hit);
  EXPECT_EQ(shared.key, created.key);

  for (int64_t k : {3, 8, 20}) {
    // Reads taken with the replay.
    ReplayOp op = Replay(shared.handle, other_in, other_out, k);
    op.wait = false;
    ASSERT_OK_AND_ASSIGN(ReplayOutcome r, other->ReplayGraph(op));
    ASSERT_EQ(r.reads.size(), 1u);
    EXPECT_EQ(Decode(r.reads[0]), Plus(input_, k + 1)) << "k = " << k;
    // A replay reading nothing, then a read of its own.
    ASSERT_OK(other->ReplayGraph(Op(shared.handle, {BufferParam{other_in}, BufferParam{other_out}, k + 10})).status());
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, Read(*other, other_out));
    EXPECT_EQ(got, Plus(input_, k + 11)) << "k = " << k;
  }
  // A sequence reading every replay, and one reading only after its last.
  for (bool stream_reads : {true, false}) {
    ReplaySequenceOp op;
    op.graph = shared.handle;
    op.base = {BufferParam{other_in}, BufferParam{other_out}, int64_t{30}};
    op.step_param = 2;
    op.step = 2;
    op.count = 4;
    op.reads = {ViewArg{other_out, 0, 0}};
    op.stream_reads = stream_reads;
    std::vector<std::vector<int32_t>> seen;
    ASSERT_OK(other
                  ->ReplaySequence(op,
                                   [&](uint64_t, const ReplayOutcome& r) {
                                     seen.push_back(Decode(r.reads.at(0)));
                                     return absl::OkStatus();
                                   })
                  .status());
    ASSERT_EQ(seen.size(), stream_reads ? 4u : 1u);
    EXPECT_EQ(seen.back(), Plus(input_, 30 + 2 * 3 + 1)) << "stream_reads " << stream_reads;
    if (stream_reads) {
      EXPECT_EQ(seen.front(), Plus(input_, 31));
    }
  }
  // The creator's own replays are still right.
  ExpectChain(created.handle, in, out, 4);
}

// A graph instance's host memory counts against the tenant's host_bytes quota while the
// instance lives (in the cache or behind a handle); an instance only the cache holds gives
// way to a new graph that would not fit beside it.
TEST_F(SessionTest, GraphInstancesHoldTheirHostMemoryAgainstTheTenantsQuota) {
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  ASSERT_OK_AND_ASSIGN(Handle in, Buffer(input_));
  ASSERT_OK_AND_ASSIGN(Handle out, Buffer());
  ASSERT_TRUE(RecordChain(add, in, out).ok());
  ASSERT_OK_AND_ASSIGN(GraphInfo first, session_->EndCapture({out}));
  const uint64_t one = Used(account_, Resource::kHostMemory);
  EXPECT_GT(one, 1000u) << "a two-call instance holds its graph, key, nodes and patches";
  EXPECT_EQ(graph_cache_.stats().bytes, first.arena_bytes + one);
  // Room for one more than this instance, not two.
  Quotas quotas{};
  quotas[static_cast<size_t>(Resource::kHostMemory)] = one + one / 2;
  account_.set_quotas(quotas);
  // Another structure of the same size: the second call adds 2, not 1.
  auto capture_other = [&]() -> absl::StatusOr<GraphInfo> {
    if (absl::Status s = session_->BeginCapture({in}, {kK}); !s.ok()) return s;
    absl::StatusOr<Handle> mid = Buffer();
    if (!mid.ok()) return mid.status();
    if (absl::Status s = session_->Launch(AddVar(add, *mid, in, 5)).status(); !s.ok()) return s;
    if (absl::Status s = session_->Launch(AddConst(add, out, *mid, 2)).status(); !s.ok()) return s;
    if (absl::Status s = session_->FreeBuffer(*mid); !s.ok()) return s;
    return session_->EndCapture({out});
  };
  absl::StatusOr<GraphInfo> refused = capture_other();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("host_bytes"));
  EXPECT_EQ(session_->graph_count(), 1u);
  EXPECT_EQ(graph_cache_.stats().graphs, 1u);
  ASSERT_OK(session_->EndCapture({}, /*discard=*/true).status());
  EXPECT_EQ(Used(account_, Resource::kHostMemory), one) << "the refusal holds nothing once its record is gone";
  // Freed, the first instance is held only by the cache, which lets it go for the second.
  ASSERT_OK(session_->FreeGraph(first.handle));
  EXPECT_EQ(Used(account_, Resource::kHostMemory), one) << "still cached";
  ASSERT_OK_AND_ASSIGN(GraphInfo second, capture_other());
  EXPECT_FALSE(second.cache_hit);
  EXPECT_EQ(Used(account_, Resource::kHostMemory), one) << "the second holds as much as the first did";
  EXPECT_EQ(graph_cache_.stats().graphs, 1u);
  EXPECT_EQ(graph_cache_.stats().evictions, 1u);
  ASSERT_OK_AND_ASSIGN(ReplayOutcome r, session_->ReplayGraph(Replay(second.handle, in, out, 7)));
  ASSERT_EQ(r.reads.size(), 1u);
  EXPECT_EQ(Decode(r.reads[0]), Plus(input_, 7 + 2));
  EXPECT_TRUE(session_->TryClose());
  EXPECT_EQ(Used(account_, Resource::kHostMemory), 0u) << "the session's instances went with it";
}

// An open capture's record counts against host_bytes as it grows: a launch whose record
// would pass the quota is refused and not run, and the record's bytes come back when the
// capture ends.
TEST_F(SessionTest, AnOpenCapturesRecordHoldsItsHostMemoryAgainstTheQuota) {
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  ASSERT_OK_AND_ASSIGN(Handle in, Buffer(input_));
  ASSERT_OK_AND_ASSIGN(Handle out, Buffer());
  ASSERT_OK(session_->BeginCapture({in}, {kK}));
  ASSERT_OK(session_->Launch(AddVar(add, out, in, 1)).status());
  const uint64_t one = Used(account_, Resource::kHostMemory);
  EXPECT_GT(one, 0u) << "one recorded call";
  Quotas quotas{};
  quotas[static_cast<size_t>(Resource::kHostMemory)] = 3 * one;
  account_.set_quotas(quotas);
  absl::Status refused;
  int recorded = 1;
  while (refused.ok() && recorded < 100) {
    refused = session_->Launch(AddVar(add, out, in, 1)).status();
    if (refused.ok()) ++recorded;
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("host_bytes"));
  EXPECT_GE(recorded, 2);
  EXPECT_LE(Used(account_, Resource::kHostMemory), 3 * one);
  EXPECT_EQ(device_.counts().launches, recorded) << "the refused launch did not run";
  ASSERT_OK(session_->EndCapture({}, /*discard=*/true).status());
  EXPECT_EQ(Used(account_, Resource::kHostMemory), 0u);
}

TEST_F(SessionTest, ASequenceStopsAtItsCallbacksError) {
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  ASSERT_OK_AND_ASSIGN(Handle in, Buffer(input_));
  ASSERT_OK_AND_ASSIGN(Handle out, Buffer());
  ASSERT_TRUE(RecordChain(add, in, out).ok());
  ASSERT_OK_AND_ASSIGN(GraphInfo graph, session_->EndCapture({out}));
  ReplaySequenceOp op;
  op.graph = graph.handle;
  op.base = {BufferParam{in}, BufferParam{out}, int64_t{0}};
  op.step_param = 2;
  op.step = 1;
  op.count = 10;
  op.reads = {ViewArg{out, 0, 4}};
  op.stream_reads = true;
  int calls = 0;
  absl::StatusOr<SequenceOutcome> stopped = session_->ReplaySequence(op, [&](uint64_t i, const ReplayOutcome&) {
    ++calls;
    return i == 2 ? absl::AbortedError("the client went away") : absl::OkStatus();
  });
  EXPECT_EQ(stopped.status(), absl::AbortedError("the client went away"));
  EXPECT_EQ(calls, 3);
  ASSERT_OK_AND_ASSIGN(GraphInfo described, session_->DescribeGraph(graph.handle));
  EXPECT_EQ(described.replays, 3u);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, Read(out));
  EXPECT_EQ(got, Plus(input_, 3)) << "the third replay (k = 2) was the last";
}

TEST_F(SessionTest, ASequenceWhoseRequesterIsGoneIsCancelled) {
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  ASSERT_OK_AND_ASSIGN(Handle in, Buffer(input_));
  ASSERT_OK_AND_ASSIGN(Handle out, Buffer());
  ASSERT_TRUE(RecordChain(add, in, out).ok());
  ASSERT_OK_AND_ASSIGN(GraphInfo graph, session_->EndCapture({out}));
  ReplaySequenceOp op;
  op.graph = graph.handle;
  op.vectors = {{BufferParam{in}, BufferParam{out}, int64_t{1}},
                {BufferParam{in}, BufferParam{out}, int64_t{2}},
                {BufferParam{in}, BufferParam{out}, int64_t{3}},
                {BufferParam{in}, BufferParam{out}, int64_t{4}}};
  int asked = 0;
  op.stopped = [&] { return ++asked == 2; };  // asked before the second and the third replay
  int reported = 0;
  absl::StatusOr<SequenceOutcome> cancelled = session_->ReplaySequence(op, [&](uint64_t, const ReplayOutcome&) {
    ++reported;
    return absl::OkStatus();
  });
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled) << cancelled.status();
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(reported, 0) << "only the last replay reports, and it never ran";
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, Read(out));
  EXPECT_EQ(got, Plus(input_, 3)) << "two replays ran";
}

TEST_F(SessionTest, CloseFreesEverythingAndLaterOperationsAreNotFound) {
  ASSERT_OK_AND_ASSIGN(Handle add, Load("add", AddSignature()));
  ASSERT_OK_AND_ASSIGN(Handle in, Buffer(input_));
  ASSERT_OK_AND_ASSIGN(Handle out, Buffer());
  ASSERT_TRUE(RecordChain(add, in, out).ok());
  ASSERT_OK_AND_ASSIGN(GraphInfo graph, session_->EndCapture({out}));
  ExpectChain(graph.handle, in, out, 2);
  // A capture left open, holding a buffer freed inside it.
  ASSERT_TRUE(RecordChain(add, in, out).ok());
  ASSERT_GT(device_.live_allocations(), 0u);

  session_->Close();
  EXPECT_EQ(device_.live_allocations(), 0u);
  EXPECT_EQ(device_.bad_frees(), 0);
  EXPECT_EQ(session_->memory_in_use(), 0u);
  EXPECT_EQ(session_->program_count(), 0u);
  EXPECT_EQ(session_->graph_count(), 0u);
  for (Resource r : {Resource::kMemory, Resource::kSessions, Resource::kPrograms, Resource::kGraphs})
    EXPECT_EQ(Used(account_, r), 0u) << ResourceName(r);
  EXPECT_EQ(graph_cache_.stats().graphs, 0u);

  std::vector<uint8_t> bytes(4);
  EXPECT_EQ(session_->AllocBuffer(kBytes).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->ReadBuffer(in, 0, bytes).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->WriteBuffer(in, 0, bytes).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->FreeBuffer(in).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->Launch(AddConst(add, out, in, 1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->ReplayGraph(Replay(graph.handle, in, out, 1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->LoadProgram({"fake", "add", "add", AddSignature(), {}}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->BeginCapture({}, {}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->Synchronize().code(), absl::StatusCode::kNotFound);
  session_->Close();  // idempotent
  EXPECT_TRUE(session_->TryClose());
  EXPECT_EQ(Used(account_, Resource::kSessions), 0u) << "given back once";
}

TEST_F(SessionTest, TryCloseLeavesARunningOperationBe) {
  Signature sig;
  sig.params = {{"x", ParamKind::kBuffer, Access::kInout}};
  ASSERT_OK_AND_ASSIGN(Handle wait, Load("wait", sig));
  ASSERT_OK_AND_ASSIGN(Handle b, Buffer(input_));
  const size_t live = device_.live_allocations();
  absl::StatusOr<LaunchResult> launched;
  std::thread running([&] {
    LaunchOp op;
    op.program = wait;
    op.args = {ViewArg{b, 0, 0}};
    op.wait = true;  // runs now, not when the stream is next needed
    launched = session_->Launch(op);
  });
  started_.WaitForNotification();
  EXPECT_FALSE(session_->TryClose());
  EXPECT_EQ(device_.live_allocations(), live);
  EXPECT_EQ(session_->memory_in_use(), kBytes);
  EXPECT_EQ(session_->program_count(), 1u);
  EXPECT_EQ(Used(account_, Resource::kSessions), 1u);
  release_.Notify();
  running.join();
  EXPECT_TRUE(launched.ok()) << launched.status();
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, Read(b));
  EXPECT_EQ(got[0], 42) << "the session is still open";
  EXPECT_TRUE(session_->TryClose());
  EXPECT_EQ(device_.live_allocations(), 0u);
  EXPECT_EQ(Used(account_, Resource::kSessions), 0u);
  EXPECT_EQ(Read(b).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace replayd
