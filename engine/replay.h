// Replay: executing a graph with a parameter vector (buffer handles for buffer parameters,
// integers for variables), and the replay sequence, K replays of one graph in one request
// from a list of vectors or a base vector whose variable steps.
//
// This file holds what a replay request is and the checks that turn it into what a graph
// instance replays: a parameter vector resolved against the session's buffers to device
// addresses and variable values, the views a replay returns (`reads`), and a sequence's
// vectors, all checked before the first replay runs. The session runs replays with these
// under its lock and its device turns. Resolving a vector and its reads into storage the
// caller keeps allocates nothing once that storage has grown, so a warm replay does not.
#ifndef REPLAYD_ENGINE_REPLAY_H_
#define REPLAYD_ENGINE_REPLAY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "drivers/driver.h"
#include "engine/buffer.h"
#include "engine/call.h"
#include "engine/graph_instance.h"
#include "engine/handle_table.h"

namespace replayd {

// One replay parameter: a buffer handle or a variable value.
struct BufferParam {
  Handle buffer = 0;
};
using ParamValue = std::variant<BufferParam, int64_t>;

struct ReplayOp {
  Handle graph = 0;
  std::vector<ParamValue> params;  // in the graph's parameter layout
  bool wait = false;
  std::vector<ViewArg> reads;  // views of session buffers returned after the replay
};

// Most bytes one replay may return through `reads`.
inline constexpr uint64_t kMaxReplayReadBytes = 1 << 20;

struct ReplayOutcome {
  std::optional<absl::Duration> device_time;
  std::vector<std::string> reads;
};

// K replays of one graph back to back: the vectors given, or `base` with the variable at
// layout index `step_param` increased by `step` after each of `count` replays.
struct ReplaySequenceOp {
  Handle graph = 0;
  std::vector<std::vector<ParamValue>> vectors;
  std::vector<ParamValue> base;
  size_t step_param = 0;
  int64_t step = 0;
  uint64_t count = 0;
  std::vector<ViewArg> reads;  // taken after each replay that reports them
  bool stream_reads = false;   // report every replay's reads, not only the last's
  // Asked before each replay after the first: true stops the sequence there, CANCELLED
  // (its requester is gone: a broken stream). Unset: the sequence runs to its end.
  std::function<bool()> stopped;
};

// Most replays in one sequence.
inline constexpr uint64_t kMaxSequenceReplays = 1 << 20;

struct SequenceOutcome {
  uint64_t replays = 0;
  absl::Duration device_time;
};

// Called after a replay of a sequence with its index and reads; a non-OK status stops
// the sequence (the replays before it stay done).
using ReplayCallback = std::function<absl::Status(uint64_t index, const ReplayOutcome& result)>;

// Checks `params` against the parameter layout of `graph` and resolves it through
// `buffers`: into `addresses` the device address of each buffer parameter, into `values`
// each variable's value (both resized to the layout). INVALID_ARGUMENT when the count is
// wrong (naming the first parameter missing), a parameter is of the wrong kind, a buffer
// is smaller than its slot, a value is outside its variable's range, or two buffers make
// a copy's views overlap; NOT_FOUND for an unknown buffer handle.
absl::Status ResolveParams(const GraphInstance& graph, std::span<const ParamValue> params,
                           const HandleTable<DeviceBuffer>& buffers, std::vector<uint64_t>& addresses,
                           std::vector<int64_t>& values);

// A view a replay returns, resolved: the buffer (held until the bytes are taken) and the
// byte range.
struct ResolvedRead {
  std::shared_ptr<DeviceBuffer> buffer;
  uint64_t offset = 0, length = 0;
};

// Resolves `reads` through `buffers` into `out` (cleared first). NOT_FOUND for an unknown
// buffer; INVALID_ARGUMENT for a view out of range or reads of more than
// kMaxReplayReadBytes in all, naming the read.
absl::Status ResolveReads(std::span<const ViewArg> reads, const HandleTable<DeviceBuffer>& buffers,
                          std::vector<ResolvedRead>& out);

// The bytes of `reads` read on `context` into `out`, one string per read, reusing the
// strings' storage. The work they depend on must be complete.
absl::Status TakeReads(Context& context, std::span<const ResolvedRead> reads, std::vector<std::string>& out);

// The parameter vectors of a replay sequence, every one checked before the first replay.
class SequenceVectors {
 public:
  // Checks `op` against `graph` and resolves its vectors through `buffers`.
  // INVALID_ARGUMENT when it runs fewer than 1 or more than kMaxSequenceReplays replays,
  // gives both vectors and a base, has a vector that ResolveParams refuses (named as
  // "replay i: ..."), or steps a parameter that is not a variable, a variable that
  // overflows int64 or leaves its range by the last replay, or by a step that is not a
  // multiple of the variable's multiple_of. NOT_FOUND for an unknown buffer handle.
  static absl::StatusOr<SequenceVectors> Check(const GraphInstance& graph, const ReplaySequenceOp& op,
                                               const HandleTable<DeviceBuffer>& buffers);

  uint64_t count() const { return count_; }
  // The buffer addresses of replay `replay` (< count()).
  std::span<const uint64_t> addresses(uint64_t replay) const;
  // The variable values of replay `replay` (< count()); with a step, the stepped value is
  // written for that replay first, so the span holds until the next call.
  std::span<const int64_t> ValuesOf(uint64_t replay);

 private:
  SequenceVectors() = default;

  uint64_t count_ = 0;
  // One vector per replay, or with a step a single one whose variable `stepped_` moves.
  std::vector<std::vector<uint64_t>> addresses_;
  std::vector<std::vector<int64_t>> values_;
  std::optional<size_t> stepped_;  // the stepped variable's index among the variables
  int64_t first_ = 0, step_ = 0;
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_REPLAY_H_
