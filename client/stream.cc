#include "client/stream.h"

#include <limits>

namespace replayd::client {
namespace {

constexpr char kNotSent[] = "the session stream had ended; the request was not sent";

}  // namespace

Stream::Stream(v1::Replayd::Stub& stub, const std::string& token, uint64_t session,
                             size_t window)
    : session_(session), window_(std::max<size_t>(1, window)) {
  if (!token.empty()) context_.AddMetadata("authorization", "Bearer " + token);
  stream_ = stub.Session(&context_);
}

Stream::~Stream() { Close(); }

bool Stream::healthy() const {
  absl::MutexLock lock(&mu_);
  return !ended_ && !closing_ && !write_failed_;
}

bool Stream::IsNotSent(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable && s.message() == kNotSent;
}

absl::StatusOr<uint64_t> Stream::Submit(v1::SessionRequest& request, DoneFn& done, PartialFn& partial) {
  absl::MutexLock write_lock(&write_mu_);  // writes, and so sequence numbers, in order
  uint64_t seq;
  {
    absl::MutexLock lock(&mu_);
    Progress([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return ended_ || closing_ || write_failed_ || pending_.size() < window_;
    });
    if (ended_ || closing_ || write_failed_) return absl::UnavailableError(kNotSent);
    seq = next_seq_++;
    request.set_seq(seq);
    request.set_session(session_);
    request.set_resume(resume_next_);
    resume_next_ = false;
    pending_.push_back({seq, std::move(done), std::move(partial)});
  }
  if (stream_->Write(request)) return seq;
  // The stream has ended. Alone, the request goes back to the caller for a new stream;
  // behind others, it fails with them when the end is read, so nothing is reordered.
  absl::MutexLock lock(&mu_);
  write_failed_ = true;
  if (pending_.size() == 1 && pending_.back().seq == seq && !reading_) {
    done = std::move(pending_.back().done);
    partial = std::move(pending_.back().partial);
    pending_.pop_back();
    completed_ = seq;
    return absl::UnavailableError(kNotSent);
  }
  return seq;
}

void Stream::Await(uint64_t seq) {
  absl::MutexLock lock(&mu_);
  Progress([this, seq]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return completed_ >= seq; });
}

void Stream::Close() {
  {
    absl::MutexLock write_lock(&write_mu_);
    bool first;
    {
      absl::MutexLock lock(&mu_);
      first = !closing_;
      closing_ = true;
    }
    if (first) stream_->WritesDone();
  }
  absl::MutexLock lock(&mu_);
  Progress([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ended_; });
}

void Stream::Progress(const std::function<bool()>& until) {
  while (!until() && !ended_) {
    if (reading_) {
      auto turn_or_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !reading_ || until(); };
      mu_.Await(absl::Condition(&turn_or_done));
      continue;
    }
    reading_ = true;
    mu_.Unlock();
    ReadOne();
    mu_.Lock();
    reading_ = false;
  }
}

void Stream::ReadOne() {
  v1::SessionReply reply;
  if (stream_->Read(&reply)) {
    Pending* p = nullptr;  // the front stays put: only the turn's holder pops
    {
      absl::MutexLock lock(&mu_);
      if (!pending_.empty() && pending_.front().seq == reply.seq()) p = &pending_.front();
    }
    if (!p) return;  // a reply to nothing we sent: ignore it
    if (!reply.final()) {
      if (p->partial) p->partial(reply);
      return;
    }
    DoneFn done = std::move(p->done);
    const uint64_t seq = p->seq;
    {
      absl::MutexLock lock(&mu_);
      pending_.pop_front();
      if (reply.code() != 0 && reply.code() != static_cast<int>(grpc::StatusCode::ABORTED)) resume_next_ = true;
    }
    done(std::move(reply));
    absl::MutexLock lock(&mu_);
    completed_ = seq;
    return;
  }
  // The end of the stream: everything outstanding fails with its status.
  grpc::Status status = stream_->Finish();
  std::deque<Pending> failed;
  {
    absl::MutexLock lock(&mu_);
    failed.swap(pending_);
  }
  absl::Status why = status.ok() ? absl::UnavailableError("the session stream ended")
                                 : absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                                status.error_message());
  for (Pending& p : failed) p.done(why);
  absl::MutexLock lock(&mu_);
  ended_ = true;
  completed_ = std::numeric_limits<uint64_t>::max();
}

}  // namespace replayd::client
