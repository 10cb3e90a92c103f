// Proto <-> engine translation. Every enum and oneof off the wire is checked here: an
// unknown enum value or a missing oneof is INVALID_ARGUMENT, never a default.
#ifndef REPLAYD_SERVER_TRANSLATE_H_
#define REPLAYD_SERVER_TRANSLATE_H_

#include "absl/status/statusor.h"
#include "drivers/driver.h"
#include "engine/call.h"
#include "engine/engine.h"
#include "engine/replay.h"
#include "engine/session.h"
#include "replayd/v1/replayd.pb.h"

namespace replayd {

absl::StatusOr<ProgramSource> FromProto(const v1::LoadProgramRequest& request);
absl::StatusOr<LaunchOp> FromProto(const v1::LaunchRequest& request);
absl::StatusOr<CopyOp> FromProto(const v1::CopyBufferRequest& request);
absl::StatusOr<VariableDecl> FromProto(const v1::Variable& variable);
// An expression whose variable names resolve through `variables`.
absl::StatusOr<Expression> FromProto(const v1::Expr& expr, std::span<const VariableDecl> variables);
absl::StatusOr<GraphDef> FromProto(const v1::GraphDef& def);
absl::StatusOr<ReplayOp> FromProto(const v1::ReplayGraphRequest& request);
// The same into `op`, reusing its storage.
absl::Status FromProto(const v1::ReplayGraphRequest& request, ReplayOp& op);
absl::StatusOr<ReplaySequenceOp> FromProto(const v1::ReplaySequenceRequest& request);
void ToProto(const DeviceStatus& device, v1::Device* out);

// Runs an eager device operation (DeviceSession::Launch or DeviceSession::CopyBuffer) decoded from
// `request` and sets the device time in `reply`, for the unary RPC and the stream alike.
template <typename Request, typename Op, typename Reply>
absl::Status RunEager(DeviceSession& session, absl::StatusOr<LaunchResult> (DeviceSession::*run)(const Op&), const Request& request,
                      Reply& reply) {
  absl::StatusOr<Op> op = FromProto(request);
  if (!op.ok()) return op.status();
  absl::StatusOr<LaunchResult> result = (session.*run)(*op);
  if (!result.ok()) return result.status();
  if (result->device_time) reply.set_device_seconds(absl::ToDoubleSeconds(*result->device_time));
  return absl::OkStatus();
}
void ToProto(const GraphInfo& info, v1::GraphReply* out);

}  // namespace replayd

#endif  // REPLAYD_SERVER_TRANSLATE_H_
