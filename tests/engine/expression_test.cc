#include "engine/expression.h"

#include <gtest/gtest.h>

#include <random>

namespace replayd {
namespace {

const std::vector<Variable> kVars = {{"pos", 1, 256, 1}, {"n", -64, 64, 8}};

int64_t Eval(const std::string& text, std::vector<int64_t> values = {17, 8}) {
  absl::StatusOr<Expression> e = Expression::Parse(text, kVars);
  EXPECT_TRUE(e.ok()) << text << ": " << e.status();
  return e.ok() ? e->Evaluate(values) : 0;
}

TEST(ExpressionTest, ParsesAndEvaluatesWithPrecedence) {
  EXPECT_EQ(Eval("1 + 2 * 3"), 7);
  EXPECT_EQ(Eval("(1 + 2) * 3"), 9);
  EXPECT_EQ(Eval("(pos+31)//32"), 1);
  EXPECT_EQ(Eval("(pos+31)//32", {33, 0}), 2);
  EXPECT_EQ(Eval("pos - 1 - 1"), 15);
  EXPECT_EQ(Eval("min(pos, 10) + max(n, 100)"), 110);
  EXPECT_EQ(Eval("-pos"), -17);
  EXPECT_EQ(Eval("pos % 5 * 2"), 4);
  EXPECT_EQ(Eval("  pos  "), 17);
}

TEST(ExpressionTest, FloorDivisionAndModuloFollowPython) {
  EXPECT_EQ(Eval("-7 // 2"), -4);
  EXPECT_EQ(Eval("-7 % 2"), 1);
  EXPECT_EQ(Eval("7 // -2"), -4);
  EXPECT_EQ(Eval("7 % -2"), -1);
  EXPECT_EQ(Eval("n // 3", {1, -8}), -3);
}

TEST(ExpressionTest, RejectsBadText) {
  for (const char* bad : {"", "pos +", "(pos", "pos)", "foo + 1", "min(pos)", "1 $ 2",
                          "99999999999999999999", "pos pos"}) {
    EXPECT_EQ(Expression::Parse(bad, kVars).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  std::string deep(200, '(');
  deep += "1" + std::string(200, ')');
  EXPECT_FALSE(Expression::Parse(deep, kVars).ok());
}

TEST(ExpressionTest, BoundsByIntervalArithmetic) {
  auto bounds = [](const std::string& t) { return *Expression::Parse(t, kVars)->Bounds(kVars); };
  EXPECT_EQ(bounds("pos").min, 1);
  EXPECT_EQ(bounds("pos").max, 256);
  EXPECT_EQ(bounds("(pos+31)//32").min, 1);
  EXPECT_EQ(bounds("(pos+31)//32").max, 8);
  EXPECT_EQ(bounds("pos * n").min, -256 * 64);
  EXPECT_EQ(bounds("pos * n").max, 256 * 64);
  EXPECT_EQ(bounds("pos % 10").max, 9);
  EXPECT_EQ(bounds("min(pos, 4)").max, 4);
  EXPECT_EQ(bounds("pos - pos").min, -255);
}

TEST(ExpressionTest, RejectsDivisorsThatCanBeZero) {
  for (const char* t : {"pos // n", "pos % n", "pos // (pos - 1)", "1 // 0", "pos % 0"}) {
    absl::StatusOr<Expression> e = Expression::Parse(t, kVars);
    ASSERT_TRUE(e.ok()) << t;
    absl::Status s = e->Bounds(kVars).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << t;
    EXPECT_NE(s.message().find("can be zero"), absl::string_view::npos) << s;
  }
  EXPECT_TRUE(Expression::Parse("pos // (n + 65)", kVars)->Bounds(kVars).ok());
}

TEST(ExpressionTest, RejectsOverflow) {
  std::vector<Variable> big = {{"x", 0, (int64_t{1} << 62) - 1, 1}};
  EXPECT_FALSE(Expression::Parse("x * 4", big)->Bounds(big).ok());
  EXPECT_FALSE(Expression::Parse("x + x + x + x", big)->Bounds(big).ok());
  EXPECT_TRUE(Expression::Parse("x + x", big)->Bounds(big).ok());
  EXPECT_FALSE(Expression::Parse("0 - x - x - x", big)->Bounds(big).ok());
}

TEST(ExpressionTest, RandomExpressionsStayWithinTheirBounds) {
  std::mt19937_64 rng(42);
  const std::vector<Variable> vars = {{"a", -50, 50, 1}, {"b", 1, 100, 1}, {"c", 0, 30, 3}};
  const Expression::Op ops[] = {Expression::Op::kAdd, Expression::Op::kSub, Expression::Op::kMul,
                                Expression::Op::kFloorDiv, Expression::Op::kMod,
                                Expression::Op::kMin, Expression::Op::kMax};
  std::function<Expression(int)> random_expr = [&](int depth) {
    if (depth == 0 || rng() % 3 == 0) {
      if (rng() % 2) return Expression::Var(static_cast<int>(rng() % 3));
      return Expression::Constant(static_cast<int64_t>(rng() % 21) - 10);
    }
    return Expression::Binary(ops[rng() % 7], random_expr(depth - 1), random_expr(depth - 1));
  };
  int checked = 0;
  for (int i = 0; i < 3000; ++i) {
    Expression e = random_expr(4);
    absl::StatusOr<Interval> b = e.Bounds(vars);
    if (!b.ok()) continue;  // a divisor that can be zero
    for (int k = 0; k < 20; ++k) {
      std::vector<int64_t> values = {static_cast<int64_t>(rng() % 101) - 50,
                                     static_cast<int64_t>(rng() % 100) + 1,
                                     static_cast<int64_t>(rng() % 11) * 3};
      int64_t v = e.Evaluate(values);
      ASSERT_GE(v, b->min) << e.ToString(vars);
      ASSERT_LE(v, b->max) << e.ToString(vars);
      ++checked;
    }
  }
  EXPECT_GT(checked, 10000);
}

TEST(ExpressionTest, ToStringRoundTripsThroughParse) {
  Expression e = *Expression::Parse("min((pos + 31) // 32, 4) * n - 1", kVars);
  EXPECT_EQ(*Expression::Parse(e.ToString(kVars), kVars), e);
}

TEST(VariableTest, ChecksDefinitionsAndValues) {
  EXPECT_TRUE(CheckVariable({"pos", 1, 256, 1}).ok());
  EXPECT_FALSE(CheckVariable({"pos", 5, 1, 1}).ok());
  EXPECT_FALSE(CheckVariable({"pos", 1, 5, 0}).ok());
  EXPECT_FALSE(CheckVariable({"1pos", 1, 5, 1}).ok());
  EXPECT_FALSE(CheckVariable({"min", 1, 5, 1}).ok());
  EXPECT_FALSE(CheckVariable({"p", 1, 5, 8}).ok()) << "no multiple of 8 in [1, 5]";
  EXPECT_TRUE(CheckVariable({"p", 1, 8, 8}).ok());
  Variable v{"pos", 1, 256, 4};
  absl::Status s = CheckValue(v, 300);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("pos = 300"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("[1, 256]"), absl::string_view::npos) << s;
  EXPECT_NE(CheckValue(v, 6).message().find("multiple of 4"), absl::string_view::npos);
  EXPECT_TRUE(CheckValue(v, 8).ok());
}

}  // namespace
}  // namespace replayd
