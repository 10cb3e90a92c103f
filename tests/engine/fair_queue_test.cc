#include "engine/fair_queue.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>

namespace replayd {
namespace {

constexpr int64_t kQuantum = 1000;

// Serves `picks` items from `queues`, each costing cost(queue index), and returns the
// device time each queue got. Each queue has `backlog` items waiting at the start and
// gets a new one after each of its items has run; with `gap`, that one arrives only
// after the next pick, as with a session whose next item comes when its last is done.
template <typename Cost>
std::vector<int64_t> Serve(FairQueue& fq, std::vector<FairQueue::Queue>& queues, int picks, Cost cost, int64_t* now,
                           int backlog = 2, bool gap = false) {
  std::deque<FairQueue::Item> items;
  for (auto& q : queues)
    for (int i = 0; i < backlog; ++i) fq.Push(&q, &items.emplace_back(), *now);
  std::vector<int64_t> got(queues.size());
  FairQueue::Queue* late = nullptr;
  for (int i = 0; i < picks; ++i) {
    FairQueue::Queue* from = nullptr;
    if (fq.Pop(*now, &from) == nullptr) {
      ADD_FAILURE() << "nothing to pop at pick " << i;
      break;
    }
    if (late) fq.Push(late, &items.emplace_back(), *now);
    const size_t index = static_cast<size_t>(from - queues.data());
    const int64_t c = cost(index);
    *now += c;
    got[index] += c;
    fq.Charge(from, c);
    if (gap) {
      late = from;
    } else {
      fq.Push(from, &items.emplace_back(), *now);
    }
  }
  return got;
}

// Batch queues of `weights`, in `fq`.
std::vector<FairQueue::Queue> BatchQueues(FairQueue& fq, const std::vector<uint32_t>& weights) {
  std::vector<FairQueue::Queue> queues(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) fq.SetShare(&queues[i], weights[i], Priority::kBatch, 0);
  return queues;
}

double Ratio(const std::vector<int64_t>& got) { return static_cast<double>(got[1]) / static_cast<double>(got[0]); }

TEST(FairQueueTest, BackloggedQueuesGetDeviceTimeInProportionToTheirWeights) {
  FairQueue fq({kQuantum, int64_t{1} << 60});
  std::vector<FairQueue::Queue> queues = BatchQueues(fq, {1, 3});
  int64_t now = 0;
  // Different item costs: the light tenant's items cost 7x the heavy one's.
  std::vector<int64_t> got = Serve(
      fq, queues, 40000, [](size_t i) { return i == 0 ? 700 : 100; }, &now);
  EXPECT_NEAR(Ratio(got), 3.0, 0.05) << got[0] << " " << got[1];
}

TEST(FairQueueTest, QueuesThatEmptyBetweenTheirItemsStillShareByWeight) {
  // Two sessions per tenant with one item each, and a session's next item arrives only
  // after the next pick: a tenant's queue is often empty when the device is given out.
  FairQueue fq({kQuantum, int64_t{1} << 60});
  std::vector<FairQueue::Queue> queues = BatchQueues(fq, {1, 3});
  int64_t now = 0;
  std::vector<int64_t> got = Serve(
      fq, queues, 40000, [](size_t) { return 50; }, &now, 2, true);
  EXPECT_NEAR(Ratio(got), 3.0, 0.05) << got[0] << " " << got[1];
}

TEST(FairQueueTest, ItemsLongerThanAQuantumStillShareByWeight) {
  FairQueue fq({kQuantum, int64_t{1} << 60});
  std::vector<FairQueue::Queue> queues = BatchQueues(fq, {1, 2, 3});
  int64_t now = 0;
  std::vector<int64_t> got = Serve(
      fq, queues, 30000, [](size_t i) { return 50'000 + 1000 * int64_t(i); }, &now);
  const double total = static_cast<double>(got[0] + got[1] + got[2]);
  EXPECT_NEAR(got[0] / total, 1.0 / 6, 0.01);
  EXPECT_NEAR(got[1] / total, 2.0 / 6, 0.01);
  EXPECT_NEAR(got[2] / total, 3.0 / 6, 0.01);
}

TEST(FairQueueTest, EachQueueIsServedInArrivalOrder) {
  FairQueue fq({kQuantum, int64_t{1} << 60});
  FairQueue::Queue a, b;
  FairQueue::Item items[6];
  for (int i = 0; i < 6; ++i) fq.Push(i % 2 ? &b : &a, &items[i], i);
  std::map<FairQueue::Queue*, std::vector<FairQueue::Item*>> order;
  for (int i = 0; i < 6; ++i) {
    FairQueue::Queue* from = nullptr;
    FairQueue::Item* item = fq.Pop(10, &from);
    order[from].push_back(item);
    fq.Charge(from, 10);
  }
  EXPECT_EQ(order[&a], (std::vector<FairQueue::Item*>{&items[0], &items[2], &items[4]}));
  EXPECT_EQ(order[&b], (std::vector<FairQueue::Item*>{&items[1], &items[3], &items[5]}));
  FairQueue::Queue* from = nullptr;
  EXPECT_EQ(fq.Pop(10, &from), nullptr);
  EXPECT_EQ(fq.waiting(), 0u);
}

TEST(FairQueueTest, InteractiveGoesFirstAndBatchIsServedWithinItsMaximumWait) {
  const int64_t max_wait = 100'000;
  FairQueue fq({kQuantum, max_wait});
  std::vector<FairQueue::Queue> queues(2);
  fq.SetShare(&queues[0], 1, Priority::kInteractive, 0);
  fq.SetShare(&queues[1], 100, Priority::kBatch, 0);
  int64_t now = 0;
  // Interactive work never stops: batch still runs, about once per max_wait of 1000-ns items.
  std::vector<int64_t> got = Serve(
      fq, queues, 10000, [](size_t) { return 1000; }, &now);
  EXPECT_GT(got[1], 0);
  const int64_t batch_items = got[1] / 1000;
  EXPECT_NEAR(static_cast<double>(batch_items), static_cast<double>(now / max_wait), 2.0);
  EXPECT_GT(got[0], 90 * got[1]);  // weight does not cross classes
}

TEST(FairQueueTest, BatchRunsAtOnceWhenNoInteractiveWorkWaits) {
  FairQueue fq({kQuantum, int64_t{1} << 60});
  FairQueue::Queue interactive, batch;
  fq.SetShare(&interactive, 1, Priority::kInteractive, 0);
  FairQueue::Item b, i;
  fq.Push(&batch, &b, 0);
  FairQueue::Queue* from = nullptr;
  EXPECT_EQ(fq.Pop(1, &from), &b);
  fq.Push(&batch, &b, 2);
  fq.Push(&interactive, &i, 3);
  EXPECT_EQ(fq.Pop(4, &from), &i);
  EXPECT_EQ(from, &interactive);
}

// Serves `b` (pushing it again each time) until `a`, also waiting, is served; returns the
// device time b got, 10 ns per item.
int64_t ServedBefore(FairQueue& fq, FairQueue::Queue& a, FairQueue::Queue& b, FairQueue::Item& ib) {
  int64_t b_time = 0;
  for (;;) {
    FairQueue::Queue* from = nullptr;
    FairQueue::Item* item = fq.Pop(0, &from);
    if (from == &a || b_time > 1000 * kQuantum) return b_time;
    fq.Charge(&b, 10);
    b_time += 10;
    fq.Push(&b, &ib, 0);
    (void)item;
  }
}

TEST(FairQueueTest, AnIdleQueueBanksAtMostAQuantumTimesItsWeight) {
  FairQueue fq({kQuantum, int64_t{1} << 60});
  FairQueue::Queue a, b;
  fq.SetShare(&b, 2, Priority::kBatch, 0);
  // a alone for a long time: 100 quanta of device time in items of a tenth.
  FairQueue::Item ia, ib;
  FairQueue::Queue* from = nullptr;
  for (int i = 0; i < 1000; ++i) {
    fq.Push(&a, &ia, 0);
    ASSERT_EQ(fq.Pop(0, &from), &ia);
    fq.Charge(&a, kQuantum / 10);
  }
  // b comes back from its pause: ahead of a by a quantum (and a's last item) times its
  // weight, no more.
  fq.Push(&a, &ia, 0);
  fq.Push(&b, &ib, 0);
  const int64_t lead = ServedBefore(fq, a, b, ib);
  EXPECT_GE(lead, 2 * kQuantum);
  EXPECT_LE(lead, 2 * (kQuantum + kQuantum / 10) + 20);
}

TEST(FairQueueTest, DebtSurvivesAPause) {
  FairQueue fq({kQuantum, int64_t{1} << 60});
  FairQueue::Queue a, b;
  FairQueue::Item ia, ib;
  FairQueue::Queue* from = nullptr;
  fq.Push(&a, &ia, 0);
  fq.Push(&b, &ib, 0);
  ASSERT_EQ(fq.Pop(0, &from), &ia);
  fq.Charge(&a, 50 * kQuantum);  // one long item while b waits
  // a pauses and comes back: b is served until it has had as much.
  fq.Push(&a, &ia, 0);
  const int64_t lead = ServedBefore(fq, a, b, ib);
  EXPECT_GE(lead, 50 * kQuantum - 20);
  EXPECT_LE(lead, 50 * kQuantum + 20);
}

TEST(FairQueueTest, ChargesKeepTheRemainderOfTheWeight) {
  FairQueue fq({kQuantum, int64_t{1} << 60});
  FairQueue::Queue q;
  fq.SetShare(&q, 3, Priority::kBatch, 0);
  for (int i = 0; i < 3; ++i) fq.Charge(&q, 1);
  EXPECT_EQ(q.virtual_ns, 1);
  EXPECT_EQ(q.remainder, 0);
}

TEST(FairQueueTest, ChangingAWaitingQueuesClassMovesIt) {
  FairQueue fq({kQuantum, int64_t{1} << 60});
  FairQueue::Queue a, b;
  fq.SetShare(&b, 1, Priority::kInteractive, 0);
  FairQueue::Item ia, ib;
  fq.Push(&b, &ib, 0);
  fq.Push(&a, &ia, 0);
  fq.SetShare(&a, 1, Priority::kInteractive, 0);
  fq.SetShare(&b, 1, Priority::kBatch, 0);
  FairQueue::Queue* from = nullptr;
  EXPECT_EQ(fq.Pop(1, &from), &ia);
  EXPECT_EQ(fq.Pop(1, &from), &ib);
}

}  // namespace
}  // namespace replayd
