// A graph's checks and its structure: CheckGraph refuses what is inconsistent, naming it;
// GraphStructure is equal for two graphs that differ only in values, and differs for any
// difference a replay could see (a size, a range, an expression, a program, an address
// space).
#include "engine/graph.h"

#include <gmock/gmock.h>

#include "tests/support/fake_driver.h"

namespace replayd {
namespace {

using ::testing::HasSubstr;

class GraphChecksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Signature sig;
    sig.params = {{"x", ParamKind::kBuffer, Access::kInout}, {"n", ParamKind::kInt32, Access::kNone}};
    program_ = MakeProgram("k1", sig);
    other_ = MakeProgram("k2", sig);
  }

  static std::shared_ptr<Program> MakeProgram(const std::string& key, Signature sig) {
    auto p = std::make_shared<Program>();
    p->key = key;
    p->entry = "k";
    p->kernel = testing::FakeContext::MakeKernel(std::move(sig), nullptr);
    return p;
  }

  // One call k(x = slot 0, n = pos + `add`) over a parameter of `bytes`, pos in [1, max].
  Graph OneCall(uint64_t bytes = 64, int64_t max = 100, int64_t add = 1) const {
    Graph g;
    g.variables = {{"pos", 1, max, 1}};
    g.slots = {{SlotKind::kParameter, bytes, nullptr}};
    GraphCall call;
    call.program = program_;
    call.args = {SlotView{0, 0, 0}, Expression::Binary(Expression::Op::kAdd, Expression::Var(0), Expression::Constant(add))};
    g.calls.push_back(call);
    return g;
  }

  testing::FakeDevice device_;
  std::shared_ptr<Program> program_, other_;
};

TEST_F(GraphChecksTest, AConsistentGraphPasses) { EXPECT_TRUE(CheckGraph(OneCall(), device_.info()).ok()); }

TEST_F(GraphChecksTest, InconsistenciesAreRefusedNamingThem) {
  struct Case {
    const char* what;
    std::function<void(Graph&)> spoil;
    const char* says;
  };
  const Case cases[] = {
      {"a view past its slot", [](Graph& g) { std::get<SlotView>(g.calls[0].args[0]) = SlotView{0, 60, 8}; }, "exceed its size 64"},
      {"a view of no slot", [](Graph& g) { std::get<SlotView>(g.calls[0].args[0]) = SlotView{3, 0, 0}; }, "slot"},
      {"an argument count off the signature", [](Graph& g) { g.calls[0].args.pop_back(); }, "argument"},
      {"an integer where a buffer goes",
       [](Graph& g) { g.calls[0].args[0] = Expression::Constant(1); }, "argument"},
      {"a parameter without a size", [](Graph& g) { g.slots[0].bytes = 0; }, "slot 0"},
      {"two variables of one name", [](Graph& g) { g.variables.push_back({"pos", 1, 2, 1}); }, "pos"},
      {"an empty range", [](Graph& g) { g.variables[0].max = 0; }, "pos"},
      {"an int32 argument past its type",
       [](Graph& g) {
         g.variables[0].max = int64_t{1} << 40;
         g.calls[0].args[1] = Expression::Var(0);
       },
       "int32"},
      {"a dimension past the device",
       [](Graph& g) { g.calls[0].global[0] = Expression::Constant(int64_t{1} << 40); }, "global[0]"},
  };
  for (const Case& c : cases) {
    Graph g = OneCall();
    c.spoil(g);
    absl::Status s = CheckGraph(g, device_.info());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.says)) << c.what;
  }
}

TEST_F(GraphChecksTest, TheLimitsAreOneRuleNamingTheCount) {
  EXPECT_TRUE(CheckGraphLimits(kMaxGraphVariables, kMaxGraphSlots, kMaxGraphCalls).ok());
  absl::Status s = CheckGraphLimits(kMaxGraphVariables + 1, 1, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr(std::to_string(kMaxGraphVariables + 1)));
  s = CheckGraphLimits(1, 1, kMaxGraphCalls + 1);
  EXPECT_THAT(std::string(s.message()), HasSubstr(std::to_string(kMaxGraphCalls + 1)));
}

TEST_F(GraphChecksTest, TheStructureIgnoresValuesAndSeesEverythingAReplaySees) {
  const std::string base = GraphStructure(OneCall(), 0);
  EXPECT_EQ(GraphStructure(OneCall(), 0), base) << "the same graph twice";
  EXPECT_EQ(GraphKey(base), GraphKey(GraphStructure(OneCall(), 0)));
  EXPECT_EQ(GraphKey(base).size(), 64u) << "SHA-256 hex";
  EXPECT_NE(GraphStructure(OneCall(128), 0), base) << "a slot size";
  EXPECT_NE(GraphStructure(OneCall(64, 200), 0), base) << "a variable's range";
  EXPECT_NE(GraphStructure(OneCall(64, 100, 2), 0), base) << "an expression";
  EXPECT_NE(GraphStructure(OneCall(), 7), base) << "an address space";
  Graph other = OneCall();
  other.calls[0].program = other_;
  EXPECT_NE(GraphStructure(other, 0), base) << "a program";
  Graph view = OneCall();
  std::get<SlotView>(view.calls[0].args[0]) = SlotView{0, 4, 8};
  EXPECT_NE(GraphStructure(view, 0), base) << "a view";
  Graph renamed = OneCall();
  renamed.variables[0].name = "step";
  EXPECT_EQ(GraphStructure(renamed, 0), base) << "a variable's name is a value: replays bind by position";
}

}  // namespace
}  // namespace replayd
