// GraphDef validation, key building, instantiation and replay, on wire bytes: a decoded
// definition goes to a real session of a real engine on the fake device (its program and
// constant handles mapped onto the session's), and one that is accepted is replayed with
// fresh buffers at its variables' smallest values. Whatever the bytes, a definition is
// refused with a status or replays: the memory plan, batching, dependency edges, copy
// nodes (checked on live memory by the fake device) and patching all run.
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "server/translate.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/support/fake_driver.h"
#include "tests/support/temp_dir.h"

namespace {

using namespace replayd;

struct World {
  TempDir cache;
  std::unique_ptr<Engine> engine;
  std::shared_ptr<DeviceSession> session;
  std::vector<Handle> programs, constants;
};

World& TheWorld() {
  static World* world = [] {
    auto* w = new World();
    auto device = std::make_unique<testing::FakeDevice>(uint64_t{4} << 20);
    device->AddKernel("k", nullptr);  // runs nothing: the fuzzer checks the plumbing
    std::vector<std::unique_ptr<Device>> devices;
    devices.push_back(std::move(device));
    EngineOptions options;
    options.cache_dir = w->cache.path();
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options, std::move(devices));
    FUZZ_CHECK(engine.ok());
    w->engine = std::move(*engine);
    absl::StatusOr<std::shared_ptr<DeviceSession>> session = w->engine->OpenSession("fuzz", "fake:0");
    FUZZ_CHECK(session.ok());
    w->session = *session;
    Signature a, b;
    a.params = {{"x", ParamKind::kBuffer, Access::kInout}, {"n", ParamKind::kInt32, Access::kNone},
                {"m", ParamKind::kInt64, Access::kNone}};
    b.params = {{"in", ParamKind::kBuffer, Access::kIn}, {"out", ParamKind::kBuffer, Access::kOut}};
    for (const Signature& sig : {a, b}) {
      absl::StatusOr<ProgramInfo> p = w->session->LoadProgram({"fake", "k", "k", sig, {}});
      FUZZ_CHECK(p.ok());
      w->programs.push_back(p->handle);
    }
    for (uint64_t bytes : {uint64_t{64}, uint64_t{4096}}) {
      absl::StatusOr<Handle> c = w->session->AllocBuffer(bytes);
      FUZZ_CHECK(c.ok());
      w->constants.push_back(*c);
    }
    return w;
  }();
  return *world;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World& w = TheWorld();
  v1::GraphDef proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<GraphDef> def = FromProto(proto);
  if (!def.ok()) return 0;
  for (SlotDef& slot : def->slots)
    if (slot.kind == SlotKind::kConstant) slot.buffer = w.constants[slot.buffer % w.constants.size()];
  for (CallDef& call : def->calls)
    if (!call.copy && call.program != 0) call.program = w.programs[call.program % w.programs.size()];
  absl::StatusOr<GraphInfo> graph = w.session->DefineGraph(*def);
  if (!graph.ok()) return 0;
  ReplayOp op;
  op.graph = graph->handle;
  op.wait = true;
  std::vector<Handle> buffers;
  bool allocated = true;
  for (const GraphParamInfo& p : graph->params) {
    if (!p.is_buffer) {
      const VariableDecl& v = p.variable;
      const int64_t r = ((v.min % v.multiple_of) + v.multiple_of) % v.multiple_of;
      op.params.push_back(r == 0 ? v.min : v.min + (v.multiple_of - r));
      continue;
    }
    absl::StatusOr<Handle> b = w.session->AllocBuffer(p.bytes);
    if (!b.ok()) {
      allocated = false;
      break;
    }
    buffers.push_back(*b);
    op.params.push_back(BufferParam{*b});
  }
  if (allocated) {
    absl::StatusOr<ReplayOutcome> replayed = w.session->ReplayGraph(op);
    // Distinct fresh buffers of the right sizes: only a copy between views of one buffer
    // parameter's slot (a definition may name one slot on both sides) may be refused.
    FUZZ_CHECK(replayed.ok() || replayed.status().code() == absl::StatusCode::kInvalidArgument);
  }
  for (Handle b : buffers) FUZZ_CHECK(w.session->FreeBuffer(b).ok());
  FUZZ_CHECK(w.session->FreeGraph(graph->handle).ok());
  return 0;
}
