// Sessions placed across three real daemons on loopback ports: each goes to the serving
// daemon with the most free memory on a device of the kind asked for, keeps its calls
// there, and skips a daemon that is draining, one that does not answer, and a name that
// does not resolve.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/placement.h"
#include "tests/integration/daemon_processes.h"
#include "tests/support/free_port.h"
#include "tests/support/status_macros.h"
#include "tests/support/tenants_file.h"

namespace replayd::client {
namespace {

constexpr uint64_t kMiB = 1 << 20;

std::string MemoryLimit(uint64_t mib) { return absl::StrCat("--cpu_memory_limit=", mib * kMiB); }

// The state a survey found for `target`; a failed expectation when it has none.
DaemonState StateOf(const std::vector<DaemonState>& survey, const std::string& target) {
  for (const DaemonState& d : survey)
    if (d.target == target) return d;
  ADD_FAILURE() << "no daemon " << target << " in the survey";
  return {};
}

uint64_t CpuFreeMemory(const DaemonState& d) {
  for (const v1::Device& device : d.devices)
    if (device.kind() == "cpu") return device.free_memory();
  ADD_FAILURE() << d.target << " lists no cpu device: " << d.status;
  return 0;
}

class PlacementTest : public ::testing::Test {
 protected:
  DaemonProcesses daemons_;
};

TEST_F(PlacementTest, ASessionGoesToTheServingDaemonWithTheMostFreeMemory) {
  const DaemonProcess a = daemons_.Start({MemoryLimit(64)}), b = daemons_.Start({MemoryLimit(256), "--drain_seconds=600"}),
                      c = daemons_.Start({MemoryLimit(128)});
  ASSERT_OK_AND_ASSIGN(Daemons daemons, Daemons::Connect({a.address, b.address, c.address}));

  // All serving: b has the most.
  ASSERT_OK_AND_ASSIGN(PlacedSession on_b, daemons.OpenSession("cpu"));
  EXPECT_EQ(on_b.target, b.address);
  EXPECT_EQ(on_b.device.id(), "cpu:0");

  // b drains (its open session keeps it draining rather than gone): c is next.
  ASSERT_EQ(kill(b.pid, SIGTERM), 0);
  DaemonProcesses::AwaitNotServing(b.address);
  ASSERT_OK_AND_ASSIGN(PlacedSession first, daemons.OpenSession("cpu"));
  EXPECT_EQ(first.target, c.address);

  // The session's calls stay on c: 100 MiB there leave c 28 MiB, so the next goes to a.
  ASSERT_OK_AND_ASSIGN(Buffer big, first.session.Alloc(100 * kMiB));
  ASSERT_OK(first.session.WriteVector<uint32_t>(big, {7, 8, 9}));
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> back, first.session.ReadVector<uint32_t>(big, 3));
  EXPECT_EQ(back, (std::vector<uint32_t>{7, 8, 9}));
  ASSERT_OK_AND_ASSIGN(std::vector<DaemonState> survey, daemons.Survey());
  ASSERT_EQ(survey.size(), 3u);
  EXPECT_EQ(CpuFreeMemory(StateOf(survey, c.address)), 28 * kMiB);
  EXPECT_EQ(CpuFreeMemory(StateOf(survey, a.address)), 64 * kMiB);
  const DaemonState drained = StateOf(survey, b.address);
  EXPECT_EQ(drained.status.code(), absl::StatusCode::kUnavailable) << drained.status;
  EXPECT_TRUE(absl::StrContains(drained.status.message(), "draining")) << drained.status;
  EXPECT_TRUE(drained.devices.empty());

  ASSERT_OK_AND_ASSIGN(PlacedSession second, daemons.OpenSession("cpu"));
  EXPECT_EQ(second.target, a.address);
  ASSERT_OK_AND_ASSIGN(Buffer small, second.session.Alloc(kMiB));
  ASSERT_OK_AND_ASSIGN(survey, daemons.Survey());
  EXPECT_EQ(CpuFreeMemory(StateOf(survey, a.address)), 63 * kMiB);
  EXPECT_EQ(CpuFreeMemory(StateOf(survey, c.address)), 28 * kMiB);
}

TEST_F(PlacementTest, DaemonsThatDoNotAnswerOrResolveAreSkipped) {
  const DaemonProcess serving = daemons_.Start({});
  const std::string silent = absl::StrCat("127.0.0.1:", FreePort());  // nothing listens
  DaemonsOptions options;
  options.probe_timeout = absl::Seconds(5);
  ASSERT_OK_AND_ASSIGN(Daemons daemons,
                       Daemons::Connect({silent, "no-such-daemon.invalid:7070", serving.address}, options));
  ASSERT_OK_AND_ASSIGN(PlacedSession placed, daemons.OpenSession("cpu"));
  EXPECT_EQ(placed.target, serving.address);
  ASSERT_OK_AND_ASSIGN(std::vector<DaemonState> survey, daemons.Survey());
  ASSERT_EQ(survey.size(), 3u);
  EXPECT_EQ(StateOf(survey, silent).status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StateOf(survey, "no-such-daemon.invalid:7070").status.code(), absl::StatusCode::kNotFound);
  EXPECT_OK(StateOf(survey, serving.address).status);
}

TEST_F(PlacementTest, NoDaemonWithTheKindIsUnavailableAndSaysWhy) {
  const DaemonProcess d = daemons_.Start({});
  const std::string silent = absl::StrCat("127.0.0.1:", FreePort());
  ASSERT_OK_AND_ASSIGN(Daemons daemons, Daemons::Connect({d.address, silent}));
  const absl::StatusOr<PlacedSession> placed = daemons.OpenSession("cuda");
  ASSERT_EQ(placed.status().code(), absl::StatusCode::kUnavailable) << placed.status();
  EXPECT_TRUE(absl::StrContains(placed.status().message(), d.address + ": no cuda device")) << placed.status();
  EXPECT_TRUE(absl::StrContains(placed.status().message(), silent)) << placed.status();
}

// A daemon that refuses the session (here: the tenant's session quota there is full) is
// passed over for the next best; a client every daemon refuses sees why.
TEST_F(PlacementTest, ARefusedSessionGoesToTheNextBestDaemon) {
  const std::string token = "placement-token";
  const std::filesystem::path tenants = daemons_.dir() / "tenants.textproto";
  std::ofstream(tenants) << TenantText("placed", token, "  quotas { sessions: 1 }\n");
  const std::string tenants_flag = "--tenants=" + tenants.string();
  const DaemonProcess big = daemons_.Start({MemoryLimit(256), tenants_flag}),
                      small = daemons_.Start({MemoryLimit(64), tenants_flag});
  DaemonsOptions options;
  options.client.token = token;
  ASSERT_OK_AND_ASSIGN(Daemons daemons, Daemons::Connect({small.address, big.address}, options));
  ASSERT_OK_AND_ASSIGN(PlacedSession first, daemons.OpenSession("cpu"));
  EXPECT_EQ(first.target, big.address);
  ASSERT_OK_AND_ASSIGN(PlacedSession second, daemons.OpenSession("cpu"));
  EXPECT_EQ(second.target, small.address);
  const absl::StatusOr<PlacedSession> third = daemons.OpenSession("cpu");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kUnavailable) << third.status();
  EXPECT_TRUE(absl::StrContains(third.status().message(), "RESOURCE_EXHAUSTED")) << third.status();

  options.client.token = "not-a-tenant";
  ASSERT_OK_AND_ASSIGN(Daemons strangers, Daemons::Connect({small.address, big.address}, options));
  const absl::StatusOr<PlacedSession> refused = strangers.OpenSession("cpu");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), small.address)) << refused.status();
}

// Daemons with the same free memory take sessions in turn, and a name stands for its
// addresses: "localhost:port" is the daemon on 127.0.0.1.
TEST_F(PlacementTest, TiesGoRoundTheDaemonsAndNamesResolve) {
  const DaemonProcess a = daemons_.Start({MemoryLimit(64)}), b = daemons_.Start({MemoryLimit(64)});
  const std::string by_name = "localhost:" + a.address.substr(a.address.rfind(':') + 1);
  ASSERT_OK_AND_ASSIGN(Daemons daemons, Daemons::Connect({by_name, b.address}));
  std::set<std::string> targets;
  std::vector<PlacedSession> sessions;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(PlacedSession placed, daemons.OpenSession("cpu"));
    targets.insert(placed.target);
    sessions.push_back(std::move(placed));
  }
  EXPECT_EQ(targets, (std::set<std::string>{a.address, b.address}));
  ASSERT_OK_AND_ASSIGN(Client client_of_a, daemons.ClientOf(a.address));
  EXPECT_OK(client_of_a.ListDevices().status());
  EXPECT_EQ(daemons.ClientOf("127.0.0.1:1").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace replayd::client
