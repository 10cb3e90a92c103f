#include "engine/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <thread>

namespace replayd {
namespace {

using ::testing::HasSubstr;

Quotas QueuedQuota(uint64_t n) {
  Quotas q{};
  q[static_cast<size_t>(Resource::kQueued)] = n;
  return q;
}

void WaitForQueued(const TenantAccount& account, uint64_t n) {
  while (account.usage().used[static_cast<size_t>(Resource::kQueued)] != n) std::this_thread::yield();
}

int ThreadPolicy() {
  int policy = -1;
  sched_param param{};
  pthread_getschedparam(pthread_self(), &policy, &param);
  return policy;
}

TEST(SchedulerTest, OneTurnAtATime) {
  Scheduler scheduler({});
  TenantAccount a("a", QueuedQuota(100)), b("b", QueuedQuota(100));
  Scheduler::Queue* qa = scheduler.QueueFor(&a, {});
  Scheduler::Queue* qb = scheduler.QueueFor(&b, {{}, 3, Priority::kInteractive});
  std::atomic<int> holders = 0, most = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        absl::StatusOr<Scheduler::Turn> turn = scheduler.Acquire(t % 2 ? qa : qb);
        ASSERT_TRUE(turn.ok()) << turn.status();
        int now = ++holders;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        --holders;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(most.load(), 1);
  EXPECT_EQ(a.usage().work_items + b.usage().work_items, 3000u);
  EXPECT_EQ(scheduler.waiting(), 0u);
}

TEST(SchedulerTest, AFullQueueAnswersAtOnceAndChangesNothing) {
  Scheduler scheduler({});
  TenantAccount a("research", QueuedQuota(2)), other("other", QueuedQuota(2));
  Scheduler::Queue* q = scheduler.QueueFor(&a, {});
  absl::StatusOr<Scheduler::Turn> held = scheduler.Acquire(scheduler.QueueFor(&other, {}));
  ASSERT_TRUE(held.ok());
  std::vector<std::thread> waiting;
  std::atomic<int> ran = 0;
  for (int i = 0; i < 2; ++i)
    waiting.emplace_back([&] {
      absl::StatusOr<Scheduler::Turn> turn = scheduler.Acquire(q);
      EXPECT_TRUE(turn.ok()) << turn.status();
      ++ran;
    });
  WaitForQueued(a, 2);
  absl::StatusOr<Scheduler::Turn> refused = scheduler.Acquire(q);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("tenant research: queued quota of 2"));
  EXPECT_EQ(a.usage().used[static_cast<size_t>(Resource::kQueued)], 2u);
  EXPECT_EQ(a.usage().rejected, 1u);
  EXPECT_EQ(ran.load(), 0);
  { Scheduler::Turn release = std::move(*held); }
  for (auto& t : waiting) t.join();
  EXPECT_EQ(ran.load(), 2);
  EXPECT_EQ(a.usage().used[static_cast<size_t>(Resource::kQueued)], 0u);
  EXPECT_EQ(a.usage().work_items, 2u);
}

TEST(SchedulerTest, TheTimeATurnIsHeldIsChargedToItsTenant) {
  Scheduler scheduler({});
  TenantAccount a("a", QueuedQuota(1));
  Scheduler::Queue* q = scheduler.QueueFor(&a, {});
  {
    absl::StatusOr<Scheduler::Turn> turn = scheduler.Acquire(q);
    ASSERT_TRUE(turn.ok());
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(a.usage().device_time, absl::Milliseconds(20));
  EXPECT_EQ(a.usage().work_items, 1u);
}

TEST(SchedulerTest, QueueStatsCountEachTenantsWaitsRefusalsAndDeviceTime) {
  Scheduler scheduler({});
  TenantAccount a("a", QueuedQuota(2)), other("other", QueuedQuota(2));
  Scheduler::Queue* q = scheduler.QueueFor(&a, {});
  absl::StatusOr<Scheduler::Turn> held = scheduler.Acquire(scheduler.QueueFor(&other, {}));
  ASSERT_TRUE(held.ok());
  std::vector<std::thread> waiting;
  for (int i = 0; i < 2; ++i) waiting.emplace_back([&] { EXPECT_TRUE(scheduler.Acquire(q).ok()); });
  WaitForQueued(a, 2);
  EXPECT_EQ(scheduler.Acquire(q).status().code(), absl::StatusCode::kResourceExhausted);
  absl::SleepFor(absl::Milliseconds(20));
  { Scheduler::Turn release = std::move(*held); }
  for (auto& t : waiting) t.join();
  std::vector<Scheduler::QueueStats> stats = scheduler.queue_stats();
  std::sort(stats.begin(), stats.end(), [](const auto& x, const auto& y) { return x.tenant < y.tenant; });
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].tenant, "a");
  EXPECT_EQ(stats[0].waits, 2u);
  EXPECT_EQ(stats[0].rejected, 1u);
  EXPECT_GE(stats[0].wait_time, absl::Milliseconds(20)) << "both waited while the turn was held";
  EXPECT_EQ(stats[1].tenant, "other");
  EXPECT_EQ(stats[1].waits, 0u) << "an uncontended turn does not wait";
  EXPECT_GE(stats[1].device_time, absl::Milliseconds(20));
  EXPECT_EQ(stats[0].device_time + stats[1].device_time, a.usage().device_time + other.usage().device_time);
}

TEST(SchedulerTest, InteractiveWaitersGoBeforeBatchWaiters) {
  Scheduler scheduler({absl::Microseconds(500), absl::Seconds(100)});
  TenantAccount holder("holder", QueuedQuota(10)), batch("batch", QueuedQuota(10)),
      interactive("interactive", QueuedQuota(10));
  Scheduler::Queue* qb = scheduler.QueueFor(&batch, {});
  Scheduler::Queue* qi = scheduler.QueueFor(&interactive, {{}, 1, Priority::kInteractive});
  absl::StatusOr<Scheduler::Turn> held = scheduler.Acquire(scheduler.QueueFor(&holder, {}));
  ASSERT_TRUE(held.ok());
  absl::Mutex mu;
  std::vector<std::string> order;
  auto run = [&](Scheduler::Queue* q, const char* name) {
    absl::StatusOr<Scheduler::Turn> turn = scheduler.Acquire(q);
    ASSERT_TRUE(turn.ok());
    absl::MutexLock lock(&mu);
    order.push_back(name);
  };
  std::thread tb(run, qb, "batch");
  WaitForQueued(batch, 1);
  std::thread ti(run, qi, "interactive");
  WaitForQueued(interactive, 1);
  { Scheduler::Turn release = std::move(*held); }
  tb.join();
  ti.join();
  EXPECT_EQ(order, (std::vector<std::string>{"interactive", "batch"}));
}

TEST(SchedulerTest, BatchTurnsRunTheirThreadAtIdlePriorityOnlyWhileInteractiveWorkIsAbout) {
  Scheduler scheduler({absl::Microseconds(500), absl::Milliseconds(20), /*idle_batch_threads=*/true});
  if (!scheduler.idle_batch_threads()) GTEST_SKIP() << "this process may not return a thread from SCHED_IDLE";
  TenantAccount batch("batch", QueuedQuota(10)), interactive("interactive", QueuedQuota(10));
  Scheduler::Queue* qb = scheduler.QueueFor(&batch, {});
  Scheduler::Queue* qi = scheduler.QueueFor(&interactive, {{}, 1, Priority::kInteractive});
  std::thread([&] {
    {
      // No interactive work yet: a batch turn keeps its thread as it was.
      absl::StatusOr<Scheduler::Turn> turn = scheduler.Acquire(qb);
      ASSERT_TRUE(turn.ok());
      EXPECT_EQ(ThreadPolicy(), SCHED_OTHER);
    }
    {
      absl::StatusOr<Scheduler::Turn> turn = scheduler.Acquire(qi);
      ASSERT_TRUE(turn.ok());
      EXPECT_EQ(ThreadPolicy(), SCHED_OTHER);  // interactive turns are never lowered
    }
    {
      absl::StatusOr<Scheduler::Turn> turn = scheduler.Acquire(qb);
      ASSERT_TRUE(turn.ok());
      EXPECT_EQ(ThreadPolicy(), SCHED_IDLE);
      scheduler.Renew(*turn);
      EXPECT_EQ(ThreadPolicy(), SCHED_IDLE);  // kept across the steps of one piece of work
    }
    EXPECT_EQ(ThreadPolicy(), SCHED_OTHER);  // restored when the turn is released
  }).join();
}

TEST(SchedulerTest, WithoutTheOptionNoTurnChangesItsThread) {
  Scheduler scheduler({absl::Microseconds(500), absl::Milliseconds(20), /*idle_batch_threads=*/false});
  EXPECT_FALSE(scheduler.idle_batch_threads());
  TenantAccount batch("batch", QueuedQuota(10)), interactive("interactive", QueuedQuota(10));
  Scheduler::Queue* qb = scheduler.QueueFor(&batch, {});
  Scheduler::Queue* qi = scheduler.QueueFor(&interactive, {{}, 1, Priority::kInteractive});
  { absl::StatusOr<Scheduler::Turn> turn = scheduler.Acquire(qi); }
  absl::StatusOr<Scheduler::Turn> turn = scheduler.Acquire(qb);
  ASSERT_TRUE(turn.ok());
  EXPECT_EQ(ThreadPolicy(), SCHED_OTHER);
}

}  // namespace
}  // namespace replayd
