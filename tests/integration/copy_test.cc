// Copies over loopback: the eager CopyBuffer RPC and its checks, copies recorded by a
// capture or named in a definition, replayed as copy nodes of a device graph.
#include <gmock/gmock.h>

#include <numeric>

#include "tests/integration/daemon_fixture.h"

namespace replayd::client {
namespace {

using ::testing::HasSubstr;

constexpr int kN = 64;
const Variable kPos{"pos", 1, 100, 1};

std::vector<float> Iota(size_t n, float from) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

class CopyTest : public DaemonFixture {
 protected:
  void SetUp() override {
    DaemonFixture::SetUp();
    session_ = std::make_unique<Session>(Open());
    affine_ = std::make_unique<Program>(
        *session_->Load({"cpu-c", kAffineSource, "affine", *ParseSignature("out,in,int32,int32"), {}}));
  }

  Buffer Alloc(uint64_t bytes) {
    auto b = session_->Alloc(bytes);
    EXPECT_TRUE(b.ok()) << b.status();
    return std::move(*b);
  }
  std::vector<float> Floats(const Buffer& b) { return *session_->ReadVector<float>(b, b.bytes() / 4); }

  absl::Status Affine(const Buffer& out, const Buffer& in, int64_t pos) {
    LaunchSpec spec;
    spec.args = {View{&out}, View{&in}, int64_t{kN}, Expr{"pos"}};
    spec.variables = {{kPos, pos}};
    return session_->Launch(*affine_, spec).status();
  }

  // A definition with two parameter slots of `bytes` each and a copy of `src` to `dst`.
  static v1::GraphDef CopyDef(v1::SlotView dst, v1::SlotView src, uint64_t bytes = kN * 4) {
    v1::GraphDef def;
    for (int i = 0; i < 2; ++i) {
      v1::Slot* slot = def.add_slots();
      slot->set_kind(v1::Slot::PARAMETER);
      slot->set_bytes(bytes);
    }
    v1::GraphCopy* copy = def.add_calls()->mutable_copy();
    *copy->mutable_dst() = dst;
    *copy->mutable_src() = src;
    return def;
  }
  static v1::SlotView SlotView(uint32_t slot, uint64_t offset = 0, uint64_t length = 0) {
    v1::SlotView v;
    v.set_slot(slot);
    v.set_offset(offset);
    v.set_length(length);
    return v;
  }

  std::unique_ptr<Session> session_;
  std::unique_ptr<Program> affine_;
};

TEST_F(CopyTest, AnEagerCopyMovesTheBytesOfItsViews) {
  Buffer a = Alloc(kN * 4), b = Alloc(kN * 4);
  ASSERT_TRUE(session_->WriteVector(a, Iota(kN, 1)).ok());
  // a[8, 24) to b[40, 56), then the whole of b's first half from a within a's other half.
  auto copied = session_->Copy(View{&b, 40 * 4, 16 * 4}, View{&a, 8 * 4, 16 * 4}, /*wait=*/true);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_GT(copied->device_seconds(), 0);
  std::vector<float> want(kN, 0.f);
  for (int i = 0; i < 16; ++i) want[40 + i] = 9.f + i;
  EXPECT_EQ(Floats(b), want);
  // Disjoint ranges of one buffer are fine: a[0, 32) to a[32, 64).
  ASSERT_TRUE(session_->Copy(View{&a, 32 * 4, 0}, View{&a, 0, 32 * 4}).ok());
  std::vector<float> halves = Iota(kN, 1);
  std::copy(halves.begin(), halves.begin() + 32, halves.begin() + 32);
  EXPECT_EQ(Floats(a), halves);
}

TEST_F(CopyTest, ABadCopyIsRefusedAndChangesNothing) {
  Buffer a = Alloc(kN * 4), b = Alloc(kN * 4);
  ASSERT_TRUE(session_->WriteVector(a, Iota(kN, 1)).ok());
  struct Case {
    const char* what;
    View dst, src;
    absl::StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"lengths differ", View{&b, 0, 8}, View{&a, 0, 16}, absl::StatusCode::kInvalidArgument, "one length"},
      {"overlap in one buffer", View{&a, 4, 64}, View{&a, 0, 64}, absl::StatusCode::kInvalidArgument, "overlapping"},
      {"source out of range", View{&b, 0, 8}, View{&a, kN * 4, 8}, absl::StatusCode::kInvalidArgument, "outside"},
      {"destination too long", View{&b, 8, kN * 4}, View{&a, 0, kN * 4}, absl::StatusCode::kInvalidArgument, "exceed"},
      {"no destination", View{nullptr}, View{&a}, absl::StatusCode::kNotFound, "destination"},
  };
  for (const Case& c : cases) {
    absl::Status s = session_->Copy(c.dst, c.src).status();
    EXPECT_EQ(s.code(), c.code) << c.what << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.what;
  }
  EXPECT_EQ(Floats(a), Iota(kN, 1));
  EXPECT_EQ(Floats(b), std::vector<float>(kN, 0.f));
  // A request without views at all, as a raw RPC.
  grpc::ClientContext context;
  v1::CopyBufferRequest request;
  request.set_session(session_->id());
  v1::CopyBufferReply reply;
  EXPECT_EQ(stub().CopyBuffer(&context, request, &reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(CopyTest, ACopyOfAnotherSessionsBufferIsNotFound) {
  Session other = Open();
  auto first = other.Alloc(8), second = other.Alloc(8), theirs = other.Alloc(kN * 4);
  ASSERT_TRUE(theirs.ok() && other.WriteVector(*theirs, Iota(kN, 1)).ok());
  Buffer mine = Alloc(kN * 4);
  // Handles are session-scoped: their third buffer's number names nothing here.
  View foreign{&*theirs};
  EXPECT_EQ(session_->Copy(View{&mine}, foreign).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Floats(mine), std::vector<float>(kN, 0.f));
}

// in -> affine -> t (internal) -> copied into both halves of out, the second half from a
// constant: the copies are calls of the graph, replayed with fresh parameters.
TEST_F(CopyTest, ACapturedCopyReplaysWithFreshParameters) {
  Buffer in = Alloc(kN * 4), out = Alloc(2 * kN * 4), weights = Alloc(kN * 4);
  ASSERT_TRUE(session_->WriteVector(weights, Iota(kN, 100)).ok());
  ASSERT_TRUE(session_->BeginCapture({&in}, {kPos}).ok());
  {
    Buffer t = Alloc(kN * 4);
    ASSERT_TRUE(Affine(t, in, 3).ok());
    ASSERT_TRUE(session_->Copy(View{&out, 0, kN * 4}, View{&t}).ok());
    ASSERT_TRUE(session_->Copy(View{&out, kN * 4, 0}, View{&weights}).ok());
  }
  auto graph = session_->EndCapture({&out});
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->info().calls(), 3u);
  EXPECT_EQ(graph->info().batches(), 1u) << "copies are nodes of the device graph";
  EXPECT_EQ(graph->info().arena_bytes(), kN * 4u) << "t became an internal";
  for (int64_t pos : {1, 42}) {
    Buffer fresh_in = Alloc(kN * 4), fresh_out = Alloc(2 * kN * 4);
    ASSERT_TRUE(session_->WriteVector(fresh_in, Iota(kN, float(pos))).ok());
    auto r = session_->Replay(*graph, {&fresh_in, &fresh_out, pos}, true, {View{&fresh_out}});
    ASSERT_TRUE(r.ok()) << r.status();
    std::vector<float> want(2 * kN);
    for (int i = 0; i < kN; ++i) {
      want[i] = (float(pos) + i) * 2.f + float(pos);
      want[kN + i] = 100.f + i;
    }
    std::vector<float> got(2 * kN);
    std::memcpy(got.data(), r->reads[0].data(), got.size() * 4);
    EXPECT_EQ(got, want) << "pos " << pos;
  }
}

TEST_F(CopyTest, ACapturedCopyAndItsDefinitionShareAKey) {
  Buffer a = Alloc(kN * 4), b = Alloc(kN * 4);
  ASSERT_TRUE(session_->BeginCapture({&a}, {}).ok());
  ASSERT_TRUE(session_->Copy(View{&b, 16, 32}, View{&a, 0, 32}).ok());
  auto captured = session_->EndCapture({&b});
  ASSERT_TRUE(captured.ok()) << captured.status();
  auto defined = session_->DefineGraph(CopyDef(SlotView(1, 16, 32), SlotView(0, 0, 32)));
  ASSERT_TRUE(defined.ok()) << defined.status();
  EXPECT_EQ(defined->info().key(), captured->info().key());
  EXPECT_TRUE(defined->info().cache_hit());
  // The same copy between other ranges is another graph.
  auto moved = session_->DefineGraph(CopyDef(SlotView(1, 0, 32), SlotView(0, 0, 32)));
  ASSERT_TRUE(moved.ok());
  EXPECT_NE(moved->info().key(), captured->info().key());
}

TEST_F(CopyTest, CopyDefinitionsAreChecked) {
  auto define = [&](const v1::GraphDef& def) { return session_->DefineGraph(def).status(); };
  EXPECT_TRUE(define(CopyDef(SlotView(1), SlotView(0))).ok());
  struct Case {
    const char* what;
    v1::GraphDef def;
    const char* message;
  };
  std::vector<Case> cases = {
      {"lengths differ", CopyDef(SlotView(1, 0, 16), SlotView(0, 0, 32)), "one length"},
      {"overlap in one slot", CopyDef(SlotView(0, 0, 32), SlotView(0, 16, 32)), "overlapping"},
      {"slot out of range", CopyDef(SlotView(7), SlotView(0)), "slot 7"},
      {"view past its slot", CopyDef(SlotView(1, 8, kN * 4), SlotView(0)), "exceed"},
  };
  v1::GraphDef with_program = CopyDef(SlotView(1), SlotView(0));
  with_program.mutable_calls(0)->set_program(affine_->handle());
  cases.push_back({"a program too", with_program, "no program"});
  v1::GraphDef with_dims = CopyDef(SlotView(1), SlotView(0));
  with_dims.mutable_calls(0)->add_global()->set_constant(4);
  cases.push_back({"dimensions", with_dims, "no program"});
  v1::GraphDef no_source = CopyDef(SlotView(1), SlotView(0));
  no_source.mutable_calls(0)->mutable_copy()->clear_src();
  cases.push_back({"no source", no_source, "dst and src"});
  for (const Case& c : cases) {
    absl::Status s = define(c.def);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.what;
  }
}

TEST_F(CopyTest, AReplayThatNamesOneBufferForBothSidesOfACopyRunsNothing) {
  auto graph = session_->DefineGraph(CopyDef(SlotView(1), SlotView(0)));
  ASSERT_TRUE(graph.ok()) << graph.status();
  Buffer a = Alloc(kN * 4), b = Alloc(kN * 4);
  ASSERT_TRUE(session_->WriteVector(a, Iota(kN, 1)).ok());
  auto same = session_->Replay(*graph, {&a, &a});
  EXPECT_EQ(same.status().code(), absl::StatusCode::kInvalidArgument) << same.status();
  EXPECT_THAT(std::string(same.status().message()), HasSubstr("overlapping"));
  EXPECT_EQ(session_->DescribeGraph(*graph)->replays(), 0u);
  // In a sequence, every vector is checked before the first replay runs.
  SequenceSpec sequence;
  sequence.vectors = {{&a, &b}, {&b, &b}};
  auto refused = session_->ReplaySequence(*graph, sequence);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("replay 1"));
  EXPECT_EQ(session_->DescribeGraph(*graph)->replays(), 0u);
  EXPECT_EQ(Floats(b), std::vector<float>(kN, 0.f));
  ASSERT_TRUE(session_->Replay(*graph, {&a, &b}, true).ok());
  EXPECT_EQ(Floats(b), Iota(kN, 1));
  EXPECT_EQ(session_->DescribeGraph(*graph)->replays(), 1u);
}

}  // namespace
}  // namespace replayd::client
