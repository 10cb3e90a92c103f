#include "server/session_stream.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
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
  // True once the stream has broken (cancelled, its client gone): nothing more reaches it.
  virtual bool Broken() = 0;
};

// Runs one operation; fills `reply` (seq, final and the status are the caller's).
class StreamOps {
 public:
  explicit StreamOps(ReplySink& sink) : sink_(sink) {}

  absl::Status Run(DeviceSession& session, const v1::SessionRequest& request, v1::SessionReply& reply) {
    switch (request.op_case()) {
      case v1::SessionRequest::kLaunch:
        return RunEager(session, &DeviceSession::Launch, request.launch(), *reply.mutable_launch());
      case v1::SessionRequest::kCopy:
        return RunEager(session, &DeviceSession::CopyBuffer, request.copy(), *reply.mutable_copy());
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
  absl::Status RunSequence(DeviceSession& session, const v1::SessionRequest& request, v1::SessionReply& reply) {
    absl::StatusOr<ReplaySequenceOp> op = FromProto(request.replay_sequence());
    if (!op.ok()) return op.status();
    // A sequence whose stream breaks stops at its next replay, streamed reads or not.
    op->stopped = [this] { return sink_.Broken(); };
    const uint64_t last = op->vectors.empty() ? op->count - 1 : op->vectors.size() - 1;
    absl::StatusOr<SequenceOutcome> r =
        session.ReplaySequence(*op, [&](uint64_t index, const ReplayOutcome& result) -> absl::Status {
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
  ReplayOutcome replay_result_;
};

StreamOp OpOf(const v1::SessionRequest& request) {
  switch (request.op_case()) {
    case v1::SessionRequest::kLaunch:
      return StreamOp::kLaunch;
    case v1::SessionRequest::kCopy:
      return StreamOp::kCopy;
    case v1::SessionRequest::kReplay:
      return StreamOp::kReplay;
    case v1::SessionRequest::kWrite:
      return StreamOp::kWrite;
    case v1::SessionRequest::kRead:
      return StreamOp::kRead;
    case v1::SessionRequest::kSynchronize:
      return StreamOp::kSynchronize;
    case v1::SessionRequest::kKeepAlive:
      return StreamOp::kKeepAlive;
    case v1::SessionRequest::kReplaySequence:
      return StreamOp::kReplaySequence;
    default:
      return StreamOp::kNone;
  }
}

// The per-stream state: its session, and whether a failure cancels what follows.
class StreamRunner {
 public:
  StreamRunner(Engine& engine, DaemonMetrics& metrics, std::string tenant, ReplySink& sink)
      : engine_(engine), metrics_(metrics), tenant_(std::move(tenant)), ops_(sink) {}

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
      absl::StatusOr<std::shared_ptr<DeviceSession>> found =
          session_ ? absl::InvalidArgumentError("a Session stream serves one session")
                   : engine_.FindSession(tenant_, request.session());
      if (found.ok()) {
        session_ = *found;
        session_metrics_ = &metrics_.For(session_->device().id, tenant_);
      }
      status = found.status();
    } else {
      session_->Renew(absl::Now());
    }
    if (status.ok() && failed_ && !request.resume()) {
      status = absl::AbortedError(
          absl::StrCat("not run: operation ", failed_seq_, " failed earlier on this stream (set resume to go on)"));
    } else if (status.ok()) {
      failed_ = false;
      const int64_t start = SteadyNowNs();
      status = ops_.Run(*session_, request, reply);
      Count(request, status, reply, (SteadyNowNs() - start) * 1e-9);
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
  void Count(const v1::SessionRequest& request, const absl::Status& status, const v1::SessionReply& reply,
             double seconds) {
    const StreamOp op = OpOf(request);
    session_metrics_->StreamOperation(op, status.code(), seconds);
    if (!status.ok()) return;
    if (op == StreamOp::kReplay) session_metrics_->Replayed(seconds);
    if (op == StreamOp::kLaunch) session_metrics_->Launched(seconds);
    if (op == StreamOp::kReplaySequence) session_metrics_->ReplayedSequence(reply.sequence().replays());
  }

  Engine& engine_;
  DaemonMetrics& metrics_;
  const std::string tenant_;
  StreamOps ops_;
  std::shared_ptr<DeviceSession> session_;
  OperationMetrics* session_metrics_ = nullptr;  // session_'s
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

// The Replayd service's methods, as protobuf describes them: a method's index there is its
// index in the generated service.
const google::protobuf::ServiceDescriptor& ReplaydMethods() {
  return *v1::SessionRequest::descriptor()->file()->FindServiceByName("Replayd");
}

const google::protobuf::MethodDescriptor* SessionMethod() { return ReplaydMethods().FindMethodByName("Session"); }

// The unary methods served beside Session (SessionStreamServer::Start serves each).
constexpr absl::string_view kQueuedUnaryMethods[] = {
    "ReplayGraph", "Launch",       "KeepAlive",  "AllocBuffer", "FreeBuffer", "FreeProgram", "CopyBuffer",
    "Synchronize", "BeginCapture", "EndCapture", "DefineGraph", "FreeGraph",  "GraphInfo"};

}  // namespace

// One call of Session: reads requests, runs them in order, one at a time, on whichever
// thread holds the turn (the polling thread that read one, or a worker), and writes their
// replies in order.
//
// Its lifecycle is its Phase:
//   kWaiting    Request has asked for a call. The call arrives: kOpen once its caller is
//               known, else kFinishing with the authentication error.
//   kOpen       Requests are read while fewer than `window` are unanswered, and run. The
//               client finishes sending: kHalfClosed.
//   kHalfClosed What was read runs and is answered; then kFinishing.
//   kBroken     The call was cancelled (the client gone, its deadline passed) or a write
//               failed, in any phase before kFinishing (even kWaiting: with two threads
//               polling, the done event may be handled before the new call). Nothing
//               queued runs, nothing more is read or written, replies are dropped. Once
//               the read in flight has come back and the turn is given up: kFinishing.
//   kFinishing  Finish has been started; the stream ends with its last completion.
// Beside its phase the stream has three activities, each at most one at a time and
// independent of the others: a read in flight (reading_), a write in flight (writing_) and
// the turn to run the queued requests (turn_held_).
//
// Ownership: the stream deletes itself when its last reference is released (Release), and
// only then counts as ended for the CallQueue. refs_ counts, under mu_:
//   - each gRPC completion still due: the new call's and the done event's (the first two,
//     as Request asks for both), and the read's, the write's and the finish's, taken when
//     StartRead, StartWrite, MaybeFinish or a refused caller start one. On releases the
//     completion's reference once it has handled it; a new-call event without a call
//     releases the done event's as well, since no done event follows.
//   - a worker given the turn (HandOff), released when its Drain returns. A polling thread
//     running requests inline takes none: it runs them inside OnRead, under the read's
//     reference. A worker that has given the turn up holds its reference until it returns,
//     so it may overlap the next worker's.
class StreamCall final : public QueuedCall, public ReplySink {
 public:
  StreamCall(const CallHost<SessionStreamService>& host, Engine& engine, size_t window)
      : host_(host), engine_(engine), window_(window) {}

  void Request() override {
    context_.AsyncNotifyWhenDone(&done_);
    host_.service.RequestBidiStream(*SessionMethod(), &context_, &io_, host_.queue.cq(), &new_call_);
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
    Release();  // the completion's reference
  }

  std::unique_ptr<v1::SessionReply> NewReply() override {
    absl::MutexLock lock(&mu_);
    return free_replies_.Take();
  }

  bool Broken() override {
    absl::MutexLock lock(&mu_);
    return phase_ == Phase::kBroken;
  }

  absl::Status Send(std::unique_ptr<v1::SessionReply> reply) override {
    Io io;
    {
      absl::MutexLock lock(&mu_);
      auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return phase_ == Phase::kBroken || replies_.size() < window_;
      };
      mu_.Await(absl::Condition(&room));
      if (phase_ == Phase::kBroken) {
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
  enum class Phase { kWaiting, kOpen, kHalfClosed, kBroken, kFinishing };

  struct Reply {
    std::unique_ptr<v1::SessionReply> message;
    bool final = false;  // the last reply of its operation
  };
  // gRPC operations decided under the lock, started after it is released (starting one
  // may send at once, and its completion may reach another thread that needs the lock).
  // A write starts before a read (see OnRead).
  struct Io {
    ReceivedRequest* read = nullptr;
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
      --refs_;  // the done event's
      return;
    }
    host_.queue.Listen(new StreamCall(host_, engine_, window_));
    absl::StatusOr<std::shared_ptr<const Tenant>> caller = host_.auth.Authenticate(context_);
    Io io;
    {
      absl::MutexLock lock(&mu_);
      // Past kWaiting, the done event came first: the stream broke before it was served.
      if (phase_ == Phase::kWaiting && !caller.ok()) {
        phase_ = Phase::kFinishing;
        ++refs_;  // the finish's completion
        io.finish = ToGrpc(caller.status());
      } else if (phase_ == Phase::kWaiting) {
        runner_.emplace(engine_, host_.metrics, (*caller)->name, *this);
        phase_ = Phase::kOpen;
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
      if (!ok || !received_.parsed || phase_ != Phase::kOpen) {
        // The client has finished sending, sent what does not parse, or the stream broke.
        if (phase_ == Phase::kOpen) {
          phase_ = Phase::kHalfClosed;
          if (ok) finish_status_ = ToGrpc(ParseError(*SessionMethod()));
        }
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
    if (turn_held_ || phase_ == Phase::kBroken) return false;
    turn_held_ = true;
    if (!IsSequence(*requests_.front()) && host_.dispatcher.RunHere()) return true;
    HandOff(io);
    return false;
  }

  // Gives the turn to a worker. With none to be had, the queued requests fail with the
  // refusal (as failed operations: what follows them is cancelled unless it resumes) and
  // the turn is given up.
  void HandOff(Io& io) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++refs_;  // the worker's, released after its Drain
    absl::Status handed = host_.dispatcher.HandOff(runner_->tenant(), [this](const std::function<void()>&) {
      Drain(/*inline_slot=*/false);
      Release();
    });
    if (handed.ok()) return;
    --refs_;  // no worker took it; the caller's own reference keeps the stream
    for (std::unique_ptr<v1::SessionRequest>& request : requests_) {
      Reply reply{free_replies_.Take(), true};
      runner_->Handle(*request, *reply.message, &handed);
      replies_.push_back(std::move(reply));
      free_requests_.Give(std::move(request));
    }
    requests_.clear();
    turn_held_ = false;
    StartWrite(io);
    StartRead(io);
    MaybeFinish(io);
  }

  // Holding the turn: runs the queued requests in order until none is left. With
  // `inline_slot`, on a polling thread that holds one, and a sequence goes to a worker.
  void Drain(bool inline_slot) {
    for (bool more = true; more;) {
      std::unique_ptr<v1::SessionRequest> request;
      Reply reply{nullptr, true};
      Io io;
      {
        absl::MutexLock lock(&mu_);
        if (phase_ == Phase::kBroken || requests_.empty()) {
          turn_held_ = false;
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
          Dispatcher::RunningOperation running(host_.dispatcher);
          runner_->Handle(*request, *reply.message);
        }
        absl::MutexLock lock(&mu_);
        free_requests_.Give(std::move(request));
        if (phase_ == Phase::kBroken) {
          free_replies_.Give(std::move(reply.message));
        } else {
          replies_.push_back(std::move(reply));
          StartWrite(io);
          StartRead(io);
        }
      }
      Start(io);
    }
    if (inline_slot) host_.dispatcher.ReleaseInlineSlot();
  }

  void StartRead(Io& io) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reading_ || phase_ != Phase::kOpen || unanswered_ >= window_) return;
    reading_ = free_requests_.Take();
    received_.message = reading_.get();
    ++refs_;  // the read's completion
    io.read = &received_;
  }

  void StartWrite(Io& io) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_.message || replies_.empty() || phase_ == Phase::kBroken) return;
    writing_ = std::move(replies_.front());
    replies_.pop_front();
    // With another reply due, the transport may hold this one and send both together.
    if (!replies_.empty() || !requests_.empty()) io.write_options.set_buffer_hint();
    ++refs_;  // the write's completion
    io.write = writing_.message.get();
  }

  // Ends the call once nothing is left to read, run or write.
  void MaybeFinish(Io& io) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if ((phase_ != Phase::kHalfClosed && phase_ != Phase::kBroken) || reading_ || turn_held_ || !requests_.empty() ||
        writing_.message || !replies_.empty())
      return;
    phase_ = Phase::kFinishing;
    ++refs_;  // the finish's completion
    io.finish = finish_status_;
  }

  // The stream is gone: nothing queued runs, nothing more is read or written. Once
  // finishing there is nothing left to stop.
  void Break() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (phase_ != Phase::kFinishing) phase_ = Phase::kBroken;
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
    CallQueue& queue = host_.queue;
    delete this;
    queue.Ended();
  }

  const CallHost<SessionStreamService> host_;
  Engine& engine_;
  const size_t window_;
  grpc::ServerContext context_;
  grpc::ServerAsyncReaderWriter<v1::SessionReply, ReceivedRequest> io_{&context_};
  Event new_call_{this, kNewCall}, read_{this, kRead}, write_{this, kWrite}, finish_{this, kFinish},
      done_{this, kDone};
  // Set once the caller is known; used only by the thread holding the turn.
  std::optional<StreamRunner> runner_;

  absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kWaiting;
  int refs_ ABSL_GUARDED_BY(mu_) = 2;  // the new-call and done events'; see the class comment
  std::unique_ptr<v1::SessionRequest> reading_ ABSL_GUARDED_BY(mu_);  // the read in flight
  ReceivedRequest received_ ABSL_GUARDED_BY(mu_);                     // the read's, into reading_
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);  // OK, or why the reading ended early
  std::deque<std::unique_ptr<v1::SessionRequest>> requests_ ABSL_GUARDED_BY(mu_);  // read, not yet run
  Reply writing_ ABSL_GUARDED_BY(mu_);                                              // the write in flight
  std::deque<Reply> replies_ ABSL_GUARDED_BY(mu_);                                  // waiting to be written
  size_t unanswered_ ABSL_GUARDED_BY(mu_) = 0;  // requests read whose last reply is not written
  bool turn_held_ ABSL_GUARDED_BY(mu_) = false;  // a thread runs the queued requests
  Recycler<v1::SessionRequest> free_requests_ ABSL_GUARDED_BY(mu_);
  Recycler<v1::SessionReply> free_replies_ ABSL_GUARDED_BY(mu_);
};

SessionStreamServer::SessionStreamServer(Engine& engine, const Authenticator& auth, SessionStreamService& service,
                                         DaemonMetrics& metrics, SessionStreamOptions options,
                                         grpc::ServerBuilder& builder)
    : engine_(engine),
      auth_(auth),
      service_(service),
      metrics_(metrics),
      options_{std::max<size_t>(options.window, 1), std::max(options.threads, 1), std::max<size_t>(options.workers, 1),
               std::max<size_t>(options.workers_per_tenant, 1)},
      calls_(builder),
      upload_env_{engine, auth},
      dispatcher_(options_.threads, options_.workers, options_.workers_per_tenant) {}

SessionStreamServer::~SessionStreamServer() { Stop(); }

void SessionStreamServer::Start() {
  for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { calls_.Poll(); });
  dispatcher_.StartStandby([this](absl::Time deadline) { return calls_.PollOnce(deadline); });
  const CallHost<SessionStreamService> host{service_, calls_, dispatcher_, auth_, metrics_};
  calls_.Listen(new StreamCall(host, engine_, options_.window));
  using Service = v1::Replayd::Service;
  auto method = [](absl::string_view name) -> const google::protobuf::MethodDescriptor& {
    return *ReplaydMethods().FindMethodByName(std::string(name));
  };
  ServeUnary(host, method("ReplayGraph"), &Service::ReplayGraph);
  ServeUnary(host, method("Launch"), &Service::Launch);
  ServeUnary(host, method("KeepAlive"), &Service::KeepAlive);
  ServeUnary(host, method("AllocBuffer"), &Service::AllocBuffer);
  ServeUnary(host, method("FreeBuffer"), &Service::FreeBuffer);
  ServeUnary(host, method("FreeProgram"), &Service::FreeProgram);
  ServeUnary(host, method("CopyBuffer"), &Service::CopyBuffer);
  ServeUnary(host, method("Synchronize"), &Service::Synchronize);
  ServeUnary(host, method("BeginCapture"), &Service::BeginCapture);
  ServeUnary(host, method("EndCapture"), &Service::EndCapture);
  ServeUnary(host, method("DefineGraph"), &Service::DefineGraph);
  ServeUnary(host, method("FreeGraph"), &Service::FreeGraph);
  ServeUnary(host, method("GraphInfo"), &Service::GraphInfo);
  ServeUpload<BufferUpload>(host, method("WriteBuffer"), upload_env_);
}

bool ServedOnQueue(absl::string_view path) {
  constexpr absl::string_view kPrefix = "/replayd.v1.Replayd/";
  if (!absl::StartsWith(path, kPrefix)) return false;
  path.remove_prefix(kPrefix.size());
  return path == "Session" || path == "WriteBuffer" ||
         std::find(std::begin(kQueuedUnaryMethods), std::end(kQueuedUnaryMethods), path) !=
             std::end(kQueuedUnaryMethods);
}

void SessionStreamServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  // From here the standby thread takes no more turns; the polling threads serve the calls
  // until they have ended.
  dispatcher_.StopStandby();
  calls_.Close();
  if (threads_.empty()) calls_.Poll();  // never started: drain the queue here
  for (std::thread& t : threads_) t.join();
  dispatcher_.JoinStandby();
}

}  // namespace replayd
