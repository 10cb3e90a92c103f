#include "server/admin_service.h"

#include "absl/strings/str_cat.h"
#include "server/status.h"
#include "spdlog/spdlog.h"

namespace replayd {
namespace {

void ToProto(const Quotas& q, v1::Quotas* out) {
  out->set_memory_bytes(q[static_cast<size_t>(Resource::kMemory)]);
  out->set_sessions(q[static_cast<size_t>(Resource::kSessions)]);
  out->set_programs(q[static_cast<size_t>(Resource::kPrograms)]);
  out->set_graphs(q[static_cast<size_t>(Resource::kGraphs)]);
  out->set_queued(q[static_cast<size_t>(Resource::kQueued)]);
  out->set_host_bytes(q[static_cast<size_t>(Resource::kHostMemory)]);
}

void ToProto(const std::string& device, const GraphCacheStats& stats, v1::GraphCacheUsage* out) {
  out->set_device(device);
  out->set_graphs(stats.graphs);
  out->set_bytes(stats.bytes);
  out->set_hits(stats.hits);
  out->set_misses(stats.misses);
  out->set_instantiations(stats.instantiations);
  out->set_evictions(stats.evictions);
}

}  // namespace

absl::Status AdminService::CheckAdmin(const grpc::ServerContext& context) const {
  absl::StatusOr<std::shared_ptr<const Tenant>> caller = auth_->Authenticate(context);
  if (!caller.ok()) return caller.status();
  if (!(*caller)->admin)
    return absl::PermissionDeniedError(absl::StrCat("tenant ", (*caller)->name, " is not an admin"));
  return absl::OkStatus();
}

grpc::Status AdminService::ListTenants(grpc::ServerContext* context, const v1::ListTenantsRequest*,
                                       v1::ListTenantsReply* reply) {
  if (absl::Status s = CheckAdmin(*context); !s.ok()) return ToGrpc(s);
  const absl::Time now = absl::Now();
  const std::vector<DeviceStatus> devices = engine_->ListDevices();
  for (const TenantReport& t : engine_->Tenants()) {
    v1::TenantStatus* out = reply->add_tenants();
    out->set_name(t.name);
    out->set_weight(t.limits.weight);
    out->set_priority(t.limits.priority == Priority::kInteractive ? v1::PRIORITY_INTERACTIVE
                                                                   : v1::PRIORITY_BATCH);
    ToProto(t.limits.quotas, out->mutable_quotas());
    ToProto(t.usage.used, out->mutable_used());
    out->set_device_time_us(static_cast<uint64_t>(absl::ToInt64Microseconds(t.usage.device_time)));
    out->set_work_items(t.usage.work_items);
    out->set_rejected(t.usage.rejected);
    for (const SessionReport& s : t.sessions) {
      v1::SessionUsage* u = out->add_sessions();
      u->set_session(s.id);
      u->set_device(s.device);
      u->set_memory_bytes(s.memory_bytes);
      u->set_programs(s.programs);
      u->set_graphs(s.graphs);
      u->set_lease_seconds_left(std::max(0.0, absl::ToDoubleSeconds(s.deadline - now)));
    }
    for (const DeviceStatus& d : devices) {
      const GraphCacheStats stats = engine_->graph_cache_stats(t.name, d.info->id);
      if (stats.graphs == 0 && stats.hits == 0 && stats.misses == 0 && stats.instantiations == 0)
        continue;  // never used there
      ToProto(d.info->id, stats, out->add_graph_caches());
    }
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::CloseSession(grpc::ServerContext* context,
                                        const v1::AdminCloseSessionRequest* request,
                                        v1::AdminCloseSessionReply* reply) {
  if (absl::Status s = CheckAdmin(*context); !s.ok()) return ToGrpc(s);
  absl::StatusOr<std::string> tenant = engine_->AdminCloseSession(request->session());
  if (!tenant.ok()) return ToGrpc(tenant.status());
  reply->set_tenant(*tenant);
  return grpc::Status::OK;
}

grpc::Status AdminService::Drain(grpc::ServerContext* context, const v1::DrainRequest*, v1::DrainReply* reply) {
  if (absl::Status s = CheckAdmin(*context); !s.ok()) return ToGrpc(s);
  const bool began = health_->BeginDrain();
  if (began) spdlog::info("Admin.Drain: draining: {} sessions open", engine_->session_count());
  reply->set_already_draining(!began);
  reply->set_seconds_left(std::max(0.0, absl::ToDoubleSeconds(health_->drain_deadline() - absl::Now())));
  reply->set_sessions(engine_->session_count());
  return grpc::Status::OK;
}

}  // namespace replayd
