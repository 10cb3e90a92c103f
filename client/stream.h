// The client end of a Session stream: requests written in order from any thread, replies
// matched to them by sequence number.
//
// No thread reads on its own: a thread that needs a reply reads it (Await), and while one
// thread reads, the others wait for it to complete their operations or to hand them the
// turn to read. A round trip therefore costs no thread hop, and an idle stream keeps no
// thread in the transport's polling (where, on a small machine, every such thread made
// each other stream's round trip slower: it takes part in handing the polling on).
// At most `window` operations are outstanding; past that, Submit reads replies on the
// calling thread until one completes.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_CLIENT_STREAM_H_
#define REPLAYD_CLIENT_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "replayd/v1/replayd.grpc.pb.h"

namespace replayd::client {

class Stream {
 public:
  // Called with every non-final reply of an operation, on the thread that reads it.
  using PartialFn = std::function<void(const v1::SessionReply&)>;
  // Called once with the final reply (or the stream's failure), on the thread that reads it.
  using DoneFn = std::function<void(absl::StatusOr<v1::SessionReply>)>;

  Stream(v1::Replayd::Stub& stub, const std::string& token, uint64_t session, size_t window);
  // Close().
  ~Stream();

  // Sends `request` (its seq, session and resume are set here) and returns its seq, which
  // Await takes. After a reply that failed, the next request sent carries resume, so each
  // operation the caller issues after seeing an error runs.
  // UNAVAILABLE (IsNotSent) when the stream had ended before `request` went out while no
  // other operation was outstanding: `done` and `partial` are left with the caller, and a
  // new stream may carry the request with nothing reordered. Any other failure is given
  // to `done`.
  absl::StatusOr<uint64_t> Submit(v1::SessionRequest& request, DoneFn& done, PartialFn& partial);

  // Returns once operation `seq` has completed: its `done` has returned.
  void Await(uint64_t seq);

  // Ends the stream once every outstanding operation has completed. Idempotent.
  void Close();

  // False once the stream has ended; a new one must be opened.
  bool healthy() const;

  // Whether `s` is Submit's answer for a request that was not sent.
  static bool IsNotSent(const absl::Status& s);

 private:
  struct Pending {
    uint64_t seq;
    DoneFn done;
    PartialFn partial;
  };
  // Reads and dispatches one reply; on the end of the stream fails what is outstanding.
  // Requires the read turn.
  void ReadOne();
  // Reads (taking the turn) or waits for the reader until `until` holds or the stream has
  // ended and nothing is left to read.
  void Progress(const std::function<bool()>& until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t session_;
  const size_t window_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionReply>> stream_;
  mutable absl::Mutex mu_;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  // Operations up to this seq have completed. Replies come in order, so this is all the
  // state an Await needs.
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // a thread holds the read turn
  bool ended_ ABSL_GUARDED_BY(mu_) = false;    // the daemon's side is gone: nothing more to read
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // Close has begun: nothing more is sent
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;  // a write found the stream ended
  bool resume_next_ ABSL_GUARDED_BY(mu_) = false;
  // Serializes writes, so sequence numbers go out in order.
  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);
};

}  // namespace replayd::client

#endif  // REPLAYD_CLIENT_STREAM_H_
