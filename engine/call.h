// One eager kernel launch as the engine receives it, and the checks that turn its
// arguments and dimensions into what a driver launches.
#ifndef REPLAYD_ENGINE_CALL_H_
#define REPLAYD_ENGINE_CALL_H_

#include <cstdint>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "drivers/driver.h"
#include "engine/expression.h"
#include "engine/handle_table.h"

namespace replayd {

// (buffer, byte offset, byte length); a length of 0 means "to the end of the buffer".
struct ViewArg {
  Handle buffer = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// A buffer argument is a view; an integer argument is an expression (a constant, a
// bound variable, or an expression over bound variables).
using CallArg = std::variant<ViewArg, Expression>;

struct BoundVariable {
  VariableDecl variable;
  int64_t value = 0;
};

struct LaunchOp {
  Handle program = 0;
  std::vector<BoundVariable> variables;  // expressions index into this list
  std::vector<CallArg> args;
  std::vector<Expression> global;  // up to 3; missing dimensions are 1
  std::vector<Expression> local;
  bool wait = false;
};

// A device-to-device copy from `src` to `dst`: views of the same length that do not
// overlap. Ordered with the session's launches; recorded when a capture is open.
struct CopyOp {
  ViewArg dst;
  ViewArg src;
  bool wait = false;
};

struct LaunchResult {
  std::optional<absl::Duration> device_time;
};

// Bound variables split into their definitions and their values, index for index.
struct BoundValues {
  std::vector<VariableDecl> variables;
  std::vector<int64_t> values;
};

// The variables of `op` and their values: each well formed, named once, its value in
// range. INVALID_ARGUMENT naming the variable, the value and the range otherwise.
absl::StatusOr<BoundValues> CheckBoundVariables(const std::vector<BoundVariable>& bound);

// The value of `e` at `values`, after checking its bounds over `variables` (no overflow,
// no divisor that can be zero).
absl::StatusOr<int64_t> EvaluateChecked(const Expression& e, std::span<const VariableDecl> variables,
                                        std::span<const int64_t> values);

// The three dimensions of `dims` within `max` per dimension and `max_total` in product;
// INVALID_ARGUMENT naming `what` ("global", "local") and the value otherwise.
absl::StatusOr<Dim3> CheckDims(const std::vector<uint64_t>& dims, const Dim3& max, uint64_t max_total,
                               absl::string_view what);

// The byte range a view covers in a buffer of `size` bytes: (offset, length) with the
// zero length resolved, or INVALID_ARGUMENT when it is empty or out of range.
absl::StatusOr<std::pair<uint64_t, uint64_t>> ResolveView(const ViewArg& view, uint64_t size);

// The byte count of a copy between the resolved ranges (offset, length) `dst` and `src`,
// in the same buffer when `same_buffer`: INVALID_ARGUMENT when the lengths differ or the
// ranges overlap.
absl::StatusOr<uint64_t> CheckCopyRanges(std::pair<uint64_t, uint64_t> dst, std::pair<uint64_t, uint64_t> src,
                                         bool same_buffer);

// Submits a copy of `bytes` from device address `src` to `dst` on `context`; with `wait`,
// returns after completion with the time it took.
absl::StatusOr<std::optional<absl::Duration>> SubmitCopy(Context& context, uint64_t dst, uint64_t src, uint64_t bytes,
                                                         bool wait);

}  // namespace replayd

#endif  // REPLAYD_ENGINE_CALL_H_
