// Graphs end to end over loopback: capture and definition, the shape-keyed cache,
// variables as parameters, symbolic dimensions, batching, the memory plan, replay checks.
#include <gmock/gmock.h>

#include <limits>
#include <random>
#include <thread>

#include "tests/integration/daemon_fixture.h"

namespace replayd::client {
namespace {

using ::testing::HasSubstr;

// out[core] = core + base: one invocation per element, so the launch dimension decides
// how many elements are written.
constexpr char kIota[] = R"(
void iota(int *out, int base, int core) { out[core] = core + base; })";

constexpr int kN = 256;
const Variable kPos{"pos", 1, 256, 1};

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

class GraphTest : public DaemonFixture {
 protected:
  void SetUp() override {
    DaemonFixture::SetUp();
    OpenAll();
  }

  void OpenAll() {
    session_ = std::make_unique<Session>(Open());
    ProgramSpec affine{"cpu-c", kAffineSource, "affine", *ParseSignature("out,in,int32,int32"), {}};
    ProgramSpec iota{"cpu-c", kIota, "iota", *ParseSignature("out,int32", true), {}};
    affine_ = std::make_unique<Program>(*session_->Load(affine));
    iota_ = std::make_unique<Program>(*session_->Load(iota));
  }

  Buffer Alloc(uint64_t bytes) {
    auto b = session_->Alloc(bytes);
    EXPECT_TRUE(b.ok()) << b.status();
    return std::move(*b);
  }

  // affine(out, in, n, k) with k bound to the variable pos.
  absl::Status AffineAtPos(const Buffer& out, const Buffer& in, int64_t pos) {
    LaunchSpec spec;
    spec.args = {View{&out}, View{&in}, int64_t{kN}, Expr{"pos"}};
    spec.variables = {{kPos, pos}};
    return session_->Launch(*affine_, spec).status();
  }

  // Captures in -> t1 -> t2 -> out, with t1 and t2 internals, k = pos, pos + 1, 2 * pos.
  absl::StatusOr<Graph> CaptureChain(const Buffer& in, const Buffer& out, int64_t pos) {
    if (absl::Status s = session_->BeginCapture({&in}, {kPos}); !s.ok()) return s;
    Buffer t1 = Alloc(kN * 4), t2 = Alloc(kN * 4);
    struct Step {
      const Buffer* dst;
      const Buffer* src;
      const char* k;
    };
    for (const Step& step : {Step{&t1, &in, "pos"}, Step{&t2, &t1, "pos + 1"}, Step{&out, &t2, "2 * pos"}}) {
      LaunchSpec spec;
      spec.args = {View{step.dst}, View{step.src}, int64_t{kN}, Expr{step.k}};
      spec.variables = {{kPos, pos}};
      if (absl::Status s = session_->Launch(*affine_, spec).status(); !s.ok()) return s;
    }
    t1 = Buffer();
    t2 = Buffer();
    return session_->EndCapture({&out});
  }

  static std::vector<float> ChainReference(const std::vector<float>& in, int64_t pos) {
    std::vector<float> v = in;
    for (int64_t k : {pos, pos + 1, 2 * pos})
      for (float& x : v) x = x * 2.0f + float(k);
    return v;
  }

  std::unique_ptr<Session> session_;
  std::unique_ptr<Program> affine_, iota_;
};

TEST_F(GraphTest, CaptureThenReplayEqualsEagerOnFreshInputs) {
  Buffer in = Alloc(kN * 4), out = Alloc(kN * 4);
  ASSERT_TRUE(session_->WriteVector(in, Random(kN, 1)).ok());
  auto graph = CaptureChain(in, out, 5);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(*session_->ReadVector<float>(out, kN), ChainReference(Random(kN, 1), 5))
      << "the captured calls also ran eagerly";
  EXPECT_EQ(graph->info().calls(), 3u);
  EXPECT_EQ(graph->info().batches(), 1u);
  ASSERT_EQ(graph->info().params_size(), 3);  // in, out, pos
  EXPECT_EQ(graph->info().params(0).buffer_bytes(), kN * 4u);
  EXPECT_EQ(graph->info().params(2).variable().name(), "pos");
  for (int64_t pos : {1, 17, 200, 256}) {
    Buffer fresh_in = Alloc(kN * 4), fresh_out = Alloc(kN * 4);
    std::vector<float> input = Random(kN, uint32_t(pos));
    ASSERT_TRUE(session_->WriteVector(fresh_in, input).ok());
    auto r = session_->Replay(*graph, {&fresh_in, &fresh_out, pos}, true, {View{&fresh_out}});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->reads.size(), 1u);
    std::vector<float> got(kN);
    std::memcpy(got.data(), r->reads[0].data(), kN * 4);
    EXPECT_EQ(got, ChainReference(input, pos)) << "pos " << pos;
    EXPECT_GT(r->device_seconds, 0);
  }
}

TEST_F(GraphTest, InternalsShareTheArenaByLifetime) {
  Buffer in = Alloc(kN * 4), out = Alloc(kN * 4);
  auto graph = CaptureChain(in, out, 1);
  ASSERT_TRUE(graph.ok());
  // t1 (calls 0-1) and t2 (calls 1-2) overlap at call 1: two slots of 1 KiB.
  EXPECT_EQ(graph->info().arena_bytes(), 2 * kN * 4u);
  EXPECT_EQ(graph->info().plan_saved_bytes(), 0u);
}

TEST_F(GraphTest, CapturesAtDifferentPositionsShareOneKeyAndInstance) {
  Buffer in = Alloc(kN * 4), out = Alloc(kN * 4);
  auto first = CaptureChain(in, out, 3);
  auto second = CaptureChain(in, out, 99);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_FALSE(first->info().cache_hit());
  EXPECT_TRUE(second->info().cache_hit());
  EXPECT_EQ(first->info().key(), second->info().key());
  EXPECT_EQ(second->info().cache().instantiations(), 1u);
  EXPECT_EQ(second->info().cache().hits(), 1u);
  // Many replays with a changing variable: still one instantiation.
  for (int64_t pos = 1; pos <= 50; ++pos) ASSERT_TRUE(session_->Replay(*second, {&in, &out, pos}).ok());
  auto info = session_->DescribeGraph(*first);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->cache().instantiations(), 1u);
  EXPECT_EQ(info->replays(), 50u);
}

TEST_F(GraphTest, ADifferentShapeGivesADifferentKey) {
  Buffer in = Alloc(kN * 4), out = Alloc(kN * 4), big_in = Alloc(kN * 8), big_out = Alloc(kN * 8);
  auto a = CaptureChain(in, out, 3);
  auto b = CaptureChain(big_in, big_out, 3);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->info().key(), b->info().key());
  EXPECT_FALSE(b->info().cache_hit());
}

TEST_F(GraphTest, ACaptureAndAnEquivalentDefinitionShareAKey) {
  Buffer in = Alloc(kN * 4), out = Alloc(kN * 4);
  auto captured = CaptureChain(in, out, 3);
  ASSERT_TRUE(captured.ok());
  v1::GraphDef def;
  auto* pos = def.add_variables();
  pos->set_name("pos");
  pos->set_min(1);
  pos->set_max(256);
  for (v1::Slot::Kind kind : {v1::Slot::PARAMETER, v1::Slot::PARAMETER, v1::Slot::INTERNAL, v1::Slot::INTERNAL}) {
    auto* slot = def.add_slots();
    slot->set_kind(kind);
    slot->set_bytes(kN * 4);
  }
  // in = slot 0, out = slot 1, t1 = slot 2, t2 = slot 3, in the capture's order.
  struct Step {
    uint32_t dst, src;
    const char* k;
  };
  for (auto [dst, src, k] : {Step{2, 0, "pos"}, Step{3, 2, "pos + 1"}, Step{1, 3, "2 * pos"}}) {
    auto* call = def.add_calls();
    call->set_program(affine_->handle());
    call->add_args()->mutable_view()->set_slot(dst);
    call->add_args()->mutable_view()->set_slot(src);
    call->add_args()->mutable_expr()->set_constant(kN);
    call->add_args()->mutable_expr()->set_text(k);
  }
  auto defined = session_->DefineGraph(def);
  ASSERT_TRUE(defined.ok()) << defined.status();
  EXPECT_EQ(defined->info().key(), captured->info().key());
  EXPECT_TRUE(defined->info().cache_hit());
  std::vector<float> input = Random(kN, 9);
  ASSERT_TRUE(session_->WriteVector(in, input).ok());
  ASSERT_TRUE(session_->Replay(*defined, {&in, &out, int64_t{7}}, true).ok());
  EXPECT_EQ(*session_->ReadVector<float>(out, kN), ChainReference(input, 7));
}

TEST_F(GraphTest, VariablesOutOfRangeNotAMultipleOrMissingRunNothing) {
  Buffer in = Alloc(kN * 4), out = Alloc(kN * 4);
  auto graph = CaptureChain(in, out, 3);
  ASSERT_TRUE(graph.ok());
  ASSERT_TRUE(session_->WriteVector(out, std::vector<float>(kN, 42.f)).ok());
  absl::Status range = session_->Replay(*graph, {&in, &out, int64_t{257}}).status();
  EXPECT_EQ(range.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(range.message()), HasSubstr("pos = 257 is outside [1, 256]"));
  EXPECT_EQ(session_->Replay(*graph, {&in, &out, int64_t{0}}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status missing = session_->Replay(*graph, {&in, &out}).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("variable pos is missing"));
  EXPECT_EQ(session_->Replay(*graph, {&in, &out, int64_t{1}, int64_t{2}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session_->Replay(*graph, {&in, int64_t{3}, int64_t{1}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*session_->ReadVector<float>(out, kN), std::vector<float>(kN, 42.f)) << "nothing ran";

  // A variable with a step.
  Variable even{"e", 2, 64, 2};
  ASSERT_TRUE(session_->BeginCapture({}, {even}).ok());
  LaunchSpec spec;
  spec.args = {View{&out}, int64_t{0}};
  spec.global = {Expr{"e"}};
  spec.variables = {{even, 4}};
  ASSERT_TRUE(session_->Launch(*iota_, spec).ok());
  auto g = session_->EndCapture({});
  ASSERT_TRUE(g.ok()) << g.status();
  absl::Status odd = session_->Replay(*g, {int64_t{5}}).status();
  EXPECT_THAT(std::string(odd.message()), HasSubstr("not a multiple of 2"));
  EXPECT_TRUE(session_->Replay(*g, {int64_t{6}}).ok());
}

TEST_F(GraphTest, SymbolicLaunchDimensionsOverTheWholeRange) {
  Buffer out = Alloc(kN * 4);
  ASSERT_TRUE(session_->BeginCapture({&out}, {kPos}).ok());
  LaunchSpec spec;
  spec.args = {View{&out}, Expr{"pos * 10"}};
  spec.global = {Expr{"pos"}};
  spec.variables = {{kPos, 1}};
  ASSERT_TRUE(session_->Launch(*iota_, spec).ok());
  auto graph = session_->EndCapture({});
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int64_t pos = 1; pos <= 256; ++pos) {
    ASSERT_TRUE(session_->WriteVector(out, std::vector<int32_t>(kN, -1)).ok());
    auto r = session_->Replay(*graph, {&out, pos}, true, {View{&out}});
    ASSERT_TRUE(r.ok()) << r.status();
    const auto* got = reinterpret_cast<const int32_t*>(r->reads[0].data());
    for (int i = 0; i < kN; ++i) ASSERT_EQ(got[i], i < pos ? i + pos * 10 : -1) << "pos " << pos << " i " << i;
  }
}

TEST_F(GraphTest, BatchBoundaries) {
  for (auto [calls, batches] :
       {std::pair{1, 1}, std::pair{31, 1}, std::pair{32, 1}, std::pair{33, 2}, std::pair{100, 3}}) {
    Buffer acc = Alloc(kN * 4);
    ASSERT_TRUE(session_->WriteVector(acc, std::vector<float>(kN, 0.f)).ok());
    ASSERT_TRUE(session_->BeginCapture({&acc}, {kPos}).ok());
    for (int c = 0; c < calls; ++c) ASSERT_TRUE(AffineAtPos(acc, acc, 1).ok());
    auto graph = session_->EndCapture({});
    ASSERT_TRUE(graph.ok()) << graph.status();
    EXPECT_EQ(graph->info().calls(), uint32_t(calls));
    EXPECT_EQ(graph->info().batches(), uint32_t(batches)) << calls << " calls";
    // acc = acc * 2 + pos, `calls` times; from 0 with pos = 1: 2^calls - 1 (capped in float).
    ASSERT_TRUE(session_->WriteVector(acc, std::vector<float>(kN, 0.f)).ok());
    ASSERT_TRUE(session_->Replay(*graph, {&acc, int64_t{1}}, true).ok());
    float expect = 0;
    for (int c = 0; c < calls; ++c) expect = expect * 2 + 1;
    EXPECT_EQ((*session_->ReadVector<float>(acc, 1))[0], expect) << calls << " calls";
  }
}

TEST_F(GraphTest, EvictionKeepsHeldGraphsWorking) {
  Start({absl::Seconds(60), 256 << 20, /*graph_cache_graphs=*/2});
  OpenAll();
  std::vector<Graph> graphs;
  std::vector<Buffer> buffers;
  for (int shape = 1; shape <= 3; ++shape) {
    buffers.push_back(Alloc(kN * 4 * shape));
    buffers.push_back(Alloc(kN * 4 * shape));
    auto g = CaptureChain(buffers[buffers.size() - 2], buffers.back(), 1);
    ASSERT_TRUE(g.ok()) << g.status();
    graphs.push_back(std::move(*g));
  }
  auto info = session_->DescribeGraph(graphs[2]);
  EXPECT_EQ(info->cache().evictions(), 1u);
  EXPECT_EQ(info->cache().graphs(), 2u);
  // The evicted graph still replays through its handle, and capturing it again misses.
  ASSERT_TRUE(session_->Replay(graphs[0], {&buffers[0], &buffers[1], int64_t{2}}).ok());
  auto again = CaptureChain(buffers[0], buffers[1], 1);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->info().cache_hit());
}

TEST_F(GraphTest, EvictionByBytes) {
  // A chain's instance counts its arena, 2 KiB (two 1 KiB internals alive together), and
  // the host memory it holds: measured first, then a bound that holds one chain, not two.
  uint64_t one = 0;
  {
    Buffer in = Alloc(kN * 4), out = Alloc(kN * 4);
    absl::StatusOr<Graph> measured = CaptureChain(in, out, 1);
    ASSERT_TRUE(measured.ok()) << measured.status();
    one = measured->info().cache().bytes();
    EXPECT_GT(one, 2048u) << "the arena and the instance's host memory";
  }
  Start({absl::Seconds(60), 256 << 20, 256, /*graph_cache_bytes=*/one + one / 2});
  OpenAll();
  Buffer in = Alloc(kN * 4), out = Alloc(kN * 4), in2 = Alloc(kN * 4 + 4), out2 = Alloc(kN * 4 + 4);
  auto a = CaptureChain(in, out, 1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->info().cache().bytes(), one);
  auto b = CaptureChain(in2, out2, 1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->info().cache().evictions(), 1u);
  EXPECT_EQ(b->info().cache().graphs(), 1u);
  EXPECT_EQ(b->info().cache().bytes(), one);
  EXPECT_FALSE(CaptureChain(in, out, 1)->info().cache_hit()) << "a was evicted";
  EXPECT_TRUE(session_->Replay(*a, {&in, &out, int64_t{1}}).ok());
}

TEST_F(GraphTest, BufferParametersMustBeLargeEnoughAndOurs) {
  Buffer in = Alloc(kN * 4), out = Alloc(kN * 4), small = Alloc(kN * 2);
  auto graph = CaptureChain(in, out, 3);
  ASSERT_TRUE(graph.ok());
  absl::Status s = session_->Replay(*graph, {&in, &small, int64_t{3}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("the graph needs 1024"));
  Session other = Open();
  auto theirs = other.Alloc(kN * 4);
  // A handle of another session is unknown here.
  v1::ReplayGraphRequest request;
  request.set_session(session_->id());
  request.set_graph(graph->handle());
  request.add_params()->set_buffer(in.handle());
  request.add_params()->set_buffer(theirs->handle() + 1000);
  request.add_params()->set_int_value(3);
  grpc::ClientContext ctx;
  v1::ReplayGraphReply reply;
  EXPECT_EQ(stub().ReplayGraph(&ctx, request, &reply).error_code(), grpc::StatusCode::NOT_FOUND);
  // Another session cannot replay our graph.
  request.set_session(other.id());
  grpc::ClientContext ctx2;
  EXPECT_EQ(stub().ReplayGraph(&ctx2, request, &reply).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(GraphTest, ReadsAreCheckedAndBounded) {
  Buffer in = Alloc(kN * 4), out = Alloc(kN * 4), big = Alloc(2 << 20);
  auto graph = CaptureChain(in, out, 3);
  ASSERT_TRUE(graph.ok());
  EXPECT_EQ(session_->Replay(*graph, {&in, &out, int64_t{3}}, false, {View{&big}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session_->Replay(*graph, {&in, &out, int64_t{3}}, false, {View{&out, 4096}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto r = session_->Replay(*graph, {&in, &out, int64_t{3}}, false, {View{&big, 0, 1 << 20}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->reads[0].size(), 1u << 20);
}

TEST_F(GraphTest, AReadBufferIsFreedWhenItsHandleGoes) {
  Buffer in = Alloc(kN * 4), out = Alloc(kN * 4);
  auto graph = CaptureChain(in, out, 3);
  ASSERT_TRUE(graph.ok());
  const uint64_t before = FreeMemory();
  {
    Buffer extra = Alloc(1 << 20);
    ASSERT_TRUE(session_->Replay(*graph, {&in, &out, int64_t{3}}, true, {View{&extra, 0, 16}}).ok());
  }
  EXPECT_EQ(FreeMemory(), before) << "a replay's reads must not hold the buffer";
}

TEST_F(GraphTest, ReplayDuringACaptureIsFailedPrecondition) {
  Buffer in = Alloc(kN * 4), out = Alloc(kN * 4);
  auto graph = CaptureChain(in, out, 3);
  ASSERT_TRUE(graph.ok());
  ASSERT_TRUE(session_->BeginCapture({}, {}).ok());
  EXPECT_EQ(session_->Replay(*graph, {&in, &out, int64_t{3}}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(session_->BeginCapture({}, {}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(session_->EndCapture({}).status().code(), absl::StatusCode::kFailedPrecondition) << "nothing recorded";
  EXPECT_EQ(session_->Replay(*graph, {&in, &out, int64_t{3}}).status().code(), absl::StatusCode::kFailedPrecondition)
      << "the failed EndCapture left the capture open";
  ASSERT_TRUE(session_->DiscardCapture().ok());
  EXPECT_EQ(session_->DiscardCapture().code(), absl::StatusCode::kFailedPrecondition) << "no capture open";
  EXPECT_TRUE(session_->Replay(*graph, {&in, &out, int64_t{3}}).ok());
}

TEST_F(GraphTest, AFailedEndCaptureKeepsTheRecord) {
  Buffer in = Alloc(kN * 4), out = Alloc(kN * 4);
  ASSERT_TRUE(session_->BeginCapture({&in}, {kPos}).ok());
  ASSERT_TRUE(AffineAtPos(out, in, 4).ok());
  Buffer gone = Alloc(16);
  const uint64_t gone_handle = gone.handle();
  gone = Buffer();
  v1::EndCaptureRequest request;
  request.set_session(session_->id());
  request.add_outputs(gone_handle);
  grpc::ClientContext ctx;
  v1::GraphReply reply;
  EXPECT_EQ(stub().EndCapture(&ctx, request, &reply).error_code(), grpc::StatusCode::NOT_FOUND);
  auto graph = session_->EndCapture({&out});
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->info().calls(), 1u);
}

TEST_F(GraphTest, ConstantsStayAliveWhileAGraphHoldsThem) {
  const uint64_t baseline = FreeMemory();
  Buffer weights = Alloc(kN * 4), out = Alloc(kN * 4);
  ASSERT_TRUE(session_->WriteVector(weights, std::vector<float>(kN, 1.5f)).ok());
  ASSERT_TRUE(session_->BeginCapture({}, {}).ok());
  ASSERT_TRUE(session_->Launch(*affine_, {View{&out}, View{&weights}, int64_t{kN}, int64_t{1}}, {1, 1, 1}).ok());
  auto graph = session_->EndCapture({&out});
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_EQ(graph->info().params_size(), 1);  // weights became a constant
  weights = Buffer();                         // the handle goes, the memory stays
  ASSERT_TRUE(session_->WriteVector(out, std::vector<float>(kN, 0.f)).ok());
  ASSERT_TRUE(session_->Replay(*graph, {&out}, true).ok());
  EXPECT_EQ((*session_->ReadVector<float>(out, 1))[0], 4.0f);
  EXPECT_LT(FreeMemory(), baseline - kN * 4);
  *graph = Graph();
  session_.reset();
  affine_.reset();
  iota_.reset();
}

TEST_F(GraphTest, ClosingTheSessionFreesGraphsArenasAndConstants) {
  const uint64_t baseline = FreeMemory();
  {
    Session s = Open();
    ProgramSpec affine{"cpu-c", kAffineSource, "affine", *ParseSignature("out,in,int32,int32"), {}};
    auto p = s.Load(affine);
    auto in = s.Alloc(kN * 4), out = s.Alloc(kN * 4), weights = s.Alloc(kN * 4);
    ASSERT_TRUE(s.BeginCapture({&*in}, {}).ok());
    auto t = s.Alloc(kN * 4);  // born in the capture: an internal
    ASSERT_TRUE(s.Launch(*p, {View{&*in}, View{&*weights}, int64_t{kN}, int64_t{1}}, {1, 1, 1}).ok());
    ASSERT_TRUE(s.Launch(*p, {View{&*t}, View{&*in}, int64_t{kN}, int64_t{1}}, {1, 1, 1}).ok());
    ASSERT_TRUE(s.Launch(*p, {View{&*out}, View{&*t}, int64_t{kN}, int64_t{1}}, {1, 1, 1}).ok());
    *t = Buffer();
    auto g = s.EndCapture({&*out});
    ASSERT_TRUE(g.ok());
    EXPECT_GT(g->info().arena_bytes(), 0u);
  }
  EXPECT_EQ(FreeMemory(), baseline) << "arena, constant and buffers all freed";
}

TEST_F(GraphTest, ConcurrentReplaysOfOneGraphAreCorrect) {
  Buffer in = Alloc(kN * 4), out = Alloc(kN * 4);
  auto graph = CaptureChain(in, out, 3);
  ASSERT_TRUE(graph.ok());
  std::vector<float> input = Random(kN, 5);
  constexpr int kThreads = 8, kRounds = 30;
  std::vector<Buffer> ins, outs;
  for (int t = 0; t < kThreads; ++t) {
    ins.push_back(Alloc(kN * 4));
    outs.push_back(Alloc(kN * 4));
    ASSERT_TRUE(session_->WriteVector(ins.back(), input).ok());
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        int64_t pos = 1 + (t * kRounds + r) % 256;
        // Half the threads replay on the session's stream, half as unary ReplayGraph RPCs.
        auto res = t % 2 == 0 ? session_->Replay(*graph, {&ins[t], &outs[t], pos}, true, {View{&outs[t]}})
                              : session_->ReplayUnary(*graph, {&ins[t], &outs[t], pos}, true, {View{&outs[t]}});
        if (!res.ok()) return void(++failures);
        std::vector<float> got(kN);
        std::memcpy(got.data(), res->reads[0].data(), kN * 4);
        if (got != ChainReference(input, pos)) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(session_->DescribeGraph(*graph)->replays(), uint64_t(kThreads * kRounds));
}

TEST_F(GraphTest, EagerLaunchChecksBoundVariablesAndExpressions) {
  Buffer out = Alloc(kN * 4);
  LaunchSpec spec;
  spec.args = {View{&out}, Expr{"(pos + 31) // 32"}};
  spec.global = {Expr{"pos"}};
  spec.variables = {{kPos, 300}};
  absl::Status s = session_->Launch(*iota_, spec).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("pos = 300 is outside [1, 256]"));
  spec.variables = {{kPos, 40}};
  ASSERT_TRUE(session_->Launch(*iota_, spec).ok());
  auto got = *session_->ReadVector<int32_t>(out, 41);
  EXPECT_EQ(got[0], 2);
  EXPECT_EQ(got[39], 41);
  EXPECT_EQ(got[40], 0);
  spec.args = {View{&out}, Expr{"pos // (pos - 1)"}};
  EXPECT_THAT(std::string(session_->Launch(*iota_, spec).status().message()), HasSubstr("can be zero"));
  spec.args = {View{&out}, Expr{"nope"}};
  EXPECT_EQ(session_->Launch(*iota_, spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.args = {View{&out}, int64_t{0}};
  spec.global = {Expr{"pos * 1000000"}};
  EXPECT_EQ(session_->Launch(*iota_, spec).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GraphTest, DefinitionsAreChecked) {
  auto define = [&](const v1::GraphDef& def) { return session_->DefineGraph(def).status(); };
  v1::GraphDef empty;
  EXPECT_EQ(define(empty).code(), absl::StatusCode::kInvalidArgument);
  v1::GraphDef base;
  base.add_slots()->set_kind(v1::Slot::PARAMETER);
  base.mutable_slots(0)->set_bytes(kN * 4);
  auto* call = base.add_calls();
  call->set_program(iota_->handle());
  call->add_args()->mutable_view()->set_slot(0);
  call->add_args()->mutable_expr()->set_constant(0);
  call->add_global()->set_constant(kN);
  EXPECT_TRUE(define(base).ok());
  v1::GraphDef past_slot = base;
  past_slot.mutable_calls(0)->mutable_global(0)->set_constant(kN + 1);  // fine for iota's view
  v1::GraphDef bad_slot = base;
  bad_slot.mutable_calls(0)->mutable_args(0)->mutable_view()->set_slot(5);
  EXPECT_EQ(define(bad_slot).code(), absl::StatusCode::kInvalidArgument);
  v1::GraphDef view_out = base;
  view_out.mutable_calls(0)->mutable_args(0)->mutable_view()->set_offset(kN * 4);
  EXPECT_EQ(define(view_out).code(), absl::StatusCode::kInvalidArgument);
  v1::GraphDef unknown_program = base;
  unknown_program.mutable_calls(0)->set_program(999);
  EXPECT_EQ(define(unknown_program).code(), absl::StatusCode::kNotFound);
  v1::GraphDef unknown_constant = base;
  unknown_constant.mutable_slots(0)->set_kind(v1::Slot::CONSTANT);
  unknown_constant.mutable_slots(0)->set_buffer(999);
  EXPECT_EQ(define(unknown_constant).code(), absl::StatusCode::kNotFound);
  v1::GraphDef zero_dim = base;
  zero_dim.mutable_calls(0)->mutable_global(0)->set_constant(0);
  EXPECT_EQ(define(zero_dim).code(), absl::StatusCode::kInvalidArgument);
  v1::GraphDef symbolic_too_big = base;
  auto* v = symbolic_too_big.add_variables();
  v->set_name("x");
  v->set_min(0);
  v->set_max(10);
  symbolic_too_big.mutable_calls(0)->mutable_global(0)->set_text("x");  // can be 0
  EXPECT_EQ(define(symbolic_too_big).code(), absl::StatusCode::kInvalidArgument);
  v1::GraphDef wrong_kind = base;
  wrong_kind.mutable_slots(0)->set_kind(static_cast<v1::Slot::Kind>(9));
  EXPECT_EQ(define(wrong_kind).code(), absl::StatusCode::kInvalidArgument);
  v1::GraphDef int32_range = base;
  auto* big = int32_range.add_variables();
  big->set_name("big");
  big->set_min(0);
  big->set_max(int64_t{1} << 40);
  int32_range.mutable_calls(0)->mutable_args(1)->mutable_expr()->set_text("big");
  EXPECT_EQ(define(int32_range).code(), absl::StatusCode::kInvalidArgument);
}

// C++'s % traps (SIGFPE) on INT64_MIN % -1, whose value is 0: every way a client could
// reach it over the wire computes 0 instead, and the daemon serves on. iota writes
// out[0] = 0 + base, so each path's base arrives in out[0].
TEST_F(GraphTest, ModuloOfInt64MinByMinusOneComputesZeroOnEveryPath) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  const Variable v{"v", kMin, 0, 1}, w{"w", -5, -1, 1};
  Buffer out = Alloc(kN * 4);
  auto reset = [&] { ASSERT_TRUE(session_->WriteVector(out, std::vector<int32_t>(kN, 7)).ok()); };
  auto first = [&]() -> int32_t {
    auto got = session_->ReadVector<int32_t>(out, 1);
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? (*got)[0] : -1;
  };
  auto launch = [&](std::vector<KernelArg> args, std::vector<Dim> global, std::vector<BoundVariable> variables) {
    reset();
    LaunchSpec spec;
    spec.args = std::move(args);
    spec.global = std::move(global);
    spec.variables = std::move(variables);
    spec.wait = true;
    return session_->Launch(*iota_, spec).status();
  };
  // A text expression as an argument, and as a launch dimension (1 = 0 + 1).
  ASSERT_TRUE(launch({View{&out}, Expr{"(-9223372036854775807-1)%-1"}}, {uint64_t{1}}, {}).ok());
  EXPECT_EQ(first(), 0);
  ASSERT_TRUE(launch({View{&out}, int64_t{0}}, {Expr{"(-9223372036854775807-1)%-1 + 1"}}, {}).ok());
  EXPECT_EQ(first(), 0);
  // Variables bound to INT64_MIN and -1.
  ASSERT_TRUE(launch({View{&out}, Expr{"v % -1"}}, {uint64_t{1}}, {{v, kMin}}).ok());
  EXPECT_EQ(first(), 0);
  ASSERT_TRUE(launch({View{&out}, Expr{"v % w"}}, {uint64_t{1}}, {{v, kMin}, {w, -1}}).ok());
  EXPECT_EQ(first(), 0);
  // A tree expression, as a client that builds the proto would send it.
  {
    reset();
    v1::LaunchRequest r;
    r.set_session(session_->id());
    r.set_program(iota_->handle());
    r.add_args()->mutable_view()->set_buffer(out.handle());
    v1::BinaryExpr* mod = r.add_args()->mutable_expr()->mutable_binary();
    mod->set_op(v1::BinaryExpr::MOD);
    mod->mutable_lhs()->set_constant(kMin);
    mod->mutable_rhs()->set_constant(-1);
    r.add_global(1);
    r.set_wait(true);
    grpc::ClientContext ctx;
    v1::LaunchReply reply;
    grpc::Status s = stub().Launch(&ctx, r, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(first(), 0);
  }
  // A captured launch (it runs at capture too), replayed on the stream and unary.
  reset();
  ASSERT_TRUE(session_->BeginCapture({}, {v, w}).ok());
  {
    LaunchSpec spec;
    spec.args = {View{&out}, Expr{"v % w"}};
    spec.variables = {{v, kMin}, {w, -1}};
    ASSERT_TRUE(session_->Launch(*iota_, spec).ok());
  }
  auto captured = session_->EndCapture({&out});
  EXPECT_EQ(first(), 0);
  ASSERT_TRUE(captured.ok()) << captured.status();
  for (bool unary : {false, true}) {
    reset();
    auto r = unary ? session_->ReplayUnary(*captured, {&out, kMin, int64_t{-1}}, true)
                   : session_->Replay(*captured, {&out, kMin, int64_t{-1}}, true);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(first(), 0) << (unary ? "unary" : "stream");
  }
  // A definition with the expression as an argument, replayed at the extremes.
  v1::GraphDef def;
  for (const Variable& var : {v, w}) {
    auto* d = def.add_variables();
    d->set_name(var.name);
    d->set_min(var.min);
    d->set_max(var.max);
  }
  def.add_slots()->set_kind(v1::Slot::PARAMETER);
  def.mutable_slots(0)->set_bytes(kN * 4);
  auto* call = def.add_calls();
  call->set_program(iota_->handle());
  call->add_args()->mutable_view()->set_slot(0);
  call->add_args()->mutable_expr()->set_text("v % w");
  call->add_global()->set_text("(v % -1) + 1");
  auto defined = session_->DefineGraph(def);
  ASSERT_TRUE(defined.ok()) << defined.status();
  reset();
  auto r = session_->Replay(*defined, {&out, kMin, int64_t{-1}}, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(first(), 0);
  // INT64_MIN // -1 is 2^63, out of int64: refused when the expression is built.
  EXPECT_EQ(launch({View{&out}, Expr{"v // w"}}, {uint64_t{1}}, {{v, kMin}, {w, -1}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(client().ListDevices().ok()) << "the daemon serves on";
}

}  // namespace
}  // namespace replayd::client
