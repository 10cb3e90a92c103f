// replayd: serves the devices of this machine to remote clients over gRPC.
#include <signal.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "server/daemon.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "address to serve on, host:port");
ABSL_FLAG(std::string, devices, replayd::kKnownDeviceKinds,
          "comma-separated device kinds to serve; a kind without hardware serves no devices and says why");
ABSL_FLAG(std::string, cuda_context, "session",
          "CUDA contexts: session (one per session, faults isolated) or primary (the device's primary context, "
          "a stream per session)");
ABSL_FLAG(uint64_t, cuda_staging_bytes, 1 << 20,
          "bytes of each of a CUDA session's two pinned staging buffers for writes and reads");
ABSL_FLAG(std::string, hip_device_graph, "auto",
          "HIP device graphs: graph (a hipGraph per batch), stream (the batch's launches in order on the "
          "session's stream) or auto (stream on ROCm 5, graph from ROCm 6)");
ABSL_FLAG(uint64_t, hip_staging_bytes, 1 << 20,
          "bytes of each of a HIP session's two pinned staging buffers for writes and reads");
ABSL_FLAG(std::string, cache_dir, "", "compile cache directory (default $XDG_CACHE_HOME/replayd or ~/.cache/replayd)");
ABSL_FLAG(uint64_t, cache_max_bytes, uint64_t{1} << 30,
          "bytes of compiled artifacts the compile cache keeps; past it the least recently used are removed");
ABSL_FLAG(int, lease_seconds, 60, "a session not renewed within this many seconds is closed");
ABSL_FLAG(uint64_t, cpu_memory_limit, 0, "bytes of memory cpu:0 may allocate (0: half of RAM)");
ABSL_FLAG(std::string, cpu_cc, "cc", "C compiler for cpu-c programs");
ABSL_FLAG(int, cpu_compile_timeout_seconds, 30, "time limit of one cpu-c compile");
ABSL_FLAG(int, cpu_threads, 0, "parallel invocations on cpu:0 (0: one per core)");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error");
ABSL_FLAG(int, graph_batch, 32, "calls in a graph's first batch; each later batch doubles it");
ABSL_FLAG(int, graph_cache_graphs, 256, "graphs one tenant may keep cached per device");
ABSL_FLAG(uint64_t, graph_cache_bytes, uint64_t{1} << 30, "arena bytes one tenant may keep cached per device");
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
          "tenant and cpu device, so a faulting kernel ends only that process) or shared (the daemon's "
          "process; trusted tenants only, untrusted ones run in a process of their own)");
ABSL_FLAG(int, max_launch_seconds, 60,
          "unless the tenants file says: the longest one launch, replay or transfer may run in a tenant's "
          "process before the process is ended (1 to 604800)");
ABSL_FLAG(int, shutdown_grace_seconds, 5, "time calls in flight get to finish at shutdown");

// How long past the grace a stop may take (closing sessions, joining threads) before the
// daemon exits without waiting.
constexpr absl::Duration kStopMargin = absl::Seconds(5);

namespace {

std::filesystem::path DefaultCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::filesystem::path(xdg) / "replayd";
  if (const char* home = std::getenv("HOME"); home && *home) return std::filesystem::path(home) / ".cache" / "replayd";
  return "/var/cache/replayd";
}

// The value of `flag` when it is in [lo, hi]; otherwise says so in the log.
std::optional<int> IntFlagIn(const absl::Flag<int>& flag, int lo, int hi) {
  const int value = absl::GetFlag(flag);
  if (value >= lo && value <= hi) return value;
  spdlog::error("--{} must be in [{}, {}]", std::string(absl::GetFlagReflectionHandle(flag).Name()), lo, hi);
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("replayd [flags]: serve compute devices over gRPC");
  absl::ParseCommandLine(argc, argv);
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));

  // Block the shutdown signals in every thread; this one takes them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (absl::GetFlag(FLAGS_lease_seconds) <= 0) {
    spdlog::error("--lease_seconds must be positive");
    return 2;
  }
  replayd::DaemonOptions options;
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
  if ((isolation != "process" && isolation != "shared") || max_launch < 1 ||
      max_launch > static_cast<int>(replayd::kMaxLaunchSeconds)) {
    spdlog::error("--isolation must be process or shared, --max_launch_seconds in [1, {}]",
                  replayd::kMaxLaunchSeconds);
    return 2;
  }
  options.tenant_defaults.isolation =
      isolation == "shared" ? replayd::Isolation::kShared : replayd::Isolation::kProcess;
  options.tenant_defaults.max_launch = absl::Seconds(max_launch);
#ifdef REPLAYD_WITH_CUDA
  absl::StatusOr<replayd::CudaContextPolicy> cuda_context =
      replayd::ParseCudaContextPolicy(absl::GetFlag(FLAGS_cuda_context));
  if (!cuda_context.ok() || absl::GetFlag(FLAGS_cuda_staging_bytes) < 4096 ||
      absl::GetFlag(FLAGS_cuda_staging_bytes) > (uint64_t{1} << 30)) {
    spdlog::error("--cuda_context must be session or primary, --cuda_staging_bytes in [4096, 1 GiB]");
    return 2;
  }
  options.cuda.context = *cuda_context;
  options.cuda.staging_bytes = absl::GetFlag(FLAGS_cuda_staging_bytes);
#endif
#ifdef REPLAYD_WITH_HIP
  absl::StatusOr<replayd::HipDeviceGraph> hip_graph =
      replayd::ParseHipDeviceGraph(absl::GetFlag(FLAGS_hip_device_graph));
  if (!hip_graph.ok() || absl::GetFlag(FLAGS_hip_staging_bytes) < 4096 ||
      absl::GetFlag(FLAGS_hip_staging_bytes) > (uint64_t{1} << 30)) {
    spdlog::error("--hip_device_graph must be auto, graph or stream, --hip_staging_bytes in [4096, 1 GiB]");
    return 2;
  }
  options.hip.device_graph = *hip_graph;
  options.hip.staging_bytes = absl::GetFlag(FLAGS_hip_staging_bytes);
#endif
  if (absl::GetFlag(FLAGS_graph_batch) < 1 || absl::GetFlag(FLAGS_graph_cache_graphs) < 1) {
    spdlog::error("--graph_batch and --graph_cache_graphs must be at least 1");
    return 2;
  }
  options.engine.batch.first_limit = absl::GetFlag(FLAGS_graph_batch);
  const std::optional<int> stream_window = IntFlagIn(FLAGS_stream_window, 0, 65536),
                           stream_threads = IntFlagIn(FLAGS_stream_threads, 1, 256),
                           stream_workers = IntFlagIn(FLAGS_stream_workers, 1, 65536),
                           workers_per_tenant = IntFlagIn(FLAGS_stream_workers_per_tenant, 1, 65536);
  if (!stream_window || !stream_threads || !stream_workers || !workers_per_tenant) return 2;
  options.streams.window = *stream_window;
  options.streams.threads = *stream_threads;
  options.streams.workers = *stream_workers;
  options.streams.workers_per_tenant = *workers_per_tenant;
  options.engine.graph_cache.max_graphs = absl::GetFlag(FLAGS_graph_cache_graphs);
  options.engine.graph_cache.max_bytes = absl::GetFlag(FLAGS_graph_cache_bytes);

  if (absl::GetFlag(FLAGS_queue_limit) < 1 || absl::GetFlag(FLAGS_scheduler_quantum) < absl::Microseconds(1) ||
      absl::GetFlag(FLAGS_batch_max_wait) <= absl::ZeroDuration()) {
    spdlog::error(
        "--queue_limit must be at least 1, --scheduler_quantum at least 1us and "
        "--batch_max_wait positive");
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
      spdlog::error(
          "--listen {} is not loopback and there is no --tenants: every caller would be "
          "the unauthenticated tenant default. Give --tenants, or "
          "--allow_remote_without_tenants to serve it anyway.",
          options.listen);
      return 2;
    }
    spdlog::warn("no --tenants: every caller is the tenant default, without authentication");
  }

  auto daemon = replayd::Daemon::Start(options);
  if (!daemon.ok()) {
    spdlog::error("{}", daemon.status().ToString());
    return 1;
  }
  spdlog::info("compile cache {}", options.engine.cache_dir.string());
  int received = 0;
  for (;;) {
    sigwait(&signals, &received);
    if (received != SIGHUP) break;
    absl::Status reloaded = (*daemon)->ReloadTenants();
    if (reloaded.ok()) {
      spdlog::info("SIGHUP: tenants reloaded");
    } else {
      spdlog::error("SIGHUP: {}; the previous tenants stay in force", reloaded.ToString());
    }
  }
  spdlog::info("signal {}: shutting down", received);
  const absl::Duration grace = absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_seconds));
  // The orderly stop waits for calls in flight; one that never ends (a kernel that does
  // not return) must not keep the daemon up. A second SIGINT or SIGTERM exits at once, and
  // past the grace and kStopMargin the daemon exits without waiting further.
  std::thread([signals, limit = grace + kStopMargin] {
    const absl::Time deadline = absl::Now() + limit;
    for (;;) {
      const timespec left = absl::ToTimespec(std::max(deadline - absl::Now(), absl::ZeroDuration()));
      const int sig = sigtimedwait(&signals, nullptr, &left);
      if (sig == SIGINT || sig == SIGTERM) {
        spdlog::warn("signal {} again: exiting at once", sig);
        std::_Exit(0);
      }
      if (sig < 0 && errno == EAGAIN) {
        spdlog::error("the stop did not finish within {}: an operation still runs (a kernel that does not "
                      "return?); exiting without waiting for it",
                      absl::FormatDuration(limit));
        std::_Exit(1);
      }
      // SIGHUP, or an interrupted wait: wait on for the rest of the time.
    }
  }).detach();
  (*daemon)->Shutdown(grace);
  daemon->reset();
  spdlog::info("stopped");
  return 0;
}
