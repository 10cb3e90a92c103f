// The client end of a Session stream: requests written in order from any thread, replies
// matched to them by sequence number on a reader thread. At most `window` operations are
// outstanding; Submit blocks past that.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_CLIENT_STREAM_H_
#define REPLAYD_CLIENT_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "replayd/v1/replayd.grpc.pb.h"

namespace replayd::client {

class SessionStream {
 public:
  // Called with every non-final reply of an operation, on the reader thread.
  using PartialFn = std::function<void(const v1::SessionReply&)>;
  // Called once with the final reply (or the stream's failure), on the reader thread.
  using DoneFn = std::function<void(absl::StatusOr<v1::SessionReply>)>;

  SessionStream(v1::Replayd::Stub& stub, const std::string& token, uint64_t session, size_t window);
  // Ends the stream: pending operations complete first.
  ~SessionStream();

  // Sends `request` (its seq and session are set here). After a reply that failed, the
  // next request sent carries resume, so each operation the caller issues after seeing
  // an error runs.
  void Submit(v1::SessionRequest& request, DoneFn done, PartialFn partial = nullptr);

  // False once the stream has broken; a new one must be opened.
  bool healthy() const;

 private:
  struct Pending {
    uint64_t seq;
    DoneFn done;
    PartialFn partial;
  };
  void ReaderMain();

  const uint64_t session_;
  const size_t window_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionReply>> stream_;
  mutable absl::Mutex mu_;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool resume_next_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex write_mu_;
  std::thread reader_;
};

}  // namespace replayd::client

#endif  // REPLAYD_CLIENT_STREAM_H_
