#include "server/queued_call.h"

namespace replayd {

void CallQueue::Listen(QueuedCall* call) {
  {
    absl::MutexLock lock(&mu_);
    if (closing_) {
      delete call;
      return;
    }
    ++live_;
  }
  call->Request();
}

void CallQueue::Ended() {
  absl::MutexLock lock(&mu_);
  --live_;
}

void CallQueue::Handle(void* tag, bool ok) {
  auto* event = static_cast<QueuedCall::Event*>(tag);
  event->call->On(event->kind, ok);
}

void CallQueue::Poll() {
  void* tag;
  bool ok;
  while (queue_->Next(&tag, &ok)) Handle(tag, ok);
}

bool CallQueue::PollOnce(absl::Time deadline) {
  void* tag;
  bool ok;
  switch (queue_->AsyncNext(&tag, &ok, absl::ToChronoTime(deadline))) {
    case grpc::CompletionQueue::SHUTDOWN:
      return false;
    case grpc::CompletionQueue::GOT_EVENT:
      Handle(tag, ok);
      return true;
    case grpc::CompletionQueue::TIMEOUT:
      return true;
  }
  return true;
}

void CallQueue::Close() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_ == 0; };
    mu_.Await(absl::Condition(&ended));
  }
  queue_->Shutdown();
}

}  // namespace replayd
