// replayd: serves the devices of this machine to remote clients over gRPC.
#include <signal.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/text_format.h"
#include "server/config.h"
#include "absl/synchronization/mutex.h"
#include "server/daemon.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

// Every flag below but these two has its field in DaemonConfig (proto/replayd/v1/config.proto),
// of the same name: a new flag needs one there.
ABSL_FLAG(std::string, config, "",
          "config file: a replayd.v1.DaemonConfig in protobuf text format (see docs/configuration.md); "
          "flags given on the command line win over it");
ABSL_FLAG(bool, print_config, false,
          "print the effective config (the command line over --config over the defaults) as a config file and "
          "exit");

ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "address to serve on, host:port");
ABSL_FLAG(std::string, devices, replayd::kKnownDeviceKinds,
          "comma-separated device kinds to serve; a kind without hardware serves no devices and says why");
ABSL_FLAG(std::string, cuda_context, "session",
          "CUDA contexts: session (one per session, faults isolated) or primary (the device's primary context, "
          "a stream per session)");
ABSL_FLAG(uint64_t, cuda_staging_bytes, 1 << 20,
          "bytes of each of a CUDA session's two pinned staging buffers for writes and reads");
ABSL_FLAG(uint64_t, cuda_executor_bytes, uint64_t{512} << 20,
          "device memory counted for each running CUDA executor's own CUDA context, beside what its sessions "
          "allocate (an H200's took 524 MiB); 0 counts none");
ABSL_FLAG(std::string, hip_device_graph, "auto",
          "HIP device graphs: graph (a hipGraph per batch), stream (the batch's launches in order on the "
          "session's stream) or auto (stream on ROCm 5, graph from ROCm 6)");
ABSL_FLAG(uint64_t, hip_staging_bytes, 1 << 20,
          "bytes of each of a HIP session's two pinned staging buffers for writes and reads");
ABSL_FLAG(uint64_t, hip_graph_kernarg_bytes, uint64_t{16} << 20,
          "bytes of kernel argument segments the node updates of one hipGraph may take before it is "
          "instantiated afresh (ROCm gives them back only with the instantiated graph)");
ABSL_FLAG(uint64_t, hip_executor_bytes, uint64_t{256} << 20,
          "device memory counted for each running HIP executor's own runtime state (its queues, scratch and "
          "loaded code objects), beside what its sessions allocate; an estimate, not measured; 0 counts none");
ABSL_FLAG(std::string, cache_dir, "", "compile cache directory (default $XDG_CACHE_HOME/replayd or ~/.cache/replayd)");
ABSL_FLAG(uint64_t, cache_max_bytes, uint64_t{1} << 30,
          "bytes of compiled artifacts the compile cache keeps; past it the least recently used are removed");
ABSL_FLAG(int, lease_seconds, 60, "a session not renewed within this many seconds is closed");
ABSL_FLAG(uint64_t, cpu_memory_limit, 0, "bytes of memory cpu:0 may allocate (0: half of RAM)");
ABSL_FLAG(std::string, cpu_cc, "cc", "C compiler for cpu-c programs");
ABSL_FLAG(int, cpu_compile_timeout_seconds, 30, "time limit of one cpu-c compile");
ABSL_FLAG(int, cpu_threads, 0, "parallel invocations on cpu:0 (0: one per core)");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, off");
ABSL_FLAG(int, graph_batch, 32, "calls in a graph's first batch; each later batch doubles it");
ABSL_FLAG(int, graph_cache_graphs, 256, "graphs one tenant may keep cached per device");
ABSL_FLAG(uint64_t, graph_cache_bytes, uint64_t{1} << 30, "arena and host bytes of graph instances one tenant may keep cached per device");
ABSL_FLAG(int, stream_window, 8,
          "Session stream operations read ahead of their replies per stream; 0 or 1 reads each request "
          "after the previous one has been answered");
ABSL_FLAG(int, stream_threads, 1,
          "threads polling the Session streams, each running the requests it receives; every polling thread "
          "costs each call a little, so more pay off only with many busy streams on many cores");
ABSL_FLAG(int, stream_workers, 1024,
          "most operations running at once on worker threads (replay sequences, and requests that arrive "
          "while others run); past it a request is refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(int, stream_workers_per_tenant, 256,
          "most of the --stream_workers one tenant's operations may hold at once; past it its requests that "
          "need a worker are refused with RESOURCE_EXHAUSTED, so no tenant can take them all");
ABSL_FLAG(std::string, tenants, "", "tenants file (protobuf text, see tenants.proto); reloaded on SIGHUP");
ABSL_FLAG(bool, allow_remote_without_tenants, false,
          "serve a non-loopback --listen address without --tenants (no authentication)");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "", "PEM CA: require client certificates it signed (mutual TLS)");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics over HTTP at /metrics on this address: port or :port (loopback), or "
          "host:port; empty: off");
ABSL_FLAG(uint64_t, queue_limit, 1024,
          "work items a tenant may have waiting for a device when its quotas set no queued limit");
ABSL_FLAG(absl::Duration, scheduler_quantum, absl::Microseconds(500),
          "device time a tenant of weight 1 may bank while idle, to spend ahead of the others when it returns");
ABSL_FLAG(absl::Duration, batch_max_wait, absl::Milliseconds(20),
          "waiting batch work runs at least once per this interval, even under interactive load");
ABSL_FLAG(bool, cpu_batch_idle, true,
          "on CPU devices, batch turns run their thread at SCHED_IDLE while interactive work is about, so "
          "interactive requests get the CPU at once (needs CAP_SYS_NICE; off with a warning without it)");
ABSL_FLAG(std::string, isolation, "process",
          "where a tenant's device work runs unless the tenants file says: process (a process of its own per "
          "tenant and cpu or cuda device, so a faulting kernel ends only that process) or shared (the daemon's "
          "process; trusted tenants only, untrusted ones run in a process of their own)");
ABSL_FLAG(int, max_launch_seconds, 60,
          "unless the tenants file says: the longest one launch, replay or transfer may run in a tenant's "
          "process before the process is ended (1 to 604800)");
ABSL_FLAG(absl::Duration, executor_linger, absl::Seconds(10),
          "how long a tenant's process outlives its last session on a device, idle, so that the tenant's next "
          "session there opens without starting one (a duration: 2s, 500ms; 0 to 1h; 0: it ends with the last "
          "session); an idle process ends sooner where its device memory is wanted");
ABSL_FLAG(std::optional<int>, drain_seconds, std::nullopt,
          "seconds a drain (SIGTERM, SIGINT, Admin.Drain) lets open sessions and calls carry on before the "
          "daemon closes them and exits; 0 to 86400 (unset: --shutdown_grace_seconds if given, else 30)");
ABSL_FLAG(std::optional<int>, shutdown_grace_seconds, std::nullopt,
          "the older name of --drain_seconds: read only when --drain_seconds is not given");

// The drain's time when no flag sets it.
constexpr int kDefaultDrainSeconds = 30;
// How long past the drain's end a stop may take (closing sessions, joining threads) before
// the daemon exits without waiting.
constexpr absl::Duration kStopMargin = absl::Seconds(5);

namespace {

std::filesystem::path DefaultCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::filesystem::path(xdg) / "replayd";
  if (const char* home = std::getenv("HOME"); home && *home) return std::filesystem::path(home) / ".cache" / "replayd";
  return "/var/cache/replayd";
}

// Says in the log why the value of flag `name` is refused, and which line of the config
// file gave it if one did.
void Refuse(const std::optional<replayd::ConfigFile>& config_file, absl::string_view name, absl::string_view why) {
  spdlog::error("--{} {}{}", std::string(name), std::string(why), config_file ? config_file->Origin(name) : "");
}

// The drain's time: --drain_seconds, or else --shutdown_grace_seconds, or else the
// default; nullopt (said in the log) when out of range.
std::optional<absl::Duration> DrainTime() {
  const std::optional<int> drain = absl::GetFlag(FLAGS_drain_seconds),
                           grace = absl::GetFlag(FLAGS_shutdown_grace_seconds);
  if (drain && grace) spdlog::warn("--drain_seconds={} wins over --shutdown_grace_seconds={}", *drain, *grace);
  const int seconds = drain ? *drain : grace ? *grace : kDefaultDrainSeconds;
  if (seconds < 0 || seconds > 86400) {
    spdlog::error("--drain_seconds (or --shutdown_grace_seconds) must be in [0, 86400]");
    return std::nullopt;
  }
  return absl::Seconds(seconds);
}

// Takes SIGHUP, SIGINT and SIGTERM (blocked in every thread) for `daemon` on a thread of its
// own until the process ends: SIGHUP reloads the tenants file; the first SIGINT or SIGTERM
// begins the drain (if Admin.Drain has not), the next exits at once.
class SignalThread {
 public:
  SignalThread(sigset_t signals, replayd::Daemon* daemon) : signals_(signals), daemon_(daemon) {
    std::thread([this] { Run(); }).detach();
  }
  // After this the thread no longer touches the daemon (it may be destroyed).
  void Detach() {
    absl::MutexLock lock(&mu_);
    daemon_ = nullptr;
  }

 private:
  void Run() {
    int stops = 0;
    for (;;) {
      int received = 0;
      if (sigwait(&signals_, &received) != 0) continue;
      if (received != SIGHUP && ++stops > 1) {
        spdlog::warn("signal {} again: exiting at once", received);
        std::_Exit(0);
      }
      absl::MutexLock lock(&mu_);
      if (daemon_ == nullptr) continue;
      if (received == SIGHUP) {
        if (absl::Status reloaded = daemon_->ReloadTenants(); reloaded.ok()) {
          spdlog::info("SIGHUP: tenants reloaded");
        } else {
          spdlog::error("SIGHUP: {}; the previous tenants stay in force", reloaded.ToString());
        }
      } else if (daemon_->Drain()) {
        spdlog::info("signal {}: draining", received);
      } else {
        spdlog::info("signal {}: draining already (Admin.Drain); another exits at once", received);
      }
    }
  }

  const sigset_t signals_;
  absl::Mutex mu_;
  replayd::Daemon* daemon_ ABSL_GUARDED_BY(mu_);
};

// The value of `flag` when it is in [lo, hi]; otherwise says so in the log.
std::optional<int> IntFlagIn(const std::optional<replayd::ConfigFile>& config_file, const absl::Flag<int>& flag,
                             int lo, int hi) {
  const int value = absl::GetFlag(flag);
  if (value >= lo && value <= hi) return value;
  Refuse(config_file, absl::GetFlagReflectionHandle(flag).Name(), absl::StrCat("must be in [", lo, ", ", hi, "]"));
  return std::nullopt;
}

// Reads the config file named by --config, if the command line names one, and sets the
// flags it gives; the command line is parsed after, so the flags given there win.
absl::StatusOr<std::optional<replayd::ConfigFile>> ReadConfigFlags(int argc, char** argv) {
  // The flags of this file and the fields of DaemonConfig must agree before any is read.
  absl::Status matches = replayd::CheckConfigMatchesFlags(__FILE__, {"config", "print_config"});
  if (!matches.ok()) return matches;
  std::optional<std::string> path = replayd::ConfigFlagIn(argc, argv);
  if (!path) return std::nullopt;
  absl::StatusOr<replayd::ConfigFile> file = replayd::ConfigFile::Read(*path);
  if (!file.ok()) return file.status();
  absl::Status set = file->SetFlags();
  if (!set.ok()) return set;
  return std::optional<replayd::ConfigFile>(*std::move(file));
}

// Prints the config the flags now hold, as a config file --config reads back. The drain's
// time is printed as drain_seconds, whichever flag set it; its older name is left out.
int PrintConfig() {
  const std::optional<absl::Duration> drain = DrainTime();
  if (!drain) return 1;
  absl::StatusOr<replayd::v1::DaemonConfig> config = replayd::ConfigFromFlags();
  std::string text;
  if (config.ok()) {
    config->set_drain_seconds(static_cast<int32_t>(absl::ToInt64Seconds(*drain)));
    config->clear_shutdown_grace_seconds();
  }
  if (!config.ok() || !google::protobuf::TextFormat::PrintToString(*config, &text)) {
    spdlog::error("--print_config: {}", config.status().ToString());
    return 1;
  }
  std::cout << "# replayd's effective config (replayd --print_config): a replayd.v1.DaemonConfig\n" << text;
  return std::cout.flush() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil is built without NDEBUG, so by default every Mutex lock updates a
  // process-wide graph of lock orders to find deadlocks: about a tenth of the daemon's time
  // in pipelined replays through an executor (docs/performance.md). The daemon does
  // without; the tests keep it, where it finds lock-order inversions.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage("replayd [flags]: serve compute devices over gRPC");
  absl::StatusOr<std::optional<replayd::ConfigFile>> config_file = ReadConfigFlags(argc, argv);
  if (!config_file.ok()) {
    spdlog::error("--config: {}", std::string(config_file.status().message()));
    return config_file.status().code() == absl::StatusCode::kInternal ? 1 : 2;
  }
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_config) != replayd::ConfigFlagIn(argc, argv).value_or("")) {
    spdlog::error("--config must be given on the command line itself, not through another flag");
    return 2;
  }
  const std::optional<replayd::ConfigFile>& file = *config_file;
  // With --print_config, stdout carries the config alone; the log goes to stderr.
  if (absl::GetFlag(FLAGS_print_config)) spdlog::set_default_logger(spdlog::stderr_color_st("replayd"));
  const spdlog::level::level_enum log_level = spdlog::level::from_str(absl::GetFlag(FLAGS_log_level));
  if (log_level == spdlog::level::off && absl::GetFlag(FLAGS_log_level) != "off") {
    Refuse(file, "log_level", "must be trace, debug, info, warn, error or off");
    return 2;
  }
  spdlog::set_level(log_level);

  // Block the shutdown signals in every thread; this one takes them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (absl::GetFlag(FLAGS_lease_seconds) <= 0) {
    Refuse(file, "lease_seconds", "must be positive");
    return 2;
  }
  const std::optional<absl::Duration> drain = DrainTime();
  if (!drain) return 2;
  replayd::DaemonOptions options;
  options.drain = *drain;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.devices = absl::StrSplit(absl::GetFlag(FLAGS_devices), ',', absl::SkipEmpty());
  std::string cache_dir = absl::GetFlag(FLAGS_cache_dir);
  options.engine.cache_dir = cache_dir.empty() ? DefaultCacheDir() : std::filesystem::path(cache_dir);
  options.engine.compile_cache.max_bytes = absl::GetFlag(FLAGS_cache_max_bytes);
  options.engine.lease = absl::Seconds(absl::GetFlag(FLAGS_lease_seconds));
  options.cpu.memory_limit = absl::GetFlag(FLAGS_cpu_memory_limit);
  options.cpu.compiler.compiler = absl::GetFlag(FLAGS_cpu_cc);
  options.cpu.compiler.time_limit = absl::Seconds(absl::GetFlag(FLAGS_cpu_compile_timeout_seconds));
  options.cpu.compiler.cage = replayd::CageBesideThisProgram();  // every compile in replayd-cc
  options.cpu.threads = absl::GetFlag(FLAGS_cpu_threads);
  const std::string isolation = absl::GetFlag(FLAGS_isolation);
  const int max_launch = absl::GetFlag(FLAGS_max_launch_seconds);
  if (isolation != "process" && isolation != "shared") {
    Refuse(file, "isolation", "must be process or shared");
    return 2;
  }
  if (max_launch < 1 || max_launch > static_cast<int>(replayd::kMaxLaunchSeconds)) {
    Refuse(file, "max_launch_seconds", absl::StrCat("must be in [1, ", replayd::kMaxLaunchSeconds, "]"));
    return 2;
  }
  options.tenant_defaults.isolation =
      isolation == "shared" ? replayd::Isolation::kShared : replayd::Isolation::kProcess;
  options.tenant_defaults.max_launch = absl::Seconds(max_launch);
  const absl::Duration linger = absl::GetFlag(FLAGS_executor_linger);
  if (linger < absl::ZeroDuration() || linger > absl::Hours(1)) {
    Refuse(file, "executor_linger", "must be in [0, 1h]");
    return 2;
  }
  options.executor_linger = linger;
#ifdef REPLAYD_WITH_CUDA
  absl::StatusOr<replayd::CudaContextPolicy> cuda_context =
      replayd::ParseCudaContextPolicy(absl::GetFlag(FLAGS_cuda_context));
  if (!cuda_context.ok()) {
    Refuse(file, "cuda_context", "must be session or primary");
    return 2;
  }
  if (absl::GetFlag(FLAGS_cuda_staging_bytes) < 4096 || absl::GetFlag(FLAGS_cuda_staging_bytes) > (uint64_t{1} << 30)) {
    Refuse(file, "cuda_staging_bytes", "must be in [4096, 1 GiB]");
    return 2;
  }
  options.cuda.context = *cuda_context;
  options.cuda.staging_bytes = absl::GetFlag(FLAGS_cuda_staging_bytes);
  options.cuda_executor_bytes = absl::GetFlag(FLAGS_cuda_executor_bytes);
#endif
#ifdef REPLAYD_WITH_HIP
  absl::StatusOr<replayd::HipDeviceGraph> hip_graph =
      replayd::ParseHipDeviceGraph(absl::GetFlag(FLAGS_hip_device_graph));
  if (!hip_graph.ok()) {
    Refuse(file, "hip_device_graph", "must be auto, graph or stream");
    return 2;
  }
  if (absl::GetFlag(FLAGS_hip_staging_bytes) < 4096 || absl::GetFlag(FLAGS_hip_staging_bytes) > (uint64_t{1} << 30)) {
    Refuse(file, "hip_staging_bytes", "must be in [4096, 1 GiB]");
    return 2;
  }
  options.hip.device_graph = *hip_graph;
  if (absl::GetFlag(FLAGS_hip_graph_kernarg_bytes) < 4096 ||
      absl::GetFlag(FLAGS_hip_graph_kernarg_bytes) > (uint64_t{1} << 30)) {
    Refuse(file, "hip_graph_kernarg_bytes", "must be in [4096, 1 GiB]");
    return 2;
  }
  options.hip.staging_bytes = absl::GetFlag(FLAGS_hip_staging_bytes);
  options.hip.graph_kernarg_bytes = absl::GetFlag(FLAGS_hip_graph_kernarg_bytes);
  options.hip_executor_bytes = absl::GetFlag(FLAGS_hip_executor_bytes);
#endif
  for (const auto* flag : {&FLAGS_graph_batch, &FLAGS_graph_cache_graphs}) {
    if (absl::GetFlag(*flag) < 1) {
      Refuse(file, absl::GetFlagReflectionHandle(*flag).Name(), "must be at least 1");
      return 2;
    }
  }
  options.engine.batch.first_limit = absl::GetFlag(FLAGS_graph_batch);
  const std::optional<int> stream_window = IntFlagIn(file, FLAGS_stream_window, 0, 65536),
                           stream_threads = IntFlagIn(file, FLAGS_stream_threads, 1, 256),
                           stream_workers = IntFlagIn(file, FLAGS_stream_workers, 1, 65536),
                           workers_per_tenant = IntFlagIn(file, FLAGS_stream_workers_per_tenant, 1, 65536);
  if (!stream_window || !stream_threads || !stream_workers || !workers_per_tenant) return 2;
  options.streams.window = *stream_window;
  options.streams.threads = *stream_threads;
  options.streams.workers = *stream_workers;
  options.streams.workers_per_tenant = *workers_per_tenant;
  options.engine.graph_cache.max_graphs = absl::GetFlag(FLAGS_graph_cache_graphs);
  options.engine.graph_cache.max_bytes = absl::GetFlag(FLAGS_graph_cache_bytes);

  if (absl::GetFlag(FLAGS_queue_limit) < 1) {
    Refuse(file, "queue_limit", "must be at least 1");
    return 2;
  }
  if (absl::GetFlag(FLAGS_scheduler_quantum) < absl::Microseconds(1)) {
    Refuse(file, "scheduler_quantum", "must be at least 1us");
    return 2;
  }
  if (absl::GetFlag(FLAGS_batch_max_wait) <= absl::ZeroDuration()) {
    Refuse(file, "batch_max_wait", "must be positive");
    return 2;
  }
  options.engine.queue_limit = absl::GetFlag(FLAGS_queue_limit);
  options.engine.scheduler.quantum = absl::GetFlag(FLAGS_scheduler_quantum);
  options.engine.scheduler.batch_max_wait = absl::GetFlag(FLAGS_batch_max_wait);
  options.engine.scheduler.idle_batch_threads = absl::GetFlag(FLAGS_cpu_batch_idle);

  options.tenants_file = absl::GetFlag(FLAGS_tenants);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (options.tenants_file.empty()) {
    const std::string host = options.listen.substr(0, options.listen.rfind(':'));
    const bool loopback = host == "localhost" || host == "[::1]" || host.rfind("127.", 0) == 0;
    if (!loopback && !absl::GetFlag(FLAGS_allow_remote_without_tenants)) {
      Refuse(file, "listen",
             absl::StrCat(options.listen,
                          " is not loopback and there is no --tenants: every caller would be the unauthenticated "
                          "tenant default. Give --tenants, or --allow_remote_without_tenants to serve it anyway."));
      return 2;
    }
    spdlog::warn("no --tenants: every caller is the tenant default, without authentication");
  }
  // The effective config, once every value has passed its checks.
  if (absl::GetFlag(FLAGS_print_config)) return PrintConfig();

  auto daemon = replayd::Daemon::Start(options);
  if (!daemon.ok()) {
    spdlog::error("{}", daemon.status().ToString());
    return 1;
  }
  spdlog::info("compile cache {}", options.engine.cache_dir.string());
  // Its thread runs until the process ends, so it is never destroyed.
  auto* signal_thread = new SignalThread(signals, daemon->get());
  (*daemon)->AwaitDrain();
  // The drain waits for open sessions; one that never ends (a kernel that does not return)
  // must not keep the daemon up: past the drain's end and kStopMargin it exits without
  // waiting further.
  std::thread([limit = (*daemon)->drain_deadline() - absl::Now() + kStopMargin] {
    absl::SleepFor(limit);
    spdlog::error("the stop did not finish within {}: an operation still runs (a kernel that does not "
                  "return?); exiting without waiting for it",
                  absl::FormatDuration(limit));
    std::_Exit(1);
  }).detach();
  const size_t left = (*daemon)->Stop();
  signal_thread->Detach();
  daemon->reset();
  spdlog::info("stopped{}", left > 0 ? absl::StrCat(" (", left, " sessions closed at the drain's end)") : "");
  return 0;
}
