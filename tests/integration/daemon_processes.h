// replayd processes on free loopback ports for tests that run the daemon binary
// (REPLAYD_BINARY): started with their flags, awaited until they serve, and killed at the
// end if a test left them running.
#ifndef REPLAYD_TESTS_INTEGRATION_DAEMON_PROCESSES_H_
#define REPLAYD_TESTS_INTEGRATION_DAEMON_PROCESSES_H_

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "tests/support/child_process.h"
#include "tests/support/free_port.h"
#include "tests/support/temp_dir.h"

namespace replayd::client {

// A replayd process on a free loopback port, its log in its own file.
struct DaemonProcess {
  pid_t pid = -1;
  std::string address;
  std::filesystem::path log;
};

class DaemonProcesses {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  DaemonProcesses() = default;
  DaemonProcesses(const DaemonProcesses&) = delete;
  DaemonProcesses& operator=(const DaemonProcesses&) = delete;
  // Kills the daemons still running; one a test has waited for is left alone.
  ~DaemonProcesses() {
    for (pid_t pid : pids_) {
      if (waitpid(pid, nullptr, WNOHANG) != 0) continue;  // reaped already, or exited now
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }

  // Starts replayd serving cpu with `flags` on `address` (empty: a free port) and waits
  // until it says SERVING; ADD_FAILURE (with its log) when it does not. Every daemon
  // started here shares one compile cache directory.
  DaemonProcess Start(const std::vector<std::string>& flags, const std::string& address = "") {
    DaemonProcess d;
    d.address = address.empty() ? absl::StrCat("127.0.0.1:", FreePort()) : address;
    d.log = dir_.path() / absl::StrCat("replayd-", pids_.size() + 1, ".log");
    std::vector<std::string> argv = {REPLAYD_BINARY, "--listen=" + d.address, "--devices=cpu",
                                     "--cache_dir=" + (dir_.path() / "cache").string()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    d.pid = Spawn(argv, d.log);
    EXPECT_GT(d.pid, 0);
    if (d.pid > 0) pids_.push_back(d.pid);
    absl::StatusOr<ServingStatus> health = absl::UnavailableError("not asked");
    for (int i = 0; i < 200 && !(health.ok() && *health == grpc::health::v1::HealthCheckResponse::SERVING); ++i) {
      absl::SleepFor(absl::Milliseconds(50));
      health = Client::Connect(d.address).Health();
    }
    EXPECT_TRUE(health.ok() && *health == grpc::health::v1::HealthCheckResponse::SERVING)
        << health.status() << "\n" << ReadText(d.log);
    return d;
  }

  // Waits until `address` says NOT_SERVING for the daemon as a whole.
  static void AwaitNotServing(const std::string& address) {
    absl::StatusOr<ServingStatus> health;
    for (int i = 0; i < 600; ++i) {
      health = Client::Connect(address).Health();
      if (health.ok() && *health == grpc::health::v1::HealthCheckResponse::NOT_SERVING) return;
      absl::SleepFor(absl::Milliseconds(50));
    }
    FAIL() << "the daemon at " << address << " never said NOT_SERVING: " << health.status();
  }

  const std::filesystem::path& dir() const { return dir_.path(); }

 private:
  TempDir dir_;
  std::vector<pid_t> pids_;
};

}  // namespace replayd::client

#endif  // REPLAYD_TESTS_INTEGRATION_DAEMON_PROCESSES_H_
