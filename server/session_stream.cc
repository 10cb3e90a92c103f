#include "server/session_stream.h"

#include <google/protobuf/arena.h>

#include <chrono>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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
      case v1::SessionRequest::kLaunch:
        return RunEager(session, &Session::Launch, request.launch(), *reply.mutable_launch());
      case v1::SessionRequest::kCopy:
        return RunEager(session, &Session::CopyBuffer, request.copy(), *reply.mutable_copy());
      case v1::SessionRequest::kReplay: {
        if (absl::Status s = FromProto(request.replay(), replay_op_); !s.ok()) return s;
        if (absl::Status s = session.ReplayGraph(replay_op_, replay_result_); !s.ok()) return s;
        v1::ReplayGraphReply* out = reply.mutable_replay();
        if (replay_result_.device_time) out->set_device_seconds(absl::ToDoubleSeconds(*replay_result_.device_time));
        for (const std::string& r : replay_result_.reads) out->add_reads(r);
        return absl::OkStatus();
      }
      case v1::SessionRequest::kWrite: {
        const v1::WriteInline& w = request.write();
        if (w.data().size() > kMaxChunkBytes)
          return absl::InvalidArgumentError(
              absl::StrCat("inline write of ", w.data().size(), " bytes exceeds ", kMaxChunkBytes));
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
          return absl::InvalidArgumentError(
              absl::StrCat("inline read of ", range->second, " bytes exceeds ", kMaxChunkBytes));
        v1::ReadChunk* out = reply.mutable_read();
        out->set_offset(range->first);
        std::string* data = out->mutable_data();
        data->resize(range->second);
        return session.ReadBuffer(v.buffer(), range->first, {reinterpret_cast<uint8_t*>(data->data()), range->second});
      }
      case v1::SessionRequest::kSynchronize:
        return session.Synchronize();
      case v1::SessionRequest::kKeepAlive:
        reply.mutable_keep_alive()->set_lease_seconds(static_cast<uint32_t>(absl::ToInt64Seconds(session.lease())));
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
    v1::SessionReply& step = *google::protobuf::Arena::CreateMessage<v1::SessionReply>(reply.GetArena());
    absl::StatusOr<SequenceResult> r =
        session.ReplaySequence(*op, [&](uint64_t index, const ReplayResult& result) -> absl::Status {
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

// The per-stream state: its session, and whether a failure cancels what follows.
class StreamRunner {
 public:
  StreamRunner(Engine& engine, absl::string_view tenant,
               grpc::ServerReaderWriter<v1::SessionReply, v1::SessionRequest>* stream)
      : engine_(engine), tenant_(tenant), ops_(stream) {}

  // Runs `request` and fills `reply` with its answer.
  void Handle(const v1::SessionRequest& request, v1::SessionReply& reply) {
    reply.Clear();
    reply.set_seq(request.seq());
    reply.set_final(true);
    absl::Status status;
    if (!session_ || (request.session() != 0 && request.session() != session_->id())) {
      absl::StatusOr<std::shared_ptr<Session>> found =
          session_ ? absl::InvalidArgumentError("a Session stream serves one session")
                   : engine_.FindSession(tenant_, request.session());
      if (found.ok()) session_ = *found;
      status = found.status();
    } else {
      session_->Renew(absl::Now());
    }
    if (status.ok() && failed_ && !request.resume()) {
      status = absl::AbortedError(
          absl::StrCat("not run: operation ", failed_seq_, " failed earlier on this stream (set resume to go on)"));
    } else if (status.ok()) {
      failed_ = false;
      status = ops_.Run(*session_, request, reply);
    }
    if (!status.ok() && !failed_ && !request.continue_on_error()) {
      failed_ = true;
      failed_seq_ = request.seq();
    }
    if (!status.ok()) {
      reply.clear_result();
      SetStatus(status, reply);
    }
  }

 private:
  Engine& engine_;
  const absl::string_view tenant_;
  StreamOps ops_;
  std::shared_ptr<Session> session_;
  // After a failed operation without continue_on_error: set, with the seq that failed.
  bool failed_ = false;
  uint64_t failed_seq_ = 0;
};

// A Read that returns sooner found its request already received: the client is pipelining.
constexpr std::chrono::microseconds kPipelinedRead(20);

// Requests read ahead of execution, at most `window` of them, and which thread runs the
// next one. The executor runs what was read ahead; a request read while the executor is
// idle and nothing waits runs at once on the reading thread, so a lone round trip pays no
// thread hop. One operation runs at a time either way, in the order read.
class ReadAhead {
 public:
  explicit ReadAhead(size_t window) : window_(window) {}
  // True when the reading thread may run its request now: nothing is queued or running.
  // It then holds the turn until Done.
  bool TryRunHere() {
    absl::MutexLock lock(&mu_);
    if (stopped_ || running_ || !queue_.empty()) return false;
    running_ = true;
    return true;
  }
  // False once the consumer has stopped.
  bool Push(std::unique_ptr<v1::SessionRequest> r) {
    absl::MutexLock lock(&mu_);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_ || queue_.size() < window_; };
    mu_.Await(absl::Condition(&room));
    if (stopped_) return false;
    queue_.push_back(std::move(r));
    return true;
  }
  // The next request, holding the turn until Done; null once the producer has finished
  // and the queue is empty, or the stream has stopped.
  std::unique_ptr<v1::SessionRequest> Pop() {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopped_ || (!running_ && (finished_ || !queue_.empty()));
    };
    mu_.Await(absl::Condition(&ready));
    if (stopped_ || queue_.empty()) return nullptr;
    std::unique_ptr<v1::SessionRequest> r = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    return r;
  }
  void Done() {
    absl::MutexLock lock(&mu_);
    running_ = false;
  }
  void Finish() {
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }
  void Stop() {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    queue_.clear();
  }
  // True when a request is waiting: its reply will follow this one.
  bool HasMore() {
    absl::MutexLock lock(&mu_);
    return !queue_.empty();
  }

 private:
  const size_t window_;
  absl::Mutex mu_;
  std::deque<std::unique_ptr<v1::SessionRequest>> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // an operation holds the turn
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

// Each operation's reply lives in an arena of its own, made on a block the stream keeps:
// a small reply allocates nothing, and nothing builds up over a long stream (an arena
// frees nothing before it is destroyed, so one arena for the stream's life would grow
// with every reply).
class ReplyArena {
 public:
  ReplyArena() : block_(kBlockBytes) {
    options_.initial_block = block_.data();
    options_.initial_block_size = block_.size();
  }
  const google::protobuf::ArenaOptions& options() const { return options_; }

 private:
  static constexpr size_t kBlockBytes = 64 << 10;
  std::vector<char> block_;
  google::protobuf::ArenaOptions options_;
};

}  // namespace

grpc::Status ServeSessionStream(Engine& engine, absl::string_view tenant, size_t window, grpc::ServerContext* context,
                                grpc::ServerReaderWriter<v1::SessionReply, v1::SessionRequest>* stream) {
  StreamRunner runner(engine, tenant, stream);
  ReplyArena block;
  if (window == 0) {
    v1::SessionRequest request;
    while (stream->Read(&request)) {
      google::protobuf::Arena arena(block.options());
      v1::SessionReply& reply = *google::protobuf::Arena::CreateMessage<v1::SessionReply>(&arena);
      runner.Handle(request, reply);
      if (!stream->Write(reply)) break;
    }
    return grpc::Status::OK;
  }
  ReadAhead ahead(window);
  // Runs one operation holding the turn and answers it; false when the stream is done for.
  // `check_cancel`: a request that waited in the queue runs only if the stream still
  // stands (the check is a poll of the call, so a request just read skips it).
  auto run = [&](const v1::SessionRequest& request, bool check_cancel) {
    bool ok = !check_cancel || !context->IsCancelled();
    if (ok) {
      google::protobuf::Arena arena(block.options());
      v1::SessionReply& reply = *google::protobuf::Arena::CreateMessage<v1::SessionReply>(&arena);
      runner.Handle(request, reply);
      // With more requests read, the transport may hold this reply and send it with the
      // next; the reply to the last request read is sent at once.
      grpc::WriteOptions options;
      if (ahead.HasMore()) options.set_buffer_hint();
      ok = stream->Write(reply, options);
    }
    if (!ok) {
      // Nothing more of this stream runs: drop what was read ahead, unblock the reader.
      ahead.Stop();
      context->TryCancel();
    }
    ahead.Done();
    return ok;
  };
  std::thread reader([&] {
    for (;;) {
      auto request = std::make_unique<v1::SessionRequest>();
      const auto asked = std::chrono::steady_clock::now();
      if (!stream->Read(request.get())) {
        // A broken stream runs nothing it had queued; one the client closed runs it all.
        if (context->IsCancelled()) ahead.Stop();
        break;
      }
      // A request that was waiting already is part of a pipeline: it goes to the queue, so
      // that reading ahead goes on. One the stream had to wait for runs here.
      const bool waited = std::chrono::steady_clock::now() - asked > kPipelinedRead;
      if (waited && ahead.TryRunHere()) {
        if (!run(*request, /*check_cancel=*/false)) break;
        continue;
      }
      if (!ahead.Push(std::move(request))) break;
    }
    ahead.Finish();
  });
  while (std::unique_ptr<v1::SessionRequest> request = ahead.Pop())
    if (!run(*request, /*check_cancel=*/true)) break;
  reader.join();
  return grpc::Status::OK;
}

}  // namespace replayd
