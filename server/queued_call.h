// Calls served on a gRPC completion queue: the machinery the Session stream and the unary
// methods served beside it share (see session_stream.h).
//
// A QueuedCall is one call of one method, from the wait for it to its end. Every gRPC
// operation it starts names one of its Events as the tag, and the thread that takes the
// completion from the CallQueue hands it to the call's On. A call that has received its
// call first listens for the next one of its method (a new QueuedCall), so each method
// always has a call waiting. A call deletes itself after its last completion and then
// tells the CallQueue, which shuts the queue down only once every call has ended.
//
// UnaryCall is the call of a unary method, answered by the service's own handler for it
// (the code gRPC's sync server would run) where the Dispatcher says: on the polling thread
// that received it, or on a worker. Its request arrives as a ReceivedRequest
// (request_parsing.h), so that one whose bytes do not parse is answered INVALID_ARGUMENT
// rather than cancelled by gRPC with INTERNAL. UploadCall is the call of a client-streaming
// method, whose requests arrive the same way and are taken in order by an Upload.
#ifndef REPLAYD_SERVER_QUEUED_CALL_H_
#define REPLAYD_SERVER_QUEUED_CALL_H_

#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/authenticator.h"
#include "server/dispatch.h"
#include "server/request_parsing.h"
#include "server/status.h"

namespace replayd {

class DaemonMetrics;

class QueuedCall {
 public:
  // What a completion is for: the call arriving, a read, a write or the finish completing,
  // or the call being done (AsyncNotifyWhenDone).
  enum Kind { kNewCall, kRead, kWrite, kFinish, kDone };
  // The tag of a gRPC operation: the call it belongs to and what it is.
  struct Event {
    QueuedCall* call;
    Kind kind;
  };
  virtual ~QueuedCall() = default;
  // Asks gRPC for the next call of the method.
  virtual void Request() = 0;
  // Handles a completion; `ok` is gRPC's flag for it. May delete the call.
  virtual void On(Kind kind, bool ok) = 0;
};

// The completion queue the calls are served on, and the count of calls alive on it.
// Thread-safe.
class CallQueue {
 public:
  // Adds the queue to `builder`, before BuildAndStart.
  explicit CallQueue(grpc::ServerBuilder& builder) : queue_(builder.AddCompletionQueue()) {}
  CallQueue(const CallQueue&) = delete;
  CallQueue& operator=(const CallQueue&) = delete;

  grpc::ServerCompletionQueue* cq() { return queue_.get(); }
  // Counts `call` alive and has it wait for its method's next call; once Close has begun,
  // deletes it instead.
  void Listen(QueuedCall* call);
  // Counts a call ended; the call calls it once it has deleted itself.
  void Ended();
  // Handles completions until the queue has been shut down and drained.
  void Poll();
  // Handles at most one completion, waiting for it until `deadline`. False once the queue
  // has been shut down.
  bool PollOnce(absl::Time deadline);
  // Listens for no more calls, waits until every call has ended, then shuts the queue down.
  void Close();

 private:
  static void Handle(void* tag, bool ok);

  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  absl::Mutex mu_;
  int live_ ABSL_GUARDED_BY(mu_) = 0;  // calls, counting those waiting to be called
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

// What the calls served on one queue use of their server; all of it outlives every call.
template <typename Service>
struct CallHost {
  Service& service;           // the async service whose methods the calls wait for
  CallQueue& queue;           // where they wait, and are counted
  Dispatcher& dispatcher;     // where received calls run
  const Authenticator& auth;  // the caller's tenant, for the workers it may hold
  DaemonMetrics& metrics;     // where the operations run are counted
};

// One call of a unary method of `Service`, which asks gRPC for calls whose requests arrive
// as ReceivedRequests:
//   void RequestUnary(const google::protobuf::MethodDescriptor&, grpc::ServerContext*,
//                     ReceivedRequest*, grpc::internal::ServerAsyncStreamingInterface*,
//                     grpc::ServerCompletionQueue*, void* tag);
// Its lifecycle, in State:
//   kWaiting   Request has asked for a call. The new-call completion brings one: the next
//              call is listened for and this one goes kRunning. Without one (the server is
//              shutting down) the call is deleted.
//   kRunning   The handler runs, on the polling thread that received the call or on a
//              worker (it waits for one in between); then the reply is finished: kReplying.
//              With a request that did not parse, no worker to be had, or an unknown caller
//              when one was needed, the call is finished with that status instead, the
//              handler unrun.
//   kReplying  Finish has been started; its completion, sent or not, deletes the call.
template <typename Service, typename RequestMessage, typename ReplyMessage>
class UnaryCall final : public QueuedCall {
 public:
  using Handler = grpc::Status (Service::*)(grpc::ServerContext*, const RequestMessage*, ReplyMessage*);

  UnaryCall(const CallHost<Service>& host, const google::protobuf::MethodDescriptor& method, Handler handler)
      : host_(host), method_(method), handler_(handler) {}

  void Request() override {
    host_.service.RequestUnary(method_, &context_, &received_, &responder_, host_.queue.cq(), &new_call_);
  }

  void On(Kind /*kind*/, bool ok) override {
    if (state_ == State::kWaiting && ok) {
      Received();
      return;
    }
    CallQueue& queue = host_.queue;
    delete this;
    queue.Ended();
  }

 private:
  enum class State { kWaiting, kRunning, kReplying };

  void Received() {
    host_.queue.Listen(new UnaryCall(host_, method_, handler_));
    if (!received_.parsed) {
      state_ = State::kReplying;
      responder_.Finish(reply_, ToGrpc(ParseError(method_)), &finish_);
      return;
    }
    state_ = State::kRunning;
    // Once Run has started the reply, another thread may take its completion and delete
    // this call: nothing of it is used after Run.
    Dispatcher& dispatcher = host_.dispatcher;
    if (dispatcher.RunHere()) {
      Run();
      dispatcher.ReleaseInlineSlot();
      return;
    }
    // The tenant is needed to count its workers; a caller without one takes none.
    absl::StatusOr<std::shared_ptr<const Tenant>> caller = host_.auth.Authenticate(context_);
    absl::Status s = caller.ok() ? dispatcher.HandOff((*caller)->name,
                                                      [this](const std::function<void()>& done) { Run(done); })
                                 : caller.status();
    if (s.ok()) return;
    state_ = State::kReplying;
    responder_.Finish(reply_, ToGrpc(s), &finish_);
  }

  // On a worker, `done` gives the tenant's worker back before the reply goes out.
  void Run(const std::function<void()>& done = nullptr) {
    grpc::Status status;
    {
      Dispatcher::RunningOperation running(host_.dispatcher);
      status = (host_.service.*handler_)(&context_, &request_, &reply_);
    }
    if (done) done();
    state_ = State::kReplying;
    responder_.Finish(reply_, status, &finish_);
  }

  const CallHost<Service> host_;
  const google::protobuf::MethodDescriptor& method_;
  const Handler handler_;
  // Written by the thread that has the call (the poller that received it, then the worker
  // that runs it); gRPC's queue and the pool order the hand-overs.
  State state_ = State::kWaiting;
  grpc::ServerContext context_;
  RequestMessage request_;
  ReceivedRequest received_{&request_};
  ReplyMessage reply_;
  grpc::ServerAsyncResponseWriter<ReplyMessage> responder_{&context_};
  Event new_call_{this, kNewCall}, finish_{this, kFinish};
};

// One call of a client-streaming method of `Service`, which asks gRPC for calls whose
// requests arrive as ReceivedRequests:
//   void RequestClientStream(const google::protobuf::MethodDescriptor&, grpc::ServerContext*,
//                            grpc::internal::ServerAsyncStreamingInterface*,
//                            grpc::ServerCompletionQueue*, void* tag);
// Its requests go in order to an `Upload` made for the call from what all of them use:
//   explicit Upload(const Upload::Env&); using Request = ...; using Reply = ...;
//   grpc::Status Take(grpc::ServerContext&, const Request&);  // one request
//   grpc::Status End(Reply*);                                 // after the last
// Its lifecycle, in State:
//   kWaiting   Request has asked for a call. The new-call completion brings one: the next
//              call is listened for, and the first request is read: kReading. Without one
//              the call is deleted.
//   kReading   A read is started. A request comes: kTaking. The stream's end (the client
//              has sent all, or is gone) ends the upload: End, then kReplying.
//   kTaking    The Upload takes the request where the Dispatcher says (the polling thread
//              or a worker), then the next is read (kReading). A request that did not
//              parse, one Take refuses, or no worker to be had finishes the call with that
//              status (kReplying), the requests after it unread.
//   kReplying  Finish has been started; its completion deletes the call.
// One operation of the call is in flight at a time, so the threads that take it in turn
// never meet.
template <typename Service, typename Upload>
class UploadCall final : public QueuedCall {
 public:
  UploadCall(const CallHost<Service>& host, const google::protobuf::MethodDescriptor& method,
             const typename Upload::Env& env)
      : host_(host), method_(method), env_(env), upload_(env) {}

  void Request() override {
    host_.service.RequestClientStream(method_, &context_, &reader_, host_.queue.cq(), &new_call_);
  }

  void On(Kind kind, bool ok) override {
    if (state_ == State::kWaiting && ok) {
      host_.queue.Listen(new UploadCall(host_, method_, env_));
      ReadNext();
      return;
    }
    if (state_ == State::kReading && kind == kRead) {
      if (!ok) {
        End();
      } else if (!received_.parsed) {
        Fail(ToGrpc(ParseError(method_)));
      } else {
        Received();
      }
      return;
    }
    CallQueue& queue = host_.queue;
    delete this;
    queue.Ended();
  }

 private:
  enum class State { kWaiting, kReading, kTaking, kReplying };

  void ReadNext() {
    state_ = State::kReading;
    reader_.Read(&received_, &read_);
  }

  void Received() {
    state_ = State::kTaking;
    // Once Take has started the next read or the finish, another thread may take its
    // completion: nothing of this call is used after it.
    Dispatcher& dispatcher = host_.dispatcher;
    if (dispatcher.RunHere()) {
      Take();
      dispatcher.ReleaseInlineSlot();
      return;
    }
    absl::StatusOr<std::shared_ptr<const Tenant>> caller = host_.auth.Authenticate(context_);
    absl::Status s =
        caller.ok() ? dispatcher.HandOff((*caller)->name, [this](const std::function<void()>& done) { Take(done); })
                    : caller.status();
    if (!s.ok()) Fail(ToGrpc(s));
  }

  // On a worker, `done` gives the tenant's worker back before the next read starts (whose
  // chunk may come at once and need a worker) or the failure is sent.
  void Take(const std::function<void()>& done = nullptr) {
    grpc::Status status;
    {
      Dispatcher::RunningOperation running(host_.dispatcher);
      status = upload_.Take(context_, request_);
    }
    if (done) done();
    if (status.ok()) {
      ReadNext();
    } else {
      Fail(status);
    }
  }

  void End() {
    typename Upload::Reply reply;
    const grpc::Status status = upload_.End(&reply);
    state_ = State::kReplying;
    if (status.ok()) {
      reader_.Finish(reply, status, &finish_);
    } else {
      reader_.FinishWithError(status, &finish_);
    }
  }

  void Fail(const grpc::Status& status) {
    state_ = State::kReplying;
    reader_.FinishWithError(status, &finish_);
  }

  const CallHost<Service> host_;
  const google::protobuf::MethodDescriptor& method_;
  const typename Upload::Env& env_;
  Upload upload_;
  State state_ = State::kWaiting;
  grpc::ServerContext context_;
  typename Upload::Request request_;
  ReceivedRequest received_{&request_};
  grpc::ServerAsyncReader<typename Upload::Reply, ReceivedRequest> reader_{&context_};
  Event new_call_{this, kNewCall}, read_{this, kRead}, finish_{this, kFinish};
};

// Serves the client-streaming `method` of `host`'s service on its queue, each call's
// requests taken by an Upload of its own made from `env`, which outlives every call. Call
// once per method.
template <typename Upload, typename Service>
void ServeUpload(const CallHost<Service>& host, const google::protobuf::MethodDescriptor& method,
                 const typename Upload::Env& env) {
  if (method.input_type() != Upload::Request::descriptor() || method.output_type() != Upload::Reply::descriptor() ||
      !method.client_streaming() || method.server_streaming()) {
    std::fprintf(stderr, "%s is not served by an upload of its types\n", method.full_name().c_str());
    std::abort();
  }
  host.queue.Listen(new UploadCall<Service, Upload>(host, method, env));
}

// Serves the unary `method` of `host`'s service on its queue, answering each call with
// `handler`, the service's synchronous handler for it; `method`'s request and reply types
// must be the handler's. Call once per method: each call received listens for the next.
template <typename Service, typename RequestMessage, typename ReplyMessage, typename HandlerBase>
void ServeUnary(const CallHost<Service>& host, const google::protobuf::MethodDescriptor& method,
                grpc::Status (HandlerBase::*handler)(grpc::ServerContext*, const RequestMessage*, ReplyMessage*)) {
  if (method.input_type() != RequestMessage::descriptor() || method.output_type() != ReplyMessage::descriptor()) {
    std::fprintf(stderr, "%s is not served by a handler of its types\n", method.full_name().c_str());
    std::abort();
  }
  host.queue.Listen(new UnaryCall<Service, RequestMessage, ReplyMessage>(host, method, handler));
}

}  // namespace replayd

#endif  // REPLAYD_SERVER_QUEUED_CALL_H_
