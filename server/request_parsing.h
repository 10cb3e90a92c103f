// Requests whose bytes do not parse as their message: malformed wire bytes, invalid UTF-8
// in a string field, messages nested past protobuf's recursion limit. Left to itself gRPC
// answers them INTERNAL, which this daemon keeps for its own bugs; they are the client's
// error, so the daemon answers INVALID_ARGUMENT naming the method and the message type
// (ParseError), on both of its paths:
//   - methods of gRPC's sync server: gRPC parses the request and, when that fails, sends
//     INTERNAL without running the handler. ParseErrorAnswers, an interceptor, rewrites
//     that status.
//   - methods served on the completion queue (queued_call.h, session_stream.h): gRPC would
//     cancel the call with INTERNAL before the daemon sees it. Their requests arrive as a
//     ReceivedRequest instead, which gRPC always takes: the bytes are parsed into its
//     message as gRPC itself would have (no extra copy) and `parsed` says whether that
//     worked, for the call to answer.
#ifndef REPLAYD_SERVER_REQUEST_PARSING_H_
#define REPLAYD_SERVER_REQUEST_PARSING_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace replayd {

// A request as it came off the wire. The receiving call points `message` at the message
// to parse into before each receive; after it, `parsed` says whether the bytes parsed.
struct ReceivedRequest {
  google::protobuf::Message* message = nullptr;
  bool parsed = false;
};

// The method a gRPC method path ("/replayd.v1.Replayd/ReplayGraph") names among the
// services compiled in; nullptr for an unknown one.
const google::protobuf::MethodDescriptor* FindMethod(absl::string_view path);

// INVALID_ARGUMENT "replayd.v1.Replayd/ReplayGraph: the request does not parse as a
// replayd.v1.ReplayGraphRequest".
absl::Status ParseError(const google::protobuf::MethodDescriptor& method);

// An interceptor for every call, to be installed on every server: a call of the sync
// server whose request did not parse is answered with ParseError instead of gRPC's
// INTERNAL. Install it first, so that interceptors after it see the status sent.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> ParseErrorAnswers();

}  // namespace replayd

namespace grpc {

// Parses the bytes into the request's message and reports success to gRPC either way; see
// ReceivedRequest. Only ever deserialized: the daemon receives these, never sends them.
template <>
class SerializationTraits<replayd::ReceivedRequest, void> {
 public:
  static Status Deserialize(ByteBuffer* buffer, replayd::ReceivedRequest* request) {
    request->parsed = request->message != nullptr &&
                      GenericDeserialize<ProtoBufferReader, google::protobuf::Message>(buffer, request->message).ok();
    return Status::OK;
  }
};

}  // namespace grpc

#endif  // REPLAYD_SERVER_REQUEST_PARSING_H_
