// The capture record on the fake device: a record becomes a graph with inputs and outputs
// as parameters, buffers allocated and freed inside as internals and every other buffer
// as a constant; a call it refuses (a variable bound with another range, past the graph
// limits) leaves it as it was.
#include "engine/capture.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/support/fake_driver.h"
#include "tests/support/status_macros.h"

namespace replayd {
namespace {

using ::testing::HasSubstr;
using testing::FakeContext;
using testing::FakeDevice;

// out[i] = in[i] + k.
std::shared_ptr<Program> AddK() {
  Signature sig;
  sig.params = {{"out", ParamKind::kBuffer, Access::kOut},
                {"in", ParamKind::kBuffer, Access::kIn},
                {"k", ParamKind::kInt32, Access::kNone}};
  auto p = std::make_shared<Program>();
  p->key = "add_k";
  p->entry = "add_k";
  p->kernel = FakeContext::MakeKernel(sig, nullptr);
  return p;
}

const std::array<Expression, 3> kOnes{Expression::Constant(1), Expression::Constant(1), Expression::Constant(1)};

class CaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto context = device_.OpenContext({"test"});
    ASSERT_TRUE(context.ok()) << context.status();
    context_ = std::shared_ptr<Context>(std::move(*context));
    program_ = AddK();
  }

  absl::StatusOr<std::shared_ptr<DeviceBuffer>> NewBuffer(uint64_t bytes) {
    absl::StatusOr<Allocation> a = context_->Allocate(bytes);
    if (!a.ok()) return a.status();
    return std::make_shared<DeviceBuffer>(context_, *a);
  }

  // add_k(out, in, k) with k an expression over `variables`.
  absl::Status Launch(CaptureRecord& record, const std::shared_ptr<DeviceBuffer>& out, const std::shared_ptr<DeviceBuffer>& in,
                      Expression k, std::span<const VariableDecl> variables) {
    std::vector<RecordedArg> args = {RecordedView{out, ViewArg{1, 0, 0}}, RecordedView{in, ViewArg{2, 0, 0}},
                                     std::move(k)};
    return record.RecordLaunch(program_, std::move(args), kOnes, kOnes, variables);
  }

  FakeDevice device_;
  std::shared_ptr<Context> context_;
  std::shared_ptr<Program> program_;
};

TEST_F(CaptureTest, ARecordBecomesAGraphWithEachBufferClassified) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> in, NewBuffer(64));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> out, NewBuffer(64));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> weights, NewBuffer(128));  // made before the capture
  const VariableDecl pos{"pos", 0, 100, 1};
  ASSERT_OK_AND_ASSIGN(CaptureRecord record, CaptureRecord::Open({{1, in}}, {pos}));

  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> temp, NewBuffer(32));
  record.NoteAllocated(*temp);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> kept, NewBuffer(16));  // made inside, never freed
  record.NoteAllocated(*kept);

  // The call binds `len` (new to the record) and `pos`, in that order.
  const VariableDecl call_vars[] = {{"len", 1, 8, 1}, pos};
  ASSERT_TRUE(Launch(record, temp, in, Expression::Var(1), call_vars).ok());
  ASSERT_TRUE(Launch(record, out, temp, Expression::Var(0), call_vars).ok());
  ASSERT_TRUE(Launch(record, kept, weights, Expression::Constant(3), {}).ok());
  ASSERT_TRUE(record.RecordCopy({out, ViewArg{1, 0, 16}}, {kept, ViewArg{5, 0, 0}}).ok());
  record.NoteFreed(*temp);
  EXPECT_EQ(record.call_count(), 4u);

  const std::shared_ptr<DeviceBuffer> outputs[] = {out, in};  // an input named again is one parameter
  Graph g = record.ToGraph(outputs);
  ASSERT_EQ(g.variables.size(), 2u);
  EXPECT_EQ(g.variables[0].name, "pos");
  EXPECT_EQ(g.variables[1].name, "len");
  ASSERT_EQ(g.slots.size(), 5u);
  EXPECT_EQ(g.slots[0].kind, SlotKind::kParameter);  // in
  EXPECT_EQ(g.slots[0].bytes, 64u);
  EXPECT_EQ(g.slots[1].kind, SlotKind::kParameter);  // out
  EXPECT_EQ(g.slots[2].kind, SlotKind::kInternal);   // temp: made and freed inside
  EXPECT_EQ(g.slots[2].bytes, 32u);
  EXPECT_EQ(g.slots[2].constant, nullptr);
  EXPECT_EQ(g.slots[3].kind, SlotKind::kConstant);  // kept
  EXPECT_EQ(g.slots[3].constant, kept);
  EXPECT_EQ(g.slots[4].kind, SlotKind::kConstant);  // weights
  EXPECT_EQ(g.slots[4].constant, weights);
  EXPECT_EQ(g.slots[4].bytes, 128u);

  ASSERT_EQ(g.calls.size(), 4u);
  EXPECT_EQ(std::get<SlotView>(g.calls[0].args[0]).slot, 2u);
  EXPECT_EQ(std::get<SlotView>(g.calls[0].args[1]).slot, 0u);
  // The call's variable indices are mapped onto the record's: its pos (1) is the graph's
  // 0, its len (0) the graph's 1.
  EXPECT_EQ(std::get<Expression>(g.calls[0].args[2]), Expression::Var(0));
  EXPECT_EQ(std::get<Expression>(g.calls[1].args[2]), Expression::Var(1));
  EXPECT_EQ(std::get<Expression>(g.calls[2].args[2]), Expression::Constant(3));
  EXPECT_TRUE(g.calls[3].is_copy());
  const SlotView dst = std::get<SlotView>(g.calls[3].args[0]);
  EXPECT_EQ(dst.slot, 1u);
  EXPECT_EQ(dst.length, 16u);
  EXPECT_EQ(std::get<SlotView>(g.calls[3].args[1]).slot, 3u);
  const absl::Status checked = CheckGraph(g, device_.info());
  EXPECT_TRUE(checked.ok()) << checked;

  // Making the graph leaves the record as it was: a second graph is the same.
  Graph again = record.ToGraph(outputs);
  EXPECT_EQ(GraphStructure(again, 0), GraphStructure(g, 0));
  EXPECT_EQ(record.call_count(), 4u);
}

TEST_F(CaptureTest, ALaunchWithAVariableOfAnotherRangeIsRefusedAndRecordsNothing) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> a, NewBuffer(64));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> b, NewBuffer(64));
  ASSERT_OK_AND_ASSIGN(CaptureRecord record, CaptureRecord::Open({}, {{"pos", 0, 100, 1}}));
  // `len` is new and would be added, but `pos` disagrees: neither the call nor `len` stays.
  const VariableDecl call_vars[] = {{"len", 1, 8, 1}, {"pos", 0, 50, 1}};
  absl::Status s = Launch(record, a, b, Expression::Var(1), call_vars);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("variable pos is bound with range [0, 50] multiple of 1; "
                                                  "the capture declared [0, 100] multiple of 1"));
  EXPECT_EQ(record.call_count(), 0u);
  ASSERT_EQ(record.variables().size(), 1u);
  // Another multiple_of disagrees too.
  const VariableDecl other_multiple[] = {{"pos", 0, 100, 2}};
  EXPECT_EQ(Launch(record, a, b, Expression::Var(0), other_multiple).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(record.call_count(), 0u);
  // The same range is accepted.
  const VariableDecl same[] = {{"pos", 0, 100, 1}};
  EXPECT_TRUE(Launch(record, a, b, Expression::Var(0), same).ok());
  EXPECT_EQ(record.call_count(), 1u);
  EXPECT_EQ(record.variables().size(), 1u);
}

TEST_F(CaptureTest, ACallPastTheGraphLimitIsRefused) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> a, NewBuffer(64));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> b, NewBuffer(64));
  ASSERT_OK_AND_ASSIGN(CaptureRecord record, CaptureRecord::Open({}, {}));
  for (size_t i = 0; i < kMaxGraphCalls; ++i)
    ASSERT_TRUE(record.RecordCopy({a, ViewArg{1, 0, 0}}, {b, ViewArg{2, 0, 0}}).ok()) << i;
  EXPECT_EQ(record.CheckRoom().code(), absl::StatusCode::kInvalidArgument);
  absl::Status copy = record.RecordCopy({a, ViewArg{1, 0, 0}}, {b, ViewArg{2, 0, 0}});
  EXPECT_EQ(copy.code(), absl::StatusCode::kInvalidArgument) << copy;
  EXPECT_THAT(std::string(copy.message()), HasSubstr(std::to_string(kMaxGraphCalls)));
  EXPECT_EQ(Launch(record, a, b, Expression::Constant(1), {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(record.call_count(), kMaxGraphCalls);
}

TEST_F(CaptureTest, ALaunchAddingVariablesPastTheLimitIsRefused) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> a, NewBuffer(64));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> b, NewBuffer(64));
  std::vector<VariableDecl> declared;
  for (size_t i = 0; i < kMaxGraphVariables; ++i) declared.push_back({"v" + std::to_string(i), 0, 10, 1});
  ASSERT_OK_AND_ASSIGN(CaptureRecord record, CaptureRecord::Open({}, declared));
  const VariableDecl extra[] = {{"extra", 0, 10, 1}};
  EXPECT_EQ(Launch(record, a, b, Expression::Var(0), extra).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(record.call_count(), 0u);
  EXPECT_EQ(record.variables().size(), kMaxGraphVariables);
  declared.push_back({"one_more", 0, 10, 1});
  EXPECT_EQ(CaptureRecord::Open({}, declared).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CaptureTest, BuffersFreedInsideAreInternalsAndOthersConstants) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> in, NewBuffer(64));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> before, NewBuffer(64));  // made before, freed inside
  ASSERT_OK_AND_ASSIGN(CaptureRecord record, CaptureRecord::Open({{1, in}}, {}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> temp, NewBuffer(64));
  record.NoteAllocated(*temp);
  // A buffer made and freed before any call named it: not in the graph at all.
  {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> unused, NewBuffer(8));
    record.NoteAllocated(*unused);
    record.NoteFreed(*unused);
  }
  // `reused` stands for a new buffer at the address of one made and freed inside: noted
  // again, it is a new buffer, not a freed one.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> reused, NewBuffer(64));
  record.NoteAllocated(*reused);
  record.NoteFreed(*reused);
  record.NoteAllocated(*reused);

  ASSERT_TRUE(Launch(record, temp, in, Expression::Constant(1), {}).ok());
  ASSERT_TRUE(Launch(record, before, temp, Expression::Constant(1), {}).ok());
  ASSERT_TRUE(Launch(record, reused, before, Expression::Constant(1), {}).ok());
  record.NoteFreed(*temp);
  record.NoteFreed(*before);  // not made inside: stays a constant, held by the record
  const DeviceBuffer* before_address = before.get();
  temp.reset();
  before.reset();

  Graph g = record.ToGraph({});
  ASSERT_EQ(g.slots.size(), 4u);
  EXPECT_EQ(g.slots[0].kind, SlotKind::kParameter);
  EXPECT_EQ(g.slots[1].kind, SlotKind::kInternal);
  EXPECT_EQ(g.slots[2].kind, SlotKind::kConstant);
  EXPECT_EQ(g.slots[2].constant.get(), before_address);
  EXPECT_EQ(g.slots[3].kind, SlotKind::kConstant);
  EXPECT_EQ(g.slots[3].constant, reused);
  const absl::Status checked = CheckGraph(g, device_.info());
  EXPECT_TRUE(checked.ok()) << checked;
}

TEST_F(CaptureTest, OpenRefusesABufferNamedTwiceAndBadVariables) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<DeviceBuffer> in, NewBuffer(64));
  absl::Status twice = CaptureRecord::Open({{4, in}, {4, in}}, {}).status();
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(twice.message(), "input buffer 4 is named twice");
  absl::Status declared = CaptureRecord::Open({}, {{"pos", 0, 1, 1}, {"pos", 0, 1, 1}}).status();
  EXPECT_EQ(declared.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(declared.message(), "variable pos is declared twice");
  EXPECT_EQ(CaptureRecord::Open({}, {{"pos", 5, 1, 1}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CaptureRecord::Open({}, {{"not a name", 0, 1, 1}}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace replayd
