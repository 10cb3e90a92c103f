#include "server/session_stream.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/service.h"
#include "server/status.h"
#include "server/translate.h"

namespace replayd {
namespace {

void SetStatus(const absl::Status& s, v1::SessionReply& reply) {
  reply.set_code(static_cast<int>(s.code()));
  reply.set_message(std::string(s.message()));
}

// Where an operation sends the replies that come before its last (a sequence's reads).
class ReplySink {
 public:
  virtual ~ReplySink() = default;
  // An empty reply to fill.
  virtual std::unique_ptr<v1::SessionReply> NewReply() = 0;
  // Queues `reply` for writing; waits while the stream has too many unsent. CANCELLED
  // once the stream has broken.
  virtual absl::Status Send(std::unique_ptr<v1::SessionReply> reply) = 0;
};

// Runs one operation; fills `reply` (seq, final and the status are the caller's).
class StreamOps {
 public:
  explicit StreamOps(ReplySink& sink) : sink_(sink) {}

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
    absl::StatusOr<SequenceResult> r =
        session.ReplaySequence(*op, [&](uint64_t index, const ReplayResult& result) -> absl::Status {
          std::unique_ptr<v1::SessionReply> step = index == last ? nullptr : sink_.NewReply();
          v1::ReplaySequenceReply* out = (step ? *step : reply).mutable_sequence();
          out->set_index(static_cast<uint32_t>(index));
          for (const std::string& bytes : result.reads) out->add_reads(bytes);
          if (!step) return absl::OkStatus();
          step->set_seq(request.seq());
          step->set_final(false);
          return sink_.Send(std::move(step));
        });
    if (!r.ok()) return r.status();
    reply.mutable_sequence()->set_replays(static_cast<uint32_t>(r->replays));
    reply.mutable_sequence()->set_device_seconds(absl::ToDoubleSeconds(r->device_time));
    return absl::OkStatus();
  }

  ReplySink& sink_;
  ReplayOp replay_op_;
  ReplayResult replay_result_;
};

// The per-stream state: its session, and whether a failure cancels what follows.
class StreamRunner {
 public:
  StreamRunner(Engine& engine, std::string tenant, ReplySink& sink)
      : engine_(engine), tenant_(std::move(tenant)), ops_(sink) {}

  const std::string& tenant() const { return tenant_; }

  // Runs `request` and fills `reply` with its answer; with `refused`, fails it with that
  // status instead.
  void Handle(const v1::SessionRequest& request, v1::SessionReply& reply, const absl::Status* refused = nullptr) {
    reply.Clear();
    reply.set_seq(request.seq());
    reply.set_final(true);
    absl::Status status;
    if (refused) {
      status = *refused;
    } else if (!session_ || (request.session() != 0 && request.session() != session_->id())) {
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
  const std::string tenant_;
  StreamOps ops_;
  std::shared_ptr<Session> session_;
  // After a failed operation without continue_on_error: set, with the seq that failed.
  bool failed_ = false;
  uint64_t failed_seq_ = 0;
};

// A message the stream keeps for its next operation; large ones are freed instead.
template <typename Message>
class Recycler {
 public:
  std::unique_ptr<Message> Take() {
    if (free_.empty()) return std::make_unique<Message>();
    std::unique_ptr<Message> m = std::move(free_.back());
    free_.pop_back();
    return m;
  }
  void Give(std::unique_ptr<Message> m) {
    if (!m || free_.size() >= kKeep || m->ByteSizeLong() > kMaxBytes) return;
    m->Clear();
    free_.push_back(std::move(m));
  }

 private:
  static constexpr size_t kKeep = 4;
  static constexpr size_t kMaxBytes = 64 << 10;
  std::vector<std::unique_ptr<Message>> free_;
};

bool IsSequence(const v1::SessionRequest& request) {
  return request.op_case() == v1::SessionRequest::kReplaySequence;
}

}  // namespace

// A call of a method served on the completion queue, from the wait for it to its end.
// gRPC's completions for it come back as Events.
class QueuedCall {
 public:
  enum Kind { kNewCall, kRead, kWrite, kFinish, kDone };
  struct Event {
    QueuedCall* call;
    Kind kind;
  };
  virtual ~QueuedCall() = default;
  // Waits for the next call of the method.
  virtual void Request() = 0;
  // Handles a completion; `ok` is gRPC's flag for it.
  virtual void On(Kind kind, bool ok) = 0;
};

// One unary call, answered by the service's own handler for the method (the code the
// sync server would run): on the polling thread that received it when the daemon is
// quiet, else on a worker (the rules of session_stream.h).
template <typename RequestMessage, typename ReplyMessage>
class UnaryCall final : public QueuedCall {
 public:
  using RequestMethod = void (SessionStreamService::*)(grpc::ServerContext*, RequestMessage*,
                                                       grpc::ServerAsyncResponseWriter<ReplyMessage>*,
                                                       grpc::CompletionQueue*, grpc::ServerCompletionQueue*, void*);
  using Handler = grpc::Status (v1::Replayd::Service::*)(grpc::ServerContext*, const RequestMessage*, ReplyMessage*);

  UnaryCall(SessionStreamServer& server, RequestMethod request, Handler handler)
      : server_(server), request_method_(request), handler_(handler) {}

  void Request() override {
    (server_.service_.*request_method_)(&context_, &request_, &responder_, server_.queue_.get(), server_.queue_.get(),
                                        &new_call_);
  }

  void On(Kind kind, bool ok) override {
    // Once Run has started the reply, another thread may take its completion and delete
    // this call: nothing of it is used after Run.
    SessionStreamServer& server = server_;
    if (kind == kNewCall && ok) {
      server.Listen(new UnaryCall(server, request_method_, handler_));
      if (server.RunHere()) {
        Run();
        server.ReleaseInlineSlot();
      } else {
        // The tenant is needed to count its workers; a caller without one takes none.
        absl::StatusOr<std::shared_ptr<const Tenant>> caller = server.auth_.Authenticate(context_);
        absl::Status s = caller.ok() ? server.HandOff((*caller)->name, [this] { Run(); }) : caller.status();
        if (!s.ok()) responder_.Finish(reply_, ToGrpc(s), &finish_);
      }
      return;
    }
    // Finished, or no call as the server is shutting down.
    delete this;
    server.Ended();
  }

 private:
  void Run() {
    grpc::Status status;
    {
      SessionStreamServer::RunningOperation running(server_);
      v1::Replayd::Service& service = server_.service_;
      status = (service.*handler_)(&context_, &request_, &reply_);
    }
    responder_.Finish(reply_, status, &finish_);
  }

  SessionStreamServer& server_;
  const RequestMethod request_method_;
  const Handler handler_;
  grpc::ServerContext context_;
  RequestMessage request_;
  ReplyMessage reply_;
  grpc::ServerAsyncResponseWriter<ReplyMessage> responder_{&context_};
  Event new_call_{this, kNewCall}, finish_{this, kFinish};
};

// One Session call. Each outstanding completion, and each thread holding the turn, holds
// a reference, and the last one released deletes the stream.
class SessionStream final : public QueuedCall, public ReplySink {
 public:
  explicit SessionStream(SessionStreamServer& server) : server_(server), window_(server.options_.window) {}

  void Request() override {
    context_.AsyncNotifyWhenDone(&done_);
    server_.service_.RequestSession(&context_, &io_, server_.queue_.get(), server_.queue_.get(), &new_call_);
  }

  void On(Kind kind, bool ok) override {
    switch (kind) {
      case kNewCall:
        OnNewCall(ok);
        break;
      case kRead:
        OnRead(ok);
        break;
      case kWrite:
        OnWrite(ok);
        break;
      case kDone:
        OnDone();
        break;
      case kFinish:
        break;
    }
    Release();
  }

  std::unique_ptr<v1::SessionReply> NewReply() override {
    absl::MutexLock lock(&mu_);
    return free_replies_.Take();
  }

  absl::Status Send(std::unique_ptr<v1::SessionReply> reply) override {
    Io io;
    {
      absl::MutexLock lock(&mu_);
      auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return broken_ || replies_.size() < window_; };
      mu_.Await(absl::Condition(&room));
      if (broken_) {
        free_replies_.Give(std::move(reply));
        return absl::CancelledError("the stream broke");
      }
      replies_.push_back({std::move(reply), false});
      StartWrite(io);
    }
    Start(io);
    return absl::OkStatus();
  }

 private:
  struct Reply {
    std::unique_ptr<v1::SessionReply> message;
    bool final = false;  // the last reply of its operation
  };
  // gRPC operations decided under the lock, started after it is released (starting one
  // may send at once, and its completion may reach another thread that needs the lock).
  // A write starts before a read (see OnRead).
  struct Io {
    v1::SessionRequest* read = nullptr;
    const v1::SessionReply* write = nullptr;
    grpc::WriteOptions write_options;
    std::optional<grpc::Status> finish;
  };

  void Start(const Io& io) {
    if (io.write) io_.Write(*io.write, io.write_options, &write_);
    if (io.read) io_.Read(io.read, &read_);
    if (io.finish) io_.Finish(*io.finish, &finish_);
  }

  void OnNewCall(bool ok) {
    if (!ok) {
      // The server is shutting down: no call, and no done event will come.
      absl::MutexLock lock(&mu_);
      --refs_;
      return;
    }
    server_.Listen(new SessionStream(server_));
    absl::StatusOr<std::shared_ptr<const Tenant>> caller = server_.auth_.Authenticate(context_);
    Io io;
    {
      absl::MutexLock lock(&mu_);
      if (!caller.ok()) {
        read_closed_ = finishing_ = true;
        ++refs_;
        io.finish = ToGrpc(caller.status());
      } else {
        runner_.emplace(server_.engine_, (*caller)->name, *this);
        StartRead(io);
      }
    }
    Start(io);
  }

  void OnRead(bool ok) {
    bool run_here = false;
    Io io;
    {
      absl::MutexLock lock(&mu_);
      std::unique_ptr<v1::SessionRequest> request = std::move(reading_);
      if (!ok || broken_) {
        // The client has finished sending, or the stream broke.
        read_closed_ = true;
        free_requests_.Give(std::move(request));
        MaybeFinish(io);
      } else {
        ++unanswered_;
        requests_.push_back(std::move(request));
        // A request run here reads the next after its reply's write has started: gRPC
        // announces the stream's window when a read starts, and then the announcement
        // goes out with the reply instead of in a packet of its own that would wake the
        // client once more per round trip. A request queued behind a running one reads
        // ahead at once.
        run_here = TakeTurn(io);
        if (!run_here) StartRead(io);
      }
    }
    Start(io);
    if (run_here) Drain(/*inline_slot=*/true);
  }

  void OnWrite(bool ok) {
    Io io;
    {
      absl::MutexLock lock(&mu_);
      Reply written = std::move(writing_);
      free_replies_.Give(std::move(written.message));
      if (!ok) {
        Break();
      } else {
        if (written.final) --unanswered_;
        StartWrite(io);
        StartRead(io);
      }
      MaybeFinish(io);
    }
    Start(io);
  }

  void OnDone() {
    Io io;
    {
      absl::MutexLock lock(&mu_);
      if (context_.IsCancelled()) Break();
      MaybeFinish(io);
    }
    Start(io);
  }

  // Takes the turn to run the queued requests if no thread holds it. True when the
  // calling (polling) thread should run them; otherwise a worker does, or already is.
  bool TakeTurn(Io& io) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (running_ || broken_) return false;
    running_ = true;
    if (!IsSequence(*requests_.front()) && server_.RunHere()) return true;
    HandOff(io);
    return false;
  }

  // Gives the turn to a worker. With none to be had, the queued requests fail with the
  // refusal (as failed operations: what follows them is cancelled unless it resumes) and
  // the turn is given up.
  void HandOff(Io& io) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++refs_;
    absl::Status handed = server_.HandOff(runner_->tenant(), [this] {
      Drain(/*inline_slot=*/false);
      Release();
    });
    if (handed.ok()) return;
    --refs_;  // the caller holds another
    for (std::unique_ptr<v1::SessionRequest>& request : requests_) {
      Reply reply{free_replies_.Take(), true};
      runner_->Handle(*request, *reply.message, &handed);
      replies_.push_back(std::move(reply));
      free_requests_.Give(std::move(request));
    }
    requests_.clear();
    running_ = false;
    StartWrite(io);
    StartRead(io);
    MaybeFinish(io);
  }

  // Holding the turn: runs the queued requests in order until none is left.
  void Drain(bool inline_slot) {
    for (bool more = true; more;) {
      std::unique_ptr<v1::SessionRequest> request;
      Reply reply{nullptr, true};
      Io io;
      {
        absl::MutexLock lock(&mu_);
        if (broken_ || requests_.empty()) {
          running_ = false;
          MaybeFinish(io);
          more = false;
        } else if (inline_slot && IsSequence(*requests_.front())) {
          HandOff(io);
          more = false;
        } else {
          request = std::move(requests_.front());
          requests_.pop_front();
          reply.message = free_replies_.Take();
        }
      }
      if (request) {
        {
          SessionStreamServer::RunningOperation running(server_);
          runner_->Handle(*request, *reply.message);
        }
        absl::MutexLock lock(&mu_);
        free_requests_.Give(std::move(request));
        if (broken_) {
          free_replies_.Give(std::move(reply.message));
        } else {
          replies_.push_back(std::move(reply));
          StartWrite(io);
          StartRead(io);
        }
      }
      Start(io);
    }
    if (inline_slot) server_.ReleaseInlineSlot();
  }

  void StartRead(Io& io) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reading_ || read_closed_ || broken_ || unanswered_ >= window_) return;
    reading_ = free_requests_.Take();
    ++refs_;
    io.read = reading_.get();
  }

  void StartWrite(Io& io) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_.message || replies_.empty() || broken_) return;
    writing_ = std::move(replies_.front());
    replies_.pop_front();
    // With another reply due, the transport may hold this one and send both together.
    if (!replies_.empty() || !requests_.empty()) io.write_options.set_buffer_hint();
    ++refs_;
    io.write = writing_.message.get();
  }

  // Ends the call once nothing is left to read, run or write.
  void MaybeFinish(Io& io) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finishing_ || !read_closed_ || reading_ || running_ || !requests_.empty() || writing_.message ||
        !replies_.empty())
      return;
    finishing_ = true;
    ++refs_;
    io.finish = grpc::Status::OK;
  }

  // The stream is gone: nothing queued runs, nothing more is read or written.
  void Break() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    broken_ = read_closed_ = true;
    for (auto& r : requests_) free_requests_.Give(std::move(r));
    requests_.clear();
    for (auto& r : replies_) free_replies_.Give(std::move(r.message));
    replies_.clear();
  }

  void Release() {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      last = --refs_ == 0;
    }
    if (!last) return;
    // Counted as ended only once destroyed: Stop may then shut the queue down.
    SessionStreamServer& server = server_;
    delete this;
    server.Ended();
  }

  SessionStreamServer& server_;
  const size_t window_;
  grpc::ServerContext context_;
  grpc::ServerAsyncReaderWriter<v1::SessionReply, v1::SessionRequest> io_{&context_};
  Event new_call_{this, kNewCall}, read_{this, kRead}, write_{this, kWrite}, finish_{this, kFinish},
      done_{this, kDone};
  // Set once the caller is known; used only by the thread holding the turn.
  std::optional<StreamRunner> runner_;

  absl::Mutex mu_;
  int refs_ ABSL_GUARDED_BY(mu_) = 2;  // the new-call and done events
  std::unique_ptr<v1::SessionRequest> reading_ ABSL_GUARDED_BY(mu_);  // the read in flight
  std::deque<std::unique_ptr<v1::SessionRequest>> requests_ ABSL_GUARDED_BY(mu_);  // read, not yet run
  Reply writing_ ABSL_GUARDED_BY(mu_);                                              // the write in flight
  std::deque<Reply> replies_ ABSL_GUARDED_BY(mu_);                                  // waiting to be written
  size_t unanswered_ ABSL_GUARDED_BY(mu_) = 0;  // requests read whose last reply is not written
  bool running_ ABSL_GUARDED_BY(mu_) = false;   // a thread holds the turn
  bool read_closed_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  Recycler<v1::SessionRequest> free_requests_ ABSL_GUARDED_BY(mu_);
  Recycler<v1::SessionReply> free_replies_ ABSL_GUARDED_BY(mu_);
};

SessionStreamServer::SessionStreamServer(Engine& engine, const Authenticator& auth, SessionStreamService& service,
                                         SessionStreamOptions options, grpc::ServerBuilder& builder)
    : engine_(engine),
      auth_(auth),
      service_(service),
      options_{std::max<size_t>(options.window, 1), std::max(options.threads, 1), std::max<size_t>(options.workers, 1),
               std::max<size_t>(options.workers_per_tenant, 1)},
      queue_(builder.AddCompletionQueue()),
      inline_free_(options_.threads),
      pool_(options_.workers) {}

SessionStreamServer::~SessionStreamServer() { Stop(); }

void SessionStreamServer::Start() {
  for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { Poll(); });
  standby_ = std::thread([this] { Standby(); });
  Listen(new SessionStream(*this));
  using Service = v1::Replayd::Service;
  ServeUnary(&SessionStreamService::RequestReplayGraph, &Service::ReplayGraph);
  ServeUnary(&SessionStreamService::RequestLaunch, &Service::Launch);
  ServeUnary(&SessionStreamService::RequestKeepAlive, &Service::KeepAlive);
  ServeUnary(&SessionStreamService::RequestAllocBuffer, &Service::AllocBuffer);
  ServeUnary(&SessionStreamService::RequestFreeBuffer, &Service::FreeBuffer);
  ServeUnary(&SessionStreamService::RequestFreeProgram, &Service::FreeProgram);
  ServeUnary(&SessionStreamService::RequestCopyBuffer, &Service::CopyBuffer);
  ServeUnary(&SessionStreamService::RequestSynchronize, &Service::Synchronize);
  ServeUnary(&SessionStreamService::RequestBeginCapture, &Service::BeginCapture);
  ServeUnary(&SessionStreamService::RequestEndCapture, &Service::EndCapture);
  ServeUnary(&SessionStreamService::RequestDefineGraph, &Service::DefineGraph);
  ServeUnary(&SessionStreamService::RequestFreeGraph, &Service::FreeGraph);
  ServeUnary(&SessionStreamService::RequestGraphInfo, &Service::GraphInfo);
}

template <typename RequestMessage, typename ReplyMessage, typename AsyncBase>
void SessionStreamServer::ServeUnary(
    void (AsyncBase::*request)(grpc::ServerContext*, RequestMessage*, grpc::ServerAsyncResponseWriter<ReplyMessage>*,
                               grpc::CompletionQueue*, grpc::ServerCompletionQueue*, void*),
    grpc::Status (v1::Replayd::Service::*handler)(grpc::ServerContext*, const RequestMessage*, ReplyMessage*)) {
  Listen(new UnaryCall<RequestMessage, ReplyMessage>(*this, request, handler));
}

void SessionStreamServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_ == 0; };
    mu_.Await(absl::Condition(&ended));
  }
  queue_->Shutdown();
  if (threads_.empty()) Poll();  // never started: drain the queue here
  for (std::thread& t : threads_) t.join();
  if (standby_.joinable()) standby_.join();
}

void SessionStreamServer::Listen(QueuedCall* call) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      delete call;
      return;
    }
    ++live_;
  }
  call->Request();
}

void SessionStreamServer::Ended() {
  absl::MutexLock lock(&mu_);
  --live_;
}

void SessionStreamServer::Dispatch(void* tag, bool ok) {
  auto* event = static_cast<QueuedCall::Event*>(tag);
  event->call->On(event->kind, ok);
}

void SessionStreamServer::Poll() {
  void* tag;
  bool ok;
  while (queue_->Next(&tag, &ok)) Dispatch(tag, ok);
}

void SessionStreamServer::Standby() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (SteadyNowNs() - last_inline_ns_.load(std::memory_order_relaxed) > kIdleNs) {
      // Nothing has run inline for a while: sleep until something does.
      standby_asleep_.store(true, std::memory_order_relaxed);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !standby_asleep_.load(std::memory_order_relaxed);
      };
      mu_.Await(absl::Condition(&woken));
      continue;
    }
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), kStall);
    const int64_t since = saturated_since_ns_.load(std::memory_order_acquire);
    if (stopping_ || since == 0 || SteadyNowNs() - since < absl::ToInt64Nanoseconds(kStall)) continue;
    // Every polling thread has been running an operation for kStall: poll in their place
    // until one is free. What arrives now finds no inline slot and goes to a worker.
    mu_.Unlock();
    void* tag;
    bool ok;
    while (inline_free_.load(std::memory_order_acquire) == 0) {
      auto next = queue_->AsyncNext(&tag, &ok, absl::ToChronoTime(absl::Now() + kStall));
      if (next == grpc::CompletionQueue::SHUTDOWN) break;
      if (next == grpc::CompletionQueue::GOT_EVENT) Dispatch(tag, ok);
    }
    mu_.Lock();
  }
}

bool SessionStreamServer::Quiet() {
  return running_.load(std::memory_order_acquire) == 0 &&
         SteadyNowNs() - last_handoff_ns_.load(std::memory_order_relaxed) > kBusyNs;
}

absl::Status SessionStreamServer::HandOff(const std::string& tenant, std::function<void()> task) {
  last_handoff_ns_.store(SteadyNowNs(), std::memory_order_relaxed);
  {
    absl::MutexLock lock(&workers_mu_);
    size_t& held = tenant_workers_[tenant];
    if (held >= options_.workers_per_tenant) {
      return absl::ResourceExhaustedError(absl::StrCat("no worker for it: tenant ", tenant, " has ", held,
                                                       " operations on workers, its most "
                                                       "(--stream_workers_per_tenant); try again"));
    }
    ++held;
  }
  // The worker gives its count back after the task, which may end the call; the server
  // outlives its workers (pool_ is destroyed first).
  if (pool_.Run([this, tenant, task = std::move(task)] {
        task();
        ReleaseWorker(tenant);
      }))
    return absl::OkStatus();
  ReleaseWorker(tenant);
  return absl::ResourceExhaustedError(absl::StrCat("no worker free to run it: the daemon runs at most ", options_.workers,
                                                   " operations at once on workers (--stream_workers); try again"));
}

void SessionStreamServer::ReleaseWorker(const std::string& tenant) {
  absl::MutexLock lock(&workers_mu_);
  auto it = tenant_workers_.find(tenant);
  if (--it->second == 0) tenant_workers_.erase(it);
}

bool SessionStreamServer::TakeInlineSlot() {
  int free = inline_free_.load(std::memory_order_relaxed);
  do {
    if (free == 0) return false;
  } while (!inline_free_.compare_exchange_weak(free, free - 1, std::memory_order_acquire));
  const int64_t now = SteadyNowNs();
  last_inline_ns_.store(now, std::memory_order_relaxed);
  if (free == 1) saturated_since_ns_.store(now, std::memory_order_release);
  if (standby_asleep_.load(std::memory_order_relaxed)) {
    absl::MutexLock lock(&mu_);
    standby_asleep_.store(false, std::memory_order_relaxed);
  }
  return true;
}

void SessionStreamServer::ReleaseInlineSlot() {
  // Cleared first: a thread that takes the slot next sets it again.
  saturated_since_ns_.store(0, std::memory_order_release);
  inline_free_.fetch_add(1, std::memory_order_release);
}

}  // namespace replayd
