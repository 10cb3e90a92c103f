#include "engine/graph_instance.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "engine/buffer.h"
#include "engine/call.h"
#include "engine/dependencies.h"

namespace replayd {

std::vector<std::pair<size_t, size_t>> CutBatches(std::span<const char> batchable, const BatchOptions& options) {
  std::vector<std::pair<size_t, size_t>> batches;
  size_t limit = std::max<size_t>(1, options.first_limit);
  size_t begin = 0;
  auto close = [&](size_t end) {
    if (end > begin) {
      batches.push_back({begin, end});
      limit *= 2;
    }
    begin = end;
  };
  for (size_t i = 0; i < batchable.size(); ++i) {
    if (!batchable[i]) {
      close(i);
      batches.push_back({i, i + 1});
      begin = i + 1;
      continue;
    }
    if (i - begin == limit) close(i);
  }
  close(batchable.size());
  return batches;
}

GraphInstance::GraphInstance(Graph graph, std::string structure, std::shared_ptr<Context> context)
    : context_(std::move(context)),
      graph_(std::move(graph)),
      structure_(std::move(structure)),
      key_(GraphKey(structure_)) {}

GraphInstance::~GraphInstance() {
  if (arena_) context_->Free(*arena_);
  if (charged_) charged_->Release(Resource::kHostMemory, host_bytes_);
}

absl::Status GraphInstance::Charge(TenantAccount* account) {
  if (charged_) return absl::OkStatus();
  if (absl::Status s = account->Reserve(Resource::kHostMemory, host_bytes_); !s.ok()) return s;
  charged_ = account;
  return absl::OkStatus();
}

namespace {

uint64_t HostBytes(const Expression& e) { return sizeof(Expression) + e.nodes().capacity() * sizeof(Expression::Node); }

uint64_t HostBytes(const std::array<Expression, 3>& dims) {
  uint64_t bytes = 0;
  for (const Expression& e : dims) bytes += HostBytes(e) - sizeof(Expression);
  return bytes;
}

}  // namespace

uint64_t GraphInstance::MeasureHostBytes() const {
  uint64_t bytes = sizeof(GraphInstance) + structure_.capacity() + key_.capacity();
  bytes += graph_.variables.capacity() * sizeof(VariableDecl) + graph_.slots.capacity() * sizeof(Slot);
  for (const GraphCall& call : graph_.calls) {
    bytes += sizeof(GraphCall) + call.args.capacity() * sizeof(GraphArg) + HostBytes(call.global) + HostBytes(call.local);
    for (const GraphArg& arg : call.args)
      if (const Expression* e = std::get_if<Expression>(&arg)) bytes += HostBytes(*e) - sizeof(Expression);
  }
  // The nodes, here and once more in the driver (its device graph or replay list keeps
  // each node's arguments).
  for (const GraphNode& node : nodes_) bytes += 2 * (sizeof(GraphNode) + node.args.capacity() * sizeof(ArgValue));
  for (const Patch& p : patches_)
    bytes += sizeof(Patch) + p.buffer_args.capacity() * sizeof(p.buffer_args[0]) +
             p.expression_args.capacity() * sizeof(size_t);
  bytes += copy_checks_.capacity() * sizeof(CopyCheck) + buffer_params_.capacity() * sizeof(uint32_t);
  bytes += (batch_of_call_.capacity() + index_in_batch_.capacity()) * sizeof(size_t) + batches_.capacity() * sizeof(Batch);
  return bytes;
}

absl::StatusOr<std::shared_ptr<GraphInstance>> GraphInstance::Create(Graph graph, std::string structure,
                                                                     std::shared_ptr<Context> context,
                                                                     const BatchOptions& options) {
  std::shared_ptr<GraphInstance> instance(
      new GraphInstance(std::move(graph), std::move(structure), std::move(context)));
  if (absl::Status s = instance->Prepare(options); !s.ok()) return s;
  return instance;
}

Dim3 GraphInstance::EvaluateDims(const std::array<Expression, 3>& dims, std::span<const int64_t> values) const {
  return {static_cast<uint64_t>(dims[0].Evaluate(values)), static_cast<uint64_t>(dims[1].Evaluate(values)),
          static_cast<uint64_t>(dims[2].Evaluate(values))};
}

uint64_t GraphInstance::PlaceholderBytes() const {
  uint64_t bytes = 0;
  for (const GraphCall& call : graph_.calls) {
    if (!call.is_copy()) continue;
    const SlotView& dst = std::get<SlotView>(call.args[0]);
    const uint64_t length = dst.length ? dst.length : graph_.slots[dst.slot].bytes - dst.offset;
    for (const GraphArg& arg : call.args) {
      const SlotView& v = std::get<SlotView>(arg);
      if (graph_.slots[v.slot].kind == SlotKind::kParameter) bytes = std::max(bytes, v.offset + length);
    }
  }
  return bytes;
}

absl::Status GraphInstance::Prepare(const BatchOptions& options) {
  const SlotIndex index = IndexSlots();
  if (absl::Status s = PlanArena(index); !s.ok()) return s;
  // A node is built on real memory of this context: CUDA and HIP refuse a memcpy node on
  // an address they do not know (a kernel node takes any pointer as a plain value). A
  // copy's view of a parameter is built on a placeholder, an allocation as large as the
  // largest such view reaches, held only while the batches are instantiated: every replay
  // retargets the node to its buffer before it launches. (A driver that cannot retarget a
  // node instantiated on memory freed since, as CUDA documents, instantiates its copies on
  // memory of its own: cuda_driver.cc.)
  std::optional<Allocation> placeholder;
  struct FreePlaceholder {
    Context& context;
    std::optional<Allocation>& allocation;
    ~FreePlaceholder() {
      if (allocation) context.Free(*allocation);
    }
  } free_placeholder{*context_, placeholder};
  if (uint64_t bytes = PlaceholderBytes(); bytes > 0) {
    absl::StatusOr<Allocation> a = context_->Allocate(bytes);
    if (!a.ok()) return a.status();
    placeholder = *a;
  }
  absl::MutexLock lock(&mu_);
  const std::vector<char> batchable = BuildNodes(index, placeholder ? placeholder->address : 0);
  if (absl::Status s = Instantiate(index, batchable, options); !s.ok()) return s;
  host_bytes_ = MeasureHostBytes();
  return absl::OkStatus();
}

GraphInstance::SlotIndex GraphInstance::IndexSlots() {
  SlotIndex index;
  index.internal.assign(graph_.slots.size(), -1);
  index.param.assign(graph_.slots.size(), -1);
  int internals = 0;
  for (size_t s = 0; s < graph_.slots.size(); ++s) {
    if (graph_.slots[s].kind == SlotKind::kInternal) {
      index.internal[s] = internals++;
    } else if (graph_.slots[s].kind == SlotKind::kParameter) {
      index.param[s] = static_cast<int>(buffer_params_.size());
      buffer_params_.push_back(static_cast<uint32_t>(s));
    }
  }
  return index;
}

std::vector<Lifetime> GraphInstance::Lifetimes(const SlotIndex& index) const {
  std::vector<Lifetime> lifetimes;
  for (size_t s = 0; s < graph_.slots.size(); ++s)
    if (index.internal[s] >= 0) lifetimes.push_back({graph_.slots[s].bytes, SIZE_MAX, 0});
  for (size_t c = 0; c < graph_.calls.size(); ++c) {
    for (const GraphArg& a : graph_.calls[c].args) {
      const SlotView* v = std::get_if<SlotView>(&a);
      if (!v || index.internal[v->slot] < 0) continue;
      Lifetime& l = lifetimes[index.internal[v->slot]];
      l.first_use = std::min(l.first_use, c);
      l.last_use = std::max(l.last_use, c);
    }
  }
  for (Lifetime& l : lifetimes)
    if (l.first_use == SIZE_MAX) l.first_use = l.last_use = 0;  // unused: placed anyway
  return lifetimes;
}

absl::Status GraphInstance::PlanArena(const SlotIndex& index) {
  plan_ = PlanMemory(Lifetimes(index));
  if (plan_.arena_bytes == 0) return absl::OkStatus();
  absl::StatusOr<Allocation> arena = context_->Allocate(plan_.arena_bytes);
  if (!arena.ok()) return arena.status();
  arena_ = *arena;
  return absl::OkStatus();
}

uint64_t GraphInstance::SlotAddress(const SlotIndex& index, uint32_t slot, bool copy, uint64_t placeholder) const {
  switch (graph_.slots[slot].kind) {
    case SlotKind::kInternal:
      return arena_->address + plan_.offsets[index.internal[slot]];
    case SlotKind::kConstant:
      return graph_.slots[slot].constant->allocation.address;
    case SlotKind::kParameter:
      return copy ? placeholder : 0;  // retargeted at every replay
  }
  return 0;
}

std::vector<int64_t> GraphInstance::InitialValues() const {
  // Each variable at its smallest valid value.
  std::vector<int64_t> values;
  for (const VariableDecl& v : graph_.variables) {
    int64_t rem = ((v.min % v.multiple_of) + v.multiple_of) % v.multiple_of;
    values.push_back(rem ? v.min + (v.multiple_of - rem) : v.min);
  }
  return values;
}

std::vector<char> GraphInstance::BuildNodes(const SlotIndex& index, uint64_t placeholder) {
  const std::vector<int64_t> values = InitialValues();
  nodes_.resize(graph_.calls.size());
  std::vector<char> batchable(graph_.calls.size());
  for (size_t c = 0; c < graph_.calls.size(); ++c) {
    Patch patch = BuildNode(index, c, placeholder, values);
    if (graph_.calls[c].is_copy() && !patch.buffer_args.empty()) AddCopyCheck(index, c);
    if (!patch.buffer_args.empty() || !patch.expression_args.empty() || patch.dims)
      patches_.push_back(std::move(patch));
    batchable[c] = context_->CanBatch(nodes_[c]);
  }
  return batchable;
}

GraphInstance::Patch GraphInstance::BuildNode(const SlotIndex& index, size_t c, uint64_t placeholder,
                                              std::span<const int64_t> values) {
  const GraphCall& call = graph_.calls[c];
  GraphNode& node = nodes_[c];
  node.kernel = call.is_copy() ? nullptr : call.program->kernel.get();
  node.args.resize(call.args.size());
  Patch patch;
  patch.call = c;
  for (size_t i = 0; i < call.args.size(); ++i) {
    if (const SlotView* v = std::get_if<SlotView>(&call.args[i])) {
      node.args[i].address = SlotAddress(index, v->slot, call.is_copy(), placeholder) + v->offset;
      if (index.param[v->slot] >= 0) patch.buffer_args.push_back({i, index.param[v->slot]});
    } else {
      const Expression& e = std::get<Expression>(call.args[i]);
      node.args[i].integer = e.Evaluate(values);
      if (e.uses_variables()) patch.expression_args.push_back(i);
    }
  }
  node.global = EvaluateDims(call.global, values);
  node.local = EvaluateDims(call.local, values);
  for (int d = 0; d < 3; ++d)
    patch.dims = patch.dims || call.global[d].uses_variables() || call.local[d].uses_variables();
  if (call.is_copy()) {
    const SlotView& dst = std::get<SlotView>(call.args[0]);
    node.copy_bytes = dst.length ? dst.length : graph_.slots[dst.slot].bytes - dst.offset;
  }
  return patch;
}

void GraphInstance::AddCopyCheck(const SlotIndex& index, size_t c) {
  const GraphCall& call = graph_.calls[c];
  const GraphNode& node = nodes_[c];
  CopyCheck check{c, node.copy_bytes, {-1, -1}, {node.args[0].address, node.args[1].address}};
  for (int i = 0; i < 2; ++i) {
    const SlotView& v = std::get<SlotView>(call.args[i]);
    if (index.param[v.slot] < 0) continue;
    check.param[i] = index.param[v.slot];
    check.address[i] = v.offset;
  }
  copy_checks_.push_back(check);
}

absl::Status GraphInstance::Instantiate(const SlotIndex& index, std::span<const char> batchable,
                                        const BatchOptions& options) {
  batch_of_call_.resize(graph_.calls.size());
  index_in_batch_.resize(graph_.calls.size());
  std::vector<uint64_t> arena_offsets(graph_.slots.size(), 0);
  for (size_t s = 0; s < graph_.slots.size(); ++s)
    if (index.internal[s] >= 0) arena_offsets[s] = plan_.offsets[index.internal[s]];
  for (auto [begin, end] : CutBatches(batchable, options)) {
    Batch batch{begin, end, nullptr};
    if (end - begin > 1 || batchable[begin]) {
      const std::vector<std::pair<size_t, size_t>> edges = context_->wants_edges()
                                                               ? DependencyEdges(graph_, arena_offsets, begin, end)
                                                               : std::vector<std::pair<size_t, size_t>>();
      absl::StatusOr<std::unique_ptr<DeviceGraph>> g =
          context_->Instantiate(std::span<const GraphNode>(nodes_).subspan(begin, end - begin), edges);
      if (!g.ok()) return g.status();
      batch.device_graph = std::move(*g);
    }
    for (size_t c = begin; c < end; ++c) {
      batch_of_call_[c] = batches_.size();
      index_in_batch_[c] = c - begin;
    }
    batches_.push_back(std::move(batch));
  }
  return absl::OkStatus();
}

absl::Status GraphInstance::CheckBuffers(std::span<const uint64_t> buffers) const {
  for (const CopyCheck& c : copy_checks_) {
    uint64_t at[2];
    for (int i = 0; i < 2; ++i) at[i] = c.param[i] < 0 ? c.address[i] : buffers[c.param[i]] + c.address[i];
    if (at[0] < at[1] + c.bytes && at[1] < at[0] + c.bytes)
      return absl::InvalidArgumentError(
          absl::StrCat("call ", c.call, " would copy between overlapping ranges: its parameters name one buffer"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<absl::Duration>> GraphInstance::SubmitAlone(const GraphNode& node, bool wait) {
  if (node.is_copy()) return SubmitCopy(*context_, node.args[0].address, node.args[1].address, node.copy_bytes, wait);
  return context_->Launch(*node.kernel, node.args, node.global, node.local, wait);
}

absl::StatusOr<std::optional<absl::Duration>> GraphInstance::Replay(std::span<const uint64_t> buffers,
                                                                    std::span<const int64_t> values, bool wait) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckBuffers(buffers); !s.ok()) return s;
  for (const Patch& p : patches_) {
    const GraphCall& call = graph_.calls[p.call];
    GraphNode& node = nodes_[p.call];
    for (auto [arg, param] : p.buffer_args)
      node.args[arg].address = buffers[param] + std::get<SlotView>(call.args[arg]).offset;
    for (size_t arg : p.expression_args) node.args[arg].integer = std::get<Expression>(call.args[arg]).Evaluate(values);
    if (p.dims) {
      node.global = EvaluateDims(call.global, values);
      node.local = EvaluateDims(call.local, values);
    }
    Batch& batch = batches_[batch_of_call_[p.call]];
    if (batch.device_graph) {
      absl::Status s = batch.device_graph->Update(index_in_batch_[p.call], node.args, node.global, node.local);
      if (!s.ok()) return s;
    }
  }
  auto start = std::chrono::steady_clock::now();
  for (size_t b = 0; b < batches_.size(); ++b) {
    Batch& batch = batches_[b];
    const bool last = b + 1 == batches_.size();
    absl::StatusOr<std::optional<absl::Duration>> r;
    if (batch.device_graph) {
      r = batch.device_graph->Launch(wait && last);
    } else {
      r = SubmitAlone(nodes_[batch.begin], wait && last);
    }
    if (!r.ok()) return r.status();
  }
  replays_.fetch_add(1);
  if (!wait) return std::optional<absl::Duration>();
  return std::optional<absl::Duration>(absl::FromChrono(std::chrono::steady_clock::now() - start));
}

}  // namespace replayd
