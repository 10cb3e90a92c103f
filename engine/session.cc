#include "engine/session.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace replayd {

Session::Session(SessionId id, std::string tenant, Device* device,
                 std::unique_ptr<Context> context, CompileCache* compile_cache,
                 absl::Duration lease)
    : id_(id),
      tenant_(std::move(tenant)),
      device_(device),
      compile_cache_(compile_cache),
      lease_(lease),
      deadline_ns_(absl::ToUnixNanos(absl::Now() + lease)),
      context_(std::move(context)) {}

Session::~Session() { Close(); }

void Session::Renew(absl::Time now) { deadline_ns_.store(absl::ToUnixNanos(now + lease_)); }

bool Session::Expired(absl::Time now) const { return absl::ToUnixNanos(now) > deadline_ns_.load(); }

void Session::Close() {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  closed_ = true;
  // Wait for submitted work before its memory goes.
  context_->Synchronize().IgnoreError();
  programs_.Clear();
  buffers_.Clear();
  memory_in_use_ = 0;
}

absl::Status Session::CheckOpen() const {
  if (closed_) return absl::NotFoundError(absl::StrCat("session ", id_, " is closed"));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Buffer>> Session::FindBuffer(Handle buffer) const {
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  return buffers_.Find(buffer);
}

uint64_t Session::memory_in_use() const {
  absl::MutexLock lock(&mu_);
  return memory_in_use_;
}

absl::StatusOr<Handle> Session::AllocBuffer(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  if (bytes == 0) return absl::InvalidArgumentError("buffer size is 0 bytes");
  if (bytes > device().total_memory)
    return absl::ResourceExhaustedError(absl::StrCat("buffer of ", bytes, " bytes exceeds ",
                                                     device().id, "'s memory of ",
                                                     device().total_memory, " bytes"));
  absl::StatusOr<Allocation> allocation = context_->Allocate(bytes);
  if (!allocation.ok()) return allocation.status();
  memory_in_use_ += bytes;
  return buffers_.Insert(std::make_shared<Buffer>(context_.get(), *allocation));
}

absl::Status Session::FreeBuffer(Handle buffer) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<Buffer>> removed = buffers_.Remove(buffer);
  if (!removed.ok()) return removed.status();
  memory_in_use_ -= (*removed)->allocation.bytes;
  return absl::OkStatus();
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> Session::ResolveRange(Handle buffer,
                                                                    uint64_t offset,
                                                                    uint64_t length) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<Buffer>> b = FindBuffer(buffer);
  if (!b.ok()) return b.status();
  return ResolveView(ViewArg{buffer, offset, length}, (*b)->allocation.bytes);
}

absl::Status Session::WriteBuffer(Handle buffer, uint64_t offset,
                                  std::span<const uint8_t> bytes) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<Buffer>> b = FindBuffer(buffer);
  if (!b.ok()) return b.status();
  if (bytes.empty()) return absl::OkStatus();
  absl::StatusOr<std::pair<uint64_t, uint64_t>> range =
      ResolveView(ViewArg{buffer, offset, bytes.size()}, (*b)->allocation.bytes);
  if (!range.ok()) return range.status();
  return context_->Write((*b)->allocation, offset, bytes);
}

absl::Status Session::ReadBuffer(Handle buffer, uint64_t offset, std::span<uint8_t> bytes) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<Buffer>> b = FindBuffer(buffer);
  if (!b.ok()) return b.status();
  if (bytes.empty()) return absl::OkStatus();
  absl::StatusOr<std::pair<uint64_t, uint64_t>> range =
      ResolveView(ViewArg{buffer, offset, bytes.size()}, (*b)->allocation.bytes);
  if (!range.ok()) return range.status();
  return context_->Read((*b)->allocation, offset, bytes);
}

absl::StatusOr<ProgramInfo> Session::LoadProgram(const ProgramSource& source) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckOpen(); !s.ok()) return s;
  }
  if (absl::Status s = CheckProgramSource(source, device()); !s.ok()) return s;
  // Compiling can take seconds: the session's other operations go on meanwhile.
  absl::StatusOr<CompiledArtifact> artifact = compile_cache_->GetOrCompile(*device_, source);
  if (!artifact.ok()) return artifact.status();
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Kernel>> kernel = context_->Load(source, artifact->path);
  if (!kernel.ok() && artifact->cache_hit) {
    // An artifact that no longer loads (a foreign or damaged file): build it anew once.
    compile_cache_->Invalidate(artifact->key);
    artifact = compile_cache_->GetOrCompile(*device_, source);
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
  info.key = artifact->key;
  info.cache_hit = artifact->cache_hit;
  info.compile_time = artifact->compile_time;
  return info;
}

absl::Status Session::FreeProgram(Handle program) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  return programs_.Remove(program).status();
}

absl::Status Session::PackArgs(const Kernel& kernel, const LaunchOp& op,
                               std::vector<ArgValue>& out) const {
  const std::vector<Param>& params = kernel.signature().params;
  if (op.args.size() != params.size())
    return absl::InvalidArgumentError(absl::StrCat("program ", op.program, " takes ",
                                                   params.size(), " arguments, got ",
                                                   op.args.size()));
  out.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    const CallArg& arg = op.args[i];
    if (p.kind == ParamKind::kBuffer) {
      const ViewArg* view = std::get_if<ViewArg>(&arg);
      if (!view)
        return absl::InvalidArgumentError(absl::StrCat("argument ", i, " must be a view of a buffer"));
      absl::StatusOr<std::shared_ptr<Buffer>> b = FindBuffer(view->buffer);
      if (!b.ok()) return absl::NotFoundError(absl::StrCat("argument ", i, ": ", b.status().message()));
      absl::StatusOr<std::pair<uint64_t, uint64_t>> range =
          ResolveView(*view, (*b)->allocation.bytes);
      if (!range.ok())
        return absl::InvalidArgumentError(absl::StrCat("argument ", i, ": ", range.status().message()));
      out[i].address = (*b)->allocation.address + range->first;
      continue;
    }
    const int64_t* value = std::get_if<int64_t>(&arg);
    if (!value)
      return absl::InvalidArgumentError(absl::StrCat("argument ", i, " must be an integer"));
    if (p.kind == ParamKind::kInt32 && (*value < std::numeric_limits<int32_t>::min() ||
                                        *value > std::numeric_limits<int32_t>::max()))
      return absl::InvalidArgumentError(
          absl::StrCat("argument ", i, ": ", *value, " does not fit in int32"));
    out[i].integer = *value;
  }
  return absl::OkStatus();
}

absl::StatusOr<LaunchResult> Session::Launch(const LaunchOp& op) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<Program>> program = programs_.Find(op.program);
  if (!program.ok()) return program.status();
  const LaunchLimits& limits = device().limits;
  absl::StatusOr<Dim3> global = CheckDims(op.global, limits.max_global, limits.max_global_total, "global");
  if (!global.ok()) return global.status();
  absl::StatusOr<Dim3> local = CheckDims(op.local, limits.max_local, limits.max_local_total, "local");
  if (!local.ok()) return local.status();
  thread_local std::vector<ArgValue> args;
  if (absl::Status s = PackArgs(*(*program)->kernel, op, args); !s.ok()) return s;
  absl::StatusOr<std::optional<absl::Duration>> time =
      context_->Launch(*(*program)->kernel, args, *global, *local, op.wait);
  if (!time.ok()) return time.status();
  return LaunchResult{*time};
}

absl::Status Session::Synchronize() {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpen(); !s.ok()) return s;
  return context_->Synchronize();
}

}  // namespace replayd
