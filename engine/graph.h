// A graph: an ordered list of calls over slots, with variables as parameters. Capture
// and DefineGraph both produce this structure; the graph cache keys it, and a graph
// instance replays it.
//
// Slots are parameters (a buffer supplied at each replay, of at least `bytes`),
// internals (private buffers placed in the instance's arena) or constants (existing
// buffers the graph holds by reference). The parameter layout of a replay is the
// parameter slots in slot order, then the variables in order.
#ifndef REPLAYD_ENGINE_GRAPH_H_
#define REPLAYD_ENGINE_GRAPH_H_

#include <array>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "drivers/driver.h"
#include "engine/expression.h"
#include "engine/program.h"

namespace replayd {

struct DeviceBuffer;

enum class SlotKind { kParameter, kInternal, kConstant };

struct Slot {
  SlotKind kind = SlotKind::kParameter;
  uint64_t bytes = 0;
  std::shared_ptr<DeviceBuffer> constant;  // constants only
};

// (slot, byte offset, byte length); a length of 0 means "to the end of the slot".
struct SlotView {
  uint32_t slot = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// A buffer argument is a view of a slot; an integer argument is an expression.
using GraphArg = std::variant<SlotView, Expression>;

// A kernel launch, or with no program a copy: args[1] (the source view) copied to
// args[0] (the destination view), views of one length that do not overlap, dimensions 1.
struct GraphCall {
  std::shared_ptr<Program> program;  // null: a copy
  std::vector<GraphArg> args;
  std::array<Expression, 3> global{Expression::Constant(1), Expression::Constant(1), Expression::Constant(1)};
  std::array<Expression, 3> local{Expression::Constant(1), Expression::Constant(1), Expression::Constant(1)};

  bool is_copy() const { return program == nullptr; }
  // How argument `arg` uses its buffer: from the signature, or out then in for a copy.
  Access access(size_t arg) const;
};

struct Graph {
  std::vector<VariableDecl> variables;
  std::vector<Slot> slots;
  std::vector<GraphCall> calls;
};

// A copy call from `src` to `dst`.
GraphCall CopyCall(const SlotView& dst, const SlotView& src);

// Limits on a graph; larger ones are INVALID_ARGUMENT.
inline constexpr size_t kMaxGraphCalls = 65536;
inline constexpr size_t kMaxGraphSlots = 65536;
inline constexpr size_t kMaxGraphVariables = 64;

// OK when a graph of `variables`, `slots` and `calls` is within the limits above;
// otherwise INVALID_ARGUMENT naming the count over its limit. The one rule for a
// definition, a capture (as it grows) and a request off the wire.
absl::Status CheckGraphLimits(size_t variables, size_t slots, size_t calls);

// OK when every part of `graph` is consistent on `device`: variables well formed with
// unique names; every slot with a size (internals and parameters) or a buffer
// (constants); every call's arguments match its program's signature, views lie inside
// their slots, integer arguments fit their type over all variable values, and launch
// dimensions stay within [1, the device's limits] over all variable values.
absl::Status CheckGraph(const Graph& graph, const DeviceInfo& device);

// The graph's structure with values and handles stripped, as a canonical byte string:
// programs by content key, slots by kind and size (constants by identity), variable
// ranges, expressions. Equal strings are the same graph in `address_space`.
std::string GraphStructure(const Graph& graph, uint64_t address_space);

// The key shown to clients: SHA-256 hex of the structure.
std::string GraphKey(const std::string& structure);

}  // namespace replayd

#endif  // REPLAYD_ENGINE_GRAPH_H_
