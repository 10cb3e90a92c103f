// The Session stream: one session's operations, in order, on one bidirectional stream.
// Each request runs through the same engine operation as its unary RPC; the stream is a
// transport, not a second implementation.
//
// The handler reads one request, runs it, writes its reply, and only then reads the next:
// a request waits in the transport (and HTTP/2 flow control pushes back on the client),
// never in a queue of ours, and there is no thread hop between the stream and the
// device. Measured on the development VM, a reader thread feeding the executor cost a
// cross-core wake-up per operation and lost on both round trip and throughput.
#ifndef REPLAYD_SERVER_SESSION_STREAM_H_
#define REPLAYD_SERVER_SESSION_STREAM_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/strings/string_view.h"
#include "engine/engine.h"
#include "replayd/v1/replayd.pb.h"

namespace replayd {

// Serves one Session stream for `tenant` until the client ends it or it breaks.
grpc::Status ServeSessionStream(Engine& engine, absl::string_view tenant,
                                grpc::ServerContext* context,
                                grpc::ServerReaderWriter<v1::SessionReply, v1::SessionRequest>* stream);

}  // namespace replayd

#endif  // REPLAYD_SERVER_SESSION_STREAM_H_
