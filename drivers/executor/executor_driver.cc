#include "drivers/executor/executor_driver.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "drivers/confinement.h"
#include "drivers/executor/wire.h"

namespace replayd::executor {
namespace {

// The answer of a command posted behind one without wait that failed (as a GPU reports
// an asynchronous error at the next call).
absl::Status EarlierFailed(const absl::Status& earlier) {
  return absl::Status(earlier.code(), absl::StrCat("an earlier command without wait failed: ", earlier.message()));
}

std::atomic<uint64_t> next_address_space{uint64_t{1} << 32};

std::string SignalName(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  return abbrev ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", signal);
}

absl::Status StatusOf(const Reply& reply) {
  if (reply.code() == 0) return absl::OkStatus();
  const auto code = reply.code() > 0 && reply.code() <= 16 ? static_cast<absl::StatusCode>(reply.code())
                                                          : absl::StatusCode::kInternal;
  return absl::Status(code, reply.message());
}

std::optional<absl::Duration> TimeOf(const Reply& reply) {
  if (!reply.has_time()) return std::nullopt;
  return absl::Nanoseconds(reply.device_time_ns());
}

void ToWire(const Allocation& a, Region& out) {
  out.set_address(a.address);
  out.set_bytes(a.bytes);
}

class ExecutorKernel : public Kernel {
 public:
  ExecutorKernel(std::shared_ptr<Executor> executor, std::shared_ptr<Executor::Link> link, uint64_t id,
                 Signature signature, std::string name)
      : executor_(std::move(executor)), link_(std::move(link)), id_(id), signature_(std::move(signature)),
        name_(std::move(name)) {}
  ~ExecutorKernel() override {
    Request r;
    r.set_free_kernel(id_);
    if (executor_->health().ok()) executor_->Release(*link_, r, "freeing a kernel").IgnoreError();
  }
  const Signature& signature() const override { return signature_; }
  uint64_t id() const { return id_; }
  const std::string& name() const { return name_; }

 private:
  const std::shared_ptr<Executor> executor_;
  const std::shared_ptr<Executor::Link> link_;
  const uint64_t id_;
  const Signature signature_;
  const std::string name_;  // "program <artifact> entry '<entry>'", for a death's cause
};

// Updates are kept here and sent with the next launch, so a replay is one round trip
// whatever the number of nodes it patches; only the values that changed since the last
// launch travel (GraphLaunch). A launch that fails after some of them may have been
// applied sends every value at the next launch, so the executor's graph is again exactly
// what the engine last asked for.
class ExecutorDeviceGraph : public DeviceGraph {
 public:
  ExecutorDeviceGraph(std::shared_ptr<Executor> executor, std::shared_ptr<Executor::Link> link, uint64_t id,
                      std::span<const GraphNode> nodes, GraphValues layout)
      : executor_(std::move(executor)), link_(std::move(link)), id_(id), layout_(std::move(layout)),
        values_(layout_.size()), pending_(nodes.size(), false),
        failures_seen_(link_->failures.load(std::memory_order_relaxed)) {
    for (size_t i = 0; i < nodes.size(); ++i) layout_.Store(i, nodes[i].args, nodes[i].global, nodes[i].local, values_);
    sent_ = values_;
    for (const GraphNode& n : nodes)
      if (!n.is_copy()) {
        what_ = absl::StrCat("replaying a device graph of ", nodes.size(), nodes.size() == 1 ? " node" : " nodes",
                             ", the first ", static_cast<const ExecutorKernel*>(n.kernel)->name());
        break;
      }
    if (what_.empty()) what_ = absl::StrCat("replaying a device graph of ", nodes.size(), " copies");
  }
  ~ExecutorDeviceGraph() override {
    Request r;
    r.set_free_graph(id_);
    if (executor_->health().ok()) executor_->Release(*link_, r, "freeing a device graph").IgnoreError();
  }

  absl::Status Update(size_t node, std::span<const ArgValue> args, const Dim3& global, const Dim3& local) override {
    if (node >= layout_.nodes() || args.size() != layout_.end(node) - layout_.first(node) - GraphValues::kDimValues)
      return absl::InvalidArgumentError(absl::StrCat("device graph update of node ", node, " does not fit"));
    layout_.Store(node, args, global, local, values_);
    if (!pending_[node]) {
      pending_[node] = true;
      pending_nodes_.push_back(node);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::optional<absl::Duration>> Launch(bool wait) override {
    // Kept between launches: its launch cleared keeps the updates' memory for the next.
    Request& r = request_;
    GraphLaunch* launch = r.mutable_graph_launch();
    launch->Clear();
    launch->set_graph(id_);
    launch->set_wait(wait);
    // A command of the link the executor refused since this graph's last launch may have
    // been this graph's launch without wait, failed part-way.
    const uint64_t failures = link_->failures.load(std::memory_order_relaxed);
    if (resync_ || failures != failures_seen_) {
      launch->set_all(true);
      launch->mutable_update_values()->Add(values_.begin(), values_.end());
      sent_ = values_;
    } else {
      for (size_t node : pending_nodes_)
        for (size_t i = layout_.first(node); i < layout_.end(node); ++i)
          if (values_[i] != sent_[i]) {
            launch->add_update_indexes(static_cast<uint32_t>(i));
            launch->add_update_values(values_[i]);
            sent_[i] = values_[i];
          }
    }
    std::optional<absl::Duration> time;
    if (wait) {
      absl::StatusOr<Reply> reply = executor_->Call(*link_, r, what_);
      if (!reply.ok()) {
        resync_ = true;
        return reply.status();
      }
      time = TimeOf(*reply);
    } else if (absl::Status s = executor_->Post(*link_, r, what_); !s.ok()) {
      resync_ = true;
      return s;
    }
    resync_ = false;
    failures_seen_ = failures;
    for (size_t node : pending_nodes_) pending_[node] = false;
    pending_nodes_.clear();
    return time;
  }

 private:
  const std::shared_ptr<Executor> executor_;
  const std::shared_ptr<Executor::Link> link_;
  const uint64_t id_;
  const GraphValues layout_;
  std::vector<uint64_t> values_;  // every value, as the engine last set it
  std::vector<uint64_t> sent_;    // every value, as the launches posted so far set it
  std::vector<bool> pending_;     // updated since the last launch that succeeded
  std::vector<size_t> pending_nodes_;
  bool resync_ = false;
  uint64_t failures_seen_;  // the link's failures at the last launch that was sent
  std::string what_;
  Request request_;  // the last launch's
};

class ExecutorContext : public Context {
 public:
  // Allocations of at least `shared_from` bytes (0: none) are shared buffers, taken from
  // `shared_budget`, while it has some left.
  ExecutorContext(std::shared_ptr<Executor> executor, std::shared_ptr<Executor::Link> link,
                  std::function<void()> closed, uint64_t shared_from, SharedBufferBudget& shared_budget)
      : executor_(std::move(executor)), link_(std::move(link)), closed_(std::move(closed)),
        shared_from_(shared_from), shared_budget_(shared_budget) {}
  // Ends the context's thread in the executor, which frees what the context still holds,
  // and tells the device (which ends an executor with its tenant's last context).
  ~ExecutorContext() override {
    Request r;
    r.set_close_context(true);
    // Its channel serves the executor's next context when nothing else holds it (a
    // kernel or device graph that outlived the context would still post on it).
    if (executor_->health().ok() && executor_->Release(*link_, r, "closing a context").ok() &&
        link_.use_count() == 1)
      executor_->Recycle(*link_);
    closed_();
  }

  absl::StatusOr<Allocation> Allocate(uint64_t bytes) override {
    if (absl::Status s = executor_->Reserve(bytes); !s.ok()) return s;
    // A shared buffer where one can be made; the executor's own memory otherwise.
    std::optional<SharedBuffer> shared;
    if (shared_from_ > 0 && bytes >= shared_from_) {
      absl::StatusOr<SharedBuffer> b = SharedBuffer::Create(bytes, shared_budget_);
      if (b.ok()) shared.emplace(*std::move(b));
    }
    Request r;
    const std::string what = absl::StrCat("allocating ", bytes, " bytes");
    absl::StatusOr<Reply> reply;
    if (shared) {
      r.set_allocate_shared(bytes);
      reply = executor_->CallWithFd(*link_, r, shared->fd(), what);
      shared->CloseFd();
    } else {
      r.set_allocate(bytes);
      reply = executor_->Call(*link_, r, what);
    }
    if (!reply.ok()) {
      executor_->Release(bytes);
      return reply.status();
    }
    const Allocation a{reply->value(), bytes};
    if (shared) {
      absl::MutexLock lock(&shared_mu_);
      shared_.erase(a.address);  // none: a freed buffer leaves the map
      shared_.emplace(a.address, *std::move(shared));
    }
    return a;
  }

  void Free(const Allocation& allocation) override {
    Request r;
    ToWire(allocation, *r.mutable_free());
    if (executor_->health().ok()) executor_->Release(*link_, r, "freeing an allocation").IgnoreError();
    executor_->Release(allocation.bytes);
    absl::MutexLock lock(&shared_mu_);
    shared_.erase(allocation.address);  // the daemon's mapping, after the executor's
  }

  absl::Status Write(const Allocation& dst, uint64_t offset, std::span<const uint8_t> bytes) override {
    if (uint8_t* p = SharedAt(dst, offset, bytes.size())) {
      // In order after every command posted before it, which may use the buffer.
      if (absl::Status s = executor_->Drain(*link_); !s.ok()) return s;
      std::memcpy(p, bytes.data(), bytes.size());
      return absl::OkStatus();
    }
    for (uint64_t done = 0; done < bytes.size();) {
      const uint64_t n = std::min<uint64_t>(bytes.size() - done, Channel::kDataBytes);
      Request r;
      Transfer* t = r.mutable_write();
      ToWire(dst, *t->mutable_allocation());
      t->set_offset(offset + done);
      t->set_bytes(n);
      absl::StatusOr<Reply> reply = executor_->Call(*link_, r, "writing a buffer", bytes.subspan(done, n));
      if (!reply.ok()) return reply.status();
      done += n;
    }
    return absl::OkStatus();
  }

  absl::Status Read(const Allocation& src, uint64_t offset, std::span<uint8_t> bytes) override {
    if (const uint8_t* p = SharedAt(src, offset, bytes.size())) {
      if (absl::Status s = executor_->Drain(*link_); !s.ok()) return s;
      std::memcpy(bytes.data(), p, bytes.size());
      return absl::OkStatus();
    }
    for (uint64_t done = 0; done < bytes.size();) {
      const uint64_t n = std::min<uint64_t>(bytes.size() - done, Channel::kDataBytes);
      Request r;
      Transfer* t = r.mutable_read();
      ToWire(src, *t->mutable_allocation());
      t->set_offset(offset + done);
      t->set_bytes(n);
      absl::StatusOr<Reply> reply = executor_->Call(*link_, r, "reading a buffer", {}, bytes.subspan(done, n));
      if (!reply.ok()) return reply.status();
      done += n;
    }
    return absl::OkStatus();
  }

  absl::Status Copy(const Allocation& dst, uint64_t dst_offset, const Allocation& src, uint64_t src_offset,
                    uint64_t bytes) override {
    Request r;
    CopyCommand* c = r.mutable_copy();
    ToWire(dst, *c->mutable_dst());
    c->set_dst_offset(dst_offset);
    ToWire(src, *c->mutable_src());
    c->set_src_offset(src_offset);
    c->set_bytes(bytes);
    return executor_->Call(*link_, r, "copying between buffers").status();
  }

  absl::StatusOr<std::unique_ptr<Kernel>> Load(const ProgramSource& source,
                                               const std::filesystem::path& artifact) override {
    Request r;
    ToWire(source, artifact.string(), *r.mutable_load());
    const std::string name = absl::StrCat("program ", artifact.stem().string(), " entry '", source.entry, "'");
    absl::StatusOr<Reply> reply = executor_->Call(*link_, r, absl::StrCat("loading ", name));
    if (!reply.ok()) return reply.status();
    return std::make_unique<ExecutorKernel>(executor_, link_, reply->value(), source.signature, name);
  }

  absl::StatusOr<std::optional<absl::Duration>> Launch(const Kernel& kernel, std::span<const ArgValue> args,
                                                       const Dim3& global, const Dim3& local, bool wait) override {
    const auto& k = static_cast<const ExecutorKernel&>(kernel);
    Request r;
    LaunchCommand* l = r.mutable_launch();
    l->set_kernel(k.id());
    ArgsToWire(args, *l->mutable_args());
    ToWire(global, *l->mutable_global());
    ToWire(local, *l->mutable_local());
    l->set_wait(wait);
    if (!wait) {
      if (absl::Status s = executor_->Post(*link_, r, absl::StrCat("running ", k.name())); !s.ok()) return s;
      return std::nullopt;
    }
    absl::StatusOr<Reply> reply = executor_->Call(*link_, r, absl::StrCat("running ", k.name()));
    if (!reply.ok()) return reply.status();
    return TimeOf(*reply);
  }

  absl::Status Synchronize() override { return executor_->Synchronize(*link_); }

  absl::StatusOr<std::unique_ptr<DeviceGraph>> Instantiate(std::span<const GraphNode> nodes,
                                                           std::span<const std::pair<size_t, size_t>> edges) override {
    Request r;
    executor::Instantiate* in = r.mutable_instantiate();
    for (const GraphNode& n : nodes) {
      Node* w = in->add_nodes();
      w->set_kernel(n.is_copy() ? 0 : static_cast<const ExecutorKernel*>(n.kernel)->id());
      ArgsToWire(n.args, *w->mutable_args());
      ToWire(n.global, *w->mutable_global());
      ToWire(n.local, *w->mutable_local());
      w->set_copy_bytes(n.copy_bytes);
    }
    for (const auto& [from, to] : edges) {
      in->add_edge_from(from);
      in->add_edge_to(to);
    }
    std::vector<size_t> arg_counts;
    for (const GraphNode& n : nodes) arg_counts.push_back(n.args.size());
    absl::StatusOr<GraphValues> layout = GraphValues::For(arg_counts);
    if (!layout.ok()) return layout.status();
    absl::StatusOr<Reply> reply = executor_->Call(*link_, r, "building a device graph");
    if (!reply.ok()) return reply.status();
    return std::make_unique<ExecutorDeviceGraph>(executor_, link_, reply->value(), nodes, *std::move(layout));
  }

  bool wants_edges() const override { return link_->wants_edges; }
  uint64_t address_space() const override { return executor_->address_space(); }
  absl::Status health() const override { return executor_->health(); }

 private:
  // The daemon's mapping of [offset, offset + bytes) of `a` when `a` is a shared buffer
  // (the caller has checked the range), else null.
  uint8_t* SharedAt(const Allocation& a, uint64_t offset, uint64_t bytes) {
    absl::MutexLock lock(&shared_mu_);
    auto it = shared_.find(a.address);
    if (it == shared_.end()) return nullptr;
    std::span<uint8_t> b = it->second.bytes();
    if (offset > b.size() || bytes > b.size() - offset) return nullptr;
    return b.data() + offset;
  }

  const std::shared_ptr<Executor> executor_;
  const std::shared_ptr<Executor::Link> link_;
  const std::function<void()> closed_;
  const uint64_t shared_from_;
  SharedBufferBudget& shared_budget_;
  absl::Mutex shared_mu_;
  // The shared buffers, by their address in the executor. Mapped here until freed, or
  // until the context closes, even when the executor ends first.
  std::map<uint64_t, SharedBuffer> shared_ ABSL_GUARDED_BY(shared_mu_);
};

}  // namespace

const char* ExecutorDeathName(ExecutorDeath death) {
  switch (death) {
    case ExecutorDeath::kSignal:
      return "signal";
    case ExecutorDeath::kExit:
      return "exit";
    case ExecutorDeath::kTimeout:
      return "timeout";
    case ExecutorDeath::kFailure:
      return "failure";
    case ExecutorDeath::kDeviceLost:
      return "device_lost";
  }
  return "failure";
}

absl::StatusOr<std::shared_ptr<Executor>> Executor::Start(const ExecutorOptions& options, std::string tenant,
                                                          std::string device, DeviceMemory& memory,
                                                          std::function<void(ExecutorDeath)> died,
                                                          uint64_t address_space) {
  if (access(options.binary.c_str(), X_OK) != 0)
    return absl::InternalError(absl::StrCat("executor program ", options.binary.string(), " cannot be run: ",
                                            std::strerror(errno)));
  // Its own bytes first: no process is started for want of them.
  if (options.own_bytes > 0)
    if (absl::Status s = memory.ReserveWithoutReclaim(device, options.own_bytes); !s.ok())
      return absl::Status(s.code(), absl::StrCat("an executor for tenant ", tenant, " needs ", options.own_bytes,
                                                 " bytes of its own: ", s.message()));
  // Until the executor holds them.
  absl::Cleanup own_bytes = [&] {
    if (options.own_bytes > 0) memory.Release(options.own_bytes);
  };
  absl::StatusOr<Channel> control = Channel::Create();
  if (!control.ok()) return control.status();
  int sockets[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets) != 0)
    return absl::InternalError(absl::StrCat("executor socket: ", std::strerror(errno)));
  std::vector<std::string> args = {options.binary.string(), "--fd=3", "--socket=4"};
  args.insert(args.end(), options.device_args.begin(), options.device_args.end());
  if (address_space > 0) args.push_back(absl::StrCat("--address_space=", address_space));
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> environment = options.environment;
  std::vector<char*> envp;
  for (std::string& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);

  // The child gets the control channel as 3 and its socket end as 4, and nothing else.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, control->fd(), 3);
  posix_spawn_file_actions_adddup2(&actions, sockets[1], 4);
  posix_spawn_file_actions_addclosefrom_np(&actions, 5);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  pid_t pid = 0;
  const int err = posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(sockets[1]);
  if (err != 0) {
    close(sockets[0]);
    return absl::InternalError(absl::StrCat("cannot start executor ", options.binary.string(), ": ", std::strerror(err)));
  }
  auto executor = std::shared_ptr<Executor>(
      new Executor(options, std::move(tenant), std::move(device), memory, *std::move(control), sockets[0], pid,
                   std::move(died)));
  std::move(own_bytes).Cancel();
  {
    absl::MutexLock lock(&executor->mu_);
    executor->reserved_ = options.own_bytes;
  }
  absl::MutexLock lock(&executor->limit_mu_);
  executor->address_space_limit_ = address_space;
  return executor;
}

Executor::Executor(const ExecutorOptions& options, std::string tenant, std::string device, DeviceMemory& memory,
                   Channel control, int socket, pid_t pid, std::function<void(ExecutorDeath)> died)
    : command_timeout_ns_(absl::ToInt64Nanoseconds(options.command_timeout)), tenant_(std::move(tenant)), device_(std::move(device)),
      memory_(memory), socket_(socket), pid_(pid), pidfd_(static_cast<int>(syscall(SYS_pidfd_open, pid, 0))),
      address_space_(next_address_space++),
      control_(std::make_shared<Link>(std::move(control))), died_(std::move(died)) {}

Executor::~Executor() {
  Stop();
  close(socket_);
  if (pidfd_ >= 0) close(pidfd_);
}

void Executor::Stop() {
  absl::MutexLock lock(&mu_);
  if (running_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    running_ = false;
  }
  memory_.Release(reserved_);
  reserved_ = 0;
}

void Executor::set_command_timeout(absl::Duration timeout) {
  command_timeout_ns_.store(absl::ToInt64Nanoseconds(timeout), std::memory_order_relaxed);
}

absl::Status Executor::set_address_space(uint64_t bytes) {
  absl::MutexLock lock(&limit_mu_);
  if (bytes == address_space_limit_) return absl::OkStatus();
  if (absl::Status s = SetAddressSpaceOf(pid_, bytes); !s.ok()) return s;
  address_space_limit_ = bytes;
  return absl::OkStatus();
}

absl::Status Executor::health() const {
  absl::MutexLock lock(&mu_);
  return death_;
}

absl::Status Executor::Reserve(uint64_t bytes) {
  if (absl::Status s = health(); !s.ok()) return s;
  // Outside the lock: the device's reclaimer may end idle executors.
  if (absl::Status s = memory_.Reserve(device_, bytes); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (!death_.ok()) {
    memory_.Release(bytes);
    return death_;
  }
  reserved_ += bytes;
  return absl::OkStatus();
}

uint64_t Executor::reserved() const {
  absl::MutexLock lock(&mu_);
  return reserved_;
}

void Executor::Release(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (!death_.ok()) return;  // given back at the death
  memory_.Release(bytes);
  reserved_ -= bytes;
}

void Executor::RecordDeath(ExecutorDeath death, const std::string& cause) {
  if (!death_.ok()) return;  // the first cause stands
  if (died_) died_(death);
  death_ = absl::FailedPreconditionError(absl::StrCat("executor of tenant ", tenant_, " on ", device_, " ", cause));
  memory_.Release(reserved_);
  reserved_ = 0;
}

bool Executor::Reaped(absl::string_view doing) {
  absl::MutexLock lock(&mu_);
  if (!running_) return true;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
  running_ = false;
  if (doing.empty() && !in_flight_.empty()) doing = in_flight_.begin()->second;
  const std::string while_doing = doing.empty() ? "" : absl::StrCat(" while ", doing);
  if (WIFSIGNALED(status)) {
    RecordDeath(ExecutorDeath::kSignal, absl::StrCat("died: ", SignalName(WTERMSIG(status)), while_doing));
  } else {
    RecordDeath(ExecutorDeath::kExit, absl::StrCat("exited with status ", WEXITSTATUS(status), while_doing));
  }
  return true;
}

void Executor::End(ExecutorDeath death, const std::string& cause) {
  absl::MutexLock lock(&mu_);
  if (running_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    running_ = false;
  }
  RecordDeath(death, cause);
}

void Executor::Recycle(Link& link) {
  if (!health().ok()) return;
  absl::MutexLock lock(&link.mu);
  absl::MutexLock spares(&spares_mu_);
  if (spares_.size() < kSpareChannels) spares_.push_back(std::move(link.channel));
}

absl::StatusOr<Channel> Executor::TakeChannel() {
  {
    absl::MutexLock spares(&spares_mu_);
    if (!spares_.empty()) {
      Channel spare = std::move(spares_.back());
      spares_.pop_back();
      spare.Reset();
      return spare;
    }
  }
  return Channel::Create();
}

absl::StatusOr<std::shared_ptr<Executor::Link>> Executor::OpenContext() {
  absl::StatusOr<Channel> channel = TakeChannel();
  if (!channel.ok()) return channel.status();
  const int fd = channel->fd();
  auto link = std::make_shared<Link>(*std::move(channel));
  // The descriptor goes first, then the command that takes it: one pair at a time.
  absl::MutexLock pair(&open_mu_);
  if (absl::Status sent = SendFd(socket_, fd); !sent.ok()) {
    End(ExecutorDeath::kFailure, absl::StrCat("failed: ", sent.message()));
    return health();
  }
  Request r;
  r.set_open_context(true);
  absl::StatusOr<Reply> reply = Call(*control_, r, "opening a context");
  if (!reply.ok()) return reply.status();
  link->wants_edges = reply->wants_edges();
  return link;
}

absl::StatusOr<Reply> Executor::Call(Link& link, Request& request, absl::string_view what,
                                     std::span<const uint8_t> in, std::span<uint8_t> out) {
  absl::MutexLock lock(&link.mu);
  return CallLocked(link, request, what, in, out);
}

absl::Status Executor::Synchronize(Link& link) {
  absl::MutexLock lock(&link.mu);
  if (!link.unsynchronized && link.pending.empty()) return health();
  Request r;
  r.set_synchronize(true);
  absl::StatusOr<Reply> reply = CallLocked(link, r, "synchronizing", {}, {});
  if (reply.ok()) link.unsynchronized = false;
  return reply.status();
}

absl::StatusOr<Reply> Executor::CallLocked(Link& link, Request& request, absl::string_view what,
                                           std::span<const uint8_t> in, std::span<uint8_t> out) {
  if (absl::Status s = Send(link, request, what, in, /*after_all=*/false); !s.ok()) return s;
  // One sleep for this command's reply, not one per reply before it: those stay in their
  // slots until more commands are posted.
  AwaitLast(link);
  // The replies of the commands posted before this one, then its own.
  absl::Status earlier = Collect(link, 1);
  if (!health().ok()) return health();
  absl::Status own = Await(link);
  if (!earlier.ok())
    return EarlierFailed(earlier);
  if (!own.ok()) return own;
  if (!out.empty()) std::memcpy(out.data(), link.channel.data().data(), out.size());
  return link.reply;
}

absl::StatusOr<Reply> Executor::CallWithFd(Link& link, Request& request, int fd, absl::string_view what) {
  // Drained first without the pair's lock: a long replay in flight holds up no other
  // context's open.
  if (absl::Status s = Drain(link); !s.ok()) return s;
  absl::MutexLock pair(&open_mu_);
  absl::MutexLock lock(&link.mu);
  // Nothing is in flight now (unless another thread posted meanwhile), so the command
  // is posted at the epoch the executor has and is never skipped: it takes the descriptor.
  if (absl::Status s = DrainLocked(link); !s.ok()) return s;
  if (absl::Status sent = SendFd(socket_, fd); !sent.ok()) {
    End(ExecutorDeath::kFailure, absl::StrCat("failed: ", sent.message()));
    return health();
  }
  if (absl::Status s = Send(link, request, what, {}, /*after_all=*/false); !s.ok()) return s;
  if (absl::Status s = Await(link); !s.ok()) return s;
  return link.reply;
}

absl::Status Executor::Drain(Link& link) {
  absl::MutexLock lock(&link.mu);
  return DrainLocked(link);
}

absl::Status Executor::DrainLocked(Link& link) {
  AwaitLast(link);
  absl::Status earlier = Collect(link, 0);
  if (absl::Status s = health(); !s.ok()) return s;
  if (!earlier.ok())
    return EarlierFailed(earlier);
  return absl::OkStatus();
}

absl::Status Executor::Release(Link& link, Request& request, absl::string_view what) {
  absl::MutexLock lock(&link.mu);
  if (absl::Status s = Send(link, request, what, {}, /*after_all=*/true); !s.ok()) return s;
  return Await(link);
}

absl::Status Executor::Post(Link& link, Request& request, absl::string_view what) {
  absl::MutexLock lock(&link.mu);
  return Send(link, request, what, {}, /*after_all=*/false);
}

absl::Status Executor::Send(Link& link, Request& request, absl::string_view what, std::span<const uint8_t> in,
                            bool after_all) {
  request.set_epoch(link.failures.load(std::memory_order_relaxed));
  if (!request.has_synchronize()) link.unsynchronized = true;
  size_t size = request.ByteSizeLong();
  // The epoch may grow while earlier replies are read below: by at most 11 bytes.
  const bool long_message = size + 11 > Channel::kSlotBytes;
  const bool uses_data = long_message || !in.empty();
  if (long_message && !in.empty()) return absl::InternalError("a command with bytes too long for its slot");
  // Commands posted before are answered first when the channel has no slot free, when
  // this one writes the data area while one of them uses it (the data area is written
  // only once no command in flight uses it), or when this one is a release. Then all of
  // them are, with one sleep for the last reply: the executor runs what was posted in one
  // turn, rather than a wake-up per slot freed.
  const bool drain =
      after_all || link.pending.size() >= Channel::kSlots ||
      (uses_data && std::any_of(link.pending.begin(), link.pending.end(), [](const Link::Pending& p) { return p.data; }));
  absl::Status earlier = absl::OkStatus();
  if (drain) {
    AwaitLast(link);
    earlier = Collect(link, 0);
  }
  if (absl::Status s = health(); !s.ok()) return s;
  if (!earlier.ok() && !after_all)
    return EarlierFailed(earlier);
  Channel& channel = link.channel;
  if (const uint64_t epoch = link.failures.load(std::memory_order_relaxed); epoch != request.epoch()) {
    request.set_epoch(epoch);
    size = request.ByteSizeLong();
  }
  if (size > Channel::kMessageBytes)
    return absl::ResourceExhaustedError(absl::StrCat("a command of ", size, " bytes exceeds the executor channel's ",
                                                     Channel::kMessageBytes));
  if (in.size() > channel.data().size()) return absl::InternalError("a transfer larger than the executor channel's data area");
  std::span<uint8_t> message = channel.request_area(size);
  request.SerializeWithCachedSizesToArray(message.data());  // the sizes ByteSizeLong just cached
  if (!in.empty()) std::memcpy(channel.data().data(), in.data(), in.size());
  // Named in flight before it is posted: the executor may end running it before
  // PostRequest returns, and the supervisor then reaps it and names what it was doing.
  if (link.pending.empty()) {
    absl::MutexLock in_flight(&mu_);
    in_flight_[&link] = std::string(what);
  }
  const uint32_t seq = channel.PostRequest(size);
  link.pending.push_back({seq, std::string(what), absl::Now(), uses_data});
  return absl::OkStatus();
}

void Executor::AwaitLast(Link& link) {
  if (link.pending.size() < 2) return;
  // Ends no later than the oldest command's deadline, which Collect then enforces.
  const Link::Pending& oldest = link.pending.front();
  const absl::Duration limit = absl::Nanoseconds(command_timeout_ns_.load(std::memory_order_relaxed));
  link.channel
      .AwaitReply(link.pending.back().seq, std::max(oldest.posted, link.answered) + limit,
                  [&] { return Reaped(oldest.what) || !health().ok(); })
      .IgnoreError();
}

absl::Status Executor::Collect(Link& link, size_t leave) {
  absl::Status first = absl::OkStatus();
  while (link.pending.size() > leave) {
    absl::Status s = Await(link);
    if (!health().ok()) return health();
    if (!s.ok() && !link.reply.skipped() && first.ok()) first = s;
  }
  return first;
}

absl::Status Executor::Await(Link& link) {
  Channel& channel = link.channel;
  const Link::Pending& p = link.pending.front();
  // Its time runs from when it could start: posted, and the command before it answered.
  const absl::Duration limit = absl::Nanoseconds(command_timeout_ns_.load(std::memory_order_relaxed));
  const absl::Time deadline = std::max(p.posted, link.answered) + limit;
  absl::StatusOr<uint64_t> bytes =
      channel.AwaitReply(p.seq, deadline, [&] { return Reaped(p.what) || !health().ok(); });
  const uint32_t seq = p.seq;
  const std::string what = p.what;
  link.pending.pop_front();
  link.answered = absl::Now();
  {
    absl::MutexLock in_flight(&mu_);
    if (link.pending.empty()) {
      in_flight_.erase(&link);
    } else {
      in_flight_[&link] = link.pending.front().what;
    }
  }
  if (!bytes.ok()) {
    link.reply.Clear();
    if (bytes.status().code() == absl::StatusCode::kDeadlineExceeded) {
      End(ExecutorDeath::kTimeout,
          absl::StrCat("was ended: ", what, " ran past the time limit of ", absl::FormatDuration(limit)));
      // This command ran out of time; the executor's later commands find it ended.
      return absl::DeadlineExceededError(health().message());
    } else if (health().ok()) {
      End(ExecutorDeath::kFailure, absl::StrCat("failed: ", bytes.status().message()));
    }
    return health();
  }
  if (!link.reply.ParseFromArray(channel.reply_of(seq).data(), static_cast<int>(*bytes))) {
    End(ExecutorDeath::kFailure, "sent a reply that does not parse");
    return health();
  }
  absl::Status s = StatusOf(link.reply);
  if (link.reply.device_lost()) {
    End(ExecutorDeath::kDeviceLost, absl::StrCat("lost its device while ", what, ": ", s.message()));
    return health();
  }
  if (!s.ok() && !link.reply.skipped()) link.failures.fetch_add(1, std::memory_order_relaxed);
  return s;
}

ExecutorDevice::ExecutorDevice(std::unique_ptr<Device> inner, ExecutorOptions options)
    : inner_(std::move(inner)), options_(std::move(options)), memory_(inner_->memory()),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), shared_buffers_(options_.max_shared_buffers) {
  if (options_.linger > absl::ZeroDuration())
    memory_.set_reclaimer([this](uint64_t wanted) { return EndIdle(wanted, ""); });
  if (wake_fd_ >= 0) supervisor_ = std::thread([this] { Supervise(); });
}

ExecutorDevice::~ExecutorDevice() {
  memory_.set_reclaimer(nullptr);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  WakeSupervisor();
  if (supervisor_.joinable()) supervisor_.join();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void ExecutorDevice::WakeSupervisor() {
  if (wake_fd_ < 0) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t ignored = write(wake_fd_, &one, sizeof one);
}

void ExecutorDevice::Supervise() {
  for (;;) {
    // The executors running now, held while they are polled (an executor that ends
    // meanwhile wakes this thread, which lets go of it).
    std::vector<std::shared_ptr<Executor>> watched, expired;
    absl::Time next = absl::InfiniteFuture();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      expired = TakeExpired(absl::Now(), next);
      for (const auto& [tenant, entry] : executors_)
        if (entry.executor->pidfd() >= 0 && entry.executor->health().ok()) watched.push_back(entry.executor);
    }
    for (const auto& e : expired) e->Stop();
    expired.clear();
    std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}};
    for (const auto& e : watched) fds.push_back({e->pidfd(), POLLIN, 0});
    int timeout_ms = -1;  // until an executor ends or the set changes, or the next linger ends
    if (next != absl::InfiniteFuture()) {
      const int64_t left_ms = absl::ToInt64Milliseconds(next - absl::Now()) + 1;
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left_ms, 0, 1 << 30));
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) return;
    if (fds[0].revents & POLLIN) {
      uint64_t count;
      [[maybe_unused]] ssize_t ignored = read(wake_fd_, &count, sizeof count);
    }
    for (size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) watched[i - 1]->Reap();
  }
}

absl::StatusOr<std::unique_ptr<Context>> ExecutorDevice::OpenContext(const ContextOptions& options) {
  if (options.isolation == Isolation::kShared) return inner_->OpenContext(options);
  const absl::string_view tenant = options.tenant;
  const absl::Duration timeout = options.max_launch > absl::ZeroDuration() ? options.max_launch
                                                                           : options_.command_timeout;
  // A new executor's own bytes: where they do not fit, idle executors of other tenants
  // give way.
  if (options_.own_bytes > 0 && memory_.free() < options_.own_bytes && !HasExecutor(tenant))
    EndIdle(options_.own_bytes - memory_.free(), tenant);
  std::shared_ptr<Executor> executor;
  absl::Status limited;  // moving its address-space limit
  {
    absl::MutexLock lock(&mu_);
    auto it = executors_.find(tenant);
    if (it == executors_.end() || !it->second.executor->health().ok()) {
      auto died = [this, tenant = std::string(tenant)](ExecutorDeath death) {
        absl::MutexLock counts(&counts_mu_);
        ++counts_[tenant].died[static_cast<size_t>(death)];
      };
      absl::StatusOr<std::shared_ptr<Executor>> started = Executor::Start(
          options_, std::string(tenant), inner_->info().id, memory_, std::move(died),
          AddressSpaceFor(options.memory_quota, 1));
      if (!started.ok()) return started.status();
      {
        absl::MutexLock counts(&counts_mu_);
        ++counts_[std::string(tenant)].started;
      }
      // An ended executor's contexts no longer count: they find it gone when they close.
      it = executors_.insert_or_assign(std::string(tenant), Entry{*started, 0}).first;
      WakeSupervisor();
    }
    executor = it->second.executor;
    it->second.idle_since = absl::InfiniteFuture();  // no longer idle, if it lingered
    const size_t contexts = ++it->second.contexts;
    // Room for this context, and the tenant's quota as it is now (a reloaded tenants file
    // may have changed it). Under the lock, so that opens side by side leave the room of
    // the most contexts. (Contexts that closed since leave their room until the next open.)
    if (const uint64_t limit = AddressSpaceFor(options.memory_quota, contexts); limit > 0)
      limited = executor->set_address_space(limit);
  }
  executor->set_command_timeout(timeout);
  // A process that has just ended is not an error here: opening finds it gone.
  if (!limited.ok() && !executor->Reap()) {
    ContextClosed(std::string(tenant), executor.get());
    return absl::InternalError(
        absl::StrCat("cannot limit the address space of the executor of tenant ", tenant, ": ", limited.message()));
  }
  auto closed = [this, tenant = std::string(tenant), e = executor.get()] { ContextClosed(tenant, e); };
  absl::StatusOr<std::shared_ptr<Executor::Link>> link = executor->OpenContext();
  if (!link.ok()) {
    closed();
    return link.status();
  }
  return std::make_unique<ExecutorContext>(std::move(executor), *std::move(link), std::move(closed),
                                           options_.shared_buffers_from, shared_buffers_);
}

uint64_t ExecutorDevice::AddressSpaceFor(uint64_t memory_quota, size_t contexts) const {
  if (options_.address_space_margin == 0) return 0;
  const uint64_t total = memory_.total();
  return (memory_quota > 0 ? std::min(memory_quota, total) : total) + options_.address_space_margin +
         contexts * kContextAddressSpace;
}

void ExecutorDevice::ContextClosed(const std::string& tenant, const Executor* executor) {
  std::shared_ptr<Executor> last;  // ended (the process killed and reaped) outside the lock
  {
    absl::MutexLock lock(&mu_);
    auto it = executors_.find(tenant);
    if (it == executors_.end() || it->second.executor.get() != executor || --it->second.contexts > 0) return;
    if (options_.linger > absl::ZeroDuration() && it->second.executor->health().ok()) {
      it->second.idle_since = absl::Now();  // the supervisor ends it once its linger is over
    } else {
      last = std::move(it->second.executor);
      executors_.erase(it);
    }
  }
  if (last) last->Stop();  // now, though the supervisor may hold it a moment longer
  WakeSupervisor();
}

std::vector<std::shared_ptr<Executor>> ExecutorDevice::TakeExpired(absl::Time now, absl::Time& next) {
  std::vector<std::shared_ptr<Executor>> expired;
  for (auto it = executors_.begin(); it != executors_.end();) {
    const Entry& e = it->second;
    if (e.contexts == 0 && e.idle_since != absl::InfiniteFuture()) {
      const absl::Time end = e.idle_since + options_.linger;
      if (end <= now || !e.executor->health().ok()) {
        expired.push_back(e.executor);
        it = executors_.erase(it);
        continue;
      }
      next = std::min(next, end);
    }
    ++it;
  }
  return expired;
}

bool ExecutorDevice::HasExecutor(absl::string_view tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = executors_.find(tenant);
  return it != executors_.end() && it->second.executor->health().ok();
}

bool ExecutorDevice::EndIdle(uint64_t wanted, absl::string_view keep) {
  std::vector<std::shared_ptr<Executor>> ended;  // stopped outside the lock
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::pair<absl::Time, std::string>> idle;  // the longest idle first
    uint64_t spare = 0;
    for (const auto& [tenant, e] : executors_) {
      if (e.contexts > 0 || e.idle_since == absl::InfiniteFuture() || tenant == keep) continue;
      idle.emplace_back(e.idle_since, tenant);
      spare += e.executor->reserved();
    }
    if (spare < wanted) return false;
    std::sort(idle.begin(), idle.end());
    uint64_t freed = 0;
    for (const auto& [since, tenant] : idle) {
      if (freed >= wanted) break;
      auto it = executors_.find(tenant);
      freed += it->second.executor->reserved();
      ended.push_back(std::move(it->second.executor));
      executors_.erase(it);
    }
  }
  for (const auto& e : ended) e->Stop();
  WakeSupervisor();  // it lets go of them
  return true;
}

std::shared_ptr<Executor> ExecutorDevice::ExecutorOf(absl::string_view tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = executors_.find(tenant);
  return it == executors_.end() ? nullptr : it->second.executor;
}

std::map<std::string, ExecutorCounts> ExecutorDevice::executor_counts() const {
  absl::MutexLock lock(&counts_mu_);
  return counts_;
}

}  // namespace replayd::executor
