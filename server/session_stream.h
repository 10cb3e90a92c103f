// The Session stream: one session's operations, in order, on one bidirectional stream.
// Each request runs through the same engine operation as its unary RPC; the stream is a
// transport, not a second implementation.
//
// With a window of W > 0 (the default is 8) a reader thread reads up to W requests ahead
// into a bounded queue and stops reading past it, so receiving overlaps execution, and a
// reply is written with a buffer hint while more requests wait, letting the transport
// send a burst of replies in one write. With a window of 0 the handler reads one
// request, runs it, writes its reply and only then reads the next: no thread hop, one
// write per reply. README's numbers compare the two; the window won on round trip and
// on pipelined throughput.
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
