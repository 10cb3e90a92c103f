#include "engine/deficit_round_robin.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>

namespace replayd {
namespace {

constexpr int64_t kQuantum = 1000;

// Keeps every queue of `queues` backlogged and serves `picks` items, each costing
// cost(queue index); returns the device time each queue got.
template <typename Cost>
std::vector<int64_t> Saturate(DeficitRoundRobin& drr, std::vector<DeficitRoundRobin::Queue>& queues,
                              int picks, Cost cost, int64_t* now) {
  std::deque<DeficitRoundRobin::Item> items;
  for (auto& q : queues)
    for (int i = 0; i < 2; ++i) drr.Push(&q, &items.emplace_back(), *now);
  std::vector<int64_t> got(queues.size());
  for (int i = 0; i < picks; ++i) {
    DeficitRoundRobin::Queue* from = nullptr;
    if (drr.Pop(*now, &from) == nullptr) {
      ADD_FAILURE() << "nothing to pop at pick " << i;
      break;
    }
    const size_t index = static_cast<size_t>(from - queues.data());
    const int64_t c = cost(index);
    *now += c;
    got[index] += c;
    drr.Charge(from, c);
    drr.Push(from, &items.emplace_back(), *now);  // still backlogged
  }
  return got;
}

TEST(DeficitRoundRobinTest, BackloggedQueuesGetDeviceTimeInProportionToTheirWeights) {
  DeficitRoundRobin drr({kQuantum, int64_t{1} << 60});
  std::vector<DeficitRoundRobin::Queue> queues(2);
  drr.SetShare(&queues[0], 1, Priority::kBatch, 0);
  drr.SetShare(&queues[1], 3, Priority::kBatch, 0);
  int64_t now = 0;
  // Different item costs: the light tenant's items cost 7x the heavy one's.
  std::vector<int64_t> got = Saturate(drr, queues, 40000, [](size_t i) { return i == 0 ? 700 : 100; }, &now);
  const double ratio = static_cast<double>(got[1]) / static_cast<double>(got[0]);
  EXPECT_NEAR(ratio, 3.0, 0.05) << got[0] << " " << got[1];
}

TEST(DeficitRoundRobinTest, ItemsLongerThanAQuantumStillShareByWeight) {
  DeficitRoundRobin drr({kQuantum, int64_t{1} << 60});
  std::vector<DeficitRoundRobin::Queue> queues(3);
  for (uint32_t i = 0; i < 3; ++i) drr.SetShare(&queues[i], i + 1, Priority::kBatch, 0);
  int64_t now = 0;
  std::vector<int64_t> got = Saturate(drr, queues, 30000, [](size_t i) { return 50'000 + 1000 * int64_t(i); }, &now);
  const double total = static_cast<double>(got[0] + got[1] + got[2]);
  EXPECT_NEAR(got[0] / total, 1.0 / 6, 0.01);
  EXPECT_NEAR(got[1] / total, 2.0 / 6, 0.01);
  EXPECT_NEAR(got[2] / total, 3.0 / 6, 0.01);
}

TEST(DeficitRoundRobinTest, EachQueueIsServedInArrivalOrder) {
  DeficitRoundRobin drr({kQuantum, int64_t{1} << 60});
  DeficitRoundRobin::Queue a, b;
  DeficitRoundRobin::Item items[6];
  for (int i = 0; i < 6; ++i) drr.Push(i % 2 ? &b : &a, &items[i], i);
  std::map<DeficitRoundRobin::Queue*, std::vector<DeficitRoundRobin::Item*>> order;
  for (int i = 0; i < 6; ++i) {
    DeficitRoundRobin::Queue* from = nullptr;
    DeficitRoundRobin::Item* item = drr.Pop(10, &from);
    order[from].push_back(item);
    drr.Charge(from, 10);
  }
  EXPECT_EQ(order[&a], (std::vector<DeficitRoundRobin::Item*>{&items[0], &items[2], &items[4]}));
  EXPECT_EQ(order[&b], (std::vector<DeficitRoundRobin::Item*>{&items[1], &items[3], &items[5]}));
  DeficitRoundRobin::Queue* from = nullptr;
  EXPECT_EQ(drr.Pop(10, &from), nullptr);
  EXPECT_EQ(drr.waiting(), 0u);
}

TEST(DeficitRoundRobinTest, InteractiveGoesFirstAndBatchIsServedWithinItsMaximumWait) {
  const int64_t max_wait = 100'000;
  DeficitRoundRobin drr({kQuantum, max_wait});
  std::vector<DeficitRoundRobin::Queue> queues(2);
  drr.SetShare(&queues[0], 1, Priority::kInteractive, 0);
  drr.SetShare(&queues[1], 100, Priority::kBatch, 0);
  int64_t now = 0;
  // Interactive work never stops: batch still runs, about once per max_wait of 1000-ns items.
  std::vector<int64_t> got = Saturate(drr, queues, 10000, [](size_t) { return 1000; }, &now);
  EXPECT_GT(got[1], 0);
  const int64_t batch_items = got[1] / 1000;
  EXPECT_NEAR(static_cast<double>(batch_items), static_cast<double>(now / max_wait), 2.0);
  EXPECT_GT(got[0], 90 * got[1]);  // weight does not cross classes
}

TEST(DeficitRoundRobinTest, BatchRunsAtOnceWhenNoInteractiveWorkWaits) {
  DeficitRoundRobin drr({kQuantum, int64_t{1} << 60});
  DeficitRoundRobin::Queue interactive, batch;
  drr.SetShare(&interactive, 1, Priority::kInteractive, 0);
  DeficitRoundRobin::Item b, i;
  drr.Push(&batch, &b, 0);
  DeficitRoundRobin::Queue* from = nullptr;
  EXPECT_EQ(drr.Pop(1, &from), &b);
  drr.Push(&batch, &b, 2);
  drr.Push(&interactive, &i, 3);
  EXPECT_EQ(drr.Pop(4, &from), &i);
  EXPECT_EQ(from, &interactive);
}

TEST(DeficitRoundRobinTest, DebtSurvivesAPauseButCreditDoesNot) {
  DeficitRoundRobin drr({kQuantum, int64_t{1} << 60});
  DeficitRoundRobin::Queue q;
  DeficitRoundRobin::Item item;
  drr.Push(&q, &item, 0);
  DeficitRoundRobin::Queue* from = nullptr;
  ASSERT_EQ(drr.Pop(0, &from), &item);
  EXPECT_EQ(q.deficit, 0);  // the unused credit went with the empty queue
  drr.Charge(&q, 5 * kQuantum);
  EXPECT_EQ(q.deficit, -5 * kQuantum);
  drr.Push(&q, &item, 1);  // alone again: served after its debt is paid off in credit
  ASSERT_EQ(drr.Pop(1, &from), &item);
  EXPECT_LE(q.deficit, 0);
}

TEST(DeficitRoundRobinTest, ChangingAWaitingQueuesClassMovesIt) {
  DeficitRoundRobin drr({kQuantum, int64_t{1} << 60});
  DeficitRoundRobin::Queue a, b;
  drr.SetShare(&b, 1, Priority::kInteractive, 0);
  DeficitRoundRobin::Item ia, ib;
  drr.Push(&b, &ib, 0);
  drr.Push(&a, &ia, 0);
  drr.SetShare(&a, 1, Priority::kInteractive, 0);
  drr.SetShare(&b, 1, Priority::kBatch, 0);
  DeficitRoundRobin::Queue* from = nullptr;
  EXPECT_EQ(drr.Pop(1, &from), &ia);
  EXPECT_EQ(drr.Pop(1, &from), &ib);
}

}  // namespace
}  // namespace replayd
