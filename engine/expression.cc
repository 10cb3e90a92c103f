#include "engine/expression.h"

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace replayd {
namespace {

using Op = Expression::Op;

// The arithmetic below is total: defined for every pair of int64 values, so no operand
// can trap (C++'s / and % raise SIGFPE on INT64_MIN / -1 and INT64_MIN % -1 and on a zero
// divisor) or overflow. Bounds() rejects the expressions whose true value can leave int64
// or whose divisor can be zero, so on checked values these are the exact results; the
// wrap-around and the 0 for a zero divisor only keep an unchecked call harmless.
int64_t Wrap(uint64_t v) { return static_cast<int64_t>(v); }

int64_t FloorDiv(int64_t a, int64_t b) {
  if (b == 0) return 0;
  if (b == -1) return Wrap(0 - static_cast<uint64_t>(a));  // INT64_MIN / -1 wraps, not traps
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

int64_t FloorMod(int64_t a, int64_t b) {
  if (b == 0 || b == -1) return 0;  // x % -1 is 0 for every x; INT64_MIN % -1 traps in C++
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

absl::Status Overflow() { return absl::InvalidArgumentError("expression overflows int64"); }

absl::StatusOr<Interval> Combine(Op op, Interval a, Interval b) {
  int64_t c[4];
  switch (op) {
    case Op::kAdd:
      if (__builtin_add_overflow(a.min, b.min, &c[0]) || __builtin_add_overflow(a.max, b.max, &c[1]))
        return Overflow();
      return Interval{c[0], c[1]};
    case Op::kSub:
      if (__builtin_sub_overflow(a.min, b.max, &c[0]) || __builtin_sub_overflow(a.max, b.min, &c[1]))
        return Overflow();
      return Interval{c[0], c[1]};
    case Op::kMul:
      if (__builtin_mul_overflow(a.min, b.min, &c[0]) || __builtin_mul_overflow(a.min, b.max, &c[1]) ||
          __builtin_mul_overflow(a.max, b.min, &c[2]) || __builtin_mul_overflow(a.max, b.max, &c[3]))
        return Overflow();
      return Interval{*std::min_element(c, c + 4), *std::max_element(c, c + 4)};
    case Op::kFloorDiv:
      if (b.min <= 0 && b.max >= 0)
        return absl::InvalidArgumentError(absl::StrCat(
            "division by an expression that can be zero (range [", b.min, ", ", b.max, "])"));
      // INT64_MIN // -1 is 2^63. A negative divisor range holds -1 exactly when it ends there.
      if (a.min == std::numeric_limits<int64_t>::min() && b.max == -1) return Overflow();
      // Floor division is monotonic in each argument on a divisor range of one sign.
      c[0] = FloorDiv(a.min, b.min), c[1] = FloorDiv(a.min, b.max);
      c[2] = FloorDiv(a.max, b.min), c[3] = FloorDiv(a.max, b.max);
      return Interval{*std::min_element(c, c + 4), *std::max_element(c, c + 4)};
    case Op::kMod: {
      if (b.min <= 0 && b.max >= 0)
        return absl::InvalidArgumentError(absl::StrCat(
            "modulo by an expression that can be zero (range [", b.min, ", ", b.max, "])"));
      if (b.min > 0) {
        if (a.min >= 0 && a.max < b.min) return a;  // a % b == a throughout
        return Interval{0, a.min >= 0 ? std::min(a.max, b.max - 1) : b.max - 1};
      }
      return Interval{b.min + 1, 0};
    }
    case Op::kMin:
      return Interval{std::min(a.min, b.min), std::min(a.max, b.max)};
    case Op::kMax:
      return Interval{std::max(a.min, b.min), std::max(a.max, b.max)};
    default:
      return absl::InternalError("not a binary op");
  }
}

int64_t Apply(Op op, int64_t a, int64_t b) {
  switch (op) {
    case Op::kAdd: return Wrap(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
    case Op::kSub: return Wrap(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
    case Op::kMul: return Wrap(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
    case Op::kFloorDiv: return FloorDiv(a, b);
    case Op::kMod: return FloorMod(a, b);
    case Op::kMin: return std::min(a, b);
    case Op::kMax: return std::max(a, b);
    default: return 0;
  }
}

bool IsIdentifierChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

// Recursive descent over: expr := term (('+'|'-') term)*; term := unary (('*'|'//'|'%') unary)*;
// unary := '-' unary | atom; atom := int | name | name '(' expr ',' expr ')' | '(' expr ')'.
class Parser {
 public:
  Parser(absl::string_view text, std::span<const VariableDecl> variables)
      : text_(text), variables_(variables) {}

  absl::StatusOr<Expression> ParseAll() {
    absl::StatusOr<Expression> e = ParseExpr(0);
    if (!e.ok()) return e;
    Skip();
    if (pos_ != text_.size()) return Error("unexpected character");
    if (e->nodes().size() > Expression::kMaxNodes)
      return absl::InvalidArgumentError(absl::StrCat("expression has more than ",
                                                     Expression::kMaxNodes, " nodes"));
    return e;
  }

 private:
  static constexpr int kMaxDepth = 64;

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("expression \"", text_.substr(0, 200), "\": ", what, " at offset ", pos_));
  }
  void Skip() {
    while (pos_ < text_.size() && absl::ascii_isspace(text_[pos_])) ++pos_;
  }
  bool Eat(absl::string_view token) {
    Skip();
    if (text_.substr(pos_, token.size()) != token) return false;
    pos_ += token.size();
    return true;
  }

  absl::StatusOr<Expression> ParseExpr(int depth) {
    if (depth > kMaxDepth) return Error("nested too deeply");
    absl::StatusOr<Expression> lhs = ParseTerm(depth);
    while (lhs.ok()) {
      Op op;
      if (Eat("+")) op = Op::kAdd;
      else if (Eat("-")) op = Op::kSub;
      else break;
      absl::StatusOr<Expression> rhs = ParseTerm(depth);
      if (!rhs.ok()) return rhs;
      lhs = Expression::Binary(op, *lhs, *rhs);
    }
    return lhs;
  }

  absl::StatusOr<Expression> ParseTerm(int depth) {
    absl::StatusOr<Expression> lhs = ParseUnary(depth);
    while (lhs.ok()) {
      Op op;
      if (Eat("//")) op = Op::kFloorDiv;
      else if (Eat("*")) op = Op::kMul;
      else if (Eat("%")) op = Op::kMod;
      else break;
      absl::StatusOr<Expression> rhs = ParseUnary(depth);
      if (!rhs.ok()) return rhs;
      lhs = Expression::Binary(op, *lhs, *rhs);
    }
    return lhs;
  }

  absl::StatusOr<Expression> ParseUnary(int depth) {
    if (depth > kMaxDepth) return Error("nested too deeply");
    if (Eat("-")) {
      absl::StatusOr<Expression> e = ParseUnary(depth + 1);
      if (!e.ok()) return e;
      return Expression::Binary(Op::kSub, Expression::Constant(0), *e);
    }
    return ParseAtom(depth);
  }

  absl::StatusOr<Expression> ParseAtom(int depth) {
    Skip();
    if (Eat("(")) {
      absl::StatusOr<Expression> e = ParseExpr(depth + 1);
      if (!e.ok()) return e;
      if (!Eat(")")) return Error("expected ')'");
      return e;
    }
    size_t start = pos_;
    while (pos_ < text_.size() && IsIdentifierChar(text_[pos_])) ++pos_;
    absl::string_view word = text_.substr(start, pos_ - start);
    if (word.empty()) return Error("expected a number, a name or '('");
    if (absl::ascii_isdigit(word[0])) {
      int64_t v;
      if (!absl::SimpleAtoi(word, &v)) return Error("bad integer");
      return Expression::Constant(v);
    }
    if (word == "min" || word == "max") {
      if (!Eat("(")) return Error("expected '(' after min/max");
      absl::StatusOr<Expression> a = ParseExpr(depth + 1);
      if (!a.ok()) return a;
      if (!Eat(",")) return Error("expected ','");
      absl::StatusOr<Expression> b = ParseExpr(depth + 1);
      if (!b.ok()) return b;
      if (!Eat(")")) return Error("expected ')'");
      return Expression::Binary(word == "min" ? Op::kMin : Op::kMax, *a, *b);
    }
    for (size_t i = 0; i < variables_.size(); ++i)
      if (variables_[i].name == word) return Expression::Var(static_cast<int>(i));
    pos_ = start;
    return Error(absl::StrCat("unknown variable \"", word, "\""));
  }

  absl::string_view text_;
  std::span<const VariableDecl> variables_;
  size_t pos_ = 0;
};

}  // namespace

absl::Status CheckVariable(const VariableDecl& v) {
  bool name_ok = !v.name.empty() && v.name.size() <= 64 && !absl::ascii_isdigit(v.name[0]) &&
                 std::all_of(v.name.begin(), v.name.end(), IsIdentifierChar) &&
                 v.name != "min" && v.name != "max";
  if (!name_ok)
    return absl::InvalidArgumentError(absl::StrCat("variable name \"", v.name.substr(0, 64),
                                                   "\" is not an identifier"));
  if (v.min > v.max)
    return absl::InvalidArgumentError(
        absl::StrCat("variable ", v.name, ": min ", v.min, " > max ", v.max));
  if (v.multiple_of < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("variable ", v.name, ": multiple_of ", v.multiple_of, " must be >= 1"));
  // The smallest multiple of multiple_of at or above min must not pass max.
  int64_t rem = FloorMod(v.min, v.multiple_of), first = v.min;
  if (rem != 0 && (__builtin_add_overflow(v.min, v.multiple_of - rem, &first) || first > v.max))
    return absl::InvalidArgumentError(absl::StrCat("variable ", v.name, ": no multiple of ",
                                                   v.multiple_of, " in [", v.min, ", ", v.max, "]"));
  return absl::OkStatus();
}

absl::Status CheckValue(const VariableDecl& v, int64_t value) {
  if (value < v.min || value > v.max)
    return absl::InvalidArgumentError(absl::StrCat("variable ", v.name, " = ", value,
                                                   " is outside [", v.min, ", ", v.max, "]"));
  if (FloorMod(value, v.multiple_of) != 0)
    return absl::InvalidArgumentError(absl::StrCat("variable ", v.name, " = ", value,
                                                   " is not a multiple of ", v.multiple_of));
  return absl::OkStatus();
}

Expression Expression::Binary(Op op, const Expression& lhs, const Expression& rhs) {
  std::vector<Node> nodes;
  nodes.reserve(lhs.nodes_.size() + rhs.nodes_.size() + 1);
  nodes.insert(nodes.end(), lhs.nodes_.begin(), lhs.nodes_.end());
  nodes.insert(nodes.end(), rhs.nodes_.begin(), rhs.nodes_.end());
  nodes.push_back({op, 0});
  return Expression(std::move(nodes));
}

absl::StatusOr<Expression> Expression::Parse(absl::string_view text,
                                             std::span<const VariableDecl> variables) {
  if (text.size() > 4096) return absl::InvalidArgumentError("expression text longer than 4096 bytes");
  return Parser(text, variables).ParseAll();
}

int64_t Expression::Evaluate(std::span<const int64_t> values) const {
  if (nodes_.size() == 1) return nodes_[0].op == Op::kConst ? nodes_[0].value : values[nodes_[0].value];
  int64_t stack[kMaxNodes];
  int top = 0;
  for (const Node& n : nodes_) {
    if (n.op == Op::kConst) {
      stack[top++] = n.value;
    } else if (n.op == Op::kVar) {
      stack[top++] = values[n.value];
    } else {
      int64_t b = stack[--top];
      stack[top - 1] = Apply(n.op, stack[top - 1], b);
    }
  }
  return stack[0];
}

absl::StatusOr<Interval> Expression::Bounds(std::span<const VariableDecl> variables) const {
  if (nodes_.empty() || nodes_.size() > kMaxNodes)
    return absl::InvalidArgumentError("expression is empty or too large");
  std::vector<Interval> stack;
  stack.reserve(nodes_.size());
  for (const Node& n : nodes_) {
    if (n.op == Op::kConst) {
      stack.push_back({n.value, n.value});
    } else if (n.op == Op::kVar) {
      if (n.value < 0 || static_cast<size_t>(n.value) >= variables.size())
        return absl::InvalidArgumentError(absl::StrCat("expression names variable ", n.value,
                                                       " of ", variables.size()));
      stack.push_back({variables[n.value].min, variables[n.value].max});
    } else {
      if (stack.size() < 2) return absl::InvalidArgumentError("malformed expression");
      Interval b = stack.back();
      stack.pop_back();
      absl::StatusOr<Interval> r = Combine(n.op, stack.back(), b);
      if (!r.ok()) return r.status();
      stack.back() = *r;
    }
  }
  if (stack.size() != 1) return absl::InvalidArgumentError("malformed expression");
  return stack[0];
}

bool Expression::uses_variables() const {
  return std::any_of(nodes_.begin(), nodes_.end(), [](const Node& n) { return n.op == Op::kVar; });
}

Expression Expression::Remapped(std::span<const int> remap) const {
  Expression e = *this;
  for (Node& n : e.nodes_)
    if (n.op == Op::kVar) n.value = remap[n.value];
  return e;
}

std::string Expression::ToString(std::span<const VariableDecl> variables) const {
  std::vector<std::string> stack;
  for (const Node& n : nodes_) {
    if (n.op == Op::kConst) {
      stack.push_back(absl::StrCat(n.value));
    } else if (n.op == Op::kVar) {
      stack.push_back(static_cast<size_t>(n.value) < variables.size() ? variables[n.value].name
                                                                      : absl::StrCat("$", n.value));
    } else {
      std::string b = std::move(stack.back());
      stack.pop_back();
      std::string& a = stack.back();
      static constexpr const char* kNames[] = {"", "", "+", "-", "*", "//", "%", "min", "max"};
      const char* name = kNames[static_cast<int>(n.op)];
      a = (n.op == Op::kMin || n.op == Op::kMax) ? absl::StrCat(name, "(", a, ", ", b, ")")
                                                 : absl::StrCat("(", a, name, b, ")");
    }
  }
  return stack.empty() ? "" : stack[0];
}

}  // namespace replayd
