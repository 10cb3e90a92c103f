// The fault of a device context that several sessions share (the CUDA primary context,
// a HIP device): one session's kernel fault loses the state of all of them. Sessions
// join and leave; while a faulted context still has sessions, new ones are refused, and
// when its last session leaves, the owner resets it and it serves again.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_DRIVERS_SHARED_FAULT_H_
#define REPLAYD_DRIVERS_SHARED_FAULT_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace replayd {

class SharedFault {
 public:
  // A session joins: UNAVAILABLE, naming the fault, while the context is faulted.
  absl::Status Join();
  // A session leaves. When it was the last one of a faulted context, `reset` runs (under
  // this object's lock, so no session joins meanwhile) and the fault is cleared.
  void Leave(const std::function<void()>& reset);
  // Records `fault` unless one is recorded already; returns the recorded one.
  absl::Status Fail(absl::Status fault);
  // The recorded fault, or OK.
  absl::Status fault() const;
  int sessions() const;

 private:
  mutable absl::Mutex mu_;
  int sessions_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status fault_ ABSL_GUARDED_BY(mu_);
};

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_SHARED_FAULT_H_
