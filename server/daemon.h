// The daemon as an object: the drivers named in its options, the engine over their
// devices, and a gRPC server listening on one address. main() builds one from flags;
// tests build one on an ephemeral loopback port.
#ifndef REPLAYD_SERVER_DAEMON_H_
#define REPLAYD_SERVER_DAEMON_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "drivers/cpu/cpu_driver.h"
#ifdef REPLAYD_WITH_CUDA
#include "drivers/cuda/cuda_driver.h"
#endif
#ifdef REPLAYD_WITH_HIP
#include "drivers/hip/hip_driver.h"
#endif
#include "engine/engine.h"
#include "server/admin_service.h"
#include "server/authenticator.h"
#include "server/health.h"
#include "server/daemon_metrics.h"
#include "server/metrics_server.h"
#include "server/service.h"
#include "server/session_stream.h"

namespace replayd {

// The device kinds this build can serve, comma-separated.
inline constexpr char kKnownDeviceKinds[] =
    "cpu"
#ifdef REPLAYD_WITH_CUDA
    ",cuda"
#endif
#ifdef REPLAYD_WITH_HIP
    ",hip"
#endif
    ;

struct DaemonOptions {
  std::string listen = "127.0.0.1:7070";  // host:port; port 0 picks a free one
  // Driver kinds to start. A kind without hardware or vendor library serves no devices.
  std::vector<std::string> devices = {"cpu"};
  EngineOptions engine;
  CpuDriverOptions cpu;
#ifdef REPLAYD_WITH_CUDA
  CudaDriverOptions cuda;
  // Device memory counted for each running CUDA executor's own CUDA context.
  uint64_t cuda_executor_bytes = uint64_t{512} << 20;
#endif
#ifdef REPLAYD_WITH_HIP
  HipDriverOptions hip;
  // Device memory counted for each running HIP executor's own runtime state.
  uint64_t hip_executor_bytes = uint64_t{256} << 20;
#endif
  // For tenants whose policy says nothing (and `default`, without a tenants file): where
  // their device work runs and the longest one launch may run there. kProcess: a
  // replayd-executor process per tenant and cpu device (drivers/executor), so a kernel
  // that crashes ends only that process; kShared: the daemon's process, for trusted
  // tenants only (untrusted ones get kProcess whatever this says).
  TenantDefaults tenant_defaults;
  std::filesystem::path executor_binary;  // empty: replayd-executor beside this program
  // How long a tenant's executor outlives its last session, idle, for the tenant's next
  // session to open in at once (executor::ExecutorOptions::linger; it ends sooner where its
  // device memory is wanted); 0: it ends with it.
  absl::Duration executor_linger = absl::Seconds(10);
  SessionStreamOptions streams;        // Session streams: window and polling threads
  std::filesystem::path tenants_file;  // empty: one tenant, default, without authentication
  // TLS: a PEM certificate chain and key; with a client CA, clients must present a
  // certificate it signed (mutual TLS). Empty: plaintext.
  std::filesystem::path tls_cert, tls_key, tls_client_ca;
  // How long a drain (SIGTERM, Admin.Drain) lets open sessions and calls carry on.
  absl::Duration drain = absl::Seconds(30);
  // Where Prometheus scrapes the metrics (GET /metrics): port, :port (loopback) or
  // host:port; empty: not served.
  std::string metrics_listen;
};

// The devices of `kind` ("cpu", "cuda", "hip") with the driver options in `options`. A kind
// whose vendor library or hardware is missing gives none and logs why, once;
// INVALID_ARGUMENT for a kind this build does not know.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> DiscoverDevices(const std::string& kind,
                                                                     const DaemonOptions& options);

class Daemon {
 public:
  // Starts serving. INVALID_ARGUMENT for an unknown device kind; UNAVAILABLE when the
  // address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options);
  ~Daemon();

  // The address clients dial, with the port actually bound ("127.0.0.1:40123").
  const std::string& address() const { return address_; }
  Engine& engine() { return *engine_; }
  // The metrics' HTTP address with the port bound; empty when not served.
  std::string metrics_address() const { return metrics_server_ ? metrics_server_->address() : ""; }

  // Reads the tenants file again (SIGHUP) and applies its limits to the engine; on error
  // the policies in force stay.
  absl::Status ReloadTenants();

  // Begins the drain (SIGTERM), as Admin.Drain does: health NOT_SERVING, new sessions
  // refused with UNAVAILABLE, open sessions and calls carry on. False when a drain had begun.
  bool Drain() { return health_->BeginDrain(); }
  // Blocks until a drain has begun, by Drain or Admin.Drain.
  void AwaitDrain() const { health_->AwaitDrain(); }
  // When the drain ends at the latest; absl::InfiniteFuture() before one has begun.
  absl::Time drain_deadline() const { return health_->drain_deadline(); }

  // Ends the drain (beginning one if none has): waits until every session has closed (by
  // its client, its lease or an admin) or the drain's time is up, then stops the server:
  // calls still running get what is left of that time, at most 1 s, then are cancelled
  // (a health Watch among them), and the streams' operations are waited for. Returns the
  // sessions still open, which the destructor closes. Call once.
  size_t Stop();

 private:
  Daemon() = default;
  // Stops accepting calls, gives calls in flight until `deadline`, then cancels them.
  void Shutdown(absl::Time deadline);

  // Where programs are compiled (engine/compile_cache.h): removed after everything else.
  std::unique_ptr<ScratchDirectory> scratch_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Health> health_;
  std::unique_ptr<DaemonMetrics> metrics_;  // counted into by the calls: outlives the server
  std::unique_ptr<ReplaydService> service_;
  std::unique_ptr<AdminService> admin_;
  // Destroyed after the server, as its completion queue must be.
  std::unique_ptr<SessionStreamServer> streams_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<MetricsServer> metrics_server_;  // reads the engine: destroyed first
};

}  // namespace replayd

#endif  // REPLAYD_SERVER_DAEMON_H_
