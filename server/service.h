// The Replayd gRPC service: authenticate the caller, decode the request, call the
// engine, encode the reply. Each handler is a thin adapter over one engine operation.
#ifndef REPLAYD_SERVER_SERVICE_H_
#define REPLAYD_SERVER_SERVICE_H_

#include <memory>
#include <string>

#include "engine/engine.h"
#include "server/authenticator.h"
#include "server/health.h"
#include "server/daemon_metrics.h"
#include "server/session_stream.h"
#include "replayd/v1/replayd.grpc.pb.h"

namespace replayd {

// The Session method is served by SessionStreamServer.
class ReplaydService final : public SessionStreamService {
 public:
  // `engine`, `auth`, `health` and `metrics` must outlive the service. While `health`
  // says the daemon drains, OpenSession is refused (Health::AdmitSession).
  ReplaydService(Engine* engine, const Authenticator* auth, const Health* health, DaemonMetrics* metrics)
      : engine_(engine), auth_(auth), health_(health), metrics_(metrics) {}

  grpc::Status ListDevices(grpc::ServerContext*, const v1::ListDevicesRequest*,
                           v1::ListDevicesReply*) override;
  grpc::Status OpenSession(grpc::ServerContext*, const v1::OpenSessionRequest*,
                           v1::OpenSessionReply*) override;
  grpc::Status KeepAlive(grpc::ServerContext*, const v1::KeepAliveRequest*,
                         v1::KeepAliveReply*) override;
  grpc::Status CloseSession(grpc::ServerContext*, const v1::CloseSessionRequest*,
                            v1::CloseSessionReply*) override;
  grpc::Status AllocBuffer(grpc::ServerContext*, const v1::AllocBufferRequest*,
                           v1::AllocBufferReply*) override;
  grpc::Status FreeBuffer(grpc::ServerContext*, const v1::FreeBufferRequest*,
                          v1::FreeBufferReply*) override;
  grpc::Status ReadBuffer(grpc::ServerContext*, const v1::ReadBufferRequest*,
                          grpc::ServerWriter<v1::ReadChunk>*) override;
  grpc::Status LoadProgram(grpc::ServerContext*, const v1::LoadProgramRequest*,
                           v1::LoadProgramReply*) override;
  grpc::Status FreeProgram(grpc::ServerContext*, const v1::FreeProgramRequest*,
                           v1::FreeProgramReply*) override;
  grpc::Status Launch(grpc::ServerContext*, const v1::LaunchRequest*,
                      v1::LaunchReply*) override;
  grpc::Status CopyBuffer(grpc::ServerContext*, const v1::CopyBufferRequest*, v1::CopyBufferReply*) override;
  grpc::Status Synchronize(grpc::ServerContext*, const v1::SynchronizeRequest*,
                           v1::SynchronizeReply*) override;
  grpc::Status BeginCapture(grpc::ServerContext*, const v1::BeginCaptureRequest*,
                            v1::BeginCaptureReply*) override;
  grpc::Status EndCapture(grpc::ServerContext*, const v1::EndCaptureRequest*,
                          v1::GraphReply*) override;
  grpc::Status DefineGraph(grpc::ServerContext*, const v1::DefineGraphRequest*,
                           v1::GraphReply*) override;
  grpc::Status ReplayGraph(grpc::ServerContext*, const v1::ReplayGraphRequest*,
                           v1::ReplayGraphReply*) override;
  grpc::Status FreeGraph(grpc::ServerContext*, const v1::FreeGraphRequest*,
                         v1::FreeGraphReply*) override;
  grpc::Status GraphInfo(grpc::ServerContext*, const v1::GraphInfoRequest*,
                         v1::GraphReply*) override;

 private:
  // The caller's tenant, from the call's bearer token; UNAUTHENTICATED without one.
  absl::StatusOr<std::shared_ptr<const Tenant>> Caller(const grpc::ServerContext* context) const;
  absl::StatusOr<std::shared_ptr<replayd::DeviceSession>> FindSession(const grpc::ServerContext* context,
                                                       SessionId id);

  Engine* const engine_;
  const Authenticator* const auth_;
  const Health* const health_;
  DaemonMetrics* const metrics_;
};

}  // namespace replayd

#endif  // REPLAYD_SERVER_SERVICE_H_
