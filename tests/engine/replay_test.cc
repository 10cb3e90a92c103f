// Replay checks on the fake device: a parameter vector resolves to device addresses and
// values or is refused naming what was wrong (a missing parameter, a kind, a buffer too
// small, a value out of range); reads resolve and are taken; a replay sequence's vectors
// and steps are checked before anything runs.
#include "engine/replay.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>

#include "tests/support/fake_driver.h"
#include "tests/support/status_macros.h"

namespace replayd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::FakeContext;
using testing::FakeDevice;

std::vector<uint64_t> Vec(std::span<const uint64_t> s) { return {s.begin(), s.end()}; }
std::vector<int64_t> Vec(std::span<const int64_t> s) { return {s.begin(), s.end()}; }
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

class ReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto context = device_.OpenContext({"test"});
    ASSERT_TRUE(context.ok()) << context.status();
    context_ = std::shared_ptr<Context>(std::move(*context));
    // Handles 1 (256 bytes), 2 (64 bytes), 3 (16 bytes), 4 (512 bytes).
    for (uint64_t bytes : {256, 64, 16, 512}) {
      ASSERT_OK_AND_ASSIGN(Allocation a, context_->Allocate(bytes));
      buffers_.Insert(std::make_shared<DeviceBuffer>(context_, a));
    }
    ASSERT_OK_AND_ASSIGN(instance_, Instance());
  }

  // Parameters: slot 0 (256 bytes), slot 1 (64 bytes), pos in [0, 100], big in
  // [0, int64 max] by 2. Calls: kernel(slot 1, slot 0, pos, big); slot 1 = slot 0[0:64].
  absl::StatusOr<std::shared_ptr<GraphInstance>> Instance() {
    Signature sig;
    sig.params = {{"out", ParamKind::kBuffer, Access::kOut},
                  {"in", ParamKind::kBuffer, Access::kIn},
                  {"pos", ParamKind::kInt64, Access::kNone},
                  {"big", ParamKind::kInt64, Access::kNone}};
    auto program = std::make_shared<Program>();
    program->key = "k";
    program->entry = "k";
    program->kernel = FakeContext::MakeKernel(sig, nullptr);
    Graph g;
    g.variables = {{"pos", 0, 100, 1}, {"big", 0, kInt64Max, 2}};
    g.slots = {{SlotKind::kParameter, 256, nullptr}, {SlotKind::kParameter, 64, nullptr}};
    GraphCall call;
    call.program = program;
    call.args = {SlotView{1, 0, 0}, SlotView{0, 0, 0}, Expression::Var(0), Expression::Var(1)};
    g.calls = {call, CopyCall(SlotView{1, 0, 64}, SlotView{0, 0, 64})};
    if (absl::Status s = CheckGraph(g, device_.info()); !s.ok()) return s;
    std::string structure = GraphStructure(g, context_->address_space());
    return GraphInstance::Create(std::move(g), std::move(structure), context_, BatchOptions{});
  }

  uint64_t AddressOf(Handle h) {
    absl::StatusOr<std::shared_ptr<DeviceBuffer>> b = buffers_.Find(h);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? (*b)->allocation.address : 0;
  }

  absl::Status Resolve(std::vector<ParamValue> params) {
    return ResolveParams(*instance_, params, buffers_, addresses_, values_);
  }

  ReplaySequenceOp Stepping(int64_t pos, int64_t big, size_t step_param, int64_t step, uint64_t count) {
    ReplaySequenceOp op;
    op.base = {BufferParam{1}, BufferParam{2}, pos, big};
    op.step_param = step_param;
    op.step = step;
    op.count = count;
    return op;
  }

  FakeDevice device_;
  std::shared_ptr<Context> context_;
  HandleTable<DeviceBuffer> buffers_{"buffer"};
  std::shared_ptr<GraphInstance> instance_;
  std::vector<uint64_t> addresses_;
  std::vector<int64_t> values_;
};

TEST_F(ReplayTest, AVectorResolvesToAddressesAndValues) {
  ASSERT_TRUE(Resolve({BufferParam{1}, BufferParam{2}, int64_t{7}, int64_t{10}}).ok());
  EXPECT_THAT(addresses_, ElementsAre(AddressOf(1), AddressOf(2)));
  EXPECT_THAT(values_, ElementsAre(7, 10));
  // Buffers larger than their slots are accepted.
  ASSERT_TRUE(Resolve({BufferParam{4}, BufferParam{1}, int64_t{0}, kInt64Max - 1}).ok());
  EXPECT_THAT(addresses_, ElementsAre(AddressOf(4), AddressOf(1)));
  EXPECT_THAT(values_, ElementsAre(0, kInt64Max - 1));
}

TEST_F(ReplayTest, AWrongCountNamesWhatIsMissing) {
  absl::Status s = Resolve({BufferParam{1}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "the graph takes 4 parameters, got 1 (buffer parameter 1 is missing)");
  s = Resolve({BufferParam{1}, BufferParam{2}, int64_t{7}});
  EXPECT_EQ(s.message(), "the graph takes 4 parameters, got 3 (variable big is missing)");
  s = Resolve({BufferParam{1}, BufferParam{2}, int64_t{7}, int64_t{0}, int64_t{0}});
  EXPECT_EQ(s.message(), "the graph takes 4 parameters, got 5");
}

TEST_F(ReplayTest, ABufferTooSmallOrOfTheWrongKindIsRefused) {
  absl::Status s = Resolve({BufferParam{3}, BufferParam{2}, int64_t{7}, int64_t{0}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "parameter 0: buffer 3 has 16 bytes; the graph needs 256");
  s = Resolve({int64_t{1}, BufferParam{2}, int64_t{7}, int64_t{0}});
  EXPECT_EQ(s.message(), "parameter 0 must be a buffer");
  s = Resolve({BufferParam{1}, BufferParam{2}, BufferParam{2}, int64_t{0}});
  EXPECT_EQ(s.message(), "parameter 2 (variable pos) must be a value");
  s = Resolve({BufferParam{1}, BufferParam{99}, int64_t{7}, int64_t{0}});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "parameter 1: buffer 99 not found in this session");
}

TEST_F(ReplayTest, AValueOutOfRangeIsRefused) {
  absl::Status s = Resolve({BufferParam{1}, BufferParam{2}, int64_t{101}, int64_t{0}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "variable pos = 101 is outside [0, 100]");
  s = Resolve({BufferParam{1}, BufferParam{2}, int64_t{1}, int64_t{3}});
  EXPECT_EQ(s.message(), "variable big = 3 is not a multiple of 2");
}

TEST_F(ReplayTest, OneBufferForBothSidesOfACopyIsRefused) {
  absl::Status s = Resolve({BufferParam{1}, BufferParam{1}, int64_t{1}, int64_t{0}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("overlapping"));
}

TEST_F(ReplayTest, ReadsResolveAndAreTaken) {
  const uint8_t bytes[] = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> b, buffers_.Find(2));
  ASSERT_TRUE(context_->Write(b->allocation, 0, bytes).ok());
  std::vector<ResolvedRead> reads;
  ASSERT_TRUE(ResolveReads(std::vector<ViewArg>{ViewArg{2, 2, 3}, ViewArg{2, 60, 0}}, buffers_, reads).ok());
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[1].offset, 60u);
  EXPECT_EQ(reads[1].length, 4u) << "a zero length reaches the end";
  std::vector<std::string> out;
  ASSERT_TRUE(TakeReads(*context_, reads, out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0], std::string("\x03\x04\x05", 3));
  EXPECT_EQ(out[1], std::string(4, '\0'));

  absl::Status s = ResolveReads(std::vector<ViewArg>{ViewArg{2, 0, 0}, ViewArg{7, 0, 0}}, buffers_, reads);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("read 1"));
  s = ResolveReads(std::vector<ViewArg>{ViewArg{3, 8, 16}}, buffers_, reads);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("read 0"));
}

TEST_F(ReplayTest, ReadsPastTheLimitAreRefused) {
  ASSERT_OK_AND_ASSIGN(Allocation a, context_->Allocate(kMaxReplayReadBytes));
  const Handle big = buffers_.Insert(std::make_shared<DeviceBuffer>(context_, a));
  std::vector<ResolvedRead> reads;
  ASSERT_TRUE(ResolveReads(std::vector<ViewArg>{ViewArg{big, 0, 0}}, buffers_, reads).ok());
  absl::Status s = ResolveReads(std::vector<ViewArg>{ViewArg{big, 0, 0}, ViewArg{1, 0, 1}}, buffers_, reads);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), absl::StrCat("reads exceed ", kMaxReplayReadBytes, " bytes in all"));
}

TEST_F(ReplayTest, ASequenceOfVectorsIsCheckedVectorByVector) {
  ReplaySequenceOp op;
  op.vectors = {{BufferParam{1}, BufferParam{2}, int64_t{1}, int64_t{2}},
                {BufferParam{2}, BufferParam{2}, int64_t{3}, int64_t{4}}};
  absl::StatusOr<SequenceVectors> refused = SequenceVectors::Check(*instance_, op, buffers_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), "replay 1: parameter 0: buffer 2 has 64 bytes; the graph needs 256");

  op.vectors[1][0] = BufferParam{1};
  ASSERT_OK_AND_ASSIGN(SequenceVectors vectors, SequenceVectors::Check(*instance_, op, buffers_));
  ASSERT_EQ(vectors.count(), 2u);
  EXPECT_THAT(Vec(vectors.ValuesOf(0)), ElementsAre(1, 2));
  EXPECT_THAT(Vec(vectors.ValuesOf(1)), ElementsAre(3, 4));
  EXPECT_THAT(Vec(vectors.addresses(1)), ElementsAre(AddressOf(1), AddressOf(2)));

  op.count = 2;  // vectors and a count: both ways at once
  EXPECT_EQ(SequenceVectors::Check(*instance_, op, buffers_).status().message(),
            "a sequence takes vectors or a base with a step, not both");
}

TEST_F(ReplayTest, ASteppingSequenceMovesItsVariable) {
  ASSERT_OK_AND_ASSIGN(SequenceVectors vectors,
                       SequenceVectors::Check(*instance_, Stepping(5, 8, /*pos*/ 2, 3, 4), buffers_));
  ASSERT_EQ(vectors.count(), 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_THAT(Vec(vectors.ValuesOf(i)), ElementsAre(5 + 3 * static_cast<int64_t>(i), 8)) << i;
    EXPECT_THAT(Vec(vectors.addresses(i)), ElementsAre(AddressOf(1), AddressOf(2))) << i;
  }
  // Steps down, and to the last value allowed.
  EXPECT_TRUE(SequenceVectors::Check(*instance_, Stepping(100, 0, 2, -10, 11), buffers_).ok());
  EXPECT_TRUE(SequenceVectors::Check(*instance_, Stepping(0, kInt64Max - 5, 3, 2, 3), buffers_).ok());
}

TEST_F(ReplayTest, ASequenceCountOutOfRangeIsRefused) {
  for (uint64_t count : {uint64_t{0}, kMaxSequenceReplays + 1}) {
    absl::Status s = SequenceVectors::Check(*instance_, Stepping(0, 0, 2, 1, count), buffers_).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), absl::StrCat("a sequence runs 1 to ", kMaxSequenceReplays, " replays, not ", count));
  }
}

TEST_F(ReplayTest, AStepParamThatIsNotAVariableIsRefused) {
  for (size_t step_param : {0, 1, 4}) {
    absl::Status s = SequenceVectors::Check(*instance_, Stepping(0, 0, step_param, 1, 2), buffers_).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), absl::StrCat("step_param ", step_param, " is not a variable parameter"));
  }
}

TEST_F(ReplayTest, AStepThatOverflowsIsRefused) {
  // The last value passes int64.
  absl::Status s = SequenceVectors::Check(*instance_, Stepping(0, kInt64Max - 1, 3, 2, 2), buffers_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "variable big overflows over the sequence");
  // The span (count - 1) * step passes int64.
  s = SequenceVectors::Check(*instance_, Stepping(0, 0, 3, int64_t{1} << 62, 3), buffers_).status();
  EXPECT_EQ(s.message(), "variable big overflows over the sequence");
}

TEST_F(ReplayTest, ALastValueOutOfRangeIsRefusedNamingItsReplay) {
  absl::Status s = SequenceVectors::Check(*instance_, Stepping(95, 0, 2, 1, 10), buffers_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "replay 9: variable pos = 104 is outside [0, 100]");
  // A base out of range is refused as a single replay's vector is.
  s = SequenceVectors::Check(*instance_, Stepping(101, 0, 2, -1, 2), buffers_).status();
  EXPECT_EQ(s.message(), "variable pos = 101 is outside [0, 100]");
}

TEST_F(ReplayTest, AStepNotAMultipleIsRefused) {
  // 0, 3, 6: the first and the last are multiples of 2, the step is not.
  absl::Status s = SequenceVectors::Check(*instance_, Stepping(0, 0, 3, 3, 3), buffers_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "step 3 of variable big is not a multiple of 2");
}

}  // namespace
}  // namespace replayd
