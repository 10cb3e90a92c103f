#include "client/stream.h"

namespace replayd::client {

SessionStream::SessionStream(v1::Replayd::Stub& stub, const std::string& token, uint64_t session,
                             size_t window)
    : session_(session), window_(std::max<size_t>(1, window)) {
  if (!token.empty()) context_.AddMetadata("authorization", "Bearer " + token);
  stream_ = stub.Session(&context_);
  reader_ = std::thread([this] { ReaderMain(); });
}

SessionStream::~SessionStream() {
  {
    absl::MutexLock lock(&write_mu_);
    stream_->WritesDone();
  }
  reader_.join();
}

bool SessionStream::healthy() const {
  absl::MutexLock lock(&mu_);
  return !broken_;
}

void SessionStream::Submit(v1::SessionRequest& request, DoneFn done, PartialFn partial) {
  absl::MutexLock write_lock(&write_mu_);  // writes, and so sequence numbers, in order
  bool broken;
  {
    absl::MutexLock lock(&mu_);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return broken_ || pending_.size() < window_; };
    mu_.Await(absl::Condition(&room));
    broken = broken_;
    if (!broken) {
      request.set_seq(next_seq_++);
      request.set_session(session_);
      request.set_resume(resume_next_);
      resume_next_ = false;
      pending_.push_back({request.seq(), std::move(done), std::move(partial)});
    }
  }
  if (broken) {
    done(absl::UnavailableError("the session stream is broken"));
    return;
  }
  // A failed write means the stream has ended: the reader then fails everything pending,
  // this request included.
  stream_->Write(request);
}

void SessionStream::ReaderMain() {
  v1::SessionReply reply;
  while (stream_->Read(&reply)) {
    Pending* p = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (!pending_.empty() && pending_.front().seq == reply.seq()) p = &pending_.front();
    }
    if (!p) continue;  // a reply to nothing we sent: ignore it
    if (!reply.final()) {
      if (p->partial) p->partial(reply);
      continue;
    }
    DoneFn done = std::move(p->done);
    {
      absl::MutexLock lock(&mu_);
      pending_.pop_front();
      if (reply.code() != 0 && reply.code() != static_cast<int>(grpc::StatusCode::ABORTED)) resume_next_ = true;
    }
    done(std::move(reply));
    reply = v1::SessionReply();
  }
  grpc::Status status = stream_->Finish();
  std::deque<Pending> failed;
  {
    absl::MutexLock lock(&mu_);
    broken_ = true;
    failed.swap(pending_);
  }
  absl::Status why = status.ok() ? absl::UnavailableError("the session stream ended")
                                 : absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                                status.error_message());
  for (Pending& p : failed) p.done(why);
}

}  // namespace replayd::client
