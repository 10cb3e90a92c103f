#include "drivers/executor/executor_server.h"

#include <unistd.h>

#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "drivers/executor/wire.h"

namespace replayd::executor {

int ExecutorServer::Run(pid_t parent) {
  auto gone = [parent] { return getppid() != parent; };
  const bool ok = Serve(
      control_,
      [&](const Request& request, bool&) {
        Reply reply;
        absl::StatusOr<bool> edges = request.has_open_context()
                                         ? OpenContext(parent)
                                         : absl::InvalidArgumentError("executor: not a control command");
        reply.set_code(static_cast<int>(edges.status().code()));
        reply.set_message(std::string(edges.status().message()));
        if (edges.ok()) reply.set_wants_edges(*edges);
        if (!edges.ok() && !device_.health().ok()) reply.set_device_lost(true);
        return reply;
      },
      gone);
  return ok ? 0 : 1;
}

absl::StatusOr<bool> ExecutorServer::OpenContext(pid_t parent) {
  absl::StatusOr<int> fd = ReceiveFd(socket_);
  if (!fd.ok()) return fd.status();
  absl::StatusOr<Channel> channel = Channel::Attach(*fd);
  if (!channel.ok()) return channel.status();
  absl::StatusOr<std::unique_ptr<Context>> context = device_.OpenContext({});
  if (!context.ok()) return context.status();
  // The daemon's transfers come through the data area: page-locked, a GPU copies straight
  // from and into it. Where the driver refuses, they are staged as before, and the
  // daemon's log says so once.
  if (absl::Status pinned = (*context)->PinHost(channel->data()); !pinned.ok() && !told_unpinned_) {
    told_unpinned_ = true;
    std::fprintf(stderr, "replayd-executor: transfers are staged: the channel cannot be page-locked: %s\n",
                 std::string(pinned.message()).c_str());
  }
  const bool edges = (*context)->wants_edges();
  RunOnThread([channel = std::make_shared<Channel>(*std::move(channel)),
               server = std::make_shared<ContextServer>(device_, std::move(*context), socket_, allocations_), parent]() mutable {
    Serve(
        *channel, [&](const Request& request, bool& done) { return server->Handle(request, channel->data(), done); },
        [parent] { return getppid() != parent; });
    // The context's memory and the channel's mapping go now, not when the thread next
    // serves.
    server.reset();
    channel.reset();
  });
  return edges;
}

void ExecutorServer::RunOnThread(std::function<void()> serve) {
  {
    absl::MutexLock lock(&threads_mu_);
    if (idle_threads_ > 0) {
      --idle_threads_;
      given_.push_back(std::move(serve));
      return;
    }
  }
  std::thread([this, serve = std::move(serve)]() mutable {
    for (;;) {
      serve();
      serve = nullptr;
      absl::MutexLock lock(&threads_mu_);
      if (idle_threads_ >= kIdleThreads) return;
      ++idle_threads_;
      threads_mu_.Await(absl::Condition(
          +[](std::deque<std::function<void()>>* given) { return !given->empty(); }, &given_));
      serve = std::move(given_.front());
      given_.pop_front();
    }
  }).detach();
}

void Allocations::Add(const Allocation& a) {
  absl::MutexLock lock(&mu_);
  bytes_[a.address] = a.bytes;
}

void Allocations::Remove(uint64_t address) {
  absl::MutexLock lock(&mu_);
  bytes_.erase(address);
}

absl::Status Allocations::CheckInside(uint64_t address, uint64_t bytes) const {
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = bytes_.upper_bound(address);
    if (it != bytes_.begin()) {
      --it;
      const uint64_t start = it->first, size = it->second;
      if (address - start <= size && bytes <= size - (address - start)) return absl::OkStatus();
    }
  }
  return absl::OutOfRangeError(
      absl::StrCat("executor: [0x", absl::Hex(address), ", +", bytes, ") is not inside an allocation"));
}

ContextServer::~ContextServer() {
  graphs_.clear();
  kernels_.clear();
  for (const auto& [address, allocation] : allocations_) {
    everyone_.Remove(address);
    context_->Free(allocation);
  }
}

Reply ContextServer::Handle(const Request& request, std::span<uint8_t> data, bool& done) {
  Reply reply;
  absl::Status s = absl::OkStatus();
  if (request.has_close_context()) {
    done = true;
  } else {
    s = Run(request, data, reply);
  }
  reply.set_code(static_cast<int>(s.code()));
  if (!s.ok()) {
    reply.set_message(std::string(s.message()));
    if (!device_.health().ok()) reply.set_device_lost(true);
  }
  return reply;
}

absl::StatusOr<Allocation> ContextServer::AllocateShared(uint64_t bytes) {
  // Taken before anything can fail, so that no descriptor is left for a later command.
  absl::StatusOr<int> fd = ReceiveFd(socket_);
  if (!fd.ok()) return fd.status();
  absl::StatusOr<Allocation> a = context_->AllocateShared(*fd, bytes);
  close(*fd);
  return a;
}

absl::StatusOr<Allocation> ContextServer::FindAllocation(const Region& region, uint64_t offset, uint64_t bytes) const {
  auto it = allocations_.find(region.address());
  if (it == allocations_.end() || it->second.bytes != region.bytes())
    return absl::NotFoundError(absl::StrCat("executor: no allocation at 0x", absl::Hex(region.address())));
  if (offset > it->second.bytes || bytes > it->second.bytes - offset)
    return absl::OutOfRangeError(absl::StrCat("executor: ", bytes, " bytes at offset ", offset,
                                              " exceed an allocation of ", it->second.bytes));
  return it->second;
}

absl::Status ContextServer::CheckBufferArgs(const Kernel& kernel, std::span<const ArgValue> args) const {
  const std::vector<replayd::Param>& params = kernel.signature().params;
  for (size_t i = 0; i < args.size() && i < params.size(); ++i) {
    if (params[i].kind != ParamKind::kBuffer) continue;
    if (absl::Status s = everyone_.CheckInside(args[i].address, 0); !s.ok())
      return absl::OutOfRangeError(absl::StrCat("executor: buffer argument ", i, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<const Kernel*> ContextServer::FindKernel(uint64_t id) const {
  auto it = kernels_.find(id);
  if (it == kernels_.end()) return absl::NotFoundError(absl::StrCat("executor: no kernel ", id));
  return it->second.get();
}

absl::Status ContextServer::Run(const Request& request, std::span<uint8_t> data, Reply& reply) {
  switch (request.command_case()) {
    case Request::kAllocate: {
      absl::StatusOr<Allocation> a = context_->Allocate(request.allocate());
      if (!a.ok()) return a.status();
      allocations_[a->address] = *a;
      everyone_.Add(*a);
      reply.set_value(a->address);
      return absl::OkStatus();
    }
    case Request::kAllocateShared: {
      absl::StatusOr<Allocation> a = AllocateShared(request.allocate_shared());
      if (!a.ok()) return a.status();
      allocations_[a->address] = *a;
      everyone_.Add(*a);
      reply.set_value(a->address);
      return absl::OkStatus();
    }
    case Request::kFree: {
      absl::StatusOr<Allocation> a = FindAllocation(request.free(), 0, 0);
      if (!a.ok()) return a.status();
      everyone_.Remove(a->address);
      context_->Free(*a);
      allocations_.erase(a->address);
      return absl::OkStatus();
    }
    case Request::kWrite:
    case Request::kRead: {
      const Transfer& t = request.has_write() ? request.write() : request.read();
      if (t.bytes() > data.size())
        return absl::InvalidArgumentError(absl::StrCat("executor: a transfer of ", t.bytes(), " bytes exceeds the data area"));
      absl::StatusOr<Allocation> a = FindAllocation(t.allocation(), t.offset(), t.bytes());
      if (!a.ok()) return a.status();
      if (request.has_write()) return context_->Write(*a, t.offset(), data.first(t.bytes()));
      return context_->Read(*a, t.offset(), data.first(t.bytes()));
    }
    case Request::kCopy: {
      // The engine names the views' ranges as allocations of their own, so each range
      // need only lie inside one allocation of the executor.
      const CopyCommand& cp = request.copy();
      const uint64_t dst = cp.dst().address() + cp.dst_offset(), src = cp.src().address() + cp.src_offset();
      if (absl::Status s = everyone_.CheckInside(dst, cp.bytes()); !s.ok()) return s;
      if (absl::Status s = everyone_.CheckInside(src, cp.bytes()); !s.ok()) return s;
      return context_->Copy({dst, cp.bytes()}, 0, {src, cp.bytes()}, 0, cp.bytes());
    }
    case Request::kLoad: {
      absl::StatusOr<std::unique_ptr<Kernel>> kernel = context_->Load(FromWire(request.load()), request.load().artifact());
      if (!kernel.ok()) return kernel.status();
      const uint64_t id = next_id_++;
      kernels_[id] = std::move(*kernel);
      reply.set_value(id);
      return absl::OkStatus();
    }
    case Request::kFreeKernel:
      if (kernels_.erase(request.free_kernel()) == 0)
        return absl::NotFoundError(absl::StrCat("executor: no kernel ", request.free_kernel()));
      return absl::OkStatus();
    case Request::kLaunch: {
      const LaunchCommand& l = request.launch();
      absl::StatusOr<const Kernel*> kernel = FindKernel(l.kernel());
      if (!kernel.ok()) return kernel.status();
      if (static_cast<size_t>(l.args_size()) != (*kernel)->signature().params.size())
        return absl::InvalidArgumentError(absl::StrCat("executor: kernel ", l.kernel(), " takes ",
                                                       (*kernel)->signature().params.size(), " arguments, got ",
                                                       l.args_size()));
      const std::vector<ArgValue> args = ArgsFromWire(l.args());
      if (absl::Status s = CheckBufferArgs(**kernel, args); !s.ok()) return s;
      absl::StatusOr<std::optional<absl::Duration>> t =
          context_->Launch(**kernel, args, FromWire(l.global()), FromWire(l.local()), l.wait());
      if (!t.ok()) return t.status();
      SetTime(*t, reply);
      return absl::OkStatus();
    }
    case Request::kSynchronize:
      return context_->Synchronize();
    case Request::kInstantiate:
    case Request::kGraphLaunch:
    case Request::kFreeGraph:
      return RunGraphCommand(request, reply);
    default:
      return absl::InvalidArgumentError("executor: not a context command");
  }
}

absl::Status ContextServer::RunGraphCommand(const Request& request, Reply& reply) {
  if (request.has_instantiate()) {
    const Instantiate& in = request.instantiate();
    std::vector<GraphNode> nodes(in.nodes_size());
    std::vector<size_t> arg_counts(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Node& n = in.nodes(static_cast<int>(i));
      if (n.kernel() != 0) {
        absl::StatusOr<const Kernel*> kernel = FindKernel(n.kernel());
        if (!kernel.ok()) return kernel.status();
        if (static_cast<size_t>(n.args_size()) != (*kernel)->signature().params.size())
          return absl::InvalidArgumentError(absl::StrCat("executor: node ", i, " has ", n.args_size(), " arguments"));
        nodes[i].kernel = *kernel;
      } else if (n.args_size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat("executor: copy node ", i, " has ", n.args_size(), " arguments"));
      }
      nodes[i].args = ArgsFromWire(n.args());
      // A kernel node's buffer arguments may be placeholders until the first launch sets
      // them (each launch's are checked); a copy node is built on real memory.
      if (nodes[i].is_copy())
        for (const ArgValue& a : nodes[i].args)
          if (absl::Status s = everyone_.CheckInside(a.address, n.copy_bytes()); !s.ok())
            return absl::OutOfRangeError(absl::StrCat("executor: copy node ", i, ": ", s.message()));
      nodes[i].global = FromWire(n.global());
      nodes[i].local = FromWire(n.local());
      nodes[i].copy_bytes = n.copy_bytes();
      arg_counts[i] = nodes[i].args.size();
    }
    if (in.edge_from_size() != in.edge_to_size()) return absl::InvalidArgumentError("executor: unpaired edges");
    std::vector<std::pair<size_t, size_t>> edges;
    for (int i = 0; i < in.edge_from_size(); ++i) {
      if (in.edge_from(i) >= nodes.size() || in.edge_to(i) >= nodes.size())
        return absl::InvalidArgumentError("executor: an edge names no node");
      edges.emplace_back(in.edge_from(i), in.edge_to(i));
    }
    absl::StatusOr<GraphValues> layout = GraphValues::For(arg_counts);
    if (!layout.ok()) return layout.status();
    absl::StatusOr<std::unique_ptr<DeviceGraph>> graph = context_->Instantiate(nodes, edges);
    if (!graph.ok()) return graph.status();
    std::vector<uint64_t> values(layout->size());
    std::vector<uint64_t> reach(layout->size(), kNotAnAddress);
    for (size_t i = 0; i < nodes.size(); ++i) {
      layout->Store(i, nodes[i].args, nodes[i].global, nodes[i].local, values);
      for (size_t a = 0; a < nodes[i].args.size(); ++a)
        if (nodes[i].is_copy()) {
          reach[layout->first(i) + a] = nodes[i].copy_bytes;
        } else if (nodes[i].kernel->signature().params[a].kind == ParamKind::kBuffer) {
          reach[layout->first(i) + a] = 0;
        }
    }
    const uint64_t id = next_id_++;
    graphs_.insert_or_assign(id, GraphState{std::move(*graph), *std::move(layout), std::move(values),
                                            std::vector<bool>(nodes.size(), false), std::move(reach)});
    reply.set_value(id);
    return absl::OkStatus();
  }
  const uint64_t id = request.has_free_graph() ? request.free_graph() : request.graph_launch().graph();
  auto it = graphs_.find(id);
  if (it == graphs_.end()) return absl::NotFoundError(absl::StrCat("executor: no graph ", id));
  if (request.has_free_graph()) {
    graphs_.erase(it);
    return absl::OkStatus();
  }
  GraphState& g = it->second;
  const GraphLaunch& launch = request.graph_launch();
  const auto& indexes = launch.update_indexes();
  const auto& values = launch.update_values();
  // Every value is checked before any is set: a launch that does not fit changes nothing.
  auto check = [&](size_t index, uint64_t value) {
    if (g.reach[index] == kNotAnAddress) return absl::OkStatus();
    absl::Status s = everyone_.CheckInside(value, g.reach[index]);
    if (s.ok()) return s;
    const size_t node = g.layout.node_of(index);
    return absl::OutOfRangeError(
        absl::StrCat("executor: argument ", index - g.layout.first(node), " of node ", node, ": ", s.message()));
  };
  updated_nodes_.clear();
  if (launch.all()) {
    if (!indexes.empty() || static_cast<size_t>(values.size()) != g.values.size())
      return absl::InvalidArgumentError(
          absl::StrCat("executor: ", values.size(), " values for a graph of ", g.values.size()));
    for (size_t i = 0; i < g.values.size(); ++i)
      if (absl::Status s = check(i, values[static_cast<int>(i)]); !s.ok()) return s;
    std::copy(values.begin(), values.end(), g.values.begin());
    for (size_t node = 0; node < g.layout.nodes(); ++node) updated_nodes_.push_back(node);
  } else {
    if (indexes.size() != values.size()) return absl::InvalidArgumentError("executor: updates without their values");
    for (int i = 0; i < indexes.size(); ++i) {
      if (indexes[i] >= g.values.size())
        return absl::InvalidArgumentError(absl::StrCat("executor: an update of value ", indexes[i], " does not fit"));
      if (absl::Status s = check(indexes[i], values[i]); !s.ok()) return s;
    }
    for (int i = 0; i < indexes.size(); ++i) {
      g.values[indexes[i]] = values[i];
      const size_t node = g.layout.node_of(indexes[i]);
      if (!g.updated[node]) {
        g.updated[node] = true;
        updated_nodes_.push_back(node);
      }
    }
  }
  absl::Status updated = absl::OkStatus();
  for (size_t node : updated_nodes_) {
    g.updated[node] = false;
    Dim3 global, local;
    g.layout.Load(node, g.values, update_args_, global, local);
    if (updated.ok()) updated = g.graph->Update(node, update_args_, global, local);
  }
  if (!updated.ok()) return updated;
  absl::StatusOr<std::optional<absl::Duration>> t = g.graph->Launch(request.graph_launch().wait());
  if (!t.ok()) return t.status();
  SetTime(*t, reply);
  return absl::OkStatus();
}

}  // namespace replayd::executor
