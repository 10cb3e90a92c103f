// Device work in supervised executor processes: an ExecutorDevice wraps one real device
// (which still describes the device and compiles programs in the daemon) and runs every
// context opened with Isolation::kProcess in its tenant's executor, a child process
// hosting the real driver, reached over a shared-memory channel
// (drivers/executor/channel.h); a context opened with Isolation::kShared is the real
// device's own, in the daemon's process. The engine above sees an ordinary Device, as
// LevelDB's EnvWrapper wraps an Env.
//
// An executor that crashes, exits, sends a reply that does not parse, or runs a command
// past its time limit ends (it is killed if need be and reaped). Its command in flight
// answers FAILED_PRECONDITION naming the tenant, the device and the cause ("executor of
// tenant research on cpu:0 died: SIGSEGV while running program 1f2e... entry 'step'"),
// or DEADLINE_EXCEEDED when it ran past the limit; every later command of its contexts
// and their health() answer FAILED_PRECONDITION with the cause, so the engine closes
// their sessions; its memory is given back to the device at once, and the tenant's next
// OpenContext starts a fresh executor. Other tenants notice nothing.
//
// Thread safety: thread-safe. Each context has a channel of its own, so the sessions of one
// tenant run side by side in its executor; the commands of one context run in order.
#ifndef REPLAYD_DRIVERS_EXECUTOR_EXECUTOR_DRIVER_H_
#define REPLAYD_DRIVERS_EXECUTOR_EXECUTOR_DRIVER_H_

#include <sys/types.h>

#include <array>
#include <atomic>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "drivers/device_memory.h"
#include "drivers/driver.h"
#include "drivers/executor/channel.h"
#include "drivers/executor/executor.pb.h"
#include "drivers/executor/shared_buffer.h"

namespace replayd::executor {

struct ExecutorOptions {
  std::filesystem::path binary;          // the replayd-executor program
  std::vector<std::string> device_args;  // how it makes its device: {"--device=cpu", ...}
  // Its whole environment, "NAME=value" each: empty for a cpu executor; a GPU executor's
  // says where the vendor's driver is and which devices are visible.
  std::vector<std::string> environment;
  // Longest a command may run (a launch, a graph replay, a synchronize) before its
  // executor is killed, unless a context's options set their own (ContextOptions::max_launch).
  absl::Duration command_timeout = absl::Seconds(60);
  // Device memory the executor holds itself, whatever its contexts allocate (a CUDA
  // executor's CUDA context), reserved on the device's account while it runs.
  uint64_t own_bytes = 0;
  // Allocations of at least this many bytes live in memory the daemon maps too
  // (shared_buffer.h), so their transfers copy straight into them; 0: none do. For a
  // device whose memory is host memory (cpu).
  uint64_t shared_buffers_from = 0;
  // How many such buffers the device's contexts may hold at once; past it a buffer is the
  // executor's own.
  int64_t max_shared_buffers = 8192;
  // For a device whose kernels run on the host (cpu), the room an executor has beyond
  // its tenant's memory: its address space is limited to the memory the tenant may hold
  // on the device (the device's memory, or the tenant's memory quota where that is less;
  // ContextOptions::memory_quota), plus this margin for the program, the device's threads
  // and the artifacts it loads, plus ExecutorDevice::kContextAddressSpace for each open
  // context. 0 sets no limit (a GPU executor: its driver reserves address space far
  // beyond any memory).
  uint64_t address_space_margin = 0;
  // How long an executor outlives its tenant's last context, idle, for the tenant's next
  // context to open in at once (a session per request then starts no process, and a GPU
  // executor no driver context, each time); 0: it ends with the last context. An idle
  // executor keeps its own bytes (own_bytes) reserved until they are wanted: a
  // reservation on the device that would not fit otherwise (another tenant's new executor,
  // an allocation) ends idle executors, the longest idle first.
  absl::Duration linger = absl::ZeroDuration();
};

// Why an executor ended before its tenant's last context closed, as a few kinds (for the
// daemon's metrics; the full cause is in its health()).
enum class ExecutorDeath {
  kSignal,   // killed by a signal from outside, or a crash (SIGSEGV, SIGABRT, ...)
  kExit,     // exited by itself
  kTimeout,  // ended because a command ran past its time limit
  kFailure,  // ended because its channel failed or its reply did not parse
  kDeviceLost,  // ended because it could no longer use its device (a CUDA sticky error)
};
inline constexpr size_t kExecutorDeathCount = 5;
// "signal", "exit", "timeout", "failure", "device_lost"
const char* ExecutorDeathName(ExecutorDeath death);

// The executors of one tenant on a device, counted since the device was made.
struct ExecutorCounts {
  uint64_t started = 0;
  std::array<uint64_t, kExecutorDeathCount> died = {};  // by ExecutorDeath
};

// One executor process: its control channel, on which contexts are opened, and the
// socket that passes each context's own channel to it.
class Executor {
 public:
  // A context's channel: its commands in order, up to Channel::kSlots of them posted and
  // not yet answered.
  struct Link {
    // A command posted and not yet answered: what it does (for the cause of a death),
    // and when it was posted.
    struct Pending {
      uint32_t seq;
      std::string what;
      absl::Time posted;
      bool data = false;  // its request is in, or its bytes go through, the data area
    };
    absl::Mutex mu;
    Channel channel ABSL_GUARDED_BY(mu);
    Reply reply ABSL_GUARDED_BY(mu);  // the last one read
    std::deque<Pending> pending ABSL_GUARDED_BY(mu);
    absl::Time answered ABSL_GUARDED_BY(mu);  // when the last reply was read
    // Commands the executor refused, counted. Each command carries the count the daemon
    // has seen (its epoch); the executor skips one sent before a refusal was seen, so
    // nothing posted behind a failed command runs. A device graph whose launch may have
    // failed part-way sends every node at its next launch.
    std::atomic<uint64_t> failures{0};
    bool wants_edges = false;  // the context's in the executor (Context::wants_edges), set as it opens
    // A command other than a synchronize has been sent since the last synchronize that
    // succeeded: the context may have device work to wait for.
    bool unsynchronized ABSL_GUARDED_BY(mu) = false;
    explicit Link(Channel c) : channel(std::move(c)) {}
  };

  // Starts an executor for `tenant` on device `device`, holding ExecutorOptions::own_bytes
  // of `memory` (reserved before the process starts, without asking the reclaimer). INTERNAL
  // when it cannot be started (the binary missing, no memory for the channel);
  // RESOURCE_EXHAUSTED when its own bytes do not fit. `died`, if given, is told
  // once, should the executor end before Stop (called under the executor's lock: it must
  // not call back into it).
  // With `address_space` (bytes, > 0) its address space is limited to that, and may
  // later be moved (set_address_space) within the hard limit it inherits.
  static absl::StatusOr<std::shared_ptr<Executor>> Start(const ExecutorOptions& options, std::string tenant,
                                                         std::string device, DeviceMemory& memory,
                                                         std::function<void(ExecutorDeath)> died = nullptr,
                                                         uint64_t address_space = 0);
  // Kills the process if it still runs and gives back what it held.
  ~Executor();
  // The same, at once: for an executor whose last context closed.
  void Stop();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // A new context in the executor, on a channel of its own.
  absl::StatusOr<std::shared_ptr<Link>> OpenContext();

  // Sends `request` on `link` with `in` in the data area, waits for its reply and copies
  // `out` from the data area. `what` says what the command does, for the cause of a
  // death. DEADLINE_EXCEEDED when it ran past the time limit (the executor is ended);
  // FAILED_PRECONDITION once the executor has ended; the reply's own status otherwise.
  // It is posted behind a command still running (a Post's), and is not run when that
  // one fails: then it answers "an earlier command without wait failed: ...", as a GPU
  // reports an asynchronous error at the next call.
  // `request` is given its epoch.
  absl::StatusOr<Reply> Call(Link& link, Request& request, absl::string_view what,
                             std::span<const uint8_t> in = {}, std::span<uint8_t> out = {});
  // Call for a command that takes descriptor `fd` (passed over the executor's socket just
  // before it; one such pair at a time), posted once every earlier command has answered.
  absl::StatusOr<Reply> CallWithFd(Link& link, Request& request, int fd, absl::string_view what);
  // Keeps the channel of `link`, whose context's close has been answered and which
  // nothing else holds, for the executor's next context (at most kSpareChannels are
  // kept): a context then opens without a new memfd and mapping, and closes without
  // unmapping.
  void Recycle(Link& link);
  // Waits until every command posted on `link` has answered: OK, the first refusal among
  // them ("an earlier command without wait failed: ..."), or FAILED_PRECONDITION once the
  // executor has ended. Before the daemon touches a shared buffer.
  absl::Status Drain(Link& link);
  // Sends `request` on `link` and returns without its reply: the executor runs it while
  // the daemon goes on (a launch without wait). Its failure is a later command's answer.
  absl::Status Post(Link& link, Request& request, absl::string_view what);
  // Waits until the context's device work has finished (a synchronize command), or its
  // first failure, as Call. Without a round trip when nothing but synchronizes has been
  // sent since the last one that succeeded and nothing is in flight (a session that ran
  // nothing closes without one).
  absl::Status Synchronize(Link& link);
  // Call for a command that gives something back (a free, a context's close): it runs
  // after every earlier command has answered, even after a refusal, which nobody is told
  // then.
  absl::Status Release(Link& link, Request& request, absl::string_view what);

  // Device memory held by this executor's allocations, reserved in the device's account
  // (where it is short, the device's reclaimer may end idle executors: the caller holds
  // no ExecutorDevice lock) and given back when they are freed or when the executor ends.
  absl::Status Reserve(uint64_t bytes);
  void Release(uint64_t bytes);
  // What it holds on the device now: its own bytes and its allocations.
  uint64_t reserved() const;

  // OK while it runs; the cause (FAILED_PRECONDITION) once it has ended.
  absl::Status health() const;
  pid_t pid() const { return pid_; }
  // A descriptor that polls readable once the process has ended (pidfd), or -1 where the
  // kernel has none; then deaths are noticed only while a command waits.
  int pidfd() const { return pidfd_; }
  // Reaps the process if it has ended, recording why (naming a command in flight, if
  // any); true when it has.
  bool Reap() { return Reaped(""); }
  // The time limit of later commands (the tenant's policy may change while it runs).
  void set_command_timeout(absl::Duration timeout);
  // Moves the limit of its address space (started with one) to `bytes`, or to its hard
  // limit where that is less; INTERNAL when the kernel refuses (the process has ended).
  absl::Status set_address_space(uint64_t bytes);
  // Distinct per executor: contexts of two executors never share device graphs.
  uint64_t address_space() const { return address_space_; }

 private:
  Executor(const ExecutorOptions& options, std::string tenant, std::string device, DeviceMemory& memory,
           Channel control, int socket, pid_t pid, std::function<void(ExecutorDeath)> died);
  // Reaps the process if it has ended, recording why (with `doing`, or else a command
  // in flight); true when it has.
  bool Reaped(absl::string_view doing);
  // Posts `request` (with `in` in the data area) once a slot is free, reading the
  // replies of earlier commands to free one, or all of them where `after_all`. Fails
  // without posting when one of the replies read is a refusal (unless `after_all`) or the
  // executor has ended.
  absl::Status Send(Link& link, Request& request, absl::string_view what, std::span<const uint8_t> in,
                    bool after_all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(link.mu);
  // A channel for a new context: a closed one's (Recycle), reset, or a new one.
  absl::StatusOr<Channel> TakeChannel();
  // Call, with the link's lock held.
  absl::StatusOr<Reply> CallLocked(Link& link, Request& request, absl::string_view what, std::span<const uint8_t> in,
                                   std::span<uint8_t> out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(link.mu);
  // With two or more commands unanswered, sleeps once until the last is answered (or the
  // oldest's deadline passes, or the executor ends); reads none of the replies.
  void AwaitLast(Link& link) ABSL_EXCLUSIVE_LOCKS_REQUIRED(link.mu);
  // Drain's work, under the link's lock.
  absl::Status DrainLocked(Link& link) ABSL_EXCLUSIVE_LOCKS_REQUIRED(link.mu);
  // Reads replies in order until at most `leave` commands are unanswered: the first
  // refusal among them, or the executor's end.
  absl::Status Collect(Link& link, size_t leave) ABSL_EXCLUSIVE_LOCKS_REQUIRED(link.mu);
  // Waits for the reply of the oldest unanswered command, into link.reply.
  absl::Status Await(Link& link) ABSL_EXCLUSIVE_LOCKS_REQUIRED(link.mu);
  // Ends the process (SIGKILL) and records `cause`.
  void End(ExecutorDeath death, const std::string& cause);
  void RecordDeath(ExecutorDeath death, const std::string& cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::atomic<int64_t> command_timeout_ns_;
  const std::string tenant_;
  const std::string device_;
  DeviceMemory& memory_;
  const int socket_;
  const pid_t pid_;
  const int pidfd_;
  const uint64_t address_space_;
  const std::shared_ptr<Link> control_;
  absl::Mutex limit_mu_;
  uint64_t address_space_limit_ ABSL_GUARDED_BY(limit_mu_);  // bytes, as last set; 0: none
  const std::function<void(ExecutorDeath)> died_;
  absl::Mutex open_mu_;  // held from passing a descriptor to the command that takes it
  // Channels of closed contexts, for the next ones (Recycle).
  static constexpr size_t kSpareChannels = 4;
  absl::Mutex spares_mu_;
  std::vector<Channel> spares_ ABSL_GUARDED_BY(spares_mu_);
  mutable absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = true;  // not yet reaped
  // What each link waiting for a reply asked for, for the cause of a death.
  std::map<const Link*, std::string> in_flight_ ABSL_GUARDED_BY(mu_);
  absl::Status death_ ABSL_GUARDED_BY(mu_);   // OK while it runs
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
};

class ExecutorDevice : public Device {
 public:
  // The address space a context takes in its executor, for the limit
  // (ExecutorOptions::address_space_margin): its channel and its thread's stack.
  static constexpr uint64_t kContextAddressSpace = Channel::kTotalBytes + (16 << 20);

  // Executors reserve in `inner`'s memory account, which its own contexts draw on, so
  // the device's memory is one figure.
  ExecutorDevice(std::unique_ptr<Device> inner, ExecutorOptions options);
  ~ExecutorDevice() override;

  const DeviceInfo& info() const override { return inner_->info(); }
  uint64_t memory_in_use() const override { return memory_.in_use(); }
  DeviceMemory& memory() override { return memory_; }
  // The daemon's own use of the device (its contexts with Isolation::kShared).
  absl::Status health() const override { return inner_->health(); }
  absl::Status Compile(const ProgramSource& source, const std::filesystem::path& output) override {
    return inner_->Compile(source, output);
  }
  // With Isolation::kProcess, a context in the tenant's executor, started now if it has
  // none or its last one ended; with kShared, a context of the real device.
  absl::StatusOr<std::unique_ptr<Context>> OpenContext(const ContextOptions& options) override;

  // The executor `tenant` runs in now, or null; for tests and reports. An executor ends
  // with its tenant's last context, or ExecutorOptions::linger after it.
  std::shared_ptr<Executor> ExecutorOf(absl::string_view tenant) const;
  // Executors started and died, by tenant.
  std::map<std::string, ExecutorCounts> executor_counts() const;
  // The shared buffers the device's contexts hold now (ExecutorOptions::shared_buffers_from).
  int64_t shared_buffers() const { return options_.max_shared_buffers - shared_buffers_.left(); }

 private:
  struct Entry {
    std::shared_ptr<Executor> executor;
    size_t contexts = 0;  // open in it
    absl::Time idle_since = absl::InfiniteFuture();  // its last context closed then (linger)
  };
  // A context of `executor` closed; the tenant's executor ends with its last one, or is
  // left idle for ExecutorOptions::linger.
  void ContextClosed(const std::string& tenant, const Executor* executor);
  // The supervisor: waits on every running executor's pidfd, so that a death (a SIGKILL
  // from outside, say) is recorded at once even while no command waits; the engine's
  // reaper then closes the tenant's sessions. It also ends executors idle past their
  // linger.
  void Supervise();
  // Whether `tenant` has an executor that runs.
  bool HasExecutor(absl::string_view tenant) const;
  // The device's reclaimer: ends idle (lingering) executors, the longest idle first, but
  // not `keep`'s, until they have given back at least `wanted` bytes; true when they have.
  // Ends none where all of them together hold less. The caller holds no lock of this device.
  bool EndIdle(uint64_t wanted, absl::string_view keep);
  // Removes the executors idle past their linger at `now` and returns them (to be
  // stopped outside the lock); the time the next idle one's linger ends, in `next`.
  std::vector<std::shared_ptr<Executor>> TakeExpired(absl::Time now, absl::Time& next)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WakeSupervisor();
  // The address-space limit of an executor with `contexts` open whose tenant may hold
  // `memory_quota` bytes (0: no quota); 0 where the device sets none.
  uint64_t AddressSpaceFor(uint64_t memory_quota, size_t contexts) const;

  const std::unique_ptr<Device> inner_;
  const ExecutorOptions options_;
  DeviceMemory& memory_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry, std::less<>> executors_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int wake_fd_ = -1;  // eventfd: the set of executors changed, or stop
  // Its own lock: an executor reports its death under its own lock, which mu_'s holders take.
  mutable absl::Mutex counts_mu_;
  std::map<std::string, ExecutorCounts> counts_ ABSL_GUARDED_BY(counts_mu_);
  SharedBufferBudget shared_buffers_;
  std::thread supervisor_;
};

}  // namespace replayd::executor

#endif  // REPLAYD_DRIVERS_EXECUTOR_EXECUTOR_DRIVER_H_
