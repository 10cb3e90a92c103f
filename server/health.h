// What the daemon says about itself: whether it serves (grpc.health.v1, for probes and
// load balancers) and whether it is draining. A drain begins once, by SIGTERM or
// Admin.Drain; from then on the daemon is NOT_SERVING, refuses new sessions with a retry
// hint, and lets open sessions carry on until they close or the drain's time is up
// (Daemon::Stop).
//
// The statuses, by health service name:
//   ""  and  replayd.v1.Replayd   SERVING while the daemon serves at least one device and is
//                                 not draining: what a readiness probe asks.
//   replayd.v1.Admin              SERVING while the process runs, draining or not (Admin
//                                 answers through a drain): what a liveness probe asks.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_SERVER_HEALTH_H_
#define REPLAYD_SERVER_HEALTH_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace replayd {

class Health {
 public:
  // `drain`: how long a drain lets open sessions carry on. `devices`: how many devices the
  // daemon serves; with none it never says SERVING for Replayd.
  Health(absl::Duration drain, size_t devices) : drain_(drain), devices_(devices) {}

  // Publishes the statuses through `service`, the server's health service (which must
  // outlive this, or be detached by Shutdown), now and at every change.
  void Attach(grpc::HealthCheckServiceInterface* service);

  // Begins the drain; false (and nothing changes) when one has begun.
  bool BeginDrain();
  bool draining() const;
  // When the drain ends at the latest; absl::InfiniteFuture() before it has begun.
  absl::Time drain_deadline() const;
  // Blocks until a drain has begun.
  void AwaitDrain() const;

  // OK while new sessions are taken. While draining, UNAVAILABLE with a hint (in its
  // message, and as grpc-retry-pushback-ms trailing metadata on `context`: the time left
  // until the drain ends) to open the session on another daemon or after the restart.
  grpc::Status AdmitSession(grpc::ServerContext& context) const;

  // At the stop: every status NOT_SERVING and the health service's Watch calls ended, so
  // that they hold up no server shutdown. Later changes are not published.
  void Shutdown();

 private:
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration drain_;
  const size_t devices_;
  mutable absl::Mutex mu_;
  grpc::HealthCheckServiceInterface* service_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Time drain_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

}  // namespace replayd

#endif  // REPLAYD_SERVER_HEALTH_H_
