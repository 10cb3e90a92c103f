#include "server/buffer_upload.h"

#include "absl/strings/str_cat.h"
#include "server/status.h"

namespace replayd {

grpc::Status BufferUpload::Take(grpc::ServerContext& context, const v1::WriteChunk& chunk) {
  if (!session_) {
    absl::StatusOr<std::shared_ptr<const Tenant>> caller = env_.auth.Authenticate(context);
    if (!caller.ok()) return ToGrpc(caller.status());
    absl::StatusOr<std::shared_ptr<DeviceSession>> session = env_.engine.FindSession((*caller)->name, chunk.session());
    if (!session.ok()) return ToGrpc(session.status());
    session_ = std::move(*session);
    session_id_ = chunk.session();
    buffer_ = chunk.buffer();
  }
  if ((chunk.session() != 0 && chunk.session() != session_id_) || (chunk.buffer() != 0 && chunk.buffer() != buffer_))
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "WriteBuffer chunks must all name the same session and buffer");
  if (chunk.data().size() > kMaxChunkBytes)
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("chunk of ", chunk.data().size(),
                                                                         " bytes exceeds the limit of ", kMaxChunkBytes));
  const auto* data = reinterpret_cast<const uint8_t*>(chunk.data().data());
  if (absl::Status s = session_->WriteBuffer(buffer_, chunk.offset(), {data, chunk.data().size()}); !s.ok())
    return ToGrpc(s);
  written_ += chunk.data().size();
  session_->Renew(absl::Now());
  return grpc::Status::OK;
}

grpc::Status BufferUpload::End(v1::WriteBufferReply* reply) {
  if (!session_) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "WriteBuffer stream has no chunk");
  reply->set_bytes_written(written_);
  return grpc::Status::OK;
}

}  // namespace replayd
