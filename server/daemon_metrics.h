// The daemon's metrics (the table in docs/operations.md): what the server counts as it
// answers calls and runs operations, and what it copies at each scrape from the engine
// (memory, sessions, device time, graph and compile caches, scheduler queues) and the
// executors, so that nothing is counted twice.
//
// The hot paths find their series once: a Session stream keeps its session's
// OperationMetrics for its life; a unary call looks them up by device and tenant.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_SERVER_DAEMON_METRICS_H_
#define REPLAYD_SERVER_DAEMON_METRICS_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "drivers/executor/executor_driver.h"
#include "engine/engine.h"
#include "server/authenticator.h"
#include "server/metrics.h"

namespace replayd {

class DaemonMetrics;

// The operations a Session stream runs, by the name its metrics give them.
enum class StreamOp { kLaunch, kCopy, kReplay, kWrite, kRead, kSynchronize, kKeepAlive, kReplaySequence, kNone };
inline constexpr size_t kStreamOpCount = 9;
const char* StreamOpName(StreamOp op);  // "launch", "copy", ..., "none" (a request without one)

// The series of one tenant's operations on one device.
class OperationMetrics {
 public:
  // A replay that completed in `seconds` (from the session's call to its end).
  void Replayed(double seconds);
  // `replays` replays of a sequence that completed.
  void ReplayedSequence(uint64_t replays);
  void Launched(double seconds);
  // A LoadProgram: its artifact from the compile cache, or compiled in `compile_seconds`.
  void Loaded(bool cache_hit, double compile_seconds);
  // A Session stream's operation, answered with `code` after `seconds`.
  void StreamOperation(StreamOp op, absl::StatusCode code, double seconds);

 private:
  friend class DaemonMetrics;
  static constexpr size_t kStatusCodes = 17;  // gRPC's and Abseil's codes, 0 to 16
  OperationMetrics(DaemonMetrics& metrics, std::string device, std::string tenant);

  DaemonMetrics& metrics_;
  const std::string device_, tenant_;
  Counter &replays_, &launches_, &compile_hits_, &compiles_, &compile_seconds_;
  Histogram &replay_seconds_, &launch_seconds_;
  // Made on first use, so that only operations run show up.
  std::array<std::atomic<Histogram*>, kStreamOpCount> stream_seconds_{};
  std::array<std::array<std::atomic<Counter*>, kStatusCodes>, kStreamOpCount> stream_ops_{};
};

class DaemonMetrics {
 public:
  // `engine` and every device in `executors` (the daemon's cpu devices, served through
  // executors) must outlive this.
  DaemonMetrics(const Engine& engine, std::vector<const executor::ExecutorDevice*> executors);
  DaemonMetrics(const DaemonMetrics&) = delete;
  DaemonMetrics& operator=(const DaemonMetrics&) = delete;

  // The series of `tenant`'s operations on `device`; the reference stays valid.
  OperationMetrics& For(absl::string_view device, absl::string_view tenant);

  // Counts a gRPC call of `method` ("/replayd.v1.Replayd/ReplayGraph") answered with
  // `code`, made by `tenant` (empty when it did not authenticate) for `device` (empty
  // when it names none).
  void CountRequest(absl::string_view method, grpc::StatusCode code, absl::string_view tenant,
                    absl::string_view device = "");
  // `id` if the daemon serves a device of that id, else "".
  std::string KnownDevice(absl::string_view id) const;
  // The device of `tenant`'s open session `session`, "" for none.
  std::string DeviceOfSession(absl::string_view tenant, uint64_t session) const;

  // Counts every call the server answers (CountRequest), with the tenant `auth` finds for
  // it: add to the ServerBuilder's interceptor creators. `auth` must outlive the server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RequestCounter(const Authenticator& auth);

  // The exposition: every metric, with the figures collected from the engine now.
  std::string Text() { return registry_.Text(); }

 private:
  friend class OperationMetrics;
  void Collect();

  const Engine& engine_;
  const std::vector<const executor::ExecutorDevice*> executors_;
  std::vector<std::string> device_ids_;  // the engine's devices, set at construction
  MetricsRegistry registry_;
  // Counted as they happen.
  Family<Counter>& requests_;
  Family<Counter>& replays_;
  Family<Counter>& launches_;
  Family<Histogram>& replay_seconds_;
  Family<Histogram>& launch_seconds_;
  Family<Counter>& stream_ops_;
  Family<Histogram>& stream_seconds_;
  Family<Counter>& compile_hits_;
  Family<Counter>& compiles_;
  Family<Counter>& compile_seconds_;
  // Copied from their sources at each scrape.
  Family<Gauge>& memory_total_;
  Family<Gauge>& memory_used_;
  Family<Gauge>& memory_free_;
  Family<Gauge>& tenant_memory_;
  Family<Gauge>& sessions_;
  Family<Counter>& device_seconds_;
  Family<Gauge>& queue_depth_;
  Family<Counter>& waits_;
  Family<Counter>& wait_seconds_;
  Family<Counter>& rejected_;
  Family<Counter>& graph_hits_;
  Family<Counter>& graph_misses_;
  Family<Counter>& graph_instantiations_;
  Family<Counter>& graph_evictions_;
  Family<Gauge>& graphs_cached_;
  Family<Gauge>& graph_bytes_;
  Family<Gauge>& artifacts_;
  Family<Gauge>& artifact_bytes_;
  Family<Counter>& artifact_evictions_;
  Family<Counter>& executors_started_;
  Family<Counter>& executors_died_;
  Family<Gauge>& shared_buffers_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::pair<std::string, std::string>, std::unique_ptr<OperationMetrics>> operations_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace replayd

#endif  // REPLAYD_SERVER_DAEMON_METRICS_H_
