#include "engine/expression.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>

namespace replayd {
namespace {

const std::vector<VariableDecl> kVars = {{"pos", 1, 256, 1}, {"n", -64, 64, 8}};

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
  std::vector<VariableDecl> big = {{"x", 0, (int64_t{1} << 62) - 1, 1}};
  EXPECT_FALSE(Expression::Parse("x * 4", big)->Bounds(big).ok());
  EXPECT_FALSE(Expression::Parse("x + x + x + x", big)->Bounds(big).ok());
  EXPECT_TRUE(Expression::Parse("x + x", big)->Bounds(big).ok());
  EXPECT_FALSE(Expression::Parse("0 - x - x - x", big)->Bounds(big).ok());
}

TEST(ExpressionTest, RandomExpressionsStayWithinTheirBounds) {
  std::mt19937_64 rng(42);
  const std::vector<VariableDecl> vars = {{"a", -50, 50, 1}, {"b", 1, 100, 1}, {"c", 0, 30, 3}};
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

// Python's floor division and modulo in 128 bits, where nothing overflows.
__int128 ReferenceApply(Expression::Op op, __int128 a, __int128 b) {
  using Op = Expression::Op;
  switch (op) {
    case Op::kAdd: return a + b;
    case Op::kSub: return a - b;
    case Op::kMul: return a * b;
    case Op::kFloorDiv: {
      __int128 q = a / b;
      return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
    }
    case Op::kMod: {
      __int128 r = a % b;
      return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
    }
    case Op::kMin: return std::min(a, b);
    case Op::kMax: return std::max(a, b);
    default: return 0;
  }
}

bool FitsInt64(__int128 v) {
  return v >= std::numeric_limits<int64_t>::min() && v <= std::numeric_limits<int64_t>::max();
}

// Every operator on every pair of ranges whose ends are drawn from the int64 extremes: an
// expression the bounds accept evaluates (without trapping) to the exact result, inside
// its bounds, at every corner and near it; one they reject has a corner whose exact result
// leaves int64, or a divisor range holding zero.
TEST(ExpressionTest, EveryOperatorAtTheInt64Extremes) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> ends = {kMin, kMin + 1, -3, -2, -1, 0, 1, 2, 3, kMax - 1, kMax};
  const Expression::Op ops[] = {Expression::Op::kAdd, Expression::Op::kSub, Expression::Op::kMul,
                                Expression::Op::kFloorDiv, Expression::Op::kMod, Expression::Op::kMin,
                                Expression::Op::kMax};
  int accepted = 0, rejected = 0;
  for (Expression::Op op : ops) {
    for (size_t i = 0; i < ends.size(); ++i)
      for (size_t j = i; j < ends.size(); ++j)
        for (size_t k = 0; k < ends.size(); ++k)
          for (size_t l = k; l < ends.size(); ++l) {
            const std::vector<VariableDecl> vars = {{"v", ends[i], ends[j], 1}, {"w", ends[k], ends[l], 1}};
            const Expression e = Expression::Binary(op, Expression::Var(0), Expression::Var(1));
            absl::StatusOr<Interval> b = e.Bounds(vars);
            // The values to try: the corners, and one step inside each end.
            std::vector<int64_t> vs = {ends[i], ends[j]}, ws = {ends[k], ends[l]};
            if (ends[i] < ends[j]) vs.insert(vs.end(), {ends[i] + 1, ends[j] - 1});
            if (ends[k] < ends[l]) ws.insert(ws.end(), {ends[k] + 1, ends[l] - 1});
            const bool divides = op == Expression::Op::kFloorDiv || op == Expression::Op::kMod;
            if (!b.ok()) {
              ++rejected;
              bool zero_divisor = divides && ends[k] <= 0 && ends[l] >= 0;
              bool leaves = false;
              for (int64_t v : {ends[i], ends[j]})
                for (int64_t w : {ends[k], ends[l]})
                  if (!(divides && w == 0)) leaves |= !FitsInt64(ReferenceApply(op, v, w));
              EXPECT_TRUE(zero_divisor || leaves) << "rejected needlessly: " << e.ToString(vars) << " over v in ["
                                                  << ends[i] << ", " << ends[j] << "], w in [" << ends[k] << ", "
                                                  << ends[l] << "]: " << b.status();
              continue;
            }
            ++accepted;
            for (int64_t v : vs)
              for (int64_t w : ws) {
                const __int128 want = ReferenceApply(op, v, w);
                const int64_t got = e.Evaluate(std::vector<int64_t>{v, w});
                ASSERT_TRUE(FitsInt64(want)) << e.ToString(vars) << " at v=" << v << " w=" << w;
                ASSERT_EQ(got, static_cast<int64_t>(want)) << e.ToString(vars) << " at v=" << v << " w=" << w;
                ASSERT_GE(got, b->min) << e.ToString(vars) << " at v=" << v << " w=" << w;
                ASSERT_LE(got, b->max) << e.ToString(vars) << " at v=" << v << " w=" << w;
              }
          }
  }
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(rejected, 1000);
}

// The crash a client could cause: INT64_MIN % -1 traps in C++ (SIGFPE) though its value is 0.
TEST(ExpressionTest, ModuloOfInt64MinByMinusOneIsZero) {
  for (const char* text : {"(-9223372036854775807-1)%-1", "(-9223372036854775807-1) % (0-1)"}) {
    absl::StatusOr<Expression> e = Expression::Parse(text, {});
    ASSERT_TRUE(e.ok()) << e.status();
    absl::StatusOr<Interval> b = e->Bounds({});
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->min, 0);
    EXPECT_EQ(b->max, 0);
    EXPECT_EQ(e->Evaluate({}), 0);
  }
  const std::vector<VariableDecl> vars = {{"v", std::numeric_limits<int64_t>::min(), 0, 1}, {"w", -5, -1, 1}};
  absl::StatusOr<Expression> mod = Expression::Parse("v % w", vars);
  ASSERT_TRUE(mod.ok()) << mod.status();
  ASSERT_TRUE(mod->Bounds(vars).ok());
  EXPECT_EQ(mod->Evaluate(std::vector<int64_t>{std::numeric_limits<int64_t>::min(), -1}), 0);
  absl::StatusOr<Expression> div = Expression::Parse("v // w", vars);
  ASSERT_TRUE(div.ok()) << div.status();
  EXPECT_EQ(div->Bounds(vars).status().code(), absl::StatusCode::kInvalidArgument) << "INT64_MIN // -1 is 2^63";
}

// Evaluate is total: even on values outside the ranges it was checked for (a caller's
// mistake), no operator traps.
TEST(ExpressionTest, EvaluateNeverTrapsOnUncheckedValues) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  for (Expression::Op op : {Expression::Op::kAdd, Expression::Op::kSub, Expression::Op::kMul,
                            Expression::Op::kFloorDiv, Expression::Op::kMod}) {
    Expression e = Expression::Binary(op, Expression::Var(0), Expression::Var(1));
    for (int64_t w : {int64_t{-1}, int64_t{0}, kMin}) e.Evaluate(std::vector<int64_t>{kMin, w});
  }
  Expression div = Expression::Binary(Expression::Op::kFloorDiv, Expression::Var(0), Expression::Var(1));
  EXPECT_EQ(div.Evaluate(std::vector<int64_t>{7, 0}), 0);
  EXPECT_EQ(div.Evaluate(std::vector<int64_t>{kMin, -1}), kMin) << "wraps";
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
  VariableDecl v{"pos", 1, 256, 4};
  absl::Status s = CheckValue(v, 300);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("pos = 300"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("[1, 256]"), absl::string_view::npos) << s;
  EXPECT_NE(CheckValue(v, 6).message().find("multiple of 4"), absl::string_view::npos);
  EXPECT_TRUE(CheckValue(v, 8).ok());
}

}  // namespace
}  // namespace replayd
