#include "tests/bench/bench_support.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "baseline.grpc.pb.h"

ABSL_FLAG(std::string, replayd, "", "the daemon binary (default: this build's server/replayd)");
ABSL_FLAG(int, runs, 7, "interleaved runs per figure; medians are reported");
ABSL_FLAG(std::string, placement, "split",
          "split: client on core 0, daemon and baseline server on core 1; any: left to the scheduler");
ABSL_FLAG(std::string, isolation, "shared",
          "the spawned daemon's --isolation: shared (the in-process path, the figures the README compares with "
          "other systems) or process (each tenant in an executor; what that costs is replayd_isolation_bench's)");
ABSL_FLAG(std::string, daemon_args, "",
          "extra flags for the spawned daemon, split on spaces (e.g. --daemon_args=--isolation=process); "
          "added after the bench's own");
ABSL_FLAG(std::string, serve_baseline, "", "internal: serve the baseline service at this address");
ABSL_FLAG(std::string, baseline_api, "sync",
          "internal: the server API the baseline serves with: sync (every method), callback or queue (Chat only), "
          "mixed (Chat on a completion queue, the rest sync)");

namespace replayd::bench {

void PinTo(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv, int cpu) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    PinTo(cpu);
    execv(args[0], args.data());
    _exit(127);
  }
}

ChildProcess::~ChildProcess() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  for (int i = 0; i < 50; ++i) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    usleep(100000);
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}


namespace {

constexpr size_t kChatReplyBytes = 4096;

// The baseline's methods but Chat, on the sync API.
class SyncMethods : public Baseline::Service {
 public:
  SyncMethods() : chunk_(1 << 20, 'b') {}
  grpc::Status Empty(grpc::ServerContext*, const Nothing*, Nothing*) override { return grpc::Status::OK; }
  grpc::Status Upload(grpc::ServerContext*, grpc::ServerReader<Blob>* reader, Nothing*) override {
    Blob blob;
    while (reader->Read(&blob)) {
    }
    return grpc::Status::OK;
  }
  grpc::Status Download(grpc::ServerContext*, const Size* size, grpc::ServerWriter<Blob>* writer) override {
    Blob blob;
    for (uint64_t done = 0; done < size->bytes(); done += chunk_.size()) {
      blob.set_data(chunk_.data(), std::min<uint64_t>(chunk_.size(), size->bytes() - done));
      if (!writer->Write(blob)) break;
    }
    return grpc::Status::OK;
  }

 protected:
  std::string chunk_;
};

class BaselineService final : public SyncMethods {
 public:
  grpc::Status Chat(grpc::ServerContext*, grpc::ServerReaderWriter<Blob, Blob>* stream) override {
    Blob in, out;
    out.set_data(chunk_.data(), kChatReplyBytes);
    while (stream->Read(&in))
      if (!stream->Write(out)) break;
    return grpc::Status::OK;
  }
};

// Chat through the callback API: each read answered by a write, then the next read.
class ChatReactor final : public grpc::ServerBidiReactor<Blob, Blob> {
 public:
  explicit ChatReactor(const std::string& reply) {
    out_.set_data(reply);
    StartRead(&in_);
  }
  void OnReadDone(bool ok) override { ok ? StartWrite(&out_) : Finish(grpc::Status::OK); }
  void OnWriteDone(bool ok) override { ok ? StartRead(&in_) : Finish(grpc::Status::OK); }
  void OnDone() override { delete this; }

 private:
  Blob in_, out_;
};

class CallbackBaseline final : public Baseline::CallbackService {
 public:
  grpc::ServerBidiReactor<Blob, Blob>* Chat(grpc::CallbackServerContext*) override { return new ChatReactor(reply_); }

 private:
  const std::string reply_ = std::string(kChatReplyBytes, 'b');
};

// Chat on a completion queue served by one thread of its own: each call moves
// read -> write -> read until the client closes. `Service` has Chat async; any other
// method it serves keeps its API.
template <typename Service>
class QueueBaseline {
 public:
  explicit QueueBaseline(grpc::ServerBuilder& builder) : cq_(builder.AddCompletionQueue()) {
    builder.RegisterService(&service_);
  }
  // Serves until Stop has been called and every call has ended, then shuts the queue
  // down (no operation may start on a queue after its shutdown).
  void Serve() {
    Accept();
    void* tag;
    bool ok;
    for (;;) {
      auto next = cq_->AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::milliseconds(50));
      if (next == grpc::CompletionQueue::SHUTDOWN) return;
      if (next == grpc::CompletionQueue::TIMEOUT) {
        if (stopping_ && live_ == 0) cq_->Shutdown();
        continue;
      }
      Call* c = static_cast<Call*>(tag);
      if (c->state == Call::kAccepting && ok) Accept();
      if (c->state == Call::kFinishing || (c->state == Call::kAccepting && !ok)) {
        delete c;
        --live_;
      } else if (!ok) {
        c->Go(Call::kFinishing);
      } else {
        c->Go(c->state == Call::kReading ? Call::kWriting : Call::kReading);
      }
    }
  }
  // After the server's Shutdown: Serve returns once the calls left have ended.
  void Stop() { stopping_ = true; }

 private:
  struct Call {
    enum State { kAccepting, kReading, kWriting, kFinishing } state = kAccepting;
    grpc::ServerContext context;
    grpc::ServerAsyncReaderWriter<Blob, Blob> stream{&context};
    Blob in, out;
    void Go(State next) {
      state = next;
      if (next == kReading) stream.Read(&in, this);
      if (next == kWriting) stream.Write(out, this);
      if (next == kFinishing) stream.Finish(grpc::Status::OK, this);
    }
  };
  void Accept() {
    ++live_;
    Call* c = new Call;
    c->out.set_data(reply_);
    service_.RequestChat(&c->context, &c->stream, cq_.get(), cq_.get(), c);
  }
  Service service_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  const std::string reply_ = std::string(kChatReplyBytes, 'b');
  int live_ = 0;  // calls, counting the one waiting to be accepted; the serving thread's
  std::atomic<bool> stopping_{false};
};

}  // namespace

int ServeBaseline(const std::string& address) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  const std::string api = absl::GetFlag(FLAGS_baseline_api);
  BaselineService sync;
  CallbackBaseline callback;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(20 << 20);
  builder.SetMaxSendMessageSize(20 << 20);
  std::unique_ptr<QueueBaseline<Baseline::AsyncService>> queue;
  std::unique_ptr<QueueBaseline<Baseline::WithAsyncMethod_Chat<SyncMethods>>> mixed;
  if (api == "sync") {
    builder.RegisterService(&sync);
  } else if (api == "callback") {
    builder.RegisterService(&callback);
  } else if (api == "queue") {
    queue = std::make_unique<QueueBaseline<Baseline::AsyncService>>(builder);
  } else if (api == "mixed") {
    mixed = std::make_unique<QueueBaseline<Baseline::WithAsyncMethod_Chat<SyncMethods>>>(builder);
  } else {
    return 2;
  }
  auto server = builder.BuildAndStart();
  if (!server) return 1;
  std::thread queue_thread;
  if (queue) queue_thread = std::thread([&] { queue->Serve(); });
  if (mixed) queue_thread = std::thread([&] { mixed->Serve(); });
  int received;
  sigwait(&signals, &received);
  server->Shutdown(std::chrono::system_clock::now());
  if (queue) queue->Stop();
  if (mixed) mixed->Stop();
  if (queue_thread.joinable()) queue_thread.join();
  return 0;
}

std::unique_ptr<ChildProcess> StartBaseline(const std::string& api, std::string* address, int cpu) {
  *address = absl::StrCat("127.0.0.1:", FreePort());
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  auto child = std::make_unique<ChildProcess>(
      std::vector<std::string>{self.string(), "--serve_baseline=" + *address, "--baseline_api=" + api}, cpu);
  if (!WaitForServer(*address, absl::Seconds(20))) {
    std::fprintf(stderr, "the %s baseline server did not start\n", api.c_str());
    std::exit(1);
  }
  return child;
}

bool WaitForServer(const std::string& address, absl::Duration timeout) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  return channel->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout));
}

BenchServers::~BenchServers() {
  daemon.reset();
  baseline.reset();
  std::error_code ec;
  std::filesystem::remove_all(cache_dir, ec);
}

std::string BenchServers::Placement() const {
  return split ? "client pinned to core 0, daemon and baseline server to core 1"
               : "left to the scheduler";
}

std::vector<std::string> SplitArgs(const std::string& args) {
  std::vector<std::string> words;
  for (absl::string_view w : absl::StrSplit(args, ' ', absl::SkipEmpty())) words.emplace_back(w);
  return words;
}

std::unique_ptr<BenchServers> StartServers(const std::vector<std::string>& daemon_args,
                                           const std::string& daemon_binary) {
  auto servers = std::make_unique<BenchServers>();
  servers->split = absl::GetFlag(FLAGS_placement) == "split";
  servers->server_cpu = servers->split ? 1 : -1;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  std::string daemon_path = daemon_binary.empty() ? absl::GetFlag(FLAGS_replayd) : daemon_binary;
  if (daemon_path.empty())
    daemon_path = (self.parent_path().parent_path().parent_path() / "server" / "replayd").string();
  servers->baseline_address = absl::StrCat("127.0.0.1:", FreePort());
  servers->daemon_address = absl::StrCat("127.0.0.1:", FreePort());
  char cache_template[] = "/tmp/replayd-bench-XXXXXX";
  servers->cache_dir = mkdtemp(cache_template);
  servers->baseline = std::make_unique<ChildProcess>(
      std::vector<std::string>{self.string(), "--serve_baseline=" + servers->baseline_address},
      servers->server_cpu);
  std::vector<std::string> argv = {daemon_path, "--listen=" + servers->daemon_address,
                                   "--cache_dir=" + servers->cache_dir, "--log_level=warn",
                                   "--isolation=" + absl::GetFlag(FLAGS_isolation)};
  argv.insert(argv.end(), daemon_args.begin(), daemon_args.end());
  for (std::string& a : SplitArgs(absl::GetFlag(FLAGS_daemon_args))) argv.push_back(std::move(a));
  servers->daemon = std::make_unique<ChildProcess>(argv, servers->server_cpu);
  PinTo(servers->split ? 0 : -1);
  if (!WaitForServer(servers->baseline_address, absl::Seconds(20)) ||
      !WaitForServer(servers->daemon_address, absl::Seconds(20))) {
    std::fprintf(stderr, "servers did not start (daemon: %s)\n", daemon_path.c_str());
    std::exit(1);
  }
  return servers;
}

int BenchMain(int argc, char** argv, int (*bench)()) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_serve_baseline).empty()) return ServeBaseline(absl::GetFlag(FLAGS_serve_baseline));
  return bench();
}

absl::StatusOr<client::Graph> CaptureChain(client::Session& session, const client::Program& program,
                                           const client::Buffer& x, int calls, int floats) {
  const client::Variable pos{"pos", 1, 1 << 30, 1};
  if (absl::Status s = session.BeginCapture({&x}, {pos}); !s.ok()) return s;
  client::LaunchSpec spec;
  spec.args = {client::View{&x}, int64_t{floats}, client::Expr{"pos"}};
  spec.variables = {{pos, 1}};
  for (int c = 0; c < calls; ++c)
    if (absl::Status s = session.Launch(program, spec).status(); !s.ok()) return s;
  return session.EndCapture({});
}

client::ClientOptions ChainSession::WideWindow() {
  client::ClientOptions options;
  options.stream_window = 256;
  return options;
}

ChainSession ChainSession::Open(const std::string& address, int calls, int floats, client::ClientOptions options) {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "opening a chain session: %s\n", s.ToString().c_str());
    std::exit(1);
  };
  ChainSession c;
  c.client = std::make_unique<client::Client>(client::Client::Connect(address, options));
  auto session = c.client->OpenSession("cpu:0");
  if (!session.ok()) fail(session.status());
  c.session = std::make_unique<client::Session>(std::move(*session));
  auto program = c.session->Load({"cpu-c", kChainKernel, "step", *client::ParseSignature("inout,int32,int32"), {}});
  if (!program.ok()) fail(program.status());
  c.program = std::make_unique<client::Program>(std::move(*program));
  auto x = c.session->Alloc(uint64_t{kChainFloats} * 4);
  if (!x.ok()) fail(x.status());
  c.x = std::make_unique<client::Buffer>(std::move(*x));
  auto g = CaptureChain(*c.session, *c.program, *c.x, calls, floats);
  if (!g.ok()) fail(g.status());
  c.graph = std::make_unique<client::Graph>(std::move(*g));
  return c;
}

double ChainSession::Pipelined(int n) {
  std::vector<std::future<absl::StatusOr<client::ReplayResult>>> futures;
  futures.reserve(n);
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) futures.push_back(session->ReplayAsync(*graph, {x.get(), int64_t{1 + i}}));
  for (auto& f : futures)
    if (!f.get().ok()) std::exit(1);
  return n / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool ChainSession::Sequence(uint32_t count) {
  client::SequenceSpec spec;
  spec.base = {x.get(), int64_t{1}};
  spec.step_param = 1;
  spec.count = count;
  auto r = session->ReplaySequence(*graph, spec);
  return r.ok() && r->replays == count;
}

std::vector<double> LatenciesUs(int iterations, const std::function<bool(int)>& call) {
  std::vector<double> samples;
  samples.reserve(iterations);
  for (int i = 0; i < iterations; ++i) {
    auto start = std::chrono::steady_clock::now();
    if (!call(i)) {
      std::fprintf(stderr, "call failed\n");
      std::exit(1);
    }
    samples.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  return samples;
}

double MedianLatencyUs(int iterations, const std::function<bool(int)>& call) {
  return Median(LatenciesUs(iterations, call));
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  if (n == 0) return 0;
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double Quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

std::vector<double> InterleavedMedians(const std::vector<std::function<double()>>& subjects,
                                       int runs) {
  std::vector<std::vector<double>> results(subjects.size());
  for (int r = 0; r < runs; ++r)
    for (size_t i = 0; i < subjects.size(); ++i) results[i].push_back(subjects[i]());
  std::vector<double> medians;
  for (auto& r : results) medians.push_back(Median(r));
  return medians;
}

}  // namespace replayd::bench
