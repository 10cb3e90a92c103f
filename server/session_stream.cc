#include "server/session_stream.h"

#include "absl/strings/str_cat.h"
#include "server/service.h"
#include "server/translate.h"

namespace replayd {
namespace {

void SetStatus(const absl::Status& s, v1::SessionReply& reply) {
  reply.set_code(static_cast<int>(s.code()));
  reply.set_message(std::string(s.message()));
}

// Runs one operation; fills `reply` (seq, final and the status are the caller's).
class StreamOps {
 public:
  StreamOps(grpc::ServerReaderWriter<v1::SessionReply, v1::SessionRequest>* stream) : stream_(stream) {}

  absl::Status Run(Session& session, const v1::SessionRequest& request, v1::SessionReply& reply) {
    switch (request.op_case()) {
      case v1::SessionRequest::kLaunch: {
        absl::StatusOr<LaunchOp> op = FromProto(request.launch());
        if (!op.ok()) return op.status();
        absl::StatusOr<LaunchResult> r = session.Launch(*op);
        if (!r.ok()) return r.status();
        v1::LaunchReply* out = reply.mutable_launch();
        if (r->device_time) out->set_device_seconds(absl::ToDoubleSeconds(*r->device_time));
        return absl::OkStatus();
      }
      case v1::SessionRequest::kReplay: {
        if (absl::Status s = FromProto(request.replay(), replay_op_); !s.ok()) return s;
        if (absl::Status s = session.ReplayGraph(replay_op_, replay_result_); !s.ok()) return s;
        v1::ReplayGraphReply* out = reply.mutable_replay();
        if (replay_result_.device_time)
          out->set_device_seconds(absl::ToDoubleSeconds(*replay_result_.device_time));
        for (const std::string& r : replay_result_.reads) out->add_reads(r);
        return absl::OkStatus();
      }
      case v1::SessionRequest::kWrite: {
        const v1::WriteInline& w = request.write();
        if (w.data().size() > kMaxChunkBytes)
          return absl::InvalidArgumentError(absl::StrCat("inline write of ", w.data().size(),
                                                         " bytes exceeds ", kMaxChunkBytes));
        auto s = session.WriteBuffer(w.buffer(), w.offset(),
                                     {reinterpret_cast<const uint8_t*>(w.data().data()), w.data().size()});
        if (s.ok()) reply.mutable_write()->set_bytes_written(w.data().size());
        return s;
      }
      case v1::SessionRequest::kRead: {
        const v1::View& v = request.read();
        auto range = session.ResolveRange(v.buffer(), v.offset(), v.length());
        if (!range.ok()) return range.status();
        if (range->second > kMaxChunkBytes)
          return absl::InvalidArgumentError(absl::StrCat("inline read of ", range->second,
                                                         " bytes exceeds ", kMaxChunkBytes));
        v1::ReadChunk* out = reply.mutable_read();
        out->set_offset(range->first);
        std::string* data = out->mutable_data();
        data->resize(range->second);
        return session.ReadBuffer(v.buffer(), range->first,
                                  {reinterpret_cast<uint8_t*>(data->data()), range->second});
      }
      case v1::SessionRequest::kSynchronize:
        return session.Synchronize();
      case v1::SessionRequest::kKeepAlive:
        reply.mutable_keep_alive()->set_lease_seconds(
            static_cast<uint32_t>(absl::ToInt64Seconds(session.lease())));
        return absl::OkStatus();
      case v1::SessionRequest::kReplaySequence:
        return RunSequence(session, request, reply);
      default:
        return absl::InvalidArgumentError("request has no operation");
    }
  }

 private:
  absl::Status RunSequence(Session& session, const v1::SessionRequest& request, v1::SessionReply& reply) {
    absl::StatusOr<ReplaySequenceOp> op = FromProto(request.replay_sequence());
    if (!op.ok()) return op.status();
    const uint64_t last = op->vectors.empty() ? op->count - 1 : op->vectors.size() - 1;
    v1::SessionReply step;
    absl::StatusOr<SequenceResult> r = session.ReplaySequence(
        *op, [&](uint64_t index, const ReplayResult& result) -> absl::Status {
          v1::ReplaySequenceReply* out = (index == last ? reply : step).mutable_sequence();
          out->set_index(static_cast<uint32_t>(index));
          out->clear_reads();
          for (const std::string& bytes : result.reads) out->add_reads(bytes);
          if (index == last) return absl::OkStatus();
          step.set_seq(request.seq());
          step.set_final(false);
          if (!stream_->Write(step)) return absl::CancelledError("the stream broke");
          return absl::OkStatus();
        });
    if (!r.ok()) return r.status();
    reply.mutable_sequence()->set_replays(static_cast<uint32_t>(r->replays));
    reply.mutable_sequence()->set_device_seconds(absl::ToDoubleSeconds(r->device_time));
    return absl::OkStatus();
  }

  grpc::ServerReaderWriter<v1::SessionReply, v1::SessionRequest>* stream_;
  ReplayOp replay_op_;
  ReplayResult replay_result_;
};

}  // namespace

grpc::Status ServeSessionStream(Engine& engine, absl::string_view tenant,
                                grpc::ServerContext* context,
                                grpc::ServerReaderWriter<v1::SessionReply, v1::SessionRequest>* stream) {
  v1::SessionRequest request;
  v1::SessionReply reply;
  std::shared_ptr<Session> session;
  StreamOps ops(stream);
  // After a failed operation without continue_on_error: set, with the seq that failed.
  bool failed = false;
  uint64_t failed_seq = 0;
  while (stream->Read(&request)) {
    reply.Clear();
    reply.set_seq(request.seq());
    reply.set_final(true);
    absl::Status status;
    if (!session || (request.session() != 0 && request.session() != session->id())) {
      absl::StatusOr<std::shared_ptr<Session>> found = session && request.session() != session->id()
          ? absl::InvalidArgumentError("a Session stream serves one session")
          : engine.FindSession(tenant, request.session());
      if (found.ok()) session = *found;
      status = found.status();
    } else {
      session->Renew(absl::Now());
    }
    if (status.ok() && failed && !request.resume()) {
      status = absl::AbortedError(absl::StrCat("not run: operation ", failed_seq,
                                               " failed earlier on this stream (set resume to go on)"));
    } else if (status.ok()) {
      failed = false;
      status = ops.Run(*session, request, reply);
    }
    if (!status.ok() && !failed && !request.continue_on_error()) {
      failed = true;
      failed_seq = request.seq();
    }
    if (!status.ok()) {
      reply.clear_result();
      SetStatus(status, reply);
    }
    if (!stream->Write(reply)) break;
    if (context->IsCancelled()) break;
  }
  return grpc::Status::OK;
}

}  // namespace replayd
