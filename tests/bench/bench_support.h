// What every replayd benchmark needs: child processes (the daemon, the baseline server)
// placed on chosen cores, the baseline service, and medians over interleaved runs.
#ifndef REPLAYD_TESTS_BENCH_BENCH_SUPPORT_H_
#define REPLAYD_TESTS_BENCH_BENCH_SUPPORT_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace replayd::bench {

// A child process, killed (SIGTERM, then SIGKILL) and reaped on destruction.
class ChildProcess {
 public:
  // Starts argv; with cpu >= 0 the child is pinned to that core.
  ChildProcess(const std::vector<std::string>& argv, int cpu);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  bool running() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
};

// Pins the calling thread to `cpu` (no-op for cpu < 0).
void PinTo(int cpu);

// A free TCP port on 127.0.0.1.
int FreePort();

// Serves the Baseline service on `address` until SIGTERM; returns the exit code.
int ServeBaseline(const std::string& address);

// Waits until a gRPC server answers at `address`; false after `timeout`.
bool WaitForServer(const std::string& address, absl::Duration timeout);

// The median of `values`.
double Median(std::vector<double> values);

// Runs each of `subjects` `runs` times, interleaved (a b a b ...), and returns per
// subject the median over runs of what each run returned.
std::vector<double> InterleavedMedians(const std::vector<std::function<double()>>& subjects,
                                       int runs);

}  // namespace replayd::bench

#endif  // REPLAYD_TESTS_BENCH_BENCH_SUPPORT_H_
