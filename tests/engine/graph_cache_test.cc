// The graph cache on the fake device: hits by structure, eviction by count and by arena
// bytes (least recently used first, never the instance just added, an evicted one living
// on while a handle holds it), and a closed session's instances dropped.
#include "engine/graph_cache.h"

#include <gtest/gtest.h>

#include "tests/support/fake_driver.h"
#include "tests/support/status_macros.h"

namespace replayd {
namespace {

using testing::FakeContext;
using testing::FakeDevice;

class GraphCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto context = device_.OpenContext({"test"});
    ASSERT_TRUE(context.ok()) << context.status();
    context_ = std::shared_ptr<Context>(std::move(*context));
    Signature sig;
    sig.params = {{"x", ParamKind::kBuffer, Access::kInout}, {"n", ParamKind::kInt32, Access::kNone}};
    program_ = std::make_shared<Program>();
    program_->key = "k";
    program_->entry = "k";
    program_->kernel = FakeContext::MakeKernel(sig, nullptr);
  }

  // A one-call graph whose internal slot has `bytes`: one structure per size.
  absl::StatusOr<std::shared_ptr<GraphInstance>> Instance(uint64_t bytes) {
    Graph g;
    g.slots = {{SlotKind::kInternal, bytes, nullptr}};
    GraphCall call;
    call.program = program_;
    call.args = {SlotView{0, 0, 0}, Expression::Constant(1)};
    g.calls.push_back(call);
    if (absl::Status s = CheckGraph(g, device_.info()); !s.ok()) return s;
    std::string structure = GraphStructure(g, context_->address_space());
    return GraphInstance::Create(std::move(g), std::move(structure), context_, BatchOptions{});
  }

  FakeDevice device_;
  std::shared_ptr<Context> context_;
  std::shared_ptr<Program> program_;
};

TEST_F(GraphCacheTest, AHitIsTheSameInstanceFoundByItsStructure) {
  GraphCache cache({});
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> a, Instance(64));
  EXPECT_EQ(cache.Lookup(a->structure()), nullptr);
  cache.Insert(a, /*owner=*/1);
  EXPECT_EQ(cache.Lookup(a->structure()), a);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> b, Instance(128));
  EXPECT_EQ(cache.Lookup(b->structure()), nullptr) << "another structure";
  const GraphCacheStats stats = cache.stats();
  EXPECT_EQ(stats.hits, 1u);
  EXPECT_EQ(stats.misses, 2u);
  EXPECT_EQ(stats.instantiations, 1u);
  EXPECT_EQ(stats.graphs, 1u);
  EXPECT_EQ(stats.bytes, a->plan().arena_bytes + a->host_bytes());
  EXPECT_GT(a->host_bytes(), 0u);
}

TEST_F(GraphCacheTest, EvictsTheLeastRecentlyUsedPastTheCount) {
  GraphCache cache({/*max_graphs=*/2, /*max_bytes=*/uint64_t{1} << 30});
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> a, Instance(64));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> b, Instance(128));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> c, Instance(256));
  cache.Insert(a, 1);
  cache.Insert(b, 1);
  ASSERT_EQ(cache.Lookup(a->structure()), a);  // a is now the most recently used
  cache.Insert(c, 1);
  EXPECT_EQ(cache.Lookup(b->structure()), nullptr) << "b was the least recently used";
  EXPECT_EQ(cache.Lookup(a->structure()), a);
  EXPECT_EQ(cache.Lookup(c->structure()), c);
  EXPECT_EQ(cache.stats().evictions, 1u);
  // An evicted instance a handle holds lives on: its arena is still allocated.
  EXPECT_EQ(device_.live_allocations(), 3u);
  b.reset();
  EXPECT_EQ(device_.live_allocations(), 2u);
}

TEST_F(GraphCacheTest, EvictsByBytesButNeverTheOneJustAdded) {
  GraphCache cache({/*max_graphs=*/256, /*max_bytes=*/1000});
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> small, Instance(512));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> big, Instance(4096));
  cache.Insert(small, 1);
  cache.Insert(big, 1);  // alone over the bound: it stays, the other goes
  EXPECT_EQ(cache.Lookup(small->structure()), nullptr);
  EXPECT_EQ(cache.Lookup(big->structure()), big);
  EXPECT_EQ(cache.stats().graphs, 1u);
}

TEST_F(GraphCacheTest, EvictUnheldDropsOnlyTheInstancesNoHandleHolds) {
  GraphCache cache({});
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> held, Instance(64));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> loose, Instance(128));
  const std::string loose_structure = loose->structure();
  cache.Insert(held, 1);
  cache.Insert(loose, 1);
  loose.reset();  // only the cache holds it now
  EXPECT_EQ(cache.EvictUnheld(), 1u);
  EXPECT_EQ(cache.Lookup(loose_structure), nullptr);
  EXPECT_EQ(cache.Lookup(held->structure()), held);
  EXPECT_EQ(cache.stats().graphs, 1u);
  EXPECT_EQ(cache.stats().evictions, 1u);
  EXPECT_EQ(cache.stats().bytes, held->plan().arena_bytes + held->host_bytes());
  EXPECT_EQ(device_.live_allocations(), 1u) << "the evicted instance's arena is freed";
}

TEST_F(GraphCacheTest, EvictOwnerDropsOnlyThatSessionsInstances) {
  GraphCache cache({});
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> mine, Instance(64));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<GraphInstance> theirs, Instance(128));
  cache.Insert(mine, 1);
  cache.Insert(theirs, 2);
  cache.EvictOwner(1);
  EXPECT_EQ(cache.Lookup(mine->structure()), nullptr);
  EXPECT_EQ(cache.Lookup(theirs->structure()), theirs);
  EXPECT_EQ(cache.stats().graphs, 1u);
}

}  // namespace
}  // namespace replayd
