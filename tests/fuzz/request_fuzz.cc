// The decoders and validators of the requests a client sends, on wire bytes: the
// LoadProgram request with its signature (and the CUDA and HIP program form checks), the
// Launch request with its arguments, variables and symbolic dimensions, a lone
// expression tree, the CopyBuffer request, and the ReplayGraph and ReplaySequence
// requests. Whatever the bytes, each is refused with a status or accepted, and what is
// accepted evaluates inside its bounds. REPLAYD_FUZZ_REQUEST picks the message (a
// compile definition: one binary per message).
#include <cstdint>
#include <string>
#include <vector>

#include "engine/call.h"
#include "engine/program.h"
#include "server/translate.h"
#include "tests/fuzz/fuzz_support.h"
#ifdef REPLAYD_WITH_CUDA
#include "drivers/cuda/cuda_program.h"
#endif

namespace {

using namespace replayd;

DeviceInfo EveryFormat() {
  DeviceInfo d;
  d.id = "fuzz:0";
  d.formats = {"cpu-c", "cuda-ptx", "cuda-cubin", "cuda-c", "hip-hsaco", "hip-c"};
  d.limits.max_global = {1u << 24, 1u << 16, 1u << 16};
  d.limits.max_global_total = 1u << 24;
  d.limits.max_local = {1024, 1024, 64};
  d.limits.max_local_total = 1024;
  d.limits.max_args = 64;
  d.total_memory = 1 << 20;
  return d;
}

void CheckProgram(const uint8_t* data, size_t size) {
  v1::LoadProgramRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  absl::StatusOr<ProgramSource> source = FromProto(request);
  if (!source.ok()) return;
  if (!CheckProgramSource(*source, EveryFormat()).ok()) return;
#ifdef REPLAYD_WITH_CUDA
  if (source->format == "cuda-ptx" || source->format == "cuda-cubin")
    BuildCudaModule(*source, nullptr, "sm_90").status().IgnoreError();
#endif
}

// Every expression of a decoded launch evaluates inside its bounds at its bound values.
void CheckLaunch(const uint8_t* data, size_t size) {
  v1::LaunchRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  absl::StatusOr<LaunchOp> op = FromProto(request);
  if (!op.ok()) return;
  absl::StatusOr<BoundValues> bound = CheckBoundVariables(op->variables);
  if (!bound.ok()) return;
  std::vector<const Expression*> expressions;
  for (const CallArg& arg : op->args)
    if (const Expression* e = std::get_if<Expression>(&arg)) expressions.push_back(e);
  for (const auto* dims : {&op->global, &op->local})
    for (const Expression& e : *dims) expressions.push_back(&e);
  for (const Expression* e : expressions) {
    absl::StatusOr<Interval> bounds = e->Bounds(bound->variables);
    if (!bounds.ok()) continue;
    absl::StatusOr<int64_t> value = EvaluateChecked(*e, bound->variables, bound->values);
    FUZZ_CHECK(value.ok());
    FUZZ_CHECK(*value >= bounds->min && *value <= bounds->max);
  }
}

void CheckExpr(const uint8_t* data, size_t size) {
  v1::Expr expr;
  if (!expr.ParseFromArray(data, static_cast<int>(size))) return;
  const std::vector<VariableDecl> variables = {{"pos", 1, 256, 1}, {"n", -64, 64, 8},
                                           {"big", INT64_MIN, INT64_MAX, 1}, {"w", -5, -1, 1}};
  absl::StatusOr<Expression> e = FromProto(expr, variables);
  if (!e.ok()) return;
  absl::StatusOr<Interval> bounds = e->Bounds(variables);
  if (!bounds.ok()) return;
  for (const std::vector<int64_t>& values :
       {std::vector<int64_t>{1, -64, INT64_MIN, -5}, std::vector<int64_t>{256, 64, INT64_MAX, -1},
        std::vector<int64_t>{17, 8, -1, -3}}) {
    const int64_t v = e->Evaluate(values);
    FUZZ_CHECK(v >= bounds->min && v <= bounds->max);
  }
}

void CheckCopy(const uint8_t* data, size_t size) {
  v1::CopyBufferRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  absl::StatusOr<CopyOp> op = FromProto(request);
  if (!op.ok()) return;
  for (uint64_t buffer_size : {uint64_t{0}, uint64_t{1}, uint64_t{4096}, ~uint64_t{0}}) {
    auto dst = ResolveView(op->dst, buffer_size), src = ResolveView(op->src, buffer_size);
    if (!dst.ok() || !src.ok()) continue;
    FUZZ_CHECK(dst->first < buffer_size && dst->second <= buffer_size - dst->first);
    CheckCopyRanges(*dst, *src, op->dst.buffer == op->src.buffer).status().IgnoreError();
  }
}

void CheckReplay(const uint8_t* data, size_t size) {
  v1::ReplayGraphRequest request;
  if (request.ParseFromArray(data, static_cast<int>(size))) FromProto(request).status().IgnoreError();
  v1::ReplaySequenceRequest sequence;
  if (sequence.ParseFromArray(data, static_cast<int>(size))) FromProto(sequence).status().IgnoreError();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  REPLAYD_FUZZ_REQUEST(data, size);
  return 0;
}
