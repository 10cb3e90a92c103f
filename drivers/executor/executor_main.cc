// replayd-executor: hosts one real device for one tenant, serving the daemon's commands on
// the shared-memory control channel it inherits as descriptor 3; each context's channel
// comes over the unix socket it inherits as descriptor 4. Started only by the daemon
// (drivers/executor/executor_driver.cc), with no other descriptors, a process group of
// its own and an empty environment (a GPU executor keeps the few variables that say where
// the vendor's driver is and which devices are visible). Before it makes its device it
// confines itself (drivers/executor/sandbox.h): a cpu executor reads artifacts from
// --artifacts only and its address space is bounded by --address_space (the memory its
// tenant may hold on the device, a margin and room for each context; the daemon moves it,
// within the hard limit the executor inherits, as the tenant's quota and contexts
// change); a cuda or hip executor gets the no-new-privileges and limit steps. It ends
// when the daemon does.
//
//   replayd-executor --fd=3 --socket=4 --device=cpu --artifacts=DIR [--memory_limit=BYTES]
//                    [--threads=N] [--address_space=BYTES]
//   replayd-executor --fd=3 --socket=4 --device=cuda --ordinal=N [--staging_bytes=BYTES]
//   replayd-executor --fd=3 --socket=4 --device=hip --ordinal=N [--staging_bytes=BYTES]
//                    [--device_graph=auto|graph|stream] [--graph_kernarg_bytes=BYTES]
//
// A cuda executor serves every context in the device's primary context, a stream each:
// one CUDA context per tenant, whose fault ends only this process. A hip executor serves
// every context on the device's runtime state in this process, a stream each, so a kernel
// fault (which loses that state for every stream, or aborts the process) ends only it.
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "drivers/cpu/cpu_driver.h"
#ifdef REPLAYD_WITH_CUDA
#include "drivers/cuda/cuda_driver.h"
#endif
#include "drivers/executor/channel.h"
#include "drivers/executor/executor_server.h"
#include "drivers/executor/sandbox.h"
#ifdef REPLAYD_WITH_HIP
#include "drivers/hip/hip_driver.h"
#endif

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "replayd-executor: %s\n", message.c_str());
  return 2;
}

// Answers every command on `control` with `why` until the daemon (`parent`) is gone: an
// executor that cannot make its device tells the daemon why (the OpenSession that
// started it answers with the cause) rather than only exiting.
int Refuse(replayd::executor::Channel& control, pid_t parent, const absl::Status& why) {
  std::fprintf(stderr, "replayd-executor: %s\n", std::string(why.message()).c_str());
  replayd::executor::Serve(
      control,
      [&](const replayd::executor::Request&, bool&) {
        replayd::executor::Reply reply;
        reply.set_code(static_cast<int>(why.code()));
        reply.set_message(std::string(why.message()));
        return reply;
      },
      [parent] { return getppid() != parent; });
  return 2;
}

// The GPU device `id` that `driver` discovers; UNAVAILABLE saying why it has none.
template <typename GpuDriver>
absl::StatusOr<std::unique_ptr<replayd::Device>> Find(GpuDriver& driver, const std::string& id) {
  for (auto& d : driver.Discover())
    if (d->info().id == id) return std::move(d);
  return absl::UnavailableError(absl::StrCat("executor: ", id, " not found", driver.unavailable().empty() ? "" : ": ",
                                             driver.unavailable()));
}

// The cuda or hip device `ordinal`, made as the daemon asked (0 staging bytes or graph
// kernarg bytes: the driver's default). The daemon compiles its programs: the executor
// loads artifacts only.
absl::StatusOr<std::unique_ptr<replayd::Device>> MakeGpuDevice(const std::string& kind, int ordinal,
                                                               uint64_t staging_bytes, const std::string& device_graph,
                                                               uint64_t graph_kernarg_bytes) {
  const std::string id = absl::StrCat(kind, ":", ordinal);
  if (kind == "cuda") {
#ifdef REPLAYD_WITH_CUDA
    replayd::CudaDriverOptions options;
    options.context = replayd::CudaContextPolicy::kPrimary;
    options.compile = false;
    if (staging_bytes > 0) options.staging_bytes = staging_bytes;
    replayd::CudaDriver driver(options);
    return Find(driver, id);
#else
    return absl::UnavailableError("executor: this build has no cuda driver");
#endif
  }
#ifdef REPLAYD_WITH_HIP
  replayd::HipDriverOptions options;
  absl::StatusOr<replayd::HipDeviceGraph> graph = replayd::ParseHipDeviceGraph(device_graph);
  if (!graph.ok()) return graph.status();
  options.device_graph = *graph;
  if (staging_bytes > 0) options.staging_bytes = staging_bytes;
  if (graph_kernarg_bytes > 0) options.graph_kernarg_bytes = graph_kernarg_bytes;
  replayd::HipDriver driver(options);
  return Find(driver, id);
#else
  (void)device_graph, (void)graph_kernarg_bytes;
  return absl::UnavailableError("executor: this build has no hip driver");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  // As the daemon does (server/main.cc): no lock-order graph at every Mutex lock.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const pid_t parent = getppid();
  int fd = -1, socket = -1;
  std::string device;
  replayd::CpuDriverOptions cpu;
  int ordinal = -1;
  uint64_t staging_bytes = 0;
  std::string device_graph = "auto";
  uint64_t graph_kernarg_bytes = 0;
  replayd::executor::SandboxOptions sandbox;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      return absl::StartsWith(arg, name) ? arg.c_str() + std::strlen(name) : nullptr;
    };
    bool ok = true;
    if (const char* v = value("--fd=")) {
      ok = absl::SimpleAtoi(v, &fd);
    } else if (const char* v = value("--socket=")) {
      ok = absl::SimpleAtoi(v, &socket);
    } else if (const char* v = value("--device=")) {
      device = v;
    } else if (const char* v = value("--artifacts=")) {
      sandbox.readable.emplace_back(v);
    } else if (const char* v = value("--memory_limit=")) {
      ok = absl::SimpleAtoi(v, &cpu.memory_limit);
    } else if (const char* v = value("--address_space=")) {
      ok = absl::SimpleAtoi(v, &sandbox.address_space);
    } else if (const char* v = value("--threads=")) {
      ok = absl::SimpleAtoi(v, &cpu.threads);
    } else if (const char* v = value("--ordinal=")) {
      ok = absl::SimpleAtoi(v, &ordinal) && ordinal >= 0;
    } else if (const char* v = value("--staging_bytes=")) {
      ok = absl::SimpleAtoi(v, &staging_bytes) && staging_bytes > 0;
    } else if (const char* v = value("--device_graph=")) {
      device_graph = v;
    } else if (const char* v = value("--graph_kernarg_bytes=")) {
      ok = absl::SimpleAtoi(v, &graph_kernarg_bytes) && graph_kernarg_bytes > 0;
    } else {
      ok = false;
    }
    if (!ok) return Fail("unknown or malformed argument " + arg);
  }
  const bool gpu = device == "cuda" || device == "hip";
  if (fd < 0 || socket < 0 || (device != "cpu" && !gpu) || (gpu && ordinal < 0))
    return Fail("usage: replayd-executor --fd=N --socket=N --device=cpu [--memory_limit=B] [--threads=N] "
                "[--address_space=B] | "
                "--device=cuda --ordinal=N [--staging_bytes=B] | --device=hip --ordinal=N [--staging_bytes=B] "
                "[--device_graph=auto|graph|stream] [--graph_kernarg_bytes=B]");

  absl::StatusOr<replayd::executor::Channel> channel = replayd::executor::Channel::Attach(fd);
  if (!channel.ok()) return Fail(std::string(channel.status().message()));
  // Batch scheduling, for this thread and the threads it starts: an executor woken by a
  // command does not preempt the daemon that posted it. On a core the two share, the
  // daemon posts what it has (up to the channel's slots) and the executor runs them in one
  // turn once the daemon waits for a reply or for its clients; a daemon waiting for a
  // reply gives the core up at once, so a round trip does not wait longer.
  const struct sched_param batch = {};
  if (sched_setscheduler(0, SCHED_BATCH, &batch) != 0)
    std::fprintf(stderr, "replayd-executor: no batch scheduling: %s\n", std::strerror(errno));
  // The hard limit stays as inherited, so that the daemon may move the limit within it.
  if (sandbox.address_space > 0) {
    struct rlimit inherited;
    if (getrlimit(RLIMIT_AS, &inherited) != 0) return Fail(std::string("RLIMIT_AS: ") + std::strerror(errno));
    sandbox.max_address_space = inherited.rlim_max;
    sandbox.address_space = std::min<uint64_t>(sandbox.address_space, inherited.rlim_max);
  }
  sandbox.host_kernels = !gpu;
  absl::StatusOr<replayd::executor::SandboxReport> confined = replayd::executor::Confine(sandbox);
  if (!confined.ok()) return Fail(std::string(confined.status().message()));
  if (!gpu && !confined->landlock)
    std::fprintf(stderr, "replayd-executor: no Landlock: file access is not confined\n");

  std::unique_ptr<replayd::Device> served;
  if (gpu) {
    absl::StatusOr<std::unique_ptr<replayd::Device>> made =
        MakeGpuDevice(device, ordinal, staging_bytes, device_graph, graph_kernarg_bytes);
    if (!made.ok()) return Refuse(*channel, parent, made.status());
    served = *std::move(made);
  } else {
    // The executor compiles nothing: no compiler is run to describe the device.
    cpu.compiler.compiler = "";
    std::vector<std::unique_ptr<replayd::Device>> devices = replayd::CpuDriver(cpu).Discover();
    if (devices.empty()) return Fail("no device");
    served = std::move(devices.front());
  }
  replayd::executor::ExecutorServer server(*channel, socket, *served);
  return server.Run(parent);
}
