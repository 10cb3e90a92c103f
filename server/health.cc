#include "server/health.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "replayd/v1/admin.grpc.pb.h"
#include "replayd/v1/replayd.grpc.pb.h"

namespace replayd {

void Health::Attach(grpc::HealthCheckServiceInterface* service) {
  absl::MutexLock lock(&mu_);
  service_ = service;
  PublishLocked();
}

bool Health::BeginDrain() {
  absl::MutexLock lock(&mu_);
  if (drain_deadline_ != absl::InfiniteFuture()) return false;
  drain_deadline_ = absl::Now() + drain_;
  PublishLocked();
  return true;
}

bool Health::draining() const {
  absl::MutexLock lock(&mu_);
  return drain_deadline_ != absl::InfiniteFuture();
}

absl::Time Health::drain_deadline() const {
  absl::MutexLock lock(&mu_);
  return drain_deadline_;
}

void Health::AwaitDrain() const {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](const absl::Time* deadline) { return *deadline != absl::InfiniteFuture(); }, &drain_deadline_));
}

grpc::Status Health::AdmitSession(grpc::ServerContext& context) const {
  const absl::Time deadline = drain_deadline();
  if (deadline == absl::InfiniteFuture()) return grpc::Status::OK;
  const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
  // A client's retry policy waits this long before it tries again: past the drain, when
  // the daemon has restarted or a load balancer has moved on.
  const int64_t pushback_ms = std::max<int64_t>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 1000);
  context.AddTrailingMetadata("grpc-retry-pushback-ms", absl::StrCat(pushback_ms));
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      absl::StrCat("replayd is draining: it takes no new sessions and stops within ",
                                   std::ceil(absl::ToDoubleSeconds(left)),
                                   " s; open the session on another daemon, or retry here after ",
                                   pushback_ms, " ms"));
}

void Health::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (service_ != nullptr) service_->Shutdown();
  service_ = nullptr;
}

void Health::PublishLocked() {
  if (service_ == nullptr) return;
  const bool serving = devices_ > 0 && drain_deadline_ == absl::InfiniteFuture();
  service_->SetServingStatus("", serving);
  service_->SetServingStatus(v1::Replayd::service_full_name(), serving);
  service_->SetServingStatus(v1::Admin::service_full_name(), true);
}

}  // namespace replayd
