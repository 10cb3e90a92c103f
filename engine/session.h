// A session: one tenant's workspace on one device. It owns buffers, programs and graphs
// under session-scoped handles and holds a lease; closing it (or letting the lease
// expire) frees everything it owns.
//
// Every operation checks its input completely before it changes anything, so a failed
// operation leaves the session as it was. Operations of one session run one at a time
// in arrival order. Work on the device (launches, each replay, copies) takes a turn
// from the device's scheduler after its checks; programs, graphs and (through the
// context) memory count against the tenant's quotas.
//
// Capture: between BeginCapture and EndCapture, launches and copies run as usual and are
// also recorded in a CaptureRecord (engine/capture.h), which EndCapture turns into a
// graph. Replay: ReplayGraph and ReplaySequence check their parameter vectors with
// engine/replay.h and run the graph instance's replays.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_ENGINE_SESSION_H_
#define REPLAYD_ENGINE_SESSION_H_

#include <atomic>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "drivers/driver.h"
#include "engine/buffer.h"
#include "engine/call.h"
#include "engine/capture.h"
#include "engine/compile_cache.h"
#include "engine/graph.h"
#include "engine/graph_cache.h"
#include "engine/graph_instance.h"
#include "engine/handle_table.h"
#include "engine/program.h"
#include "engine/replay.h"
#include "engine/scheduler.h"
#include "engine/tenant.h"

namespace replayd {

using SessionId = uint64_t;

// A graph definition with session handles, as DefineGraph receives it.
struct SlotDef {
  SlotKind kind = SlotKind::kParameter;
  uint64_t bytes = 0;  // parameters and internals
  Handle buffer = 0;   // constants
};
struct CallDef {
  bool copy = false;  // a copy from args[1] to args[0]: no program, no dimensions
  Handle program = 0;
  std::vector<GraphArg> args;
  std::vector<Expression> global, local;  // up to 3 each; missing ones are 1
};
struct GraphDef {
  std::vector<VariableDecl> variables;
  std::vector<SlotDef> slots;
  std::vector<CallDef> calls;
};

struct GraphParamInfo {
  bool is_buffer = true;
  uint32_t slot = 0;   // buffers
  uint64_t bytes = 0;  // buffers: the least size accepted
  VariableDecl variable;   // variables
};

struct GraphInfo {
  Handle handle = 0;
  std::string key;
  bool cache_hit = false;
  size_t calls = 0;
  size_t batches = 0;
  uint64_t arena_bytes = 0;
  uint64_t saved_bytes = 0;
  uint64_t replays = 0;
  std::vector<GraphParamInfo> params;  // the replay parameter layout
  GraphCacheStats cache;
};

// What a session needs from the engine; all of it outlives the session.
struct SessionEnv {
  Device* device = nullptr;
  CompileCache* compile_cache = nullptr;
  GraphCache* graph_cache = nullptr;
  BatchOptions batch;
  // The tenant's account, holding this session's sessions quota unit until Close.
  TenantAccount* account = nullptr;
  Scheduler* scheduler = nullptr;     // the device's
  Scheduler::Queue* queue = nullptr;  // the tenant's on that device
};

class DeviceSession {
 public:
  DeviceSession(SessionId id, std::string tenant, SessionEnv env, std::shared_ptr<Context> context, absl::Duration lease);
  ~DeviceSession();
  DeviceSession(const DeviceSession&) = delete;
  DeviceSession& operator=(const DeviceSession&) = delete;

  SessionId id() const { return id_; }
  const std::string& tenant() const { return tenant_; }
  const DeviceInfo& device() const { return env_.device->info(); }
  absl::Duration lease() const { return lease_; }
  // OK while its context can run work; the cause once it never can again.
  absl::Status health() const { return context_->health(); }

  // Pushes the lease deadline to now + lease.
  void Renew(absl::Time now);
  bool Expired(absl::Time now) const;

  // Frees every buffer, program and graph; later operations are NOT_FOUND. Idempotent.
  // Waits for the operation running, if any.
  void Close();
  // Close, unless an operation is running: then false, and nothing changes.
  bool TryClose();

  // A new zeroed buffer. INVALID_ARGUMENT for 0 bytes; RESOURCE_EXHAUSTED past the
  // device's free memory.
  absl::StatusOr<Handle> AllocBuffer(uint64_t bytes);
  absl::Status FreeBuffer(Handle buffer);

  // The range [offset, offset + length) of `buffer` with a zero length meaning "to the
  // end", or INVALID_ARGUMENT / NOT_FOUND. Transfers check their whole range first.
  absl::StatusOr<std::pair<uint64_t, uint64_t>> ResolveRange(Handle buffer, uint64_t offset, uint64_t length);
  absl::Status WriteBuffer(Handle buffer, uint64_t offset, std::span<const uint8_t> bytes);
  absl::Status ReadBuffer(Handle buffer, uint64_t offset, std::span<uint8_t> bytes);

  // Compiles (through the compile cache) and loads a program.
  absl::StatusOr<ProgramInfo> LoadProgram(const ProgramSource& source);
  absl::Status FreeProgram(Handle program);

  // One eager launch, checked against the program's signature, the bound variables'
  // ranges and the device limits. Recorded when a capture is open, unless it fails.
  absl::StatusOr<LaunchResult> Launch(const LaunchOp& op);
  // One eager copy between views of session buffers: INVALID_ARGUMENT when their lengths
  // differ or they overlap. Recorded when a capture is open, unless it fails.
  absl::StatusOr<LaunchResult> CopyBuffer(const CopyOp& op);
  absl::Status Synchronize();

  // Opens a capture. FAILED_PRECONDITION when one is open; NOT_FOUND for an unknown input.
  absl::Status BeginCapture(const std::vector<Handle>& inputs, const std::vector<VariableDecl>& variables);
  // Closes the capture and returns its graph (a cache hit when the same structure was
  // seen). FAILED_PRECONDITION when no capture is open or it recorded no call. On any
  // failure the capture stays open as it was; `discard` closes it with no graph
  // (handle 0).
  absl::StatusOr<GraphInfo> EndCapture(const std::vector<Handle>& outputs, bool discard = false);
  // The same graph as a capture would make, built from an explicit definition.
  absl::StatusOr<GraphInfo> DefineGraph(const GraphDef& def);
  absl::StatusOr<GraphInfo> DescribeGraph(Handle graph);
  absl::Status FreeGraph(Handle graph);
  // Replays a graph with a parameter vector; checks everything before anything runs.
  // FAILED_PRECONDITION while capturing.
  absl::StatusOr<ReplayOutcome> ReplayGraph(const ReplayOp& op);
  // The same into `result`, reusing its storage (the stream's hot path).
  absl::Status ReplayGraph(const ReplayOp& op, ReplayOutcome& result);
  // Replays a sequence, checking every parameter vector and read before the first replay.
  // `on_replay` gets the reads of every replay with stream_reads, else of the last only.
  absl::StatusOr<SequenceOutcome> ReplaySequence(const ReplaySequenceOp& op, const ReplayCallback& on_replay);

  // Bytes of device memory held by this session's buffers.
  uint64_t memory_in_use() const;
  size_t program_count() const;
  size_t graph_count() const;
  absl::Time deadline() const { return absl::FromUnixNanos(deadline_ns_.load()); }

 private:
  void CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckOpen() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Counts the open capture's record (or none) against the tenant's host_bytes quota, as
  // it grows and shrinks: RESOURCE_EXHAUSTED, with the count unchanged, past the quota.
  absl::Status ChargeCapture() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the call recorded last (the device refused it), if a capture is open.
  void ForgetLastRecorded() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the capture and gives back what its record held.
  void DropCapture() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<DeviceBuffer>> FindBuffer(Handle buffer) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status PackArgs(const Kernel& kernel, const LaunchOp& op, std::span<const VariableDecl> variables,
                        std::span<const int64_t> values, std::vector<ArgValue>& out) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The buffers `handles` name, in order, or NOT_FOUND for the first unknown one.
  absl::StatusOr<std::vector<std::shared_ptr<DeviceBuffer>>> FindBuffers(const std::vector<Handle>& handles) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The arguments of `op` as a capture records them: each view with its buffer.
  absl::StatusOr<std::vector<RecordedArg>> RecordedArgs(const LaunchOp& op) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Graph> GraphFromDef(const GraphDef& def) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::StatusOr<GraphInfo> AddGraph(Graph graph) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  GraphInfo Describe(Handle handle, const GraphInstance& instance, bool cache_hit) const;
  absl::StatusOr<std::shared_ptr<GraphInstance>> FindReplayable(Handle graph) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const SessionId id_;
  const std::string tenant_;
  const SessionEnv env_;
  const absl::Duration lease_;
  std::atomic<int64_t> deadline_ns_;

  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Why the context was lost, when it was by the close (an executor died); read then, as
  // the device may be gone by the time a holder of the closed session asks.
  absl::Status lost_ ABSL_GUARDED_BY(mu_);
  uint64_t capture_charged_ ABSL_GUARDED_BY(mu_) = 0;  // host_bytes the open capture holds
  // Read without the lock (by the admin's report while work runs); written under it.
  std::atomic<uint64_t> memory_in_use_ = 0;
  std::atomic<size_t> program_count_ = 0, graph_count_ = 0;
  std::shared_ptr<Context> context_;
  // Declared after context_, so they are destroyed (and free their memory) before it.
  HandleTable<DeviceBuffer> buffers_ ABSL_GUARDED_BY(mu_){"buffer"};
  HandleTable<Program> programs_ ABSL_GUARDED_BY(mu_){"program"};
  HandleTable<GraphInstance> graphs_ ABSL_GUARDED_BY(mu_){"graph"};
  std::optional<CaptureRecord> capture_ ABSL_GUARDED_BY(mu_);
  // Scratch of a launch and of a replay, which hold mu_ throughout: kept with its
  // capacity, so a warm replay allocates nothing.
  std::vector<ArgValue> launch_args_ ABSL_GUARDED_BY(mu_);
  struct ReplayScratch {
    std::vector<uint64_t> addresses;
    std::vector<int64_t> values;
    std::vector<ResolvedRead> reads;
  } replay_scratch_ ABSL_GUARDED_BY(mu_);
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_SESSION_H_
