// The executor's side: runs the daemon's commands on one real device in this process.
// The control channel opens contexts; each context then has a channel of its own (its
// memfd passed over the executor's socket) served by a thread of its own, so the
// sessions of one tenant run side by side as they do in the daemon.
//
// A context's allocations are kept by address, its kernels and device graphs by id, and
// every command is checked against them (an unknown id, a range outside an allocation, a
// wrong argument count) so that a bad command is refused with a status, never run.
//
// Thread safety: ExecutorServer::Run owns the calling thread; each ContextServer its own.
#ifndef REPLAYD_DRIVERS_EXECUTOR_EXECUTOR_SERVER_H_
#define REPLAYD_DRIVERS_EXECUTOR_EXECUTOR_SERVER_H_

#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "drivers/driver.h"
#include "drivers/executor/channel.h"
#include "drivers/executor/executor.pb.h"
#include "drivers/executor/wire.h"

namespace replayd::executor {

// Serves `channel`'s requests in order with `handle` until `stop` (asked about once a
// second) says the daemon is gone or `handle` asks to end; false when the channel fails.
// A request whose epoch is behind the refusals sent so far was posted behind one of them
// and is skipped (ABORTED, `skipped`).
template <typename Handle, typename Stop>
bool Serve(Channel& channel, Handle handle, Stop stop);

// The allocations of every context of an executor. Contexts that share an address space
// may use each other's buffers and device graphs (Context::address_space), so an address
// a kernel or a copy is given is checked against all of them. Thread-safe.
class Allocations {
 public:
  void Add(const Allocation& a) ABSL_LOCKS_EXCLUDED(mu_);
  void Remove(uint64_t address) ABSL_LOCKS_EXCLUDED(mu_);
  // OK when [address, address + bytes) lies inside one allocation; OUT_OF_RANGE otherwise.
  absl::Status CheckInside(uint64_t address, uint64_t bytes) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::map<uint64_t, uint64_t> bytes_ ABSL_GUARDED_BY(mu_);  // by address
};

// One context of `device` on its own channel. `socket` is the executor's: the memfd of
// an allocate_shared command comes over it just before the command (the daemon sends one
// such pair at a time).
class ContextServer {
 public:
  // `everyone` holds the allocations of the executor's every context, this one's included.
  ContextServer(const Device& device, std::unique_ptr<Context> context, int socket, Allocations& everyone)
      : device_(device), context_(std::move(context)), socket_(socket), everyone_(everyone) {}
  ~ContextServer();

  // Runs one command; `done` is set by close_context. A failure after which the process
  // can no longer use the device (Device::health) is marked device_lost.
  Reply Handle(const Request& request, std::span<uint8_t> data, bool& done);

 private:
  struct GraphState {
    std::unique_ptr<DeviceGraph> graph;
    GraphValues layout;
    std::vector<uint64_t> values;  // every value, as the launches so far set it
    std::vector<bool> updated;     // per node: set by the launch being read
    // Per value: the bytes from it that must lie inside one allocation (a copy
    // node's addresses: its copy's; a kernel's buffer argument: 0, the address itself),
    // or kNotAnAddress.
    std::vector<uint64_t> reach;
  };
  static constexpr uint64_t kNotAnAddress = ~uint64_t{0};
  absl::Status Run(const Request& request, std::span<uint8_t> data, Reply& reply);
  absl::Status RunGraphCommand(const Request& request, Reply& reply);
  // The allocation made here at exactly `region`, with [offset, offset + bytes) inside it.
  absl::StatusOr<Allocation> FindAllocation(const Region& region, uint64_t offset, uint64_t bytes) const;
  // OK when every buffer argument of `kernel` lies inside one allocation of the executor
  // (at its start, or its end for an empty view). The daemon checks every view against its
  // allocations first; this makes a wrong address from it a refusal, not a fault.
  absl::Status CheckBufferArgs(const Kernel& kernel, std::span<const ArgValue> args) const;
  absl::StatusOr<const Kernel*> FindKernel(uint64_t id) const;

  // The memfd that came with an allocate_shared command, as an allocation of the context.
  absl::StatusOr<Allocation> AllocateShared(uint64_t bytes);

  const Device& device_;
  std::unique_ptr<Context> context_;
  const int socket_;
  Allocations& everyone_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Allocation> allocations_;  // made here, by address
  std::map<uint64_t, std::unique_ptr<Kernel>> kernels_;
  std::map<uint64_t, GraphState> graphs_;
  std::vector<ArgValue> update_args_;  // one node update's, reused
  std::vector<size_t> updated_nodes_;  // the launch being read's, reused
};

class ExecutorServer {
 public:
  // `socket` carries the memfd of each new context's channel.
  ExecutorServer(Channel& control, int socket, Device& device)
      : control_(control), socket_(socket), device_(device) {}

  // Serves until the process `parent` is no longer this process's parent (the daemon is
  // gone), then returns 0; returns 1 if the control channel fails.
  int Run(pid_t parent);

 private:
  // Opens a context on the channel whose descriptor comes next on the socket and serves
  // it on a thread of its own; its Context::wants_edges.
  absl::StatusOr<bool> OpenContext(pid_t parent);
  // Runs `serve` on a thread of its own: one whose context has closed and that waits for
  // the next, or a new one. Up to kIdleThreads wait; the others end with their context.
  void RunOnThread(std::function<void()> serve);

  static constexpr int kIdleThreads = 4;
  Channel& control_;
  const int socket_;
  Device& device_;
  Allocations allocations_;     // of every context
  bool told_unpinned_ = false;  // that a channel could not be page-locked
  absl::Mutex threads_mu_;
  // Waiting threads not yet given a context, and what they are given.
  int idle_threads_ ABSL_GUARDED_BY(threads_mu_) = 0;
  std::deque<std::function<void()>> given_ ABSL_GUARDED_BY(threads_mu_);
};

template <typename Handle, typename Stop>
bool Serve(Channel& channel, Handle handle, Stop stop) {
  Request request;
  uint64_t failures = 0;  // refusals sent on this channel
  for (;;) {
    absl::StatusOr<uint64_t> bytes = channel.AwaitRequest(stop);
    if (!bytes.ok()) return bytes.status().code() == absl::StatusCode::kUnavailable;
    Reply reply;
    bool done = false;
    if (!request.ParseFromArray(channel.request(*bytes).data(), static_cast<int>(*bytes))) {
      reply.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
      reply.set_message("executor: a request that does not parse");
    } else if (request.epoch() != failures) {
      reply.set_code(static_cast<int>(absl::StatusCode::kAborted));
      reply.set_message("executor: not run, an earlier command failed");
      reply.set_skipped(true);
    } else {
      reply = handle(request, done);
    }
    if (reply.code() != 0 && !reply.skipped()) ++failures;
    std::span<uint8_t> out = channel.reply();
    // A reply fits its slot: a message too long for it (no reply carries much else) is cut.
    if (reply.ByteSizeLong() > out.size()) {
      std::string& message = *reply.mutable_message();
      size_t cut = std::min(message.size(), out.size() / 2);
      while (cut > 0 && cut < message.size() && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80)
        --cut;  // not inside a UTF-8 sequence
      message.resize(cut);
    }
    const size_t size = reply.ByteSizeLong();
    if (size > out.size() || !reply.SerializeToArray(out.data(), static_cast<int>(out.size()))) return false;
    channel.PostReply(size);
    if (done) return true;
  }
}

}  // namespace replayd::executor

#endif  // REPLAYD_DRIVERS_EXECUTOR_EXECUTOR_SERVER_H_
