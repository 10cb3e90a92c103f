// A client session's connection state, shared by its Session and every handle made in it:
// the stub, token and id, and the Session stream (opened on first use and again once the
// last one has ended). Internal to the client library: not part of client.h.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_CLIENT_SESSION_CORE_H_
#define REPLAYD_CLIENT_SESSION_CORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/stream.h"
#include "replayd/v1/replayd.grpc.pb.h"

namespace replayd::client::client_internal {

// A request sent on a session's stream: the stream and its seq there, for Await.
struct Submitted {
  std::shared_ptr<Stream> stream;
  uint64_t seq = 0;
};

class SessionCore {
 public:
  SessionCore(std::shared_ptr<v1::Replayd::Stub> stub, std::string token, uint64_t id, size_t window)
      : stub_(std::move(stub)), token_(std::move(token)), id_(id), window_(window) {}
  // CloseStream().
  ~SessionCore();
  SessionCore(const SessionCore&) = delete;
  SessionCore& operator=(const SessionCore&) = delete;

  v1::Replayd::Stub& stub() const { return *stub_; }
  const std::string& token() const { return token_; }  // bearer token, empty without tenants
  uint64_t id() const { return id_; }

  // Sends `request` on the session's stream, opened on first use and again once the last
  // one has ended (a request that found it ended unsent goes on the new one). `done` and
  // `partial` as in Stream::Submit; on an error here `done` is not called.
  absl::StatusOr<Submitted> Submit(v1::SessionRequest& request, Stream::DoneFn done,
                                   Stream::PartialFn partial = nullptr);
  // Submit, then wait for the operation on this thread: `done` has run when it returns OK.
  absl::Status Run(v1::SessionRequest& request, Stream::DoneFn done, Stream::PartialFn partial = nullptr);
  // Ends the stream once its outstanding operations have completed.
  void CloseStream();

  // Marks the session closed; true only for the first call. Handles of a closed session
  // no longer free themselves on the daemon.
  bool MarkClosed() { return !closed_.exchange(true); }
  bool closed() const { return closed_; }

 private:
  const std::shared_ptr<v1::Replayd::Stub> stub_;
  const std::string token_;
  const uint64_t id_;
  const size_t window_;
  std::atomic<bool> closed_{false};
  absl::Mutex mu_;
  std::shared_ptr<Stream> stream_ ABSL_GUARDED_BY(mu_);
};

}  // namespace replayd::client::client_internal

#endif  // REPLAYD_CLIENT_SESSION_CORE_H_
