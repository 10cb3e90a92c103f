#include "server/daemon_metrics.h"

#include <algorithm>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/message.h"
#include "server/request_parsing.h"
#include "server/session_stream.h"

namespace replayd {

namespace {

// The metrics' labels: every series of an operation is one tenant's on one device.
const std::vector<std::string> kDeviceTenant = {"device", "tenant"};

std::vector<std::string> DeviceTenantAnd(std::string label) {
  std::vector<std::string> labels = kDeviceTenant;
  labels.push_back(std::move(label));
  return labels;
}

// "/replayd.v1.Replayd/ReplayGraph" -> "Replayd/ReplayGraph": the service without its
// package, and the method.
absl::string_view ShortMethod(absl::string_view method) {
  const size_t slash = method.rfind('/');
  if (slash == absl::string_view::npos || slash == 0) return method;
  const size_t dot = method.rfind('.', slash);
  const size_t start = dot == absl::string_view::npos ? (method[0] == '/' ? 1 : 0) : dot + 1;
  return method.substr(start);
}

const char* CodeName(absl::StatusCode code) {
  // absl::StatusCodeToString's names are gRPC's: OK, CANCELLED, INVALID_ARGUMENT, ...
  static const std::array<std::string, 17> names = [] {
    std::array<std::string, 17> n;
    for (int i = 0; i < 17; ++i) n[i] = absl::StatusCodeToString(static_cast<absl::StatusCode>(i));
    return n;
  }();
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? names[i].c_str() : "UNKNOWN";
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// Counts one call at its status, with the tenant of its token and the device it is for:
// the device an OpenSession names, or the device of the session a request names (read
// from the call's first request; replayd.v1.Replayd's messages are all protobuf).
class RequestInterceptor final : public grpc::experimental::Interceptor {
 public:
  RequestInterceptor(grpc::experimental::ServerRpcInfo* info, DaemonMetrics& metrics, const Authenticator& auth)
      : info_(info), metrics_(metrics), auth_(auth) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) && !received_) {
      received_ = true;
      const void* message = methods->GetRecvMessage();
      // A method served on the completion queue receives a ReceivedRequest, which holds
      // the message if it parsed.
      if (message != nullptr && ServedOnQueue(info_->method())) {
        const auto* received = static_cast<const ReceivedRequest*>(message);
        message = received->parsed ? received->message : nullptr;
      }
      if (message != nullptr && absl::StartsWith(info_->method(), kReplaydMethods))
        device_ = DeviceOf(*static_cast<const google::protobuf::Message*>(message));
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS))
      metrics_.CountRequest(info_->method(), methods->GetSendStatus().error_code(), TenantName(), device_);
    methods->Proceed();
  }

 private:
  static constexpr absl::string_view kReplaydMethods = "/replayd.v1.Replayd/";

  // The caller's tenant, "" when its token does not authenticate.
  const std::string& TenantName() {
    if (!tenant_) {
      const auto& metadata = info_->server_context()->client_metadata();
      auto it = metadata.find("authorization");
      absl::string_view header;
      if (it != metadata.end()) header = absl::string_view(it->second.data(), it->second.size());
      absl::StatusOr<std::shared_ptr<const Tenant>> tenant = auth_.Authenticate(header);
      tenant_ = tenant.ok() ? (*tenant)->name : "";
    }
    return *tenant_;
  }

  // The device `request` is for: its `device` field if the daemon serves such a device
  // (so a client cannot make up label values), else its `session` field's device.
  std::string DeviceOf(const google::protobuf::Message& request) {
    const google::protobuf::Descriptor& type = *request.GetDescriptor();
    const google::protobuf::Reflection& fields = *request.GetReflection();
    using Field = google::protobuf::FieldDescriptor;
    if (const Field* device = type.FindFieldByName("device"); device != nullptr && device->type() == Field::TYPE_STRING)
      return metrics_.KnownDevice(fields.GetString(request, device));
    if (const Field* session = type.FindFieldByName("session");
        session != nullptr && session->cpp_type() == Field::CPPTYPE_UINT64 && !session->is_repeated())
      return metrics_.DeviceOfSession(TenantName(), fields.GetUInt64(request, session));
    return "";
  }

  grpc::experimental::ServerRpcInfo* const info_;
  DaemonMetrics& metrics_;
  const Authenticator& auth_;
  bool received_ = false;
  std::optional<std::string> tenant_;
  std::string device_;
};

class RequestInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  RequestInterceptorFactory(DaemonMetrics& metrics, const Authenticator& auth) : metrics_(metrics), auth_(auth) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new RequestInterceptor(info, metrics_, auth_);
  }

 private:
  DaemonMetrics& metrics_;
  const Authenticator& auth_;
};

}  // namespace

const char* StreamOpName(StreamOp op) {
  static constexpr std::array<const char*, kStreamOpCount> kNames = {
      "launch", "copy", "replay", "write", "read", "synchronize", "keep_alive", "replay_sequence", "none"};
  const size_t i = static_cast<size_t>(op);
  return i < kNames.size() ? kNames[i] : "none";
}

OperationMetrics::OperationMetrics(DaemonMetrics& m, std::string device, std::string tenant)
    : metrics_(m),
      device_(std::move(device)),
      tenant_(std::move(tenant)),
      replays_(m.replays_.With({device_, tenant_})),
      launches_(m.launches_.With({device_, tenant_})),
      compile_hits_(m.compile_hits_.With({device_, tenant_})),
      compiles_(m.compiles_.With({device_, tenant_})),
      compile_seconds_(m.compile_seconds_.With({device_, tenant_})),
      replay_seconds_(m.replay_seconds_.With({device_, tenant_})),
      launch_seconds_(m.launch_seconds_.With({device_, tenant_})) {}

void OperationMetrics::Replayed(double seconds) {
  replays_.Add();
  replay_seconds_.Observe(seconds);
}

void OperationMetrics::ReplayedSequence(uint64_t replays) { replays_.Add(static_cast<double>(replays)); }

void OperationMetrics::Launched(double seconds) {
  launches_.Add();
  launch_seconds_.Observe(seconds);
}

void OperationMetrics::Loaded(bool cache_hit, double compile_seconds) {
  if (cache_hit) {
    compile_hits_.Add();
  } else {
    compiles_.Add();
    compile_seconds_.Add(compile_seconds);
  }
}

void OperationMetrics::StreamOperation(StreamOp op, absl::StatusCode code, double seconds) {
  const size_t o = std::min(static_cast<size_t>(op), kStreamOpCount - 1);
  const size_t c = std::min(static_cast<size_t>(code), kStatusCodes - 1);
  Histogram* h = stream_seconds_[o].load(std::memory_order_acquire);
  if (!h) {
    // Two threads may both look it up: the family gives both the same series.
    h = &metrics_.stream_seconds_.With({device_, tenant_, StreamOpName(op)});
    stream_seconds_[o].store(h, std::memory_order_release);
  }
  Counter* n = stream_ops_[o][c].load(std::memory_order_acquire);
  if (!n) {
    n = &metrics_.stream_ops_.With({device_, tenant_, StreamOpName(op), CodeName(code)});
    stream_ops_[o][c].store(n, std::memory_order_release);
  }
  h->Observe(seconds);
  n->Add();
}

DaemonMetrics::DaemonMetrics(const Engine& engine, std::vector<const executor::ExecutorDevice*> executors)
    : engine_(engine),
      executors_(std::move(executors)),
      requests_(registry_.AddCounter("replayd_requests_total",
                                     "gRPC calls answered, by method (service/method) and status code, with the "
                                     "device of the session they name (empty for none)",
                                     {"method", "code", "device", "tenant"})),
      replays_(registry_.AddCounter("replayd_replays_total",
                                    "graph replays completed (each replay of a sequence counts)", kDeviceTenant)),
      launches_(registry_.AddCounter("replayd_launches_total", "eager launches completed", kDeviceTenant)),
      replay_seconds_(registry_.AddHistogram("replayd_replay_duration_seconds",
                                             "time of a completed ReplayGraph (unary or on a stream) in the daemon, "
                                             "from the session's call to its end, queueing included",
                                             kDeviceTenant, LatencyBuckets())),
      launch_seconds_(registry_.AddHistogram("replayd_launch_duration_seconds",
                                             "time of a completed eager Launch in the daemon, queueing included",
                                             kDeviceTenant, LatencyBuckets())),
      stream_ops_(registry_.AddCounter("replayd_stream_operations_total",
                                       "Session stream operations answered, by operation and status code",
                                       {"device", "tenant", "op", "code"})),
      stream_seconds_(registry_.AddHistogram("replayd_stream_operation_duration_seconds",
                                             "time of a Session stream operation in the daemon, from the start of "
                                             "its run to its answer",
                                             DeviceTenantAnd("op"), LatencyBuckets())),
      compile_hits_(registry_.AddCounter("replayd_compile_cache_hits_total",
                                         "programs loaded from the compile cache without compiling", kDeviceTenant)),
      compiles_(registry_.AddCounter("replayd_compiles_total", "programs compiled (compile cache misses)",
                                     kDeviceTenant)),
      compile_seconds_(registry_.AddCounter("replayd_compile_seconds_total", "time spent compiling programs",
                                            kDeviceTenant)),
      memory_total_(registry_.AddGauge("replayd_device_memory_total_bytes", "device memory the daemon may use",
                                       {"device"})),
      memory_used_(registry_.AddGauge("replayd_device_memory_used_bytes",
                                      "device memory in use: buffers, graph arenas, executors' allocations",
                                      {"device"})),
      memory_free_(registry_.AddGauge("replayd_device_memory_free_bytes", "device memory free", {"device"})),
      tenant_memory_(registry_.AddGauge("replayd_session_memory_bytes",
                                        "bytes of buffers held by a tenant's open sessions on a device",
                                        kDeviceTenant)),
      sessions_(registry_.AddGauge("replayd_open_sessions", "sessions open", kDeviceTenant)),
      device_seconds_(registry_.AddCounter("replayd_device_seconds_total",
                                           "device time granted by the scheduler (turns held)", kDeviceTenant)),
      queue_depth_(registry_.AddGauge("replayd_scheduler_queue_depth", "work items waiting for the device now",
                                      {"device"})),
      waits_(registry_.AddCounter("replayd_scheduler_waits_total",
                                  "work items that waited for the device behind others", kDeviceTenant)),
      wait_seconds_(registry_.AddCounter("replayd_scheduler_wait_seconds_total",
                                         "time work items waited for the device", kDeviceTenant)),
      rejected_(registry_.AddCounter("replayd_scheduler_rejected_total",
                                     "work items refused because the tenant's queue was full", kDeviceTenant)),
      graph_hits_(registry_.AddCounter("replayd_graph_cache_hits_total",
                                       "captures and definitions answered by a cached graph", kDeviceTenant)),
      graph_misses_(registry_.AddCounter("replayd_graph_cache_misses_total",
                                         "captures and definitions not found in the graph cache", kDeviceTenant)),
      graph_instantiations_(registry_.AddCounter("replayd_graph_cache_instantiations_total",
                                                 "graphs instantiated into the graph cache", kDeviceTenant)),
      graph_evictions_(registry_.AddCounter("replayd_graph_cache_evictions_total",
                                            "graphs evicted from the graph cache", kDeviceTenant)),
      graphs_cached_(registry_.AddGauge("replayd_graph_cache_graphs", "graphs cached now", kDeviceTenant)),
      graph_bytes_(registry_.AddGauge("replayd_graph_cache_bytes", "arena bytes of the graphs cached now",
                                      kDeviceTenant)),
      artifacts_(registry_.AddGauge("replayd_compile_cache_artifacts", "compiled artifacts in the compile cache")),
      artifact_bytes_(registry_.AddGauge("replayd_compile_cache_bytes", "bytes of the compile cache's artifacts")),
      artifact_evictions_(registry_.AddCounter("replayd_compile_cache_evictions_total",
                                               "artifacts removed from the compile cache past its bound")),
      executors_started_(registry_.AddCounter("replayd_executors_started_total",
                                              "executor processes started (isolation: process)", kDeviceTenant)),
      executors_died_(registry_.AddCounter(
          "replayd_executors_died_total",
          "executor processes that ended before their tenant's last session closed, by cause: signal (a crash or "
          "a kill), exit, timeout (a command past its time limit), failure (of its channel) or device_lost (a CUDA "
          "sticky error)",
          DeviceTenantAnd("cause"))),
      shared_buffers_(registry_.AddGauge("replayd_executor_shared_buffers",
                                         "CPU buffers mapped in the daemon and in their executor now (shared "
                                         "buffers, of 64 KiB or more); past the device's budget, buffers are "
                                         "executors' own",
                                         {"device"})) {
  for (const DeviceStatus& d : engine_.ListDevices()) device_ids_.push_back(d.info->id);
  registry_.AddCollector([this] { Collect(); });
}

OperationMetrics& DaemonMetrics::For(absl::string_view device, absl::string_view tenant) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<OperationMetrics>& m = operations_[std::make_pair(std::string(device), std::string(tenant))];
  if (!m) m.reset(new OperationMetrics(*this, std::string(device), std::string(tenant)));
  return *m;
}

void DaemonMetrics::CountRequest(absl::string_view method, grpc::StatusCode code, absl::string_view tenant,
                                 absl::string_view device) {
  requests_.With({ShortMethod(method), CodeName(static_cast<absl::StatusCode>(code)), device, tenant}).Add();
}

std::string DaemonMetrics::KnownDevice(absl::string_view id) const {
  return std::find(device_ids_.begin(), device_ids_.end(), id) != device_ids_.end() ? std::string(id) : "";
}

std::string DaemonMetrics::DeviceOfSession(absl::string_view tenant, uint64_t session) const {
  return engine_.DeviceOfSession(tenant, session);
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> DaemonMetrics::RequestCounter(
    const Authenticator& auth) {
  return std::make_unique<RequestInterceptorFactory>(*this, auth);
}

void DaemonMetrics::Collect() {
  for (const DeviceStatus& d : engine_.ListDevices()) {
    const std::string& id = d.info->id;
    memory_total_.With({id}).Set(static_cast<double>(d.info->total_memory));
    memory_free_.With({id}).Set(static_cast<double>(d.free_memory));
    memory_used_.With({id}).Set(static_cast<double>(d.info->total_memory - std::min(d.free_memory, d.info->total_memory)));
  }

  // Sessions and their memory, per device and tenant; every pair with a scheduler queue
  // (a tenant that has had a session on the device, or is configured) reads 0 without.
  const std::vector<SchedulerReport> schedulers = engine_.scheduler_reports();
  absl::flat_hash_map<std::pair<std::string, std::string>, std::pair<uint64_t, uint64_t>> open;
  for (const SchedulerReport& r : schedulers)
    for (const Scheduler::QueueStats& q : r.queues) open[std::make_pair(r.device, q.tenant)];
  for (const TenantReport& t : engine_.Tenants())
    for (const SessionReport& s : t.sessions) {
      auto& [count, bytes] = open[std::make_pair(s.device, t.name)];
      ++count;
      bytes += s.memory_bytes;
    }
  for (const auto& [key, figures] : open) {
    sessions_.With({key.first, key.second}).Set(static_cast<double>(figures.first));
    tenant_memory_.With({key.first, key.second}).Set(static_cast<double>(figures.second));
  }

  for (const SchedulerReport& r : schedulers) {
    queue_depth_.With({r.device}).Set(static_cast<double>(r.waiting));
    for (const Scheduler::QueueStats& q : r.queues) {
      device_seconds_.With({r.device, q.tenant}).Set(Seconds(q.device_time));
      waits_.With({r.device, q.tenant}).Set(static_cast<double>(q.waits));
      wait_seconds_.With({r.device, q.tenant}).Set(Seconds(q.wait_time));
      rejected_.With({r.device, q.tenant}).Set(static_cast<double>(q.rejected));
    }
  }

  for (const GraphCacheReport& g : engine_.graph_cache_reports()) {
    graph_hits_.With({g.device, g.tenant}).Set(static_cast<double>(g.stats.hits));
    graph_misses_.With({g.device, g.tenant}).Set(static_cast<double>(g.stats.misses));
    graph_instantiations_.With({g.device, g.tenant}).Set(static_cast<double>(g.stats.instantiations));
    graph_evictions_.With({g.device, g.tenant}).Set(static_cast<double>(g.stats.evictions));
    graphs_cached_.With({g.device, g.tenant}).Set(static_cast<double>(g.stats.graphs));
    graph_bytes_.With({g.device, g.tenant}).Set(static_cast<double>(g.stats.bytes));
  }

  const CompileCacheStats compiled = engine_.compile_cache_stats();
  artifacts_.With({}).Set(static_cast<double>(compiled.artifacts));
  artifact_bytes_.With({}).Set(static_cast<double>(compiled.bytes));
  artifact_evictions_.With({}).Set(static_cast<double>(compiled.evictions));

  for (const executor::ExecutorDevice* device : executors_) {
    const std::string& id = device->info().id;
    shared_buffers_.With({id}).Set(static_cast<double>(device->shared_buffers()));
    for (const auto& [tenant, counts] : device->executor_counts()) {
      executors_started_.With({id, tenant}).Set(static_cast<double>(counts.started));
      for (size_t i = 0; i < executor::kExecutorDeathCount; ++i)
        if (counts.died[i] > 0)
          executors_died_.With({id, tenant, executor::ExecutorDeathName(static_cast<executor::ExecutorDeath>(i))})
              .Set(static_cast<double>(counts.died[i]));
    }
  }
}

}  // namespace replayd
