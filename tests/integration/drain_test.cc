// Draining real replayd processes over loopback: SIGTERM and Admin.Drain turn health
// NOT_SERVING and refuse new sessions with a retry hint, while open sessions and their
// replays in flight carry on; the daemon exits 0 once they have closed or the drain's time
// is up; a second SIGTERM exits at once; a client that meets a draining daemon carries on
// on a second one.
#include <gtest/gtest.h>
#include <signal.h>

#include <future>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "tests/integration/affine_work.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/daemon_processes.h"
#include "tests/support/child_process.h"
#include "tests/support/status_macros.h"

namespace replayd::client {
namespace {

using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;
using grpc::health::v1::HealthCheckResponse;

class DrainTest : public ::testing::Test {
 protected:
  DaemonProcess Start(const std::vector<std::string>& flags) { return daemons_.Start(flags); }
  static void AwaitNotServing(const std::string& address) { DaemonProcesses::AwaitNotServing(address); }

  DaemonProcesses daemons_;
};

// OpenSession on a draining daemon: UNAVAILABLE, a message that says why and what to do,
// and a retry pushback in the trailing metadata.
void ExpectSessionRefused(const std::string& address) {
  Client client = Client::Connect(address);
  grpc::ClientContext context;
  v1::OpenSessionRequest request;
  request.set_device("cpu:0");
  v1::OpenSessionReply reply;
  const grpc::Status refused = client.stub().OpenSession(&context, request, &reply);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "draining")) << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "another daemon")) << refused.error_message();
  const auto& trailers = context.GetServerTrailingMetadata();
  auto pushback = trailers.find("grpc-retry-pushback-ms");
  ASSERT_NE(pushback, trailers.end()) << "no grpc-retry-pushback-ms";
  int64_t ms = 0;
  EXPECT_TRUE(absl::SimpleAtoi(absl::string_view(pushback->second.data(), pushback->second.size()), &ms));
  EXPECT_GT(ms, 0);
}

TEST_F(DrainTest, SigtermTurnsHealthNotServingAndReplaysInFlightComplete) {
  const DaemonProcess d = Start({"--drain_seconds=600"});
  Client client = Client::Connect(d.address);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> work, Work::Begin(client));
  // Replays queued on the session's stream, running or waiting when the signal comes.
  std::vector<std::future<absl::StatusOr<ReplayResult>>> in_flight;
  for (int64_t pos = 1; pos <= 32; ++pos) in_flight.push_back(work->ReplayAsync(pos));
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  AwaitNotServing(d.address);
  ASSERT_OK_AND_ASSIGN(ServingStatus replayd, client.Health("replayd.v1.Replayd"));
  EXPECT_EQ(replayd, HealthCheckResponse::NOT_SERVING);
  ASSERT_OK_AND_ASSIGN(ServingStatus admin, client.Health("replayd.v1.Admin"));
  EXPECT_EQ(admin, HealthCheckResponse::SERVING);  // what a liveness probe asks holds
  ExpectSessionRefused(d.address);
  for (int64_t pos = 1; pos <= 32; ++pos) EXPECT_TRUE(Work::Check(in_flight[pos - 1].get(), pos).ok()) << pos;
  // The open session goes on working through the drain.
  EXPECT_TRUE(work->ReplayAndCheck(1000).ok());
  EXPECT_TRUE(work->Close().ok());
  EXPECT_EQ(WaitExit(d.pid), 0) << ReadText(d.log);
  EXPECT_TRUE(absl::StrContains(ReadText(d.log), "drained: every session has closed")) << ReadText(d.log);
}

TEST_F(DrainTest, ASecondSigtermExitsAtOnce) {
  const DaemonProcess d = Start({"--drain_seconds=600"});
  Client client = Client::Connect(d.address);
  // An open session holds the drain for its 600 s.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> work, Work::Begin(client));
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  AwaitNotServing(d.address);  // the first signal is taken, so the second is not merged into it
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  EXPECT_EQ(WaitExit(d.pid), 0) << ReadText(d.log);
  EXPECT_TRUE(absl::StrContains(ReadText(d.log), "again: exiting at once")) << ReadText(d.log);
}

// Admin.Drain drains as SIGTERM does; a session left open is closed when the drain's time
// is up, and the daemon still exits 0.
TEST_F(DrainTest, AdminDrainClosesWhatIsOpenWhenTheTimeIsUp) {
  const DaemonProcess d = Start({"--drain_seconds=1"});
  Client client = Client::Connect(d.address);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> work, Work::Begin(client));
  ASSERT_OK_AND_ASSIGN(v1::DrainReply drain, client.Drain());
  EXPECT_FALSE(drain.already_draining());
  EXPECT_EQ(drain.sessions(), 1u);
  EXPECT_LE(drain.seconds_left(), 1.0);
  EXPECT_EQ(WaitExit(d.pid), 0) << ReadText(d.log);
  EXPECT_TRUE(absl::StrContains(ReadText(d.log), "with 1 sessions open: closing them")) << ReadText(d.log);
  EXPECT_FALSE(work->ReplayAndCheck(1).ok());  // the daemon is gone
}

// --shutdown_grace_seconds, the flag's older name, sets the drain's time when
// --drain_seconds is not given; with both, --drain_seconds wins.
TEST_F(DrainTest, ShutdownGraceSecondsIsTheOlderNameOfDrainSeconds) {
  for (const auto& [flags, seconds] : std::vector<std::pair<std::vector<std::string>, double>>{
           {{"--shutdown_grace_seconds=7"}, 7}, {{"--shutdown_grace_seconds=7", "--drain_seconds=500"}, 500}}) {
    const DaemonProcess d = Start(flags);
    Client client = Client::Connect(d.address);
    ASSERT_OK_AND_ASSIGN(Session session, client.OpenSession("cpu:0"));  // holds the drain
    ASSERT_OK_AND_ASSIGN(v1::DrainReply drain, client.Drain());
    EXPECT_LE(drain.seconds_left(), seconds);
    EXPECT_GT(drain.seconds_left(), seconds - 5);
    ASSERT_OK_AND_ASSIGN(v1::DrainReply again, client.Drain());
    EXPECT_TRUE(again.already_draining()) << again.DebugString();
    EXPECT_TRUE(session.Close().ok());
    EXPECT_EQ(WaitExit(d.pid), 0) << ReadText(d.log);
  }
}

// A client whose daemon drains finishes its work there, and opens its next session on
// another daemon, which it finds by asking each for its health.
TEST_F(DrainTest, AClientCarriesOnOnASecondDaemon) {
  const std::vector<DaemonProcess> daemons = {Start({"--drain_seconds=600"}), Start({"--drain_seconds=600"})};
  auto serving = [&]() -> absl::StatusOr<std::string> {
    for (const DaemonProcess& d : daemons) {
      absl::StatusOr<ServingStatus> health = Client::Connect(d.address).Health();
      if (health.ok() && *health == HealthCheckResponse::SERVING) return d.address;
    }
    return absl::UnavailableError("no daemon serves");
  };
  ASSERT_OK_AND_ASSIGN(std::string first, serving());
  ASSERT_EQ(first, daemons[0].address);
  Client a = Client::Connect(first);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> on_a, Work::Begin(a));
  EXPECT_TRUE(on_a->ReplayAndCheck(1).ok());

  ASSERT_EQ(kill(daemons[0].pid, SIGTERM), 0);
  AwaitNotServing(first);
  ExpectSessionRefused(first);
  ASSERT_OK_AND_ASSIGN(std::string second, serving());
  ASSERT_EQ(second, daemons[1].address);
  Client b = Client::Connect(second);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> on_b, Work::Begin(b));
  for (int64_t pos = 2; pos <= 20; ++pos) {
    EXPECT_TRUE(on_a->ReplayAndCheck(pos).ok()) << pos;  // the session on A finishes its work
    EXPECT_TRUE(on_b->ReplayAndCheck(pos).ok()) << pos;
  }
  on_a.reset();  // closes its session: A has nothing left to wait for
  EXPECT_EQ(WaitExit(daemons[0].pid), 0) << ReadText(daemons[0].log);
  EXPECT_TRUE(on_b->ReplayAndCheck(21).ok());
  on_b.reset();
  ASSERT_EQ(kill(daemons[1].pid, SIGTERM), 0);
  EXPECT_EQ(WaitExit(daemons[1].pid), 0) << ReadText(daemons[1].log);
}

}  // namespace
}  // namespace replayd::client
