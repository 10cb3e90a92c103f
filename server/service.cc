#include "server/service.h"

#include "absl/strings/str_cat.h"
#include "server/status.h"
#include "server/translate.h"

namespace replayd {

absl::StatusOr<std::shared_ptr<const Tenant>> ReplaydService::Caller(const grpc::ServerContext* context) const {
  return auth_->Authenticate(*context);
}

absl::StatusOr<std::shared_ptr<replayd::DeviceSession>> ReplaydService::FindSession(const grpc::ServerContext* context,
                                                                              SessionId id) {
  absl::StatusOr<std::shared_ptr<const Tenant>> caller = Caller(context);
  if (!caller.ok()) return caller.status();
  return engine_->FindSession((*caller)->name, id);
}

grpc::Status ReplaydService::ListDevices(grpc::ServerContext* context, const v1::ListDevicesRequest*,
                                         v1::ListDevicesReply* reply) {
  absl::StatusOr<std::shared_ptr<const Tenant>> caller = Caller(context);
  if (!caller.ok()) return ToGrpc(caller.status());
  for (const DeviceStatus& d : engine_->ListDevices())
    if (CheckDevice(**caller, d.info->id).ok()) ToProto(d, reply->add_devices());
  return grpc::Status::OK;
}

grpc::Status ReplaydService::OpenSession(grpc::ServerContext* context, const v1::OpenSessionRequest* request,
                                         v1::OpenSessionReply* reply) {
  absl::StatusOr<std::shared_ptr<const Tenant>> caller = Caller(context);
  if (!caller.ok()) return ToGrpc(caller.status());
  if (absl::Status s = CheckDevice(**caller, request->device()); !s.ok()) return ToGrpc(s);
  if (grpc::Status admitted = health_->AdmitSession(*context); !admitted.ok()) return admitted;
  auto session = engine_->OpenSession((*caller)->name, request->device());
  if (!session.ok()) return ToGrpc(session.status());
  reply->set_session((*session)->id());
  reply->set_tenant((*session)->tenant());
  reply->set_lease_seconds(static_cast<uint32_t>(absl::ToInt64Seconds((*session)->lease())));
  return grpc::Status::OK;
}

grpc::Status ReplaydService::KeepAlive(grpc::ServerContext* context, const v1::KeepAliveRequest* request,
                                       v1::KeepAliveReply* reply) {
  auto session = FindSession(context, request->session());
  if (!session.ok()) return ToGrpc(session.status());
  // A session whose context is lost (its executor died) says so at once, before the
  // engine's reaper closes it.
  if (absl::Status lost = (*session)->health(); !lost.ok()) return ToGrpc(lost);
  reply->set_lease_seconds(static_cast<uint32_t>(absl::ToInt64Seconds((*session)->lease())));
  return grpc::Status::OK;
}

grpc::Status ReplaydService::CloseSession(grpc::ServerContext* context, const v1::CloseSessionRequest* request,
                                          v1::CloseSessionReply*) {
  absl::StatusOr<std::shared_ptr<const Tenant>> caller = Caller(context);
  if (!caller.ok()) return ToGrpc(caller.status());
  return ToGrpc(engine_->CloseSession((*caller)->name, request->session()));
}

grpc::Status ReplaydService::AllocBuffer(grpc::ServerContext* context, const v1::AllocBufferRequest* request,
                                         v1::AllocBufferReply* reply) {
  auto session = FindSession(context, request->session());
  if (!session.ok()) return ToGrpc(session.status());
  absl::StatusOr<Handle> buffer = (*session)->AllocBuffer(request->bytes());
  if (!buffer.ok()) return ToGrpc(buffer.status());
  reply->set_buffer(*buffer);
  return grpc::Status::OK;
}

grpc::Status ReplaydService::FreeBuffer(grpc::ServerContext* context, const v1::FreeBufferRequest* request,
                                        v1::FreeBufferReply*) {
  auto session = FindSession(context, request->session());
  if (!session.ok()) return ToGrpc(session.status());
  return ToGrpc((*session)->FreeBuffer(request->buffer()));
}

grpc::Status ReplaydService::ReadBuffer(grpc::ServerContext* context, const v1::ReadBufferRequest* request,
                                        grpc::ServerWriter<v1::ReadChunk>* writer) {
  auto session = FindSession(context, request->session());
  if (!session.ok()) return ToGrpc(session.status());
  auto range = (*session)->ResolveRange(request->buffer(), request->offset(), request->length());
  if (!range.ok()) return ToGrpc(range.status());
  auto [offset, length] = *range;
  v1::ReadChunk chunk;
  for (uint64_t done = 0; done < length;) {
    if (context->IsCancelled()) return grpc::Status::CANCELLED;
    uint64_t n = std::min<uint64_t>(kMaxChunkBytes, length - done);
    chunk.set_offset(offset + done);
    std::string* data = chunk.mutable_data();
    data->resize(n);
    absl::Status s =
        (*session)->ReadBuffer(request->buffer(), offset + done, {reinterpret_cast<uint8_t*>(data->data()), n});
    if (!s.ok()) return ToGrpc(s);
    if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
    done += n;
    (*session)->Renew(absl::Now());
  }
  return grpc::Status::OK;
}

grpc::Status ReplaydService::LoadProgram(grpc::ServerContext* context, const v1::LoadProgramRequest* request,
                                         v1::LoadProgramReply* reply) {
  absl::StatusOr<std::shared_ptr<const Tenant>> caller = Caller(context);
  if (!caller.ok()) return ToGrpc(caller.status());
  auto session = engine_->FindSession((*caller)->name, request->session());
  if (!session.ok()) return ToGrpc(session.status());
  if (absl::Status s = CheckFormat(**caller, request->format()); !s.ok()) return ToGrpc(s);
  absl::StatusOr<ProgramSource> source = FromProto(*request);
  if (!source.ok()) return ToGrpc(source.status());
  absl::StatusOr<ProgramInfo> info = (*session)->LoadProgram(*source);
  if (!info.ok()) return ToGrpc(info.status());
  metrics_->For((*session)->device().id, (*caller)->name)
      .Loaded(info->cache_hit, absl::ToDoubleSeconds(info->compile_time));
  reply->set_program(info->handle);
  reply->set_key(info->key);
  reply->set_cache_hit(info->cache_hit);
  reply->set_compile_seconds(absl::ToDoubleSeconds(info->compile_time));
  return grpc::Status::OK;
}

grpc::Status ReplaydService::FreeProgram(grpc::ServerContext* context, const v1::FreeProgramRequest* request,
                                         v1::FreeProgramReply*) {
  auto session = FindSession(context, request->session());
  if (!session.ok()) return ToGrpc(session.status());
  return ToGrpc((*session)->FreeProgram(request->program()));
}

grpc::Status ReplaydService::Launch(grpc::ServerContext* context, const v1::LaunchRequest* request,
                                    v1::LaunchReply* reply) {
  auto session = FindSession(context, request->session());
  if (!session.ok()) return ToGrpc(session.status());
  const int64_t start = SteadyNowNs();
  absl::Status launched = RunEager(**session, &replayd::DeviceSession::Launch, *request, *reply);
  if (launched.ok())
    metrics_->For((*session)->device().id, (*session)->tenant()).Launched((SteadyNowNs() - start) * 1e-9);
  return ToGrpc(launched);
}

grpc::Status ReplaydService::CopyBuffer(grpc::ServerContext* context, const v1::CopyBufferRequest* request,
                                        v1::CopyBufferReply* reply) {
  auto session = FindSession(context, request->session());
  if (!session.ok()) return ToGrpc(session.status());
  return ToGrpc(RunEager(**session, &replayd::DeviceSession::CopyBuffer, *request, *reply));
}

grpc::Status ReplaydService::Synchronize(grpc::ServerContext* context, const v1::SynchronizeRequest* request,
                                         v1::SynchronizeReply*) {
  auto session = FindSession(context, request->session());
  if (!session.ok()) return ToGrpc(session.status());
  return ToGrpc((*session)->Synchronize());
}

grpc::Status ReplaydService::BeginCapture(grpc::ServerContext* context, const v1::BeginCaptureRequest* request,
                                          v1::BeginCaptureReply*) {
  auto session = FindSession(context, request->session());
  if (!session.ok()) return ToGrpc(session.status());
  if (absl::Status s = CheckGraphLimits(request->variables_size(), 0, 0); !s.ok()) return ToGrpc(s);
  std::vector<VariableDecl> variables;
  for (const v1::Variable& v : request->variables()) {
    absl::StatusOr<VariableDecl> var = FromProto(v);
    if (!var.ok()) return ToGrpc(var.status());
    variables.push_back(*var);
  }
  std::vector<Handle> inputs(request->inputs().begin(), request->inputs().end());
  return ToGrpc((*session)->BeginCapture(inputs, variables));
}

grpc::Status ReplaydService::EndCapture(grpc::ServerContext* context, const v1::EndCaptureRequest* request,
                                        v1::GraphReply* reply) {
  auto session = FindSession(context, request->session());
  if (!session.ok()) return ToGrpc(session.status());
  std::vector<Handle> outputs(request->outputs().begin(), request->outputs().end());
  absl::StatusOr<replayd::GraphInfo> info = (*session)->EndCapture(outputs, request->discard());
  if (!info.ok()) return ToGrpc(info.status());
  ToProto(*info, reply);
  return grpc::Status::OK;
}

grpc::Status ReplaydService::DefineGraph(grpc::ServerContext* context, const v1::DefineGraphRequest* request,
                                         v1::GraphReply* reply) {
  auto session = FindSession(context, request->session());
  if (!session.ok()) return ToGrpc(session.status());
  absl::StatusOr<GraphDef> def = FromProto(request->graph());
  if (!def.ok()) return ToGrpc(def.status());
  absl::StatusOr<replayd::GraphInfo> info = (*session)->DefineGraph(*def);
  if (!info.ok()) return ToGrpc(info.status());
  ToProto(*info, reply);
  return grpc::Status::OK;
}

grpc::Status ReplaydService::ReplayGraph(grpc::ServerContext* context, const v1::ReplayGraphRequest* request,
                                         v1::ReplayGraphReply* reply) {
  auto session = FindSession(context, request->session());
  if (!session.ok()) return ToGrpc(session.status());
  absl::StatusOr<ReplayOp> op = FromProto(*request);
  if (!op.ok()) return ToGrpc(op.status());
  const int64_t start = SteadyNowNs();
  absl::StatusOr<ReplayOutcome> result = (*session)->ReplayGraph(*op);
  if (!result.ok()) return ToGrpc(result.status());
  metrics_->For((*session)->device().id, (*session)->tenant()).Replayed((SteadyNowNs() - start) * 1e-9);
  if (result->device_time) reply->set_device_seconds(absl::ToDoubleSeconds(*result->device_time));
  for (std::string& r : result->reads) reply->add_reads(std::move(r));
  return grpc::Status::OK;
}

grpc::Status ReplaydService::FreeGraph(grpc::ServerContext* context, const v1::FreeGraphRequest* request,
                                       v1::FreeGraphReply*) {
  auto session = FindSession(context, request->session());
  if (!session.ok()) return ToGrpc(session.status());
  return ToGrpc((*session)->FreeGraph(request->graph()));
}

grpc::Status ReplaydService::GraphInfo(grpc::ServerContext* context, const v1::GraphInfoRequest* request,
                                       v1::GraphReply* reply) {
  auto session = FindSession(context, request->session());
  if (!session.ok()) return ToGrpc(session.status());
  absl::StatusOr<replayd::GraphInfo> info = (*session)->DescribeGraph(request->graph());
  if (!info.ok()) return ToGrpc(info.status());
  ToProto(*info, reply);
  return grpc::Status::OK;
}

}  // namespace replayd
