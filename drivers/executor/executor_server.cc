#include "drivers/executor/executor_server.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "drivers/executor/wire.h"

namespace replayd::executor {

int ExecutorServer::Run(pid_t parent) {
  Request request;
  Reply reply;
  for (;;) {
    absl::StatusOr<uint64_t> bytes = channel_.AwaitRequest([&] { return getppid() != parent; });
    if (!bytes.ok()) return bytes.status().code() == absl::StatusCode::kUnavailable ? 0 : 1;
    std::span<uint8_t> in = channel_.request();
    if (!request.ParseFromArray(in.data(), static_cast<int>(*bytes))) {
      reply.Clear();
      reply.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
      reply.set_message("executor: a request that does not parse");
    } else {
      reply = Handle(request, channel_.data());
    }
    std::span<uint8_t> out = channel_.reply();
    const size_t size = reply.ByteSizeLong();
    if (size > out.size() || !reply.SerializeToArray(out.data(), static_cast<int>(out.size()))) return 1;
    channel_.PostReply(size);
  }
}

Reply ExecutorServer::Handle(const Request& request, std::span<uint8_t> data) {
  Reply reply;
  absl::Status s = Run(request, data, reply);
  reply.set_code(static_cast<int>(s.code()));
  if (!s.ok()) reply.set_message(std::string(s.message()));
  reply.set_memory_in_use(device_.memory_in_use());
  return reply;
}

absl::StatusOr<ExecutorServer::ContextState*> ExecutorServer::FindContext(uint64_t id) {
  auto it = contexts_.find(id);
  if (it == contexts_.end()) return absl::NotFoundError(absl::StrCat("executor: no context ", id));
  return &it->second;
}

absl::StatusOr<Allocation> ExecutorServer::FindAllocation(ContextState& c, const Region& region, uint64_t offset,
                                                          uint64_t bytes) {
  auto it = c.allocations.find(region.address());
  if (it == c.allocations.end() || it->second.bytes != region.bytes())
    return absl::NotFoundError(absl::StrCat("executor: no allocation at 0x", absl::Hex(region.address())));
  if (offset > it->second.bytes || bytes > it->second.bytes - offset)
    return absl::OutOfRangeError(absl::StrCat("executor: ", bytes, " bytes at offset ", offset,
                                              " exceed an allocation of ", it->second.bytes));
  return it->second;
}

absl::StatusOr<const Kernel*> ExecutorServer::FindKernel(uint64_t context, uint64_t id) const {
  auto it = kernels_.find(id);
  if (it == kernels_.end() || it->second.context != context)
    return absl::NotFoundError(absl::StrCat("executor: no kernel ", id, " in context ", context));
  return it->second.kernel.get();
}

void ExecutorServer::CloseContext(uint64_t id) {
  std::erase_if(graphs_, [&](const auto& g) { return g.second.context == id; });
  std::erase_if(kernels_, [&](const auto& k) { return k.second.context == id; });
  auto it = contexts_.find(id);
  if (it == contexts_.end()) return;
  for (const auto& [address, allocation] : it->second.allocations) it->second.context->Free(allocation);
  contexts_.erase(it);
}

absl::Status ExecutorServer::Run(const Request& request, std::span<uint8_t> data, Reply& reply) {
  if (request.command_case() == Request::kOpenContext) {
    absl::StatusOr<std::unique_ptr<Context>> context = device_.OpenContext("");
    if (!context.ok()) return context.status();
    const uint64_t id = next_id_++;
    contexts_[id].context = std::move(*context);
    reply.set_value(id);
    return absl::OkStatus();
  }
  absl::StatusOr<ContextState*> found = FindContext(request.context());
  if (!found.ok()) return found.status();
  ContextState& c = **found;
  switch (request.command_case()) {
    case Request::kCloseContext:
      CloseContext(request.context());
      return absl::OkStatus();
    case Request::kAllocate: {
      absl::StatusOr<Allocation> a = c.context->Allocate(request.allocate());
      if (!a.ok()) return a.status();
      c.allocations[a->address] = *a;
      reply.set_value(a->address);
      return absl::OkStatus();
    }
    case Request::kFree: {
      absl::StatusOr<Allocation> a = FindAllocation(c, request.free(), 0, 0);
      if (!a.ok()) return a.status();
      c.context->Free(*a);
      c.allocations.erase(a->address);
      return absl::OkStatus();
    }
    case Request::kWrite:
    case Request::kRead: {
      const Transfer& t = request.has_write() ? request.write() : request.read();
      if (t.bytes() > data.size())
        return absl::InvalidArgumentError(absl::StrCat("executor: a transfer of ", t.bytes(), " bytes exceeds the data area"));
      absl::StatusOr<Allocation> a = FindAllocation(c, t.allocation(), t.offset(), t.bytes());
      if (!a.ok()) return a.status();
      if (request.has_write()) return c.context->Write(*a, t.offset(), data.first(t.bytes()));
      return c.context->Read(*a, t.offset(), data.first(t.bytes()));
    }
    case Request::kCopy: {
      const CopyCommand& cp = request.copy();
      absl::StatusOr<Allocation> dst = FindAllocation(c, cp.dst(), cp.dst_offset(), cp.bytes());
      if (!dst.ok()) return dst.status();
      absl::StatusOr<Allocation> src = FindAllocation(c, cp.src(), cp.src_offset(), cp.bytes());
      if (!src.ok()) return src.status();
      return c.context->Copy(*dst, cp.dst_offset(), *src, cp.src_offset(), cp.bytes());
    }
    case Request::kLoad: {
      const ProgramSource source = FromWire(request.load());
      absl::StatusOr<std::unique_ptr<Kernel>> kernel = c.context->Load(source, request.load().artifact());
      if (!kernel.ok()) return kernel.status();
      const uint64_t id = next_id_++;
      kernels_[id] = {request.context(), std::move(*kernel)};
      reply.set_value(id);
      return absl::OkStatus();
    }
    case Request::kFreeKernel: {
      auto it = kernels_.find(request.free_kernel());
      if (it == kernels_.end() || it->second.context != request.context())
        return absl::NotFoundError(absl::StrCat("executor: no kernel ", request.free_kernel()));
      kernels_.erase(it);
      return absl::OkStatus();
    }
    case Request::kLaunch: {
      const LaunchCommand& l = request.launch();
      absl::StatusOr<const Kernel*> kernel = FindKernel(request.context(), l.kernel());
      if (!kernel.ok()) return kernel.status();
      if (static_cast<size_t>(l.args_size()) != (*kernel)->signature().params.size())
        return absl::InvalidArgumentError(absl::StrCat("executor: kernel ", l.kernel(), " takes ",
                                                       (*kernel)->signature().params.size(), " arguments, got ",
                                                       l.args_size()));
      const std::vector<ArgValue> args = ArgsFromWire(l.args());
      absl::StatusOr<std::optional<absl::Duration>> t =
          c.context->Launch(**kernel, args, FromWire(l.global()), FromWire(l.local()), l.wait());
      if (!t.ok()) return t.status();
      SetTime(*t, reply);
      return absl::OkStatus();
    }
    case Request::kSynchronize:
      return c.context->Synchronize();
    case Request::kInstantiate:
    case Request::kGraphLaunch:
    case Request::kFreeGraph:
      return RunGraphCommand(request, reply);
    default:
      return absl::InvalidArgumentError("executor: an unknown command");
  }
}

absl::Status ExecutorServer::RunGraphCommand(const Request& request, Reply& reply) {
  ContextState& c = contexts_.at(request.context());
  if (request.has_instantiate()) {
    const Instantiate& in = request.instantiate();
    std::vector<GraphNode> nodes(in.nodes_size());
    std::vector<size_t> arg_counts(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Node& n = in.nodes(static_cast<int>(i));
      if (n.kernel() != 0) {
        absl::StatusOr<const Kernel*> kernel = FindKernel(request.context(), n.kernel());
        if (!kernel.ok()) return kernel.status();
        if (static_cast<size_t>(n.args_size()) != (*kernel)->signature().params.size())
          return absl::InvalidArgumentError(absl::StrCat("executor: node ", i, " has ", n.args_size(), " arguments"));
        nodes[i].kernel = *kernel;
      } else if (n.args_size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat("executor: copy node ", i, " has ", n.args_size(), " arguments"));
      }
      nodes[i].args = ArgsFromWire(n.args());
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
    absl::StatusOr<std::unique_ptr<DeviceGraph>> graph = c.context->Instantiate(nodes, edges);
    if (!graph.ok()) return graph.status();
    const uint64_t id = next_id_++;
    graphs_[id] = {request.context(), std::move(*graph), std::move(arg_counts)};
    reply.set_value(id);
    return absl::OkStatus();
  }
  const uint64_t id = request.has_free_graph() ? request.free_graph() : request.graph_launch().graph();
  auto it = graphs_.find(id);
  if (it == graphs_.end() || it->second.context != request.context())
    return absl::NotFoundError(absl::StrCat("executor: no graph ", id));
  if (request.has_free_graph()) {
    graphs_.erase(it);
    return absl::OkStatus();
  }
  GraphState& g = it->second;
  for (const NodeUpdate& u : request.graph_launch().updates()) {
    if (u.node() >= g.arg_counts.size() || static_cast<size_t>(u.args_size()) != g.arg_counts[u.node()])
      return absl::InvalidArgumentError(absl::StrCat("executor: an update of node ", u.node(), " does not fit"));
    const std::vector<ArgValue> args = ArgsFromWire(u.args());
    if (absl::Status s = g.graph->Update(u.node(), args, FromWire(u.global()), FromWire(u.local())); !s.ok()) return s;
  }
  absl::StatusOr<std::optional<absl::Duration>> t = g.graph->Launch(request.graph_launch().wait());
  if (!t.ok()) return t.status();
  SetTime(*t, reply);
  return absl::OkStatus();
}

}  // namespace replayd::executor
