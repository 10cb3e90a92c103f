// The Admin gRPC service (admin.proto): tenants with their usage against quotas and their
// graph caches, closing any session, and draining the daemon. Callers must be admin
// tenants.
#ifndef REPLAYD_SERVER_ADMIN_SERVICE_H_
#define REPLAYD_SERVER_ADMIN_SERVICE_H_

#include "engine/engine.h"
#include "replayd/v1/admin.grpc.pb.h"
#include "server/authenticator.h"
#include "server/health.h"

namespace replayd {

class AdminService final : public v1::Admin::Service {
 public:
  // `engine`, `auth` and `health` must outlive the service.
  AdminService(Engine* engine, const Authenticator* auth, Health* health)
      : engine_(engine), auth_(auth), health_(health) {}

  grpc::Status ListTenants(grpc::ServerContext*, const v1::ListTenantsRequest*,
                           v1::ListTenantsReply*) override;
  grpc::Status CloseSession(grpc::ServerContext*, const v1::AdminCloseSessionRequest*,
                            v1::AdminCloseSessionReply*) override;
  grpc::Status Drain(grpc::ServerContext*, const v1::DrainRequest*, v1::DrainReply*) override;

 private:
  // UNAUTHENTICATED or PERMISSION_DENIED unless the caller is an admin tenant.
  absl::Status CheckAdmin(const grpc::ServerContext& context) const;

  Engine* const engine_;
  const Authenticator* const auth_;
  Health* const health_;
};

}  // namespace replayd

#endif  // REPLAYD_SERVER_ADMIN_SERVICE_H_
