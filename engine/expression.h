// Variables and integer expressions over them.
//
// A variable is a named integer with an inclusive range [min, max] and a multiple_of; a
// bound variable carries a value for one call or one replay. An expression is built from
// variables and constants with + - * // % min max over int64, with Python's floor
// semantics for // and %. It is stored flat in postfix order, so evaluation is a loop
// over a small array and two expressions are equal when their node arrays are.
//
// Every expression has bounds computed by interval arithmetic over its variables'
// ranges. An expression whose bounds overflow int64, or that divides by an expression
// whose range contains zero, is rejected when it is built, so evaluating it on values
// within range can neither overflow nor divide by zero.
#ifndef REPLAYD_ENGINE_EXPRESSION_H_
#define REPLAYD_ENGINE_EXPRESSION_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace replayd {

struct VariableDecl {
  std::string name;
  int64_t min = 0;
  int64_t max = 0;
  int64_t multiple_of = 1;

  bool SameRange(const VariableDecl& o) const {
    return min == o.min && max == o.max && multiple_of == o.multiple_of;
  }
};

// OK when `v` is well formed: a name of at most 64 identifier characters, min <= max,
// multiple_of >= 1, and at least one multiple inside the range.
absl::Status CheckVariable(const VariableDecl& v);

// OK when `value` is in [min, max] and a multiple of multiple_of; otherwise
// INVALID_ARGUMENT naming the variable, the value and the range.
absl::Status CheckValue(const VariableDecl& v, int64_t value);

struct Interval {
  int64_t min = 0;
  int64_t max = 0;
};

class Expression {
 public:
  enum class Op : uint8_t { kConst, kVar, kAdd, kSub, kMul, kFloorDiv, kMod, kMin, kMax };
  struct Node {
    Op op;
    int64_t value;  // the constant, or the variable's index
    bool operator==(const Node&) const = default;
  };

  // Most nodes one expression may have.
  static constexpr size_t kMaxNodes = 256;

  Expression() : Expression(Constant(0)) {}
  static Expression Constant(int64_t value) { return Expression({{Op::kConst, value}}); }
  static Expression Var(int index) { return Expression({{Op::kVar, index}}); }
  // lhs op rhs for a binary op.
  static Expression Binary(Op op, const Expression& lhs, const Expression& rhs);

  // Parses the text syntax: integers, variable names, + - * // % , min(a, b), max(a, b),
  // parentheses, unary minus. Names are resolved through `variables` (their index).
  static absl::StatusOr<Expression> Parse(absl::string_view text,
                                          std::span<const VariableDecl> variables);

  // The value with variable i bound to values[i]. The caller has checked the values
  // against the ranges Bounds() was computed with.
  int64_t Evaluate(std::span<const int64_t> values) const;

  // The interval of all values over the variables' ranges; INVALID_ARGUMENT on overflow,
  // a possibly-zero divisor, or a variable index out of range.
  absl::StatusOr<Interval> Bounds(std::span<const VariableDecl> variables) const;

  bool is_constant() const { return nodes_.size() == 1 && nodes_[0].op == Op::kConst; }
  int64_t constant() const { return nodes_[0].value; }
  bool uses_variables() const;
  const std::vector<Node>& nodes() const { return nodes_; }
  // Maps each variable index i to remap[i].
  Expression Remapped(std::span<const int> remap) const;
  std::string ToString(std::span<const VariableDecl> variables) const;
  bool operator==(const Expression&) const = default;

 private:
  explicit Expression(std::vector<Node> nodes) : nodes_(std::move(nodes)) {}
  std::vector<Node> nodes_;
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_EXPRESSION_H_
