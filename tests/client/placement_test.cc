// Daemon targets: host:port, [IPv6]:port and dns:/// forms, names resolved to every
// address, and the targets refused before anything is dialled.
#include "client/placement.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "tests/support/status_macros.h"

namespace replayd::client {
namespace {

bool Has(const std::vector<std::string>& targets, const std::string& one) {
  return std::find(targets.begin(), targets.end(), one) != targets.end();
}

TEST(ResolveTargetTest, ANumericAddressIsItself) {
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> v4, ResolveTarget("127.0.0.1:7070"));
  EXPECT_EQ(v4, std::vector<std::string>{"127.0.0.1:7070"});
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> v6, ResolveTarget("[::1]:7070"));
  EXPECT_EQ(v6, std::vector<std::string>{"[::1]:7070"});
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> dns, ResolveTarget("dns:///127.0.0.1:80"));
  EXPECT_EQ(dns, std::vector<std::string>{"127.0.0.1:80"});
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> unix_socket, ResolveTarget("unix:/run/replayd.sock"));
  EXPECT_EQ(unix_socket, std::vector<std::string>{"unix:/run/replayd.sock"});
}

TEST(ResolveTargetTest, ANameStandsForEachOfItsAddresses) {
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> targets, ResolveTarget("localhost:7070"));
  EXPECT_TRUE(Has(targets, "127.0.0.1:7070")) << targets.size();
  for (const std::string& t : targets) EXPECT_TRUE(t == "127.0.0.1:7070" || t == "[::1]:7070") << t;
}

TEST(ResolveTargetTest, TargetsWithoutAUsablePortAreRefused) {
  for (const char* bad : {"localhost", "localhost:", "localhost:0", "localhost:65536", "localhost:http", "::1:7070",
                          "[::1]7070", "[::1", ":7070", "dns:///localhost"}) {
    const absl::StatusOr<std::vector<std::string>> resolved = ResolveTarget(bad);
    EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument) << bad << ": " << resolved.status();
  }
}

TEST(ResolveTargetTest, ANameThatDoesNotResolveIsNotFound) {
  const absl::StatusOr<std::vector<std::string>> resolved = ResolveTarget("no-such-daemon.invalid:7070");
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kNotFound) << resolved.status();
}

TEST(DaemonsTest, ConnectRefusesBadTargetsAndOptions) {
  EXPECT_EQ(Daemons::Connect({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Daemons::Connect({"127.0.0.1:7070", "localhost"}).status().code(), absl::StatusCode::kInvalidArgument);
  DaemonsOptions no_time;
  no_time.probe_timeout = absl::ZeroDuration();
  EXPECT_EQ(Daemons::Connect({"127.0.0.1:7070"}, no_time).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DaemonsTest, ATargetThatResolvesToNothingIsNotFoundAtASurvey) {
  ASSERT_OK_AND_ASSIGN(Daemons daemons, Daemons::Connect({"no-such-daemon.invalid:7070"}));
  EXPECT_EQ(daemons.Survey().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(daemons.OpenSession("cpu").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace replayd::client
