// WorkerPool: a worker per blocked task up to its most threads, refusals past them, and
// work taken again once a worker is free.
#include "server/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>

#include "absl/synchronization/notification.h"
#include "server/dispatch.h"
#include "absl/time/clock.h"

namespace replayd {
namespace {

TEST(WorkerPoolTest, EachBlockedTaskGetsAWorkerOfItsOwn) {
  WorkerPool pool(8);
  absl::Notification release;
  std::atomic<int> started{0};
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(pool.Run([&] {
      ++started;
      release.WaitForNotification();
    }));
  // All four run at once: none waits for another to finish.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (started < 4 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(started, 4);
  release.Notify();
}

TEST(WorkerPoolTest, PastItsMostThreadsItRefusesAndTakesWorkAgainOnceOneIsFree) {
  WorkerPool pool(2);
  absl::Notification release;
  std::atomic<int> finished{0};
  auto blocked = [&] {
    release.WaitForNotification();
    ++finished;
  };
  ASSERT_TRUE(pool.Run(blocked));
  ASSERT_TRUE(pool.Run(blocked));
  bool ran = false;
  EXPECT_FALSE(pool.Run([&] { ran = true; })) << "both workers are busy";
  release.Notify();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (finished < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(finished, 2);
  absl::Notification done;
  EXPECT_TRUE(pool.Run([&] { done.Notify(); })) << "an idle worker takes it";
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE(ran) << "a refused task never runs";
}

TEST(WorkerPoolTest, TheDestructorWaitsForTheTasksGiven) {
  std::atomic<int> finished{0};
  {
    WorkerPool pool(4);
    for (int i = 0; i < 4; ++i)
      ASSERT_TRUE(pool.Run([&] {
        absl::SleepFor(absl::Milliseconds(20));
        ++finished;
      }));
  }
  EXPECT_EQ(finished, 4);
}

// A tenant allowed one worker may send its next operation as soon as the last one is
// done: the count is given back before the reply, not after the worker has wound down.
TEST(DispatcherTest, ATenantsWorkerIsFreeForItsNextOperationOnceTheLastIsDone) {
  absl::Notification release_first, release_third;
  Dispatcher dispatcher(/*inline_slots=*/1, /*workers=*/4, /*workers_per_tenant=*/1);
  // Let the blocked tasks go before the dispatcher waits for them, however the test ends.
  struct Release {
    absl::Notification* n[2];
    ~Release() {
      for (absl::Notification* x : n)
        if (!x->HasBeenNotified()) x->Notify();
    }
  } release{{&release_first, &release_third}};
  absl::Notification answered, second_ran;
  ASSERT_TRUE(dispatcher
                  .HandOff("alice",
                           [&](const std::function<void()>& done) {
                             done();  // as a unary call does before its reply
                             answered.Notify();
                             release_first.WaitForNotification();  // still winding down
                           })
                  .ok());
  answered.WaitForNotification();
  EXPECT_TRUE(dispatcher
                  .HandOff("alice",
                           [&](const std::function<void()>& done) {
                             done();
                             second_ran.Notify();
                           })
                  .ok());
  EXPECT_TRUE(second_ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  // A task that does not say it is done holds the tenant's worker until it returns.
  absl::Notification holding;
  ASSERT_TRUE(dispatcher
                  .HandOff("alice",
                           [&](const std::function<void()>&) {
                             holding.Notify();
                             release_third.WaitForNotification();
                           })
                  .ok());
  holding.WaitForNotification();
  EXPECT_EQ(dispatcher.HandOff("alice", [](const std::function<void()>&) {}).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(dispatcher.HandOff("bob", [](const std::function<void()>&) {}).ok()) << "another tenant has its own";
}

}  // namespace
}  // namespace replayd
