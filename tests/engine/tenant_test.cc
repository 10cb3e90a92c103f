// A tenant's account: reservations at a quota pass, one past fails naming the quota with
// the usage unchanged, releases give back, a reservation not committed is released, and
// concurrent reservations never pass a quota together.
#include "engine/tenant.h"

#include <gmock/gmock.h>

#include <atomic>
#include <thread>
#include <vector>

namespace replayd {
namespace {

using ::testing::HasSubstr;

Quotas WithQuota(Resource r, uint64_t limit) {
  Quotas q = {};
  q[static_cast<size_t>(r)] = limit;
  return q;
}

TEST(TenantAccountTest, AReservationPastTheQuotaFailsNamingItAndChangesNothing) {
  TenantAccount account("research", WithQuota(Resource::kMemory, 1 << 20));
  ASSERT_TRUE(account.Reserve(Resource::kMemory, 1040000).ok());
  absl::Status past = account.Reserve(Resource::kMemory, 16384);
  EXPECT_EQ(past.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(past.message()), HasSubstr("tenant research: memory_bytes quota of 1048576 exceeded"));
  EXPECT_EQ(account.usage().used[static_cast<size_t>(Resource::kMemory)], 1040000u);
  account.Release(Resource::kMemory, 1040000);
  EXPECT_TRUE(account.Reserve(Resource::kMemory, 1 << 20).ok()) << "exactly at the quota";
  EXPECT_TRUE(account.Reserve(Resource::kSessions, 1000000).ok()) << "0 is no limit";
}

TEST(TenantAccountTest, AReservationNotCommittedIsReleased) {
  TenantAccount account("t", WithQuota(Resource::kPrograms, 1));
  ASSERT_TRUE(account.Reserve(Resource::kPrograms, 1).ok());
  { Reservation r(&account, Resource::kPrograms, 1); }  // the operation failed after reserving
  EXPECT_TRUE(account.Reserve(Resource::kPrograms, 1).ok());
  {
    Reservation r(&account, Resource::kPrograms, 1);
    r.Commit();
  }
  EXPECT_FALSE(account.Reserve(Resource::kPrograms, 1).ok()) << "a committed reservation stays";
}

TEST(TenantAccountTest, ConcurrentReservationsNeverPassTheQuotaTogether) {
  constexpr uint64_t kQuota = 1000;
  TenantAccount account("t", WithQuota(Resource::kGraphs, kQuota));
  std::atomic<uint64_t> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i)
        if (account.Reserve(Resource::kGraphs, 1).ok()) ++granted;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(granted.load(), kQuota);
  EXPECT_EQ(account.usage().used[static_cast<size_t>(Resource::kGraphs)], kQuota);
}

}  // namespace
}  // namespace replayd
