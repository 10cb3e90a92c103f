// A graph instance: a checked graph made ready to replay on one context. Its internal
// buffers are placed in one arena by the memory plan, its calls are cut into batches and
// each batch is instantiated once as a device graph. A replay patches only the nodes that
// depend on parameters (buffer parameter addresses, variable arguments, symbolic launch
// dimensions) and launches the batches in order: no compile, no re-instantiation.
//
// Thread safety: thread-safe; replays of one instance run one at a time.
#ifndef REPLAYD_ENGINE_GRAPH_INSTANCE_H_
#define REPLAYD_ENGINE_GRAPH_INSTANCE_H_

#include <array>
#include <atomic>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "drivers/driver.h"
#include "engine/graph.h"
#include "engine/memory_plan.h"
#include "engine/tenant.h"

namespace replayd {

struct BatchOptions {
  size_t first_limit = 32;  // calls in the first batch; each later batch doubles it
};

// The calls of each batch, as [begin, end) ranges: at most the limit (doubling after each
// batch), and a call the device cannot batch alone in its own.
std::vector<std::pair<size_t, size_t>> CutBatches(std::span<const char> batchable, const BatchOptions& options);

class GraphInstance {
 public:
  // Instantiates `graph` (already checked with CheckGraph) on `context`.
  // RESOURCE_EXHAUSTED when the arena does not fit in device memory.
  static absl::StatusOr<std::shared_ptr<GraphInstance>> Create(Graph graph, std::string structure,
                                                               std::shared_ptr<Context> context,
                                                               const BatchOptions& options);
  ~GraphInstance();

  const Graph& graph() const { return graph_; }
  const std::string& structure() const { return structure_; }
  const std::string& key() const { return key_; }
  size_t batch_count() const { return batches_.size(); }
  const MemoryPlan& plan() const { return plan_; }
  // The slot of each buffer parameter, in parameter order.
  const std::vector<uint32_t>& buffer_params() const { return buffer_params_; }
  uint64_t replays() const { return replays_.load(); }
  // The daemon's memory the instance holds (its graph, key, nodes and patches, and the
  // driver's copies of its nodes), as counted against its tenant's host_bytes quota.
  uint64_t host_bytes() const { return host_bytes_; }
  // Reserves host_bytes() of `account`'s host memory, given back when the instance goes;
  // RESOURCE_EXHAUSTED (and nothing reserved) past its quota. Once per instance.
  absl::Status Charge(TenantAccount* account);
  // True when the instance runs on `context`, so that what `context` does next is ordered
  // after a replay without wait. The tenant's sessions share instances through the graph
  // cache, and one runs on the context of the session that created it: another session
  // orders its own work after a replay only by waiting for it.
  bool RunsOn(const Context& context) const { return context_.get() == &context; }
  // The bytes a copy's view of a parameter reaches at most (offset + length): the size of
  // the memory its node is built on before a replay names the buffer. 0 without such copies.
  uint64_t PlaceholderBytes() const;

  // INVALID_ARGUMENT when `buffers` (one device address per buffer parameter) makes a
  // copy's two views overlap: slots never do, but a replay may pass one buffer for two.
  absl::Status CheckBuffers(std::span<const uint64_t> buffers) const;

  // One replay. `buffers` holds one device address per buffer parameter, each of a
  // buffer at least the slot's size; `values` one value per variable, each checked
  // against its range. With `wait`, returns after completion with the device time.
  // Checks `buffers` with CheckBuffers first, running nothing when they fail.
  absl::StatusOr<std::optional<absl::Duration>> Replay(std::span<const uint64_t> buffers,
                                                       std::span<const int64_t> values, bool wait);

 private:
  struct Batch {
    size_t begin = 0, end = 0;
    std::unique_ptr<DeviceGraph> device_graph;  // null: a single call launched eagerly
  };
  // Where a parameter-dependent node gets its values.
  struct Patch {
    size_t call = 0;
    std::vector<std::pair<size_t, size_t>> buffer_args;  // (arg, buffer parameter)
    std::vector<size_t> expression_args;                 // args that use variables
    bool dims = false;                                   // dimensions use variables
  };
  // A copy with a buffer parameter on either side: where its views are for a replay.
  struct CopyCheck {
    size_t call = 0;
    uint64_t bytes = 0;
    std::array<int, 2> param{-1, -1};   // destination, source: buffer parameter or -1
    std::array<uint64_t, 2> address{};  // the view's offset after a parameter, else its address
  };
  // A batch of one call the device graph cannot hold, submitted on its own.
  absl::StatusOr<std::optional<absl::Duration>> SubmitAlone(const GraphNode& node, bool wait);

  // Where each slot goes: its index among the internals (its lifetime and its offset in
  // the plan) and among the buffer parameters, -1 where it is not one.
  struct SlotIndex {
    std::vector<int> internal;
    std::vector<int> param;
  };

  GraphInstance(Graph graph, std::string structure, std::shared_ptr<Context> context);
  // Makes the instance ready to replay, in the steps below: slots indexed, the arena
  // planned and allocated, a node and its patch built per call, the batches instantiated.
  absl::Status Prepare(const BatchOptions& options);
  // Indexes the slots and fills buffer_params_.
  SlotIndex IndexSlots();
  // The lifetime of each internal, first to last use in call order.
  std::vector<Lifetime> Lifetimes(const SlotIndex& index) const;
  // Plans the internals' memory and allocates the arena (none when it is empty).
  absl::Status PlanArena(const SlotIndex& index);
  // The device address a node is built with for `slot`: in the arena, the constant's, or
  // for a parameter `placeholder` in a copy and 0 elsewhere (patched at every replay).
  uint64_t SlotAddress(const SlotIndex& index, uint32_t slot, bool copy, uint64_t placeholder) const;
  // The values the nodes are built with: each variable at its smallest valid value.
  std::vector<int64_t> InitialValues() const;
  // Builds every call's node, its patch and its copy check; whether each call can go in a
  // device graph.
  std::vector<char> BuildNodes(const SlotIndex& index, uint64_t placeholder) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Builds node `call` with `values` and returns where it depends on parameters.
  Patch BuildNode(const SlotIndex& index, size_t call, uint64_t placeholder, std::span<const int64_t> values)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes where copy `call`, built with a buffer parameter, finds its views at a replay.
  void AddCopyCheck(const SlotIndex& index, size_t call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cuts the calls into batches and instantiates a device graph for each that can have one.
  absl::Status Instantiate(const SlotIndex& index, std::span<const char> batchable, const BatchOptions& options)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Dim3 EvaluateDims(const std::array<Expression, 3>& dims, std::span<const int64_t> values) const;
  // What host_bytes() says, measured on the prepared instance.
  uint64_t MeasureHostBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Declared first, so it is destroyed last: the graph's programs hold kernels and its
  // constants hold buffers of this context, which must not outlive it.
  const std::shared_ptr<Context> context_;
  const Graph graph_;
  const std::string structure_;
  const std::string key_;
  MemoryPlan plan_;
  std::optional<Allocation> arena_;
  std::vector<uint32_t> buffer_params_;

  absl::Mutex mu_;
  std::vector<GraphNode> nodes_ ABSL_GUARDED_BY(mu_);  // current values of every call
  std::vector<Patch> patches_;
  std::vector<CopyCheck> copy_checks_;
  std::vector<size_t> batch_of_call_, index_in_batch_;
  std::vector<Batch> batches_;
  std::atomic<uint64_t> replays_{0};
  uint64_t host_bytes_ = 0;             // measured at the end of Prepare
  TenantAccount* charged_ = nullptr;    // whose host_bytes quota holds host_bytes_
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_GRAPH_INSTANCE_H_
