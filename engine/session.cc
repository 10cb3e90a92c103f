#include "engine/session.h"

#include "spdlog/spdlog.h"

#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"

namespace replayd {

DeviceSession::DeviceSession(SessionId id, std::string tenant, SessionEnv env, std::shared_ptr<Context> context,
                 absl::Duration lease)
    : id_(id),
      tenant_(std::move(tenant)),
      env_(env),
      lease_(lease),
      deadline_ns_(absl::ToUnixNanos(absl::Now() + lease)),
      context_(std::move(context)) {}

DeviceSession::~DeviceSession() { Close(); }

void DeviceSession::Renew(absl::Time now) { deadline_ns_.store(absl::ToUnixNanos(now + lease_)); }

bool DeviceSession::Expired(absl::Time now) const { return absl::ToUnixNanos(now) > deadline_ns_.load(); }

void DeviceSession::Close() {
  absl::MutexLock lock(&mu_);
  CloseLocked();
}

bool DeviceSession::TryClose() {
  if (!mu_.TryLock()) return false;
  CloseLocked();
  mu_.Unlock();
  return true;
}

void DeviceSession::CloseLocked() {
  if (closed_) return;
  closed_ = true;
  lost_ = context_->health();
  // Wait for submitted work before its memory goes.
  context_->Synchronize().IgnoreError();
  DropCapture();
  env_.account->Release(Resource::kGraphs, graphs_.size());
  env_.account->Release(Resource::kPrograms, programs_.size());
  env_.account->Release(Resource::kSessions, 1);
  graphs_.Clear();
  graph_count_ = 0;
  env_.graph_cache->EvictOwner(id_);
  programs_.Clear();
  program_count_ = 0;
  buffers_.Clear();
  memory_in_use_ = 0;
}

absl::Status DeviceSession::CheckOpen() const {
  if (!closed_) return absl::OkStatus();
  // A session closed because its context was lost (an executor died) goes on answering
  // the cause to whoever still holds it (a Session stream), as FindSession does.
  if (!lost_.ok()) return lost_;
  return absl::NotFoundError(absl::StrCat("session ", id_, " is closed"));
}

absl::StatusOr<std::shared_ptr<DeviceBuffer>> DeviceSession::FindBuffer(Handle buffer) const {
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  return buffers_.Find(buffer);
}

uint64_t DeviceSession::memory_in_use() const { return memory_in_use_.load(); }
size_t DeviceSession::program_count() const { return program_count_.load(); }
size_t DeviceSession::graph_count() const { return graph_count_.load(); }

absl::StatusOr<Handle> DeviceSession::AllocBuffer(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  if (bytes == 0) return absl::InvalidArgumentError("buffer size is 0 bytes");
  if (bytes > device().total_memory)
    return absl::ResourceExhaustedError(absl::StrCat("buffer of ", bytes, " bytes exceeds ", device().id,
                                                     "'s memory of ", device().total_memory, " bytes"));
  absl::StatusOr<Allocation> allocation = context_->Allocate(bytes);
  if (!allocation.ok()) return allocation.status();
  memory_in_use_ += bytes;
  auto buffer = std::make_shared<DeviceBuffer>(context_, *allocation);
  if (capture_) capture_->NoteAllocated(*buffer);
  return buffers_.Insert(std::move(buffer));
}

absl::Status DeviceSession::FreeBuffer(Handle buffer) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<DeviceBuffer>> removed = buffers_.Remove(buffer);
  if (!removed.ok()) return removed.status();
  memory_in_use_ -= (*removed)->allocation.bytes;
  if (capture_) capture_->NoteFreed(**removed);
  return absl::OkStatus();
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> DeviceSession::ResolveRange(Handle buffer, uint64_t offset, uint64_t length) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<DeviceBuffer>> b = FindBuffer(buffer);
  if (!b.ok()) return b.status();
  return ResolveView(ViewArg{buffer, offset, length}, (*b)->allocation.bytes);
}

absl::Status DeviceSession::WriteBuffer(Handle buffer, uint64_t offset, std::span<const uint8_t> bytes) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<DeviceBuffer>> b = FindBuffer(buffer);
  if (!b.ok()) return b.status();
  if (bytes.empty()) return absl::OkStatus();
  absl::StatusOr<std::pair<uint64_t, uint64_t>> range =
      ResolveView(ViewArg{buffer, offset, bytes.size()}, (*b)->allocation.bytes);
  if (!range.ok()) return range.status();
  absl::StatusOr<Scheduler::Turn> turn = env_.scheduler->Acquire(env_.queue);
  if (!turn.ok()) return turn.status();
  return context_->Write((*b)->allocation, offset, bytes);
}

absl::Status DeviceSession::ReadBuffer(Handle buffer, uint64_t offset, std::span<uint8_t> bytes) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<DeviceBuffer>> b = FindBuffer(buffer);
  if (!b.ok()) return b.status();
  if (bytes.empty()) return absl::OkStatus();
  absl::StatusOr<std::pair<uint64_t, uint64_t>> range =
      ResolveView(ViewArg{buffer, offset, bytes.size()}, (*b)->allocation.bytes);
  if (!range.ok()) return range.status();
  absl::StatusOr<Scheduler::Turn> turn = env_.scheduler->Acquire(env_.queue);
  if (!turn.ok()) return turn.status();
  return context_->Read((*b)->allocation, offset, bytes);
}

absl::StatusOr<ProgramInfo> DeviceSession::LoadProgram(const ProgramSource& source) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckOpen(); !s.ok()) return s;
  }
  if (absl::Status s = CheckProgramSource(source, device()); !s.ok()) return s;
  // The quota is checked before the compile, which can be long, and released on failure.
  if (absl::Status s = env_.account->Reserve(Resource::kPrograms, 1); !s.ok()) return s;
  Reservation reserved(env_.account, Resource::kPrograms, 1);
  // Compiling can take seconds: the session's other operations go on meanwhile.
  absl::StatusOr<CompiledArtifact> artifact = env_.compile_cache->GetOrCompile(*env_.device, source);
  if (!artifact.ok()) return artifact.status();
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Kernel>> kernel = context_->Load(source, artifact->path);
  if (!kernel.ok() && artifact->cache_hit) {
    // An artifact that no longer loads (a foreign or damaged file): build it anew once.
    spdlog::warn("program {} (entry '{}'): its cached artifact does not load ({}): compiling it again", artifact->key,
                 source.entry, std::string(kernel.status().message()));
    env_.compile_cache->Invalidate(artifact->key);
    artifact = env_.compile_cache->GetOrCompile(*env_.device, source);
    if (!artifact.ok()) return artifact.status();
    kernel = context_->Load(source, artifact->path);
  }
  if (!kernel.ok()) return kernel.status();
  auto program = std::make_shared<Program>();
  program->key = artifact->key;
  program->entry = source.entry;
  program->kernel = std::move(*kernel);
  ProgramInfo info;
  info.handle = programs_.Insert(std::move(program));
  ++program_count_;
  reserved.Commit();
  info.key = artifact->key;
  info.cache_hit = artifact->cache_hit;
  info.compile_time = artifact->compile_time;
  return info;
}

absl::Status DeviceSession::FreeProgram(Handle program) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  if (absl::Status s = programs_.Remove(program).status(); !s.ok()) return s;
  --program_count_;
  env_.account->Release(Resource::kPrograms, 1);
  return absl::OkStatus();
}

absl::Status DeviceSession::PackArgs(const Kernel& kernel, const LaunchOp& op, std::span<const VariableDecl> variables,
                               std::span<const int64_t> values, std::vector<ArgValue>& out) const {
  const std::vector<Param>& params = kernel.signature().params;
  if (op.args.size() != params.size())
    return absl::InvalidArgumentError(
        absl::StrCat("program ", op.program, " takes ", params.size(), " arguments, got ", op.args.size()));
  out.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    const CallArg& arg = op.args[i];
    if (p.kind == ParamKind::kBuffer) {
      const ViewArg* view = std::get_if<ViewArg>(&arg);
      if (!view) return absl::InvalidArgumentError(absl::StrCat("argument ", i, " must be a view of a buffer"));
      absl::StatusOr<std::shared_ptr<DeviceBuffer>> b = FindBuffer(view->buffer);
      if (!b.ok()) return absl::NotFoundError(absl::StrCat("argument ", i, ": ", b.status().message()));
      absl::StatusOr<std::pair<uint64_t, uint64_t>> range = ResolveView(*view, (*b)->allocation.bytes);
      if (!range.ok()) return absl::InvalidArgumentError(absl::StrCat("argument ", i, ": ", range.status().message()));
      out[i].address = (*b)->allocation.address + range->first;
      continue;
    }
    const Expression* e = std::get_if<Expression>(&arg);
    if (!e) return absl::InvalidArgumentError(absl::StrCat("argument ", i, " must be an integer"));
    absl::StatusOr<int64_t> value = EvaluateChecked(*e, variables, values);
    if (!value.ok()) return absl::InvalidArgumentError(absl::StrCat("argument ", i, ": ", value.status().message()));
    if (p.kind == ParamKind::kInt32 &&
        (*value < std::numeric_limits<int32_t>::min() || *value > std::numeric_limits<int32_t>::max()))
      return absl::InvalidArgumentError(absl::StrCat("argument ", i, ": ", *value, " does not fit in int32"));
    out[i].integer = *value;
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<Dim3> EvaluateDims(const std::vector<Expression>& dims, const Dim3& max, uint64_t max_total,
                                  std::span<const VariableDecl> variables, std::span<const int64_t> values,
                                  absl::string_view what) {
  std::vector<uint64_t> evaluated;
  for (size_t d = 0; d < dims.size() && d < 4; ++d) {
    absl::StatusOr<int64_t> v = EvaluateChecked(dims[d], variables, values);
    if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat(what, "[", d, "]: ", v.status().message()));
    if (*v < 0) return absl::InvalidArgumentError(absl::StrCat(what, "[", d, "] = ", *v, " is negative"));
    evaluated.push_back(static_cast<uint64_t>(*v));
  }
  if (dims.size() > 3) evaluated.resize(dims.size());
  return CheckDims(evaluated, max, max_total, what);
}

std::array<Expression, 3> PadDims(const std::vector<Expression>& dims) {
  std::array<Expression, 3> out{Expression::Constant(1), Expression::Constant(1), Expression::Constant(1)};
  for (size_t d = 0; d < dims.size() && d < 3; ++d) out[d] = dims[d];
  return out;
}

}  // namespace

absl::StatusOr<LaunchResult> DeviceSession::Launch(const LaunchOp& op) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<Program>> program = programs_.Find(op.program);
  if (!program.ok()) return program.status();
  absl::StatusOr<BoundValues> bound = CheckBoundVariables(op.variables);
  if (!bound.ok()) return bound.status();
  const LaunchLimits& limits = device().limits;
  absl::StatusOr<Dim3> global = EvaluateDims(op.global, limits.max_global, limits.max_global_total,
                                             bound->variables, bound->values, "global");
  if (!global.ok()) return global.status();
  absl::StatusOr<Dim3> local =
      EvaluateDims(op.local, limits.max_local, limits.max_local_total, bound->variables, bound->values, "local");
  if (!local.ok()) return local.status();
  std::vector<ArgValue>& args = launch_args_;
  if (absl::Status s = PackArgs(*(*program)->kernel, op, bound->variables, bound->values, args); !s.ok()) return s;
  absl::StatusOr<Scheduler::Turn> turn = env_.scheduler->Acquire(env_.queue);
  if (!turn.ok()) return turn.status();
  if (capture_) {
    absl::StatusOr<std::vector<RecordedArg>> recorded = RecordedArgs(op);
    if (!recorded.ok()) return recorded.status();
    if (absl::Status s = capture_->RecordLaunch(*program, std::move(*recorded), PadDims(op.global),
                                                PadDims(op.local), bound->variables);
        !s.ok())
      return s;
    if (absl::Status s = ChargeCapture(); !s.ok()) {
      capture_->ForgetLast();
      return s;
    }
  }
  absl::StatusOr<std::optional<absl::Duration>> time =
      context_->Launch(*(*program)->kernel, args, *global, *local, op.wait);
  if (!time.ok()) {
    ForgetLastRecorded();  // recorded, then refused by the device
    return time.status();
  }
  return LaunchResult{*time};
}

absl::Status DeviceSession::ChargeCapture() {
  const uint64_t bytes = capture_ ? capture_->host_bytes() : 0;
  if (bytes > capture_charged_) {
    if (absl::Status s = env_.account->Reserve(Resource::kHostMemory, bytes - capture_charged_); !s.ok()) return s;
  } else {
    env_.account->Release(Resource::kHostMemory, capture_charged_ - bytes);
  }
  capture_charged_ = bytes;
  return absl::OkStatus();
}

void DeviceSession::ForgetLastRecorded() {
  if (!capture_) return;
  capture_->ForgetLast();
  ChargeCapture().IgnoreError();  // gives back: cannot fail
}

void DeviceSession::DropCapture() {
  capture_.reset();
  ChargeCapture().IgnoreError();  // gives back: cannot fail
}

absl::StatusOr<std::vector<RecordedArg>> DeviceSession::RecordedArgs(const LaunchOp& op) const {
  std::vector<RecordedArg> args;
  for (const CallArg& arg : op.args) {
    if (const ViewArg* v = std::get_if<ViewArg>(&arg)) {
      absl::StatusOr<std::shared_ptr<DeviceBuffer>> b = FindBuffer(v->buffer);
      if (!b.ok()) return b.status();
      args.push_back(RecordedView{std::move(*b), *v});
    } else {
      args.push_back(std::get<Expression>(arg));
    }
  }
  return args;
}

absl::StatusOr<std::vector<std::shared_ptr<DeviceBuffer>>> DeviceSession::FindBuffers(const std::vector<Handle>& handles) const {
  std::vector<std::shared_ptr<DeviceBuffer>> found;
  for (Handle h : handles) {
    absl::StatusOr<std::shared_ptr<DeviceBuffer>> b = FindBuffer(h);
    if (!b.ok()) return b.status();
    found.push_back(std::move(*b));
  }
  return found;
}

absl::StatusOr<LaunchResult> DeviceSession::CopyBuffer(const CopyOp& op) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  std::shared_ptr<DeviceBuffer> buffers[2];
  std::pair<uint64_t, uint64_t> ranges[2];
  const ViewArg* views[2] = {&op.dst, &op.src};
  for (int i = 0; i < 2; ++i) {
    const char* what = i == 0 ? "destination" : "source";
    absl::StatusOr<std::shared_ptr<DeviceBuffer>> b = FindBuffer(views[i]->buffer);
    if (!b.ok()) return absl::NotFoundError(absl::StrCat(what, ": ", b.status().message()));
    absl::StatusOr<std::pair<uint64_t, uint64_t>> r = ResolveView(*views[i], (*b)->allocation.bytes);
    if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", r.status().message()));
    buffers[i] = std::move(*b);
    ranges[i] = *r;
  }
  absl::StatusOr<uint64_t> bytes = CheckCopyRanges(ranges[0], ranges[1], buffers[0] == buffers[1]);
  if (!bytes.ok()) return bytes.status();
  if (capture_) {
    if (absl::Status s = capture_->CheckRoom(); !s.ok()) return s;
  }
  absl::StatusOr<Scheduler::Turn> turn = env_.scheduler->Acquire(env_.queue);
  if (!turn.ok()) return turn.status();
  if (capture_) {
    if (absl::Status s = capture_->RecordCopy({buffers[0], op.dst}, {buffers[1], op.src}); !s.ok()) return s;
    if (absl::Status s = ChargeCapture(); !s.ok()) {
      capture_->ForgetLast();
      return s;
    }
  }
  absl::StatusOr<std::optional<absl::Duration>> time =
      SubmitCopy(*context_, buffers[0]->allocation.address + ranges[0].first,
                 buffers[1]->allocation.address + ranges[1].first, *bytes, op.wait);
  if (!time.ok()) {
    ForgetLastRecorded();  // recorded, then refused by the device
    return time.status();
  }
  return LaunchResult{*time};
}

absl::Status DeviceSession::BeginCapture(const std::vector<Handle>& inputs, const std::vector<VariableDecl>& variables) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  if (capture_) return absl::FailedPreconditionError("a capture is already open in this session");
  std::vector<CapturedBuffer> named;
  for (Handle h : inputs) {
    absl::StatusOr<std::shared_ptr<DeviceBuffer>> b = FindBuffer(h);
    if (!b.ok()) return b.status();
    named.push_back({h, std::move(*b)});
  }
  absl::StatusOr<CaptureRecord> record = CaptureRecord::Open(std::move(named), variables);
  if (!record.ok()) return record.status();
  capture_.emplace(std::move(*record));
  return absl::OkStatus();
}

absl::StatusOr<GraphInfo> DeviceSession::EndCapture(const std::vector<Handle>& outputs, bool discard) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  if (!capture_) return absl::FailedPreconditionError("no capture is open in this session");
  if (discard) {
    DropCapture();
    return GraphInfo();
  }
  if (capture_->call_count() == 0)
    return absl::FailedPreconditionError("the capture recorded no call; launch, or end it with discard");
  absl::StatusOr<std::vector<std::shared_ptr<DeviceBuffer>>> output_buffers = FindBuffers(outputs);
  if (!output_buffers.ok()) return output_buffers.status();
  absl::StatusOr<GraphInfo> info = AddGraph(capture_->ToGraph(*output_buffers));
  if (info.ok()) DropCapture();
  return info;
}

absl::StatusOr<Graph> DeviceSession::GraphFromDef(const GraphDef& def) {
  Graph g;
  g.variables = def.variables;
  for (size_t i = 0; i < def.slots.size(); ++i) {
    const SlotDef& sd = def.slots[i];
    Slot slot{sd.kind, sd.bytes, nullptr};
    if (sd.kind == SlotKind::kConstant) {
      absl::StatusOr<std::shared_ptr<DeviceBuffer>> b = FindBuffer(sd.buffer);
      if (!b.ok()) return absl::NotFoundError(absl::StrCat("slot ", i, ": ", b.status().message()));
      if (sd.bytes != 0 && sd.bytes != (*b)->allocation.bytes)
        return absl::InvalidArgumentError(absl::StrCat("slot ", i, ": ", sd.bytes, " bytes declared, buffer ",
                                                       sd.buffer, " has ", (*b)->allocation.bytes));
      slot.bytes = (*b)->allocation.bytes;
      slot.constant = *b;
    }
    g.slots.push_back(std::move(slot));
  }
  for (size_t i = 0; i < def.calls.size(); ++i) {
    const CallDef& cd = def.calls[i];
    if (cd.copy) {
      if (cd.program != 0 || !cd.global.empty() || !cd.local.empty())
        return absl::InvalidArgumentError(absl::StrCat("call ", i, ": a copy has no program and no dimensions"));
      GraphCall call;
      call.args = cd.args;
      g.calls.push_back(std::move(call));
      continue;
    }
    absl::StatusOr<std::shared_ptr<Program>> p = programs_.Find(cd.program);
    if (!p.ok()) return absl::NotFoundError(absl::StrCat("call ", i, ": ", p.status().message()));
    if (cd.global.size() > 3 || cd.local.size() > 3)
      return absl::InvalidArgumentError(absl::StrCat("call ", i, ": more than 3 dimensions"));
    g.calls.push_back({*p, cd.args, PadDims(cd.global), PadDims(cd.local)});
  }
  return g;
}

absl::StatusOr<GraphInfo> DeviceSession::DefineGraph(const GraphDef& def) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  if (absl::Status s = CheckGraphLimits(def.variables.size(), def.slots.size(), def.calls.size()); !s.ok()) return s;
  absl::StatusOr<Graph> g = GraphFromDef(def);
  if (!g.ok()) return g.status();
  return AddGraph(std::move(*g));
}

absl::StatusOr<GraphInfo> DeviceSession::AddGraph(Graph graph) {
  if (absl::Status s = CheckGraph(graph, device()); !s.ok()) return s;
  if (absl::Status s = env_.account->Reserve(Resource::kGraphs, 1); !s.ok()) return s;
  Reservation reserved(env_.account, Resource::kGraphs, 1);
  std::string structure = GraphStructure(graph, context_->address_space());
  std::shared_ptr<GraphInstance> instance = env_.graph_cache->Lookup(structure);
  const bool hit = instance != nullptr;
  if (!hit) {
    absl::StatusOr<std::shared_ptr<GraphInstance>> created =
        GraphInstance::Create(std::move(graph), std::move(structure), context_, env_.batch);
    if (!created.ok()) return created.status();
    instance = std::move(*created);
    // Its host memory counts against the tenant's quota; instances that only the cache
    // still holds give theirs back first when it would not fit.
    absl::Status charged = instance->Charge(env_.account);
    if (charged.code() == absl::StatusCode::kResourceExhausted && env_.graph_cache->EvictUnheld() > 0)
      charged = instance->Charge(env_.account);
    if (!charged.ok()) return charged;
    env_.graph_cache->Insert(instance, id_);
  }
  Handle h = graphs_.Insert(instance);
  ++graph_count_;
  reserved.Commit();
  return Describe(h, *instance, hit);
}

GraphInfo DeviceSession::Describe(Handle handle, const GraphInstance& instance, bool cache_hit) const {
  GraphInfo info;
  info.handle = handle;
  info.key = instance.key();
  info.cache_hit = cache_hit;
  info.calls = instance.graph().calls.size();
  info.batches = instance.batch_count();
  info.arena_bytes = instance.plan().arena_bytes;
  info.saved_bytes = instance.plan().saved_bytes;
  info.replays = instance.replays();
  for (uint32_t slot : instance.buffer_params())
    info.params.push_back({true, slot, instance.graph().slots[slot].bytes, {}});
  for (const VariableDecl& v : instance.graph().variables) info.params.push_back({false, 0, 0, v});
  info.cache = env_.graph_cache->stats();
  return info;
}

absl::StatusOr<GraphInfo> DeviceSession::DescribeGraph(Handle graph) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<GraphInstance>> g = graphs_.Find(graph);
  if (!g.ok()) return g.status();
  return Describe(graph, **g, false);
}

absl::Status DeviceSession::FreeGraph(Handle graph) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  if (absl::Status s = graphs_.Remove(graph).status(); !s.ok()) return s;
  --graph_count_;
  env_.account->Release(Resource::kGraphs, 1);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<GraphInstance>> DeviceSession::FindReplayable(Handle graph) const {
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  if (capture_) return absl::FailedPreconditionError("ReplayGraph while a capture is open");
  return graphs_.Find(graph);
}

absl::StatusOr<ReplayOutcome> DeviceSession::ReplayGraph(const ReplayOp& op) {
  ReplayOutcome result;
  if (absl::Status s = ReplayGraph(op, result); !s.ok()) return s;
  return result;
}

absl::Status DeviceSession::ReplayGraph(const ReplayOp& op, ReplayOutcome& result) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<GraphInstance>> g = FindReplayable(op.graph);
  if (!g.ok()) return g.status();
  std::vector<uint64_t>& addresses = replay_scratch_.addresses;
  std::vector<int64_t>& values = replay_scratch_.values;
  std::vector<ResolvedRead>& reads = replay_scratch_.reads;
  // The scratch keeps its capacity but must not keep the buffers alive past this call.
  struct ReleaseReads {
    std::vector<ResolvedRead>& reads;
    ~ReleaseReads() { reads.clear(); }
  } release{reads};
  if (absl::Status s = ResolveParams(**g, op.params, buffers_, addresses, values); !s.ok()) return s;
  if (absl::Status s = ResolveReads(op.reads, buffers_, reads); !s.ok()) return s;
  absl::StatusOr<Scheduler::Turn> turn = env_.scheduler->Acquire(env_.queue);
  if (!turn.ok()) return turn.status();
  // Reads, and the session's later work, are ordered after the replay on the session's
  // context. An instance another session created runs on that one's context: this
  // session's earlier work is finished first and the replay waited for.
  const bool foreign = !(*g)->RunsOn(*context_);
  if (foreign)
    if (absl::Status s = context_->Synchronize(); !s.ok()) return s;
  absl::StatusOr<std::optional<absl::Duration>> time = (*g)->Replay(addresses, values, op.wait || foreign);
  if (!time.ok()) return time.status();
  result.device_time = op.wait ? *time : std::nullopt;
  return TakeReads(*context_, reads, result.reads);
}

absl::StatusOr<SequenceOutcome> DeviceSession::ReplaySequence(const ReplaySequenceOp& op, const ReplayCallback& on_replay) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<GraphInstance>> found = FindReplayable(op.graph);
  if (!found.ok()) return found.status();
  GraphInstance& g = **found;
  // Every vector and read is checked before the first replay runs.
  absl::StatusOr<SequenceVectors> vectors = SequenceVectors::Check(g, op, buffers_);
  if (!vectors.ok()) return vectors.status();
  std::vector<ResolvedRead> reads;
  if (absl::Status s = ResolveReads(op.reads, buffers_, reads); !s.ok()) return s;

  SequenceOutcome result;
  ReplayOutcome step_result;
  const uint64_t count = vectors->count();
  auto start = std::chrono::steady_clock::now();
  // A turn per replay, so other tenants' work runs between the replays of a long
  // sequence. Only the first is refused by a full queue: a sequence once admitted runs
  // to its end. Between replays the turn is renewed, so the sequence waits in its queue
  // with no gap; it is given back before reads go to the client.
  std::optional<Scheduler::Turn> turn;
  const bool foreign = !g.RunsOn(*context_);  // see ReplayGraph
  if (foreign)
    if (absl::Status s = context_->Synchronize(); !s.ok()) return s;
  for (uint64_t i = 0; i < count; ++i) {
    if (i > 0 && op.stopped && op.stopped())
      return absl::CancelledError(absl::StrCat("the sequence stopped after ", i, " of ", count,
                                               " replays: its stream ended"));
    const bool report = op.stream_reads || i + 1 == count;
    if (turn) {
      env_.scheduler->Renew(*turn);
    } else {
      absl::StatusOr<Scheduler::Turn> acquired = env_.scheduler->Acquire(env_.queue, /*check_quota=*/i == 0);
      if (!acquired.ok()) return acquired.status();
      turn.emplace(std::move(*acquired));
    }
    absl::StatusOr<std::optional<absl::Duration>> time =
        g.Replay(vectors->addresses(i), vectors->ValuesOf(i), /*wait=*/foreign);
    if (!time.ok()) return time.status();
    ++result.replays;
    if (!report) continue;
    absl::Status taken = TakeReads(*context_, reads, step_result.reads);
    turn.reset();
    if (!taken.ok()) return taken;
    if (absl::Status s = on_replay(i, step_result); !s.ok()) return s;
  }
  if (absl::Status s = context_->Synchronize(); !s.ok()) return s;
  result.device_time = absl::FromChrono(std::chrono::steady_clock::now() - start);
  return result;
}

absl::Status DeviceSession::Synchronize() {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  return context_->Synchronize();
}

}  // namespace replayd
