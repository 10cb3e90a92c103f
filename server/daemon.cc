#include "server/daemon.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <grpcpp/ext/proto_server_reflection_plugin.h>

#include "absl/strings/str_cat.h"
#include "drivers/executor/executor_driver.h"
#include "server/request_parsing.h"
#include "spdlog/spdlog.h"

namespace replayd {

namespace {

// How long calls still running when the drain ends may go on before they are cancelled.
constexpr absl::Duration kLastCallsGrace = absl::Seconds(1);

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const DaemonOptions& options) {
  if (options.tls_cert.empty() != options.tls_key.empty())
    return absl::InvalidArgumentError("TLS needs both a certificate and a key");
  if (options.tls_cert.empty()) {
    if (!options.tls_client_ca.empty())
      return absl::InvalidArgumentError("a client CA needs a server certificate and key");
    return grpc::InsecureServerCredentials();
  }
  absl::StatusOr<std::string> cert = ReadFile(options.tls_cert), key = ReadFile(options.tls_key);
  if (!cert.ok()) return cert.status();
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!options.tls_client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(options.tls_client_ca);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

// What a GPU executor keeps of the daemon's environment: where the vendor's runtime is,
// and which devices are visible in which order and as which target (so that cuda:N and
// hip:N are the same device in both processes; HSA_XNACK sets the XNACK mode, which is
// part of a HIP device's target, so code compiled for the daemon's loads in the executor),
// and the MPS server the daemon's CUDA work would be a client of, with the same limits.
constexpr const char* kGpuEnvironment[] = {"LD_LIBRARY_PATH",
                                           "CUDA_VISIBLE_DEVICES",
                                           "CUDA_DEVICE_ORDER",
                                           "CUDA_CACHE_PATH",
                                           "CUDA_CACHE_DISABLE",
                                           "CUDA_MPS_PIPE_DIRECTORY",
                                           "CUDA_MPS_LOG_DIRECTORY",
                                           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                                           "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                                           "ROCM_PATH",
                                           "HIP_PATH",
                                           "HIP_VISIBLE_DEVICES",
                                           "ROCR_VISIBLE_DEVICES",
                                           "GPU_DEVICE_ORDINAL",
                                           "HSA_OVERRIDE_GFX_VERSION",
                                           "HSA_XNACK"};

// The arguments and own memory of an executor for the GPU device `device`.
void DescribeGpuExecutor(const Device& device, const DaemonOptions& options, executor::ExecutorOptions& executor) {
  const std::string& id = device.info().id;  // cuda:N or hip:N, N the driver's ordinal
  const std::string ordinal = absl::StrCat("--ordinal=", id.substr(id.find(':') + 1));
#ifdef REPLAYD_WITH_CUDA
  if (device.info().kind == DeviceKind::kCuda) {
    executor.device_args = {"--device=cuda", ordinal, absl::StrCat("--staging_bytes=", options.cuda.staging_bytes)};
    executor.own_bytes = options.cuda_executor_bytes;
  }
#endif
#ifdef REPLAYD_WITH_HIP
  if (device.info().kind == DeviceKind::kHip) {
    executor.device_args = {"--device=hip", ordinal, absl::StrCat("--staging_bytes=", options.hip.staging_bytes),
                            absl::StrCat("--device_graph=", HipDeviceGraphName(options.hip.device_graph)),
                            absl::StrCat("--graph_kernarg_bytes=", options.hip.graph_kernarg_bytes)};
    executor.own_bytes = options.hip_executor_bytes;
  }
#endif
  (void)options, (void)ordinal;  // a build without a GPU driver has none to describe
  for (const char* name : kGpuEnvironment)
    if (const char* value = std::getenv(name)) executor.environment.push_back(absl::StrCat(name, "=", value));
}

// A device served through executors: a tenant's contexts run in a process of the tenant's
// own, or in the daemon's process when its policy is Isolation::kShared; both kinds of
// context draw on the device's one memory account.
absl::StatusOr<std::unique_ptr<Device>> WithExecutors(std::unique_ptr<Device> device, const DaemonOptions& options) {
  const DeviceKind kind = device->info().kind;
  executor::ExecutorOptions executor;
  executor.binary = options.executor_binary;
  if (executor.binary.empty()) {
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot find this program's directory: ", ec.message()));
    executor.binary = self.parent_path() / "replayd-executor";
  }
  if (access(executor.binary.c_str(), X_OK) != 0)
    return absl::FailedPreconditionError(absl::StrCat("executor program ", executor.binary.string(),
                                                      " cannot be run: ", std::strerror(errno)));
  if (kind == DeviceKind::kCpu) {
    const std::filesystem::path& cage = options.cpu.compiler.cage;
    if (!cage.empty() && access(cage.c_str(), X_OK) != 0)
      return absl::FailedPreconditionError(
          absl::StrCat("compiler cage ", cage.string(), " cannot be run: ", std::strerror(errno)));
    // The executor reads artifacts from the compile cache and its scratch directory, and
    // no other file of its own.
    std::error_code ec;
    const std::filesystem::path artifacts = std::filesystem::weakly_canonical(options.engine.cache_dir, ec);
    executor.device_args = {"--device=cpu",
                            absl::StrCat("--artifacts=", (ec ? options.engine.cache_dir : artifacts).string()),
                            absl::StrCat("--artifacts=", options.engine.compile_cache.scratch_dir.string()),
                            absl::StrCat("--memory_limit=", device->info().total_memory),
                            absl::StrCat("--threads=", options.cpu.threads)};
    // Buffers of 64 KiB and more (the size from which the CPU device maps rather than
    // takes from the heap) live in memory the daemon maps too, so their transfers are one
    // copy; smaller ones cross the channel, where a few KiB cost no more.
    executor.shared_buffers_from = 64 << 10;
    // Its address space: what its tenant may hold here, and 4 GiB for the program, its
    // threads' stacks and the artifacts it loads.
    executor.address_space_margin = uint64_t{4} << 30;
  } else {
    DescribeGpuExecutor(*device, options, executor);
  }
  executor.command_timeout = options.tenant_defaults.max_launch;
  executor.linger = options.executor_linger;
  spdlog::info("{}: tenants run in executors ({}) unless their isolation is shared; default isolation {}",
               device->info().id, executor.binary.string(), std::string(IsolationName(options.tenant_defaults.isolation)));
  return std::unique_ptr<Device>(std::make_unique<executor::ExecutorDevice>(std::move(device), executor));
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Device>>> DiscoverDevices(const std::string& kind,
                                                                     const DaemonOptions& options) {
  if (kind == "cpu") return CpuDriver(options.cpu).Discover();
#ifdef REPLAYD_WITH_CUDA
  if (kind == "cuda") {
    CudaDriver driver(options.cuda);
    std::vector<std::unique_ptr<Device>> devices = driver.Discover();
    if (devices.empty()) spdlog::warn("cuda: no devices: {}", driver.unavailable());
    if (!driver.cuda_c_unavailable().empty())
      spdlog::warn("cuda: cuda-c is not served: {}", driver.cuda_c_unavailable());
    return devices;
  }
#endif
#ifdef REPLAYD_WITH_HIP
  if (kind == "hip") {
    HipDriver driver(options.hip);
    std::vector<std::unique_ptr<Device>> devices = driver.Discover();
    if (devices.empty()) spdlog::warn("hip: no devices: {}", driver.unavailable());
    return devices;
  }
#endif
  return absl::InvalidArgumentError(
      absl::StrCat("device kind \"", kind, "\" is not supported by this build (known: ", kKnownDeviceKinds, ")"));
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  absl::StatusOr<std::unique_ptr<ScratchDirectory>> scratch = ScratchDirectory::Make("replayd-compile");
  if (!scratch.ok()) return scratch.status();
  options.engine.compile_cache.scratch_dir = (*scratch)->path();
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<const executor::ExecutorDevice*> executors;  // for the metrics
  for (const std::string& kind : options.devices) {
    absl::StatusOr<std::vector<std::unique_ptr<Device>>> found = DiscoverDevices(kind, options);
    if (!found.ok()) return found.status();
    for (auto& d : *found) {
      spdlog::info("device {}: {} ({} bytes, {})", d->info().id, d->info().name, d->info().total_memory,
                   d->info().driver_version);
      const Device* bare = d.get();
      absl::StatusOr<std::unique_ptr<Device>> served = WithExecutors(std::move(d), options);
      if (!served.ok()) return served.status();
      if (served->get() != bare) executors.push_back(static_cast<const executor::ExecutorDevice*>(served->get()));
      devices.push_back(*std::move(served));
    }
  }
  std::unique_ptr<Daemon> daemon(new Daemon());
  daemon->scratch_ = std::move(*scratch);
  if (options.tenants_file.empty()) {
    daemon->auth_ = std::make_unique<Authenticator>(options.tenant_defaults);
  } else {
    absl::StatusOr<std::unique_ptr<Authenticator>> auth =
        Authenticator::FromFile(options.tenants_file, options.tenant_defaults);
    if (!auth.ok()) return auth.status();
    daemon->auth_ = std::move(*auth);
    spdlog::info("tenants: {} from {}", daemon->auth_->tenant_count(), options.tenants_file.string());
  }
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options.engine, std::move(devices));
  if (!engine.ok()) return engine.status();
  daemon->engine_ = std::move(*engine);
  daemon->engine_->ConfigureTenants(daemon->auth_->configs());
  daemon->health_ = std::make_unique<Health>(options.drain, daemon->engine_->ListDevices().size());
  daemon->metrics_ = std::make_unique<DaemonMetrics>(*daemon->engine_, std::move(executors));
  daemon->service_ = std::make_unique<ReplaydService>(daemon->engine_.get(), daemon->auth_.get(),
                                                      daemon->health_.get(), daemon->metrics_.get());
  daemon->admin_ = std::make_unique<AdminService>(daemon->engine_.get(), daemon->auth_.get(), daemon->health_.get());

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = ServerCredentials(options);
  if (!credentials.ok()) return credentials.status();
  // grpc.health.v1 (gRPC's own service, fed by Health) and server reflection, for probes
  // and grpcurl. Both are process-wide settings of gRPC that take effect at BuildAndStart.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, *credentials, &port);
  builder.RegisterService(daemon->service_.get());
  builder.RegisterService(daemon->admin_.get());
  // Program code may be up to 16 MiB; transfers use chunks of at most 1 MiB.
  builder.SetMaxReceiveMessageSize(20 << 20);
  builder.SetMaxSendMessageSize(20 << 20);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(ParseErrorAnswers());  // first: the others see the status it sends
  interceptors.push_back(daemon->metrics_->RequestCounter(*daemon->auth_));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  daemon->streams_ = std::make_unique<SessionStreamServer>(*daemon->engine_, *daemon->auth_, *daemon->service_,
                                                           *daemon->metrics_, options.streams, builder);
  daemon->server_ = builder.BuildAndStart();
  if (!daemon->server_ || port == 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  daemon->streams_->Start();
  daemon->health_->Attach(daemon->server_->GetHealthCheckService());
  std::string host = options.listen.substr(0, options.listen.rfind(':'));
  daemon->address_ = absl::StrCat(host, ":", port);
  spdlog::info("listening on {}", daemon->address_);
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> metrics =
        MetricsServer::Start(options.metrics_listen, [m = daemon->metrics_.get()] { return m->Text(); });
    if (!metrics.ok()) return metrics.status();
    daemon->metrics_server_ = std::move(*metrics);
  }
  return daemon;
}

absl::Status Daemon::ReloadTenants() {
  if (absl::Status s = auth_->Reload(); !s.ok()) return s;
  engine_->ConfigureTenants(auth_->configs());
  return absl::OkStatus();
}

size_t Daemon::Stop() {
  if (Drain()) spdlog::info("draining: {} sessions open", engine_->session_count());
  const absl::Time deadline = drain_deadline();
  // Sessions close at their clients' pace; a stop is rare enough to look now and then.
  size_t open = engine_->session_count();
  while (open > 0 && absl::Now() < deadline) {
    absl::SleepFor(std::min(absl::Milliseconds(50), deadline - absl::Now()));
    open = engine_->session_count();
  }
  if (open > 0) {
    spdlog::warn("the drain's time is up with {} sessions open: closing them", open);
  } else {
    spdlog::info("drained: every session has closed");
  }
  // With every session closed, what still runs belongs to none: an admin's or a probe's
  // call, or a health Watch, which never ends by itself.
  Shutdown(std::min(deadline, absl::Now() + kLastCallsGrace));
  return open;
}

void Daemon::Shutdown(absl::Time deadline) {
  if (health_) health_->Shutdown();
  if (server_) server_->Shutdown(absl::ToChronoTime(deadline));
  if (streams_) streams_->Stop();
}

Daemon::~Daemon() {
  Shutdown(absl::Now());
  if (server_) server_->Wait();
}

}  // namespace replayd
