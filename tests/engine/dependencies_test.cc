#include "engine/dependencies.h"

#include <gmock/gmock.h>

#include "engine/buffer.h"
#include "engine/graph_instance.h"

namespace replayd {
namespace {

using Edges = std::vector<std::pair<size_t, size_t>>;

class FakeKernel : public Kernel {
 public:
  explicit FakeKernel(Signature s) : signature_(std::move(s)) {}
  const Signature& signature() const override { return signature_; }

 private:
  Signature signature_;
};

// A context that only hands out distinct addresses, for constant buffers.
class FakeContext : public Context {
 public:
  absl::StatusOr<Allocation> Allocate(uint64_t bytes) override { return Allocation{next_ += 1 << 20, bytes}; }
  void Free(const Allocation&) override {}
  absl::Status Write(const Allocation&, uint64_t, std::span<const uint8_t>) override { return {}; }
  absl::Status Read(const Allocation&, uint64_t, std::span<uint8_t>) override { return {}; }
  absl::Status Copy(const Allocation&, uint64_t, const Allocation&, uint64_t, uint64_t) override { return {}; }
  absl::StatusOr<std::unique_ptr<Kernel>> Load(const ProgramSource&, const std::filesystem::path&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<std::optional<absl::Duration>> Launch(const Kernel&, std::span<const ArgValue>, const Dim3&,
                                                       const Dim3&, bool) override {
    return std::optional<absl::Duration>();
  }
  absl::Status Synchronize() override { return {}; }
  struct Patched {
    size_t node;
    std::vector<ArgValue> args;
    Dim3 global;
  };
  // Records every update it gets.
  class NullGraph : public DeviceGraph {
   public:
    explicit NullGraph(std::vector<Patched>* updates) : updates_(updates) {}
    absl::Status Update(size_t node, std::span<const ArgValue> args, const Dim3& global, const Dim3&) override {
      updates_->push_back({node, std::vector<ArgValue>(args.begin(), args.end()), global});
      return {};
    }
    absl::StatusOr<std::optional<absl::Duration>> Launch(bool) override { return std::optional<absl::Duration>(); }

   private:
    std::vector<Patched>* updates_;
  };
  // Records the nodes and edges of every batch it instantiates.
  absl::StatusOr<std::unique_ptr<DeviceGraph>> Instantiate(std::span<const GraphNode> nodes,
                                                           std::span<const std::pair<size_t, size_t>> edges) override {
    batches.push_back({nodes.size(), Edges(edges.begin(), edges.end())});
    instantiated.insert(instantiated.end(), nodes.begin(), nodes.end());
    return std::make_unique<NullGraph>(&updates);
  }
  bool wants_edges() const override { return true; }
  uint64_t address_space() const override { return 0; }

  std::vector<std::pair<size_t, Edges>> batches;
  std::vector<GraphNode> instantiated;
  std::vector<Patched> updates;

 private:
  uint64_t next_ = 0;
};

class DependenciesTest : public ::testing::Test {
 protected:
  // A program reading its first argument and writing its second: out = f(in).
  std::shared_ptr<Program> Program2(Access a, Access b) {
    Signature s;
    s.params = {{"a", ParamKind::kBuffer, a}, {"b", ParamKind::kBuffer, b}};
    auto p = std::make_shared<Program>();
    p->kernel = std::make_unique<FakeKernel>(s);
    return p;
  }
  uint32_t AddSlot(SlotKind kind, uint64_t bytes, uint64_t arena_offset = 0) {
    Slot s{kind, bytes, nullptr};
    if (kind == SlotKind::kConstant) s.constant = std::make_shared<DeviceBuffer>(context_, *context_->Allocate(bytes));
    graph_.slots.push_back(s);
    offsets_.push_back(arena_offset);
    return static_cast<uint32_t>(graph_.slots.size() - 1);
  }
  // Calls program(a, b) with a read and b written.
  void Call(uint32_t a, uint32_t b, uint64_t a_offset = 0, uint64_t length = 0) {
    graph_.calls.push_back({rw_, {SlotView{a, a_offset, length}, SlotView{b, 0, 0}}, {}, {}});
  }
  // Copies a to b.
  void Copy(uint32_t b, uint32_t a, uint64_t b_offset = 0, uint64_t a_offset = 0, uint64_t length = 0) {
    graph_.calls.push_back(CopyCall(SlotView{b, b_offset, length}, SlotView{a, a_offset, length}));
  }
  Edges Compute() { return DependencyEdges(graph_, offsets_, 0, graph_.calls.size()); }

  std::shared_ptr<FakeContext> context_ = std::make_shared<FakeContext>();
  std::shared_ptr<Program> rw_ = Program2(Access::kIn, Access::kOut);
  Graph graph_;
  std::vector<uint64_t> offsets_;
};

TEST_F(DependenciesTest, ReadAfterWrite) {
  uint32_t a = AddSlot(SlotKind::kInternal, 256, 0), b = AddSlot(SlotKind::kInternal, 256, 256),
           c = AddSlot(SlotKind::kInternal, 256, 512);
  Call(a, b);  // writes b
  Call(b, c);  // reads b
  EXPECT_EQ(Compute(), (Edges{{0, 1}}));
}

TEST_F(DependenciesTest, IndependentCallsHaveNoEdge) {
  uint32_t in = AddSlot(SlotKind::kInternal, 256, 0), x = AddSlot(SlotKind::kInternal, 256, 256),
           y = AddSlot(SlotKind::kInternal, 256, 512);
  Call(in, x);
  Call(in, y);  // both only read `in`
  EXPECT_EQ(Compute(), Edges{});
}

TEST_F(DependenciesTest, WriteAfterReadAndWriteAfterWrite) {
  uint32_t a = AddSlot(SlotKind::kInternal, 256, 0), b = AddSlot(SlotKind::kInternal, 256, 256),
           c = AddSlot(SlotKind::kInternal, 256, 512);
  Call(a, b);  // reads a, writes b
  Call(c, a);  // writes a: after call 0 read it
  Call(c, b);  // writes b again: after call 0 wrote it (and after call 1 through nothing)
  EXPECT_EQ(Compute(), (Edges{{0, 1}, {0, 2}}));
}

TEST_F(DependenciesTest, InternalsThatShareArenaBytesAreOrdered) {
  // t1 and t2 have disjoint lifetimes, so the plan put both at offset 0.
  uint32_t in = AddSlot(SlotKind::kInternal, 256, 1024), t1 = AddSlot(SlotKind::kInternal, 256, 0),
           t2 = AddSlot(SlotKind::kInternal, 256, 0), out = AddSlot(SlotKind::kInternal, 256, 2048),
           out2 = AddSlot(SlotKind::kInternal, 256, 4096);
  Call(in, t1);    // 0: writes t1
  Call(t1, out);   // 1: reads t1
  Call(in, t2);    // 2: writes t2 = t1's bytes: after 0 (WAW) and 1 (WAR)
  Call(t2, out2);  // 3
  EXPECT_EQ(Compute(), (Edges{{0, 1}, {1, 2}, {2, 3}}));
}

TEST_F(DependenciesTest, ParametersMayAliasEachOtherAndConstants) {
  uint32_t p0 = AddSlot(SlotKind::kParameter, 256), p1 = AddSlot(SlotKind::kParameter, 256),
           c = AddSlot(SlotKind::kConstant, 256), x = AddSlot(SlotKind::kInternal, 256, 0);
  Call(x, p0);  // 0: writes p0
  Call(p1, x);  // 1: reads p1, which a replay may bind to p0's buffer
  Call(c, x);   // 2: reads a constant that p0 may alias (and writes x after 1)
  EXPECT_EQ(Compute(), (Edges{{0, 1}, {1, 2}}));
}

TEST_F(DependenciesTest, DistinctConstantsAndDisjointRangesDoNotConflict) {
  uint32_t c1 = AddSlot(SlotKind::kConstant, 256), c2 = AddSlot(SlotKind::kConstant, 256),
           p = AddSlot(SlotKind::kParameter, 1024), x = AddSlot(SlotKind::kInternal, 256, 0),
           y = AddSlot(SlotKind::kInternal, 256, 256);
  Call(x, c1);
  Call(c2, y);  // another constant buffer
  EXPECT_EQ(Compute(), Edges{});
  graph_.calls.clear();
  // Writes to [0, 512) and a read of [512, 1024) of the same parameter.
  graph_.calls.push_back({rw_, {SlotView{x, 0, 0}, SlotView{p, 0, 512}}, {}, {}});
  graph_.calls.push_back({rw_, {SlotView{p, 512, 512}, SlotView{y, 0, 0}}, {}, {}});
  EXPECT_EQ(Compute(), Edges{});
}

TEST_F(DependenciesTest, ImpliedEdgesAreLeftOut) {
  uint32_t a = AddSlot(SlotKind::kInternal, 256, 0), b = AddSlot(SlotKind::kInternal, 256, 256),
           c = AddSlot(SlotKind::kInternal, 256, 512), d = AddSlot(SlotKind::kInternal, 256, 768);
  Call(d, a);  // 0: writes a
  Call(a, b);  // 1: reads a, writes b
  Call(b, a);  // 2: reads b (after 1) and writes a (after 0 wrote it: implied through 1)
  Call(c, d);  // 3: reads c, writes d, which call 0 read
  EXPECT_EQ(Compute(), (Edges{{0, 1}, {0, 3}, {1, 2}}));
}

TEST_F(DependenciesTest, AnInstanceHandsEachBatchItsEdges) {
  // Constants: distinct buffers, so only real conflicts order calls.
  uint32_t a = AddSlot(SlotKind::kConstant, 256), b = AddSlot(SlotKind::kConstant, 256),
           c = AddSlot(SlotKind::kConstant, 256), d = AddSlot(SlotKind::kConstant, 256);
  Call(a, b);
  Call(b, c);
  Call(a, d);  // independent of the first two
  auto one_batch = GraphInstance::Create(graph_, "g", context_, {32});
  ASSERT_TRUE(one_batch.ok()) << one_batch.status();
  ASSERT_EQ(context_->batches.size(), 1u);
  EXPECT_EQ(context_->batches[0].first, 3u);
  EXPECT_EQ(context_->batches[0].second, (Edges{{0, 1}}));
  context_->batches.clear();
  auto two_batches = GraphInstance::Create(graph_, "g", context_, {2});
  ASSERT_TRUE(two_batches.ok());
  ASSERT_EQ(context_->batches.size(), 2u);  // [0, 2) and [2, 3): batches run in order
  EXPECT_EQ(context_->batches[0].second, (Edges{{0, 1}}));
  EXPECT_EQ(context_->batches[1].second, Edges{});
}

TEST_F(DependenciesTest, TheMemoryPlanReusingBytesOrdersTheCallsThatShareThem) {
  // Internals: d (call 2) reuses the bytes of b or c, dead after call 1, so call 2 must
  // follow call 1 although it touches none of its slots.
  uint32_t a = AddSlot(SlotKind::kInternal, 256), b = AddSlot(SlotKind::kInternal, 256),
           c = AddSlot(SlotKind::kInternal, 256), d = AddSlot(SlotKind::kInternal, 256);
  Call(a, b);
  Call(b, c);
  Call(a, d);
  auto instance = GraphInstance::Create(graph_, "g", context_, {32});
  ASSERT_TRUE(instance.ok()) << instance.status();
  EXPECT_GT((*instance)->plan().saved_bytes, 0u);
  EXPECT_EQ(context_->batches[0].second, (Edges{{0, 1}, {1, 2}}));
}

// Which nodes a replay patches: those whose buffer arguments are parameters, whose
// integer arguments use variables, or whose dimensions do; no others.
TEST_F(DependenciesTest, AReplayPatchesOnlyTheParameterDependentNodes) {
  Signature s;
  s.params = {{"a", ParamKind::kBuffer, Access::kIn},
              {"b", ParamKind::kBuffer, Access::kOut},
              {"k", ParamKind::kInt32, Access::kNone}};
  auto program = std::make_shared<Program>();
  program->kernel = std::make_unique<FakeKernel>(s);
  uint32_t p = AddSlot(SlotKind::kParameter, 256), c1 = AddSlot(SlotKind::kConstant, 256),
           c2 = AddSlot(SlotKind::kConstant, 256);
  graph_.variables = {{"pos", 1, 100, 1}};
  const Expression five = Expression::Constant(5), pos = Expression::Var(0);
  auto call = [&](uint32_t a, uint64_t a_offset, Expression k) {
    graph_.calls.push_back({program, {SlotView{a, a_offset, 0}, SlotView{c2, 0, 0}, k}});
  };
  call(c1, 0, five);  // 0: constants only
  call(p, 64, five);  // 1: a buffer parameter, at an offset
  call(c1, 0, pos);   // 2: an integer argument that uses pos
  call(c1, 0, five);  // 3: its grid uses pos
  graph_.calls[3].global[0] = Expression::Binary(Expression::Op::kAdd, pos, Expression::Constant(1));
  call(c1, 0, Expression::Binary(Expression::Op::kAdd, five, five));  // 4: a constant expression
  auto instance = GraphInstance::Create(graph_, "g", context_, {32});
  ASSERT_TRUE(instance.ok()) << instance.status();
  ASSERT_EQ(context_->batches.size(), 1u);
  const uint64_t buffers[] = {0x10000};
  const int64_t values[] = {7};
  ASSERT_TRUE((*instance)->Replay(buffers, values, false).ok());
  ASSERT_EQ(context_->updates.size(), 3u);
  EXPECT_EQ(context_->updates[0].node, 1u);
  EXPECT_EQ(context_->updates[0].args[0].address, 0x10000u + 64);
  EXPECT_EQ(context_->updates[1].node, 2u);
  EXPECT_EQ(context_->updates[1].args[2].integer, 7);
  EXPECT_EQ(context_->updates[2].node, 3u);
  EXPECT_EQ(context_->updates[2].global, (Dim3{8, 1, 1}));
}

TEST_F(DependenciesTest, ACopyReadsItsSourceAndWritesItsDestination) {
  uint32_t a = AddSlot(SlotKind::kInternal, 256, 0), b = AddSlot(SlotKind::kInternal, 256, 256),
           c = AddSlot(SlotKind::kInternal, 256, 512), d = AddSlot(SlotKind::kInternal, 256, 768);
  Call(a, b);  // 0: writes b
  Copy(c, b);  // 1: reads b (after 0), writes c
  Copy(d, a);  // 2: reads a, which nobody writes: free to run at once
  Call(c, a);  // 3: reads c (after 1), writes a (after 2 read it; after 0 read it through 1)
  EXPECT_EQ(Compute(), (Edges{{0, 1}, {1, 3}, {2, 3}}));
}

TEST_F(DependenciesTest, CopiesOfDisjointRangesOfOneParameterAreIndependent) {
  // An internal source: internals never share bytes with parameters.
  uint32_t p = AddSlot(SlotKind::kParameter, 1024), x = AddSlot(SlotKind::kInternal, 512);
  Copy(p, x, 0, 0, 256);      // p[0, 256) from x[0, 256)
  Copy(p, x, 512, 256, 256);  // p[512, 768) from x[256, 512): other bytes of p
  EXPECT_EQ(Compute(), Edges{});
  Copy(x, p, 0, 600, 256);  // reads p[600, 856) after 1 wrote it; writes x[0, 256) after 0 read it
  EXPECT_EQ(Compute(), (Edges{{0, 2}, {1, 2}}));
}

// A copy is a node of the batch's device graph with its addresses and byte count; a
// replay patches it when a view is a parameter, and refuses addresses that overlap.
TEST_F(DependenciesTest, ACopyIsANodeThatAReplayPatches) {
  uint32_t p0 = AddSlot(SlotKind::kParameter, 256), p1 = AddSlot(SlotKind::kParameter, 256),
           c = AddSlot(SlotKind::kConstant, 256), x = AddSlot(SlotKind::kInternal, 256);
  Copy(x, c, 0, 0, 128);     // 0: no parameter
  Copy(p1, p0, 64, 0, 128);  // 1: parameters on both sides
  Call(x, p0);               // 2
  auto instance = GraphInstance::Create(graph_, "g", context_, {32});
  ASSERT_TRUE(instance.ok()) << instance.status();
  ASSERT_EQ(context_->batches.size(), 1u);
  ASSERT_EQ(context_->instantiated.size(), 3u);
  EXPECT_TRUE(context_->instantiated[0].is_copy());
  EXPECT_EQ(context_->instantiated[0].copy_bytes, 128u);
  EXPECT_EQ(context_->instantiated[0].args[1].address, graph_.slots[c].constant->allocation.address);
  EXPECT_FALSE(context_->instantiated[2].is_copy());
  const uint64_t buffers[] = {0x10000, 0x20000};
  ASSERT_TRUE((*instance)->Replay(buffers, {}, false).ok());
  ASSERT_EQ(context_->updates.size(), 2u);
  EXPECT_EQ(context_->updates[0].node, 1u);
  EXPECT_EQ(context_->updates[0].args[0].address, 0x20000u + 64);
  EXPECT_EQ(context_->updates[0].args[1].address, 0x10000u);
  EXPECT_EQ(context_->updates[1].node, 2u);
  // One buffer for both: [64, 192) and [0, 128) of it overlap. Nothing is patched.
  const uint64_t same[] = {0x10000, 0x10000};
  absl::StatusOr<std::optional<absl::Duration>> r = (*instance)->Replay(same, {}, false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(context_->updates.size(), 2u);
  EXPECT_EQ((*instance)->replays(), 1u);
  // Far enough apart within one large buffer is fine.
  const uint64_t apart[] = {0x10000, 0x10000 + 128};
  EXPECT_TRUE((*instance)->Replay(apart, {}, false).ok());
}

// A kernel must not outlive its context: an instance that holds the last reference to
// its context drops it only after the programs of its graph.
TEST(GraphInstanceLifetimeTest, TheContextOutlivesTheKernelsOfItsGraph) {
  auto alive = std::make_shared<bool>(true);
  bool context_alive_at_kernel_end = false;
  struct WatchedContext : FakeContext {
    std::shared_ptr<bool> alive;
    ~WatchedContext() override { *alive = false; }
  };
  struct WatchingKernel : FakeKernel {
    WatchingKernel(Signature s, std::shared_ptr<bool> alive, bool* seen)
        : FakeKernel(std::move(s)), alive(std::move(alive)), seen(seen) {}
    ~WatchingKernel() override { *seen = *alive; }
    std::shared_ptr<bool> alive;
    bool* seen;
  };
  auto context = std::make_shared<WatchedContext>();
  context->alive = alive;
  Signature s;
  s.params = {{"a", ParamKind::kBuffer, Access::kInout}};
  auto program = std::make_shared<Program>();
  program->kernel = std::make_unique<WatchingKernel>(s, alive, &context_alive_at_kernel_end);
  Graph graph;
  graph.slots.push_back({SlotKind::kInternal, 64, nullptr});
  graph.calls.push_back({program, {SlotView{0, 0, 0}}, {}, {}});
  program.reset();
  auto instance = GraphInstance::Create(std::move(graph), "g", std::move(context), {32});
  ASSERT_TRUE(instance.ok()) << instance.status();
  instance->reset();  // the only holder of the context and of the program
  EXPECT_FALSE(*alive);
  EXPECT_TRUE(context_alive_at_kernel_end);
}

}  // namespace
}  // namespace replayd
