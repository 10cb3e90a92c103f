// Replaying a graph allocates nothing on the heap once its operation and result are
// reused: the hot path of the Session stream. Counted by replacing operator new in this
// test binary.
#include <gtest/gtest.h>

// GCC cannot see that the replaced operator new and delete below pair malloc with free.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <atomic>
#include <cstdlib>
#include <new>

#include "drivers/cpu/cpu_driver.h"
#include "engine/engine.h"
#include "tests/support/temp_dir.h"

namespace {
std::atomic<bool> counting{false};
std::atomic<uint64_t> allocations{0};
}  // namespace

void* operator new(size_t n) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace replayd {
namespace {

TEST(ReplayAllocationTest, AReplayAllocatesNothingOnceWarm) {
  TempDir dir;
  EngineOptions options;
  options.cache_dir = dir.path();
  CpuDriverOptions cpu;
  cpu.memory_limit = 64 << 20;
  cpu.threads = 1;
  CpuDriver driver(cpu);
  auto engine = Engine::Create(options, driver.Discover());
  ASSERT_TRUE(engine.ok());
  auto session = (*engine)->OpenSession("default", "cpu:0");
  ASSERT_TRUE(session.ok());
  Signature sig;
  sig.params = {{"x", ParamKind::kBuffer, Access::kInout}, {"pos", ParamKind::kInt32, Access::kNone}};
  auto program = (*session)->LoadProgram(
      {"cpu-c", "void step(float *x, int pos) { x[0] += (float)pos; }", "step", sig, {}});
  ASSERT_TRUE(program.ok()) << program.status();
  Handle x = *(*session)->AllocBuffer(64);
  VariableDecl pos{"pos", 1, 1000, 1};
  ASSERT_TRUE((*session)->BeginCapture({x}, {pos}).ok());
  LaunchOp launch;
  launch.program = program->handle;
  launch.variables = {{pos, 1}};
  launch.args = {ViewArg{x, 0, 0}, Expression::Var(0)};
  for (int i = 0; i < 40; ++i) ASSERT_TRUE((*session)->Launch(launch).ok());  // two batches
  auto graph = (*session)->EndCapture({});
  ASSERT_TRUE(graph.ok()) << graph.status();

  ReplayOp op;
  op.graph = graph->handle;
  op.params = {BufferParam{x}, int64_t{1}};
  op.reads = {ViewArg{x, 0, 16}};
  op.wait = true;
  ReplayOutcome result;
  ASSERT_TRUE((*session)->ReplayGraph(op, result).ok());  // warm: thread-local scratch, result
  counting = true;
  for (int64_t p = 1; p <= 100; ++p) {
    std::get<int64_t>(op.params[1]) = p;
    ASSERT_TRUE((*session)->ReplayGraph(op, result).ok());
  }
  counting = false;
  EXPECT_EQ(allocations.load(), 0u);
  EXPECT_EQ(result.reads.size(), 1u);
}

}  // namespace
}  // namespace replayd
