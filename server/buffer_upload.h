// WriteBuffer, served on the completion queue as an UploadCall (queued_call.h), so that a
// chunk whose bytes do not parse is answered INVALID_ARGUMENT: gRPC's sync server would
// read it as the stream's end.
#ifndef REPLAYD_SERVER_BUFFER_UPLOAD_H_
#define REPLAYD_SERVER_BUFFER_UPLOAD_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>

#include "engine/engine.h"
#include "replayd/v1/replayd.pb.h"
#include "server/authenticator.h"

namespace replayd {

// Largest chunk of a WriteBuffer or ReadBuffer stream.
inline constexpr size_t kMaxChunkBytes = 1 << 20;

// One WriteBuffer call's chunks, taken in order as they arrive (UploadCall,
// queued_call.h): the first names the session and the buffer, and every later one the
// same or none; each is written at its offset and renews the session's lease.
class BufferUpload {
 public:
  struct Env {
    Engine& engine;
    const Authenticator& auth;
  };
  using Request = v1::WriteChunk;
  using Reply = v1::WriteBufferReply;

  explicit BufferUpload(const Env& env) : env_(env) {}
  // Writes `chunk`; its error ends the call, the chunks before it written.
  grpc::Status Take(grpc::ServerContext& context, const v1::WriteChunk& chunk);
  // After the last chunk: the bytes written, or INVALID_ARGUMENT for a call without one.
  grpc::Status End(v1::WriteBufferReply* reply);

 private:
  const Env& env_;
  std::shared_ptr<DeviceSession> session_;  // from the first chunk
  SessionId session_id_ = 0;
  Handle buffer_ = 0;
  uint64_t written_ = 0;
};

}  // namespace replayd

#endif  // REPLAYD_SERVER_BUFFER_UPLOAD_H_
