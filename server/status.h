// absl::Status <-> grpc::Status. The codes are the same set with the same numbers; the
// message passes through unchanged.
#ifndef REPLAYD_SERVER_STATUS_H_
#define REPLAYD_SERVER_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace replayd {

grpc::Status ToGrpc(const absl::Status& status);

}  // namespace replayd

#endif  // REPLAYD_SERVER_STATUS_H_
