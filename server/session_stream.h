// The Session stream: one session's operations, in order, on one bidirectional stream.
// Each request runs through the same engine operation as its unary RPC; the stream is a
// transport, not a second implementation.
//
// With a window of 0 the handler reads one request, runs it, writes its reply, and only
// then reads the next: a request waits in the transport (HTTP/2 flow control pushes
// back on the client), and no thread hop lies between the stream and the device. With a
// window of W > 0 a reader thread reads up to W requests ahead into a bounded queue and
// stops reading past it, so parsing overlaps execution at the price of a hand-off per
// operation. README's numbers compare the two.
#ifndef REPLAYD_SERVER_SESSION_STREAM_H_
#define REPLAYD_SERVER_SESSION_STREAM_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/strings/string_view.h"
#include "engine/engine.h"
#include "replayd/v1/replayd.pb.h"

namespace replayd {

// Serves one Session stream for `tenant` until the client ends it or it breaks.
grpc::Status ServeSessionStream(Engine& engine, absl::string_view tenant, size_t window,
                                grpc::ServerContext* context,
                                grpc::ServerReaderWriter<v1::SessionReply, v1::SessionRequest>* stream);

}  // namespace replayd

#endif  // REPLAYD_SERVER_SESSION_STREAM_H_
