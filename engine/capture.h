// Capture: turning eager calls into a graph. Between BeginCapture and EndCapture a
// session runs each call as usual and also records it here, with the buffers its views
// name and its integer expressions over the capture's variables. The record then becomes
// a graph: the buffers named as inputs and outputs become parameters, buffers created and
// freed inside the capture become internals, other buffers become constants, and every
// bound variable becomes a variable parameter with its value stripped.
//
// The record holds every buffer it names, so a buffer freed before the capture ends is
// still there to be classified. It knows buffers, not handles: the session resolves its
// handles and hands the buffers over. Every operation checks before it changes anything,
// so a refused call leaves the record as it was.
//
// Thread safety: not thread-safe; the owning session serialises access.
#ifndef REPLAYD_ENGINE_CAPTURE_H_
#define REPLAYD_ENGINE_CAPTURE_H_

#include <array>
#include <memory>
#include <span>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "engine/buffer.h"
#include "engine/call.h"
#include "engine/expression.h"
#include "engine/graph.h"
#include "engine/handle_table.h"
#include "engine/program.h"

namespace replayd {

// A buffer named to the capture, with the handle that named it (for messages).
struct CapturedBuffer {
  Handle handle = 0;
  std::shared_ptr<DeviceBuffer> buffer;
};

// A view argument with the buffer its handle named when the call ran.
struct RecordedView {
  std::shared_ptr<DeviceBuffer> buffer;
  ViewArg view;
};

// A recorded call argument: a view, or an integer expression.
using RecordedArg = std::variant<RecordedView, Expression>;

class CaptureRecord {
 public:
  // An empty record whose graph takes `inputs` as its first buffer parameters and
  // `variables` as its first variables. INVALID_ARGUMENT when more variables than a graph
  // may hold are declared, a buffer is named twice, or a variable is malformed or
  // declared twice.
  static absl::StatusOr<CaptureRecord> Open(std::vector<CapturedBuffer> inputs, std::vector<VariableDecl> variables);

  // A buffer allocated while the record is open: an internal of the graph when it is
  // freed before the graph is made. A buffer noted again (a new buffer at the address of
  // one freed earlier) is a new buffer, not a freed one.
  void NoteAllocated(const DeviceBuffer& buffer);
  // A buffer freed while the record is open.
  void NoteFreed(const DeviceBuffer& buffer);

  // OK when one more call fits under the graph limits; INVALID_ARGUMENT otherwise.
  absl::Status CheckRoom() const;

  // Records a launch of `program`. The expressions of `args`, `global` and `local` index
  // `variables`, the call's bound variables; each is mapped by name onto the record's,
  // and a new name becomes a new graph variable. INVALID_ARGUMENT when a variable's range
  // or multiple differs from the record's, or the call or its new variables do not fit
  // under the graph limits; then nothing is recorded. The views were checked by the
  // caller against their buffers.
  absl::Status RecordLaunch(std::shared_ptr<Program> program, std::vector<RecordedArg> args,
                            const std::array<Expression, 3>& global, const std::array<Expression, 3>& local,
                            std::span<const VariableDecl> variables);
  // Records a copy from `src` to `dst`, views the caller has checked. INVALID_ARGUMENT
  // when it does not fit under the graph limits; then nothing is recorded.
  absl::Status RecordCopy(RecordedView dst, RecordedView src);
  // Forgets the last call recorded and the variables it added: the device refused it
  // after it was recorded, and a failed call leaves the record as it was.
  void ForgetLast();

  size_t call_count() const { return calls_.size(); }
  // The daemon's memory the recorded calls hold, as counted against the tenant's
  // host_bytes quota while the capture is open.
  uint64_t host_bytes() const { return host_bytes_; }
  const std::vector<VariableDecl>& variables() const { return variables_; }

  // The graph of the calls recorded, with the record's variables. Parameter slots come
  // first: the inputs, then `outputs`, each buffer once. Every other buffer a call names
  // gets a slot at its first use: an internal when it was allocated and freed while the
  // record was open, else a constant holding the buffer. The record is unchanged.
  Graph ToGraph(std::span<const std::shared_ptr<DeviceBuffer>> outputs) const;

 private:
  struct RecordedCall {
    std::shared_ptr<Program> program;  // null: a copy, args destination then source
    std::vector<RecordedArg> args;
    std::array<Expression, 3> global{Expression::Constant(1), Expression::Constant(1), Expression::Constant(1)};
    std::array<Expression, 3> local{Expression::Constant(1), Expression::Constant(1), Expression::Constant(1)};
    size_t added_variables = 0;  // the record's last variables, new with this call
  };
  static uint64_t HostBytes(const RecordedCall& call);
  void Add(RecordedCall call);

  CaptureRecord(std::vector<std::shared_ptr<DeviceBuffer>> inputs, std::vector<VariableDecl> variables)
      : inputs_(std::move(inputs)), variables_(std::move(variables)) {}

  std::vector<std::shared_ptr<DeviceBuffer>> inputs_;
  std::vector<VariableDecl> variables_;
  // By address: a recorded buffer is held by the record, so its address names it alone;
  // an address noted again after a free is a new buffer (NoteAllocated forgets the free).
  absl::flat_hash_set<const DeviceBuffer*> born_;     // allocated while open
  absl::flat_hash_set<const DeviceBuffer*> dropped_;  // born, then freed while open
  std::vector<RecordedCall> calls_;
  uint64_t host_bytes_ = 0;  // summed over calls_
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_CAPTURE_H_
