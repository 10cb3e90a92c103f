// A graph instance on the fake device: replays compute, copy nodes on parameters are built
// on real memory and retargeted, and every failure of the device (an allocation, an
// instantiation, an update, a launch mid-replay) comes back as an error with nothing
// leaked and the next replay correct.
#include "engine/graph_instance.h"

#include <gtest/gtest.h>

#include <cstring>

#include "tests/support/fake_driver.h"
#include "tests/support/status_macros.h"

namespace replayd {
namespace {

using testing::FakeContext;
using testing::FakeDevice;

constexpr int kN = 64;

// out[i] = in[i] * 2 + k for i < global[0].
std::shared_ptr<Program> Affine() {
  Signature sig;
  sig.params = {{"out", ParamKind::kBuffer, Access::kOut},
                {"in", ParamKind::kBuffer, Access::kIn},
                {"n", ParamKind::kInt32, Access::kNone},
                {"k", ParamKind::kInt32, Access::kNone}};
  auto p = std::make_shared<Program>();
  p->key = "affine";
  p->entry = "affine";
  p->kernel = FakeContext::MakeKernel(sig, [](std::span<const ArgValue> args, const Dim3& global) {
    auto* out = reinterpret_cast<float*>(args[0].address);
    const auto* in = reinterpret_cast<const float*>(args[1].address);
    for (uint64_t i = 0; i < global[0] && static_cast<int64_t>(i) < args[2].integer; ++i)
      out[i] = in[i] * 2.0f + static_cast<float>(args[3].integer);
  });
  return p;
}

class GraphInstanceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto context = device_.OpenContext({"test"});
    ASSERT_TRUE(context.ok()) << context.status();
    context_ = std::shared_ptr<Context>(std::move(*context));
    affine_ = Affine();
  }

  // Slots: 0 in (parameter), 1 out (parameter, two halves), 2 t (internal). Calls:
  // t = affine(in, pos); out[0:n] = t; out[n:2n] = in, each `repeat` times.
  Graph Chain(int repeat = 1, bool copies = true) {
    Graph g;
    g.variables = {{"pos", 0, 100, 1}};
    g.slots = {{SlotKind::kParameter, kN * 4, nullptr},
               {SlotKind::kParameter, 2 * kN * 4, nullptr},
               {SlotKind::kInternal, kN * 4, nullptr}};
    for (int r = 0; r < repeat; ++r) {
      GraphCall call;
      call.program = affine_;
      call.args = {SlotView{2, 0, 0}, SlotView{0, 0, 0}, Expression::Constant(kN), Expression::Var(0)};
      call.global[0] = Expression::Constant(kN);
      g.calls.push_back(call);
      if (!copies) continue;
      g.calls.push_back(CopyCall(SlotView{1, 0, kN * 4}, SlotView{2, 0, 0}));
      g.calls.push_back(CopyCall(SlotView{1, kN * 4, kN * 4}, SlotView{0, 0, 0}));
    }
    return g;
  }

  absl::StatusOr<std::shared_ptr<GraphInstance>> Create(Graph g, size_t first_batch = 32) {
    if (absl::Status s = CheckGraph(g, device_.info()); !s.ok()) return s;
    std::string structure = GraphStructure(g, context_->address_space());
    return GraphInstance::Create(std::move(g), std::move(structure), context_, BatchOptions{first_batch});
  }

  Allocation Buffer(uint64_t bytes) {
    auto a = context_->Allocate(bytes);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? *a : Allocation{};
  }

  std::vector<float> Floats(const Allocation& a, size_t n) {
    std::vector<float> v(n);
    std::memcpy(v.data(), reinterpret_cast<const void*>(a.address), n * 4);
    return v;
  }

  // Replays with fresh buffers and checks out against in at pos.
  void ReplayAndCheck(GraphInstance& instance, int64_t pos) {
    Allocation in = Buffer(kN * 4), out = Buffer(2 * kN * 4);
    for (int i = 0; i < kN; ++i) reinterpret_cast<float*>(in.address)[i] = static_cast<float>(i) - 7.5f;
    const uint64_t buffers[] = {in.address, out.address};
    const int64_t values[] = {pos};
    auto r = instance.Replay(buffers, values, true);
    EXPECT_TRUE(r.ok()) << r.status();
    const std::vector<float> got = Floats(out, 2 * kN);
    for (int i = 0; i < kN; ++i) {
      EXPECT_EQ(got[i], (static_cast<float>(i) - 7.5f) * 2.0f + static_cast<float>(pos)) << i;
      EXPECT_EQ(got[kN + i], static_cast<float>(i) - 7.5f) << i;
    }
    context_->Free(in);
    context_->Free(out);
  }

  FakeDevice device_;
  std::shared_ptr<Context> context_;
  std::shared_ptr<Program> affine_;
};

TEST_F(GraphInstanceTest, ReplaysAndRetargetsCopiesOnParameters) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> instance, Create(Chain()));
  EXPECT_EQ(instance->batch_count(), 1u);
  // The arena, and the placeholder the copy nodes were built on, freed once built.
  EXPECT_EQ(device_.counts().allocations, 2);
  EXPECT_EQ(device_.live_allocations(), 1u);
  for (int64_t pos : {3, 50, 3}) ReplayAndCheck(*instance, pos);
  EXPECT_EQ(instance->replays(), 3u);
  instance.reset();
  EXPECT_EQ(device_.live_allocations(), 0u);
  EXPECT_EQ(device_.bad_frees(), 0);
}

TEST_F(GraphInstanceTest, APlaceholderIsMadeOnlyForCopiesOnParameters) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> instance, Create(Chain(1, /*copies=*/false)));
  EXPECT_EQ(device_.counts().allocations, 1) << "the arena alone";
  EXPECT_EQ(instance->PlaceholderBytes(), 0u);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> with_copies, Create(Chain()));
  EXPECT_EQ(with_copies->PlaceholderBytes(), 2u * kN * 4) << "out's view reaches its end";
}

TEST_F(GraphInstanceTest, AFailedInstantiationLeavesNothingAllocated) {
  device_.faults().instantiate = 0;
  auto instance = Create(Chain());
  EXPECT_EQ(instance.status().code(), absl::StatusCode::kInternal) << instance.status();
  EXPECT_EQ(device_.live_allocations(), 0u);
  EXPECT_EQ(device_.bad_frees(), 0);
}

TEST_F(GraphInstanceTest, AFailedArenaOrPlaceholderAllocationLeavesNothingAllocated) {
  for (int which : {0, 1}) {  // the arena, then the placeholder
    device_.faults().allocate = which;
    auto instance = Create(Chain());
    EXPECT_EQ(instance.status().code(), absl::StatusCode::kInternal) << which << ": " << instance.status();
    EXPECT_EQ(device_.live_allocations(), 0u) << which;
  }
  EXPECT_EQ(device_.bad_frees(), 0);
  // A device too small for the arena: RESOURCE_EXHAUSTED.
  FakeDevice small(kN * 2);
  auto context = small.OpenContext({"test"});
  ASSERT_TRUE(context.ok());
  Graph g = Chain();
  std::string structure = GraphStructure(g, 0);
  auto instance = GraphInstance::Create(std::move(g), structure, std::move(*context), BatchOptions{});
  EXPECT_EQ(instance.status().code(), absl::StatusCode::kResourceExhausted) << instance.status();
  EXPECT_EQ(small.live_allocations(), 0u);
}

TEST_F(GraphInstanceTest, ALaunchErrorMidReplayFailsItAndTheNextReplayIsRight) {
  // Batches of 1, 2, 4, ... calls: a failure in the second batch leaves the first run.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> instance, Create(Chain(3), /*first_batch=*/1));
  ASSERT_GE(instance->batch_count(), 3u);
  Allocation in = Buffer(kN * 4), out = Buffer(2 * kN * 4);
  const uint64_t buffers[] = {in.address, out.address};
  const int64_t values[] = {9};
  device_.faults().graph_launch = 1;
  auto failed = instance->Replay(buffers, values, true);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
  EXPECT_EQ(instance->replays(), 0u) << "a failed replay is not counted";
  context_->Free(in);
  context_->Free(out);
  ReplayAndCheck(*instance, 9);
  EXPECT_EQ(instance->replays(), 1u);
}

TEST_F(GraphInstanceTest, AFailedUpdateLaunchesNothing) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> instance, Create(Chain()));
  const int launches = device_.counts().graph_launches;
  Allocation in = Buffer(kN * 4), out = Buffer(2 * kN * 4);
  const uint64_t buffers[] = {in.address, out.address};
  const int64_t values[] = {1};
  device_.faults().update = 0;
  EXPECT_FALSE(instance->Replay(buffers, values, true).ok());
  EXPECT_EQ(device_.counts().graph_launches, launches);
  context_->Free(in);
  context_->Free(out);
  ReplayAndCheck(*instance, 1);
}

TEST_F(GraphInstanceTest, ACopyRetargetedOffDeviceMemoryIsRefusedByTheDevice) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> instance, Create(Chain()));
  Allocation in = Buffer(kN * 4);
  std::vector<float> host(2 * kN);
  const uint64_t buffers[] = {in.address, reinterpret_cast<uint64_t>(host.data())};
  const int64_t values[] = {1};
  EXPECT_EQ(instance->Replay(buffers, values, true).status().code(), absl::StatusCode::kInvalidArgument);
  context_->Free(in);
}

}  // namespace
}  // namespace replayd
