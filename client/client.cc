#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/session_core.h"
#include "client/stream.h"

namespace replayd::client {

constexpr size_t kChunkBytes = 1 << 20;

namespace client_internal {

SessionCore::~SessionCore() { CloseStream(); }

absl::StatusOr<Submitted> SessionCore::Submit(v1::SessionRequest& request, Stream::DoneFn done,
                                              Stream::PartialFn partial) {
  for (int attempt = 0;; ++attempt) {
    std::shared_ptr<Stream> s;
    {
      absl::MutexLock lock(&mu_);
      if (!stream_ || !stream_->healthy()) stream_ = std::make_shared<Stream>(*stub_, token_, id_, window_);
      s = stream_;
    }
    absl::StatusOr<uint64_t> seq = s->Submit(request, done, partial);
    if (seq.ok()) return Submitted{std::move(s), *seq};
    if (attempt > 0 || !Stream::IsNotSent(seq.status())) return seq.status();
  }
}

absl::Status SessionCore::Run(v1::SessionRequest& request, Stream::DoneFn done,
                              Stream::PartialFn partial) {
  absl::StatusOr<Submitted> sent = Submit(request, std::move(done), std::move(partial));
  if (!sent.ok()) return sent.status();
  sent->stream->Await(sent->seq);
  return absl::OkStatus();
}

void SessionCore::CloseStream() {
  std::shared_ptr<Stream> s;
  {
    absl::MutexLock lock(&mu_);
    s = std::move(stream_);
  }
  if (s) s->Close();
}

}  // namespace client_internal

void Authorize(grpc::ClientContext& context, const std::string& token) {
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

namespace {

// Frees one handle of the session on the daemon, best effort: the handles of a closed
// session are gone with it. `set` names the handle in the request; `rpc` is the Free call.
template <typename Request, typename Reply>
void FreeHandle(const std::shared_ptr<client_internal::SessionCore>& core, uint64_t handle,
                void (Request::*set)(uint64_t),
                grpc::Status (v1::Replayd::Stub::*rpc)(grpc::ClientContext*, const Request&, Reply*)) {
  if (!core || handle == 0 || core->closed()) return;
  grpc::ClientContext context;
  Authorize(context, core->token());
  Request request;
  request.set_session(core->id());
  (request.*set)(handle);
  Reply reply;
  ((core->stub()).*rpc)(&context, request, &reply);
}

}  // namespace

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Release();
    core_ = std::move(other.core_);
    handle_ = std::exchange(other.handle_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

Buffer::~Buffer() { Release(); }

void Buffer::Release() {
  FreeHandle(core_, handle_, &v1::FreeBufferRequest::set_buffer, &v1::Replayd::Stub::FreeBuffer);
  handle_ = 0;
}

Program& Program::operator=(Program&& other) noexcept {
  if (this != &other) {
    Release();
    core_ = std::move(other.core_);
    handle_ = std::exchange(other.handle_, 0);
    info_ = std::move(other.info_);
  }
  return *this;
}

Program::~Program() { Release(); }

void Program::Release() {
  FreeHandle(core_, handle_, &v1::FreeProgramRequest::set_program, &v1::Replayd::Stub::FreeProgram);
  handle_ = 0;
}

Session& Session::operator=(Session&& other) noexcept {
  if (this != &other) {
    Close().IgnoreError();
    core_ = std::move(other.core_);
    lease_seconds_ = other.lease_seconds_;
  }
  return *this;
}

Session::~Session() { Close().IgnoreError(); }

uint64_t Session::id() const { return core_->id(); }

absl::Status Session::Close() {
  if (!core_ || !core_->MarkClosed()) return absl::OkStatus();
  core_->CloseStream();
  grpc::ClientContext context;
  Authorize(context, core_->token());
  v1::CloseSessionRequest request;
  request.set_session(core_->id());
  v1::CloseSessionReply reply;
  return FromGrpc(core_->stub().CloseSession(&context, request, &reply));
}

absl::StatusOr<Buffer> Session::Alloc(uint64_t bytes) {
  grpc::ClientContext context;
  Authorize(context, core_->token());
  v1::AllocBufferRequest request;
  request.set_session(core_->id());
  request.set_bytes(bytes);
  v1::AllocBufferReply reply;
  absl::Status s = FromGrpc(core_->stub().AllocBuffer(&context, request, &reply));
  if (!s.ok()) return s;
  return Buffer(core_, reply.buffer(), bytes);
}

absl::Status Session::Write(const Buffer& buffer, uint64_t offset, std::span<const uint8_t> bytes) {
  grpc::ClientContext context;
  Authorize(context, core_->token());
  v1::WriteBufferReply reply;
  auto writer = core_->stub().WriteBuffer(&context, &reply);
  v1::WriteChunk chunk;
  chunk.set_session(core_->id());
  chunk.set_buffer(buffer.handle());
  size_t done = 0;
  do {
    size_t n = std::min(kChunkBytes, bytes.size() - done);
    chunk.set_offset(offset + done);
    chunk.set_data(bytes.data() + done, n);
    if (!writer->Write(chunk)) break;
    done += n;
  } while (done < bytes.size());
  writer->WritesDone();
  return FromGrpc(writer->Finish());
}

absl::Status Session::Read(const Buffer& buffer, uint64_t offset, std::span<uint8_t> out) {
  if (out.empty()) return absl::OkStatus();
  grpc::ClientContext context;
  Authorize(context, core_->token());
  v1::ReadBufferRequest request;
  request.set_session(core_->id());
  request.set_buffer(buffer.handle());
  request.set_offset(offset);
  request.set_length(out.size());
  auto reader = core_->stub().ReadBuffer(&context, request);
  v1::ReadChunk chunk;
  uint64_t got = 0;
  while (reader->Read(&chunk)) {
    uint64_t at = chunk.offset() - offset;
    if (chunk.offset() < offset || at > out.size() || chunk.data().size() > out.size() - at) {
      context.TryCancel();
      reader->Finish();
      return absl::InternalError("ReadBuffer chunk outside the requested range");
    }
    std::memcpy(out.data() + at, chunk.data().data(), chunk.data().size());
    got += chunk.data().size();
  }
  absl::Status s = FromGrpc(reader->Finish());
  if (s.ok() && got != out.size())
    return absl::InternalError(absl::StrCat("ReadBuffer returned ", got, " of ", out.size(), " bytes"));
  return s;
}

absl::StatusOr<Program> Session::Load(const ProgramSpec& spec) {
  grpc::ClientContext context;
  Authorize(context, core_->token());
  v1::LoadProgramRequest request;
  request.set_session(core_->id());
  request.set_format(spec.format);
  request.set_code(spec.code);
  request.set_entry(spec.entry);
  *request.mutable_signature() = spec.signature;
  for (const auto& o : spec.options) request.add_options(o);
  v1::LoadProgramReply reply;
  absl::Status s = FromGrpc(core_->stub().LoadProgram(&context, request, &reply));
  if (!s.ok()) return s;
  return Program(core_, std::move(reply));
}

absl::StatusOr<v1::LaunchReply> Session::Launch(const Program& program, const std::vector<KernelArg>& args,
                                                std::array<uint64_t, 3> global, std::array<uint64_t, 3> local,
                                                bool wait) {
  LaunchSpec spec;
  spec.args = args;
  spec.global = {global[0], global[1], global[2]};
  spec.local = {local[0], local[1], local[2]};
  spec.wait = wait;
  return Launch(program, spec);
}

namespace {

void ToProto(const Variable& v, v1::Variable* out) {
  out->set_name(v.name);
  out->set_min(v.min);
  out->set_max(v.max);
  out->set_multiple_of(v.multiple_of);
}

void ToProto(const View& v, v1::View* out) {
  out->set_buffer(v.buffer ? v.buffer->handle() : 0);
  out->set_offset(v.offset);
  out->set_length(v.length);
}

// Fills numeric dimensions into `plain`, or all of them as expressions into `symbolic`
// when any is an expression.
void DimsToProto(const std::vector<Dim>& dims, google::protobuf::RepeatedField<uint64_t>* plain,
                 google::protobuf::RepeatedPtrField<v1::Expr>* symbolic) {
  bool any_expr = false;
  for (const Dim& d : dims) any_expr = any_expr || std::holds_alternative<Expr>(d);
  for (const Dim& d : dims) {
    if (!any_expr) {
      plain->Add(std::get<uint64_t>(d));
    } else if (const Expr* e = std::get_if<Expr>(&d)) {
      symbolic->Add()->set_text(e->text);
    } else {
      symbolic->Add()->set_constant(static_cast<int64_t>(std::get<uint64_t>(d)));
    }
  }
}

// A stream reply's status.
absl::Status ReplyStatus(const v1::SessionReply& reply) {
  return absl::Status(static_cast<absl::StatusCode>(reply.code()), reply.message());
}

// The done callback of a stream operation: `take(reply)` when it succeeded, else the
// failure, into `out`.
template <typename Out, typename Take>
Stream::DoneFn ReplyDone(Out out, Take take) {
  return [out = std::move(out), take = std::move(take)](absl::StatusOr<v1::SessionReply> reply) {
    if (!reply.ok()) return out(reply.status());
    if (reply->code() != 0) return out(ReplyStatus(*reply));
    out(take(*reply));
  };
}

}  // namespace

absl::StatusOr<v1::LaunchReply> Session::Launch(const Program& program, const LaunchSpec& spec) {
  // On the session's stream, in order with its replays: one round trip, as a unary Launch,
  // on the daemon's faster path.
  v1::SessionRequest op;
  v1::LaunchRequest& request = *op.mutable_launch();
  request.set_session(core_->id());
  request.set_program(program.handle());
  for (const KernelArg& arg : spec.args) {
    v1::Arg* a = request.add_args();
    if (const View* v = std::get_if<View>(&arg)) {
      ToProto(*v, a->mutable_view());
    } else if (const Expr* e = std::get_if<Expr>(&arg)) {
      a->mutable_expr()->set_text(e->text);
    } else {
      a->set_int_value(std::get<int64_t>(arg));
    }
  }
  DimsToProto(spec.global, request.mutable_global(), request.mutable_global_expr());
  DimsToProto(spec.local, request.mutable_local(), request.mutable_local_expr());
  for (const BoundVariable& b : spec.variables) {
    v1::BoundVariable* bv = request.add_variables();
    ToProto(b.variable, bv->mutable_variable());
    bv->set_value(b.value);
  }
  request.set_wait(spec.wait);
  absl::StatusOr<v1::LaunchReply> result = absl::UnknownError("no reply");
  absl::Status ran = core_->Run(
      op, ReplyDone([&result](absl::StatusOr<v1::LaunchReply> r) { result = std::move(r); },
                    [](v1::SessionReply& reply) { return std::move(*reply.mutable_launch()); }));
  if (!ran.ok()) return ran;
  return result;
}

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    Release();
    core_ = std::move(other.core_);
    info_ = std::move(other.info_);
    other.info_.Clear();
  }
  return *this;
}

Graph::~Graph() { Release(); }

void Graph::Release() {
  FreeHandle(core_, info_.graph(), &v1::FreeGraphRequest::set_graph, &v1::Replayd::Stub::FreeGraph);
  info_.set_graph(0);
}

absl::Status Session::BeginCapture(const std::vector<const Buffer*>& inputs, const std::vector<Variable>& variables) {
  grpc::ClientContext context;
  Authorize(context, core_->token());
  v1::BeginCaptureRequest request;
  request.set_session(core_->id());
  for (const Buffer* b : inputs) request.add_inputs(b->handle());
  for (const Variable& v : variables) ToProto(v, request.add_variables());
  v1::BeginCaptureReply reply;
  return FromGrpc(core_->stub().BeginCapture(&context, request, &reply));
}

absl::StatusOr<Graph> Session::EndCapture(const std::vector<const Buffer*>& outputs) {
  grpc::ClientContext context;
  Authorize(context, core_->token());
  v1::EndCaptureRequest request;
  request.set_session(core_->id());
  for (const Buffer* b : outputs) request.add_outputs(b->handle());
  v1::GraphReply reply;
  absl::Status s = FromGrpc(core_->stub().EndCapture(&context, request, &reply));
  if (!s.ok()) return s;
  return Graph(core_, std::move(reply));
}

absl::Status Session::DiscardCapture() {
  grpc::ClientContext context;
  Authorize(context, core_->token());
  v1::EndCaptureRequest request;
  request.set_session(core_->id());
  request.set_discard(true);
  v1::GraphReply reply;
  return FromGrpc(core_->stub().EndCapture(&context, request, &reply));
}

absl::StatusOr<Graph> Session::DefineGraph(const v1::GraphDef& def) {
  grpc::ClientContext context;
  Authorize(context, core_->token());
  v1::DefineGraphRequest request;
  request.set_session(core_->id());
  *request.mutable_graph() = def;
  v1::GraphReply reply;
  absl::Status s = FromGrpc(core_->stub().DefineGraph(&context, request, &reply));
  if (!s.ok()) return s;
  return Graph(core_, std::move(reply));
}

namespace {

void ParamsToProto(const std::vector<ParamArg>& params, google::protobuf::RepeatedPtrField<v1::ParamValue>* out) {
  for (const ParamArg& p : params) {
    if (const Buffer* const* b = std::get_if<const Buffer*>(&p)) {
      out->Add()->set_buffer(*b ? (*b)->handle() : 0);
    } else {
      out->Add()->set_int_value(std::get<int64_t>(p));
    }
  }
}

void ReplayToProto(const Graph& graph, const std::vector<ParamArg>& params, bool wait, const std::vector<View>& reads,
                   v1::ReplayGraphRequest* request) {
  request->set_graph(graph.handle());
  ParamsToProto(params, request->mutable_params());
  request->set_wait(wait);
  for (const View& v : reads) ToProto(v, request->add_reads());
}

ReplayResult FromProto(v1::ReplayGraphReply& reply) {
  ReplayResult result;
  result.device_seconds = reply.device_seconds();
  for (std::string& r : *reply.mutable_reads()) result.reads.push_back(std::move(r));
  return result;
}

}  // namespace

absl::StatusOr<ReplayResult> Session::ReplayUnary(const Graph& graph, const std::vector<ParamArg>& params, bool wait,
                                                  const std::vector<View>& reads) {
  grpc::ClientContext context;
  Authorize(context, core_->token());
  v1::ReplayGraphRequest request;
  request.set_session(core_->id());
  ReplayToProto(graph, params, wait, reads, &request);
  v1::ReplayGraphReply reply;
  absl::Status s = FromGrpc(core_->stub().ReplayGraph(&context, request, &reply));
  if (!s.ok()) return s;
  return FromProto(reply);
}

namespace {

// The done callback of a replay: its result, or the failure, into `out`.
template <typename Out>
Stream::DoneFn ReplayDone(Out out) {
  return ReplyDone(std::move(out), [](v1::SessionReply& reply) { return FromProto(*reply.mutable_replay()); });
}

}  // namespace

std::future<absl::StatusOr<ReplayResult>> Session::ReplayAsync(const Graph& graph, const std::vector<ParamArg>& params,
                                                               bool wait, const std::vector<View>& reads) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<ReplayResult>>>();
  std::future<absl::StatusOr<ReplayResult>> result = promise->get_future();
  v1::SessionRequest request;
  ReplayToProto(graph, params, wait, reads, request.mutable_replay());
  absl::StatusOr<client_internal::Submitted> sent =
      core_->Submit(request, ReplayDone([promise](absl::StatusOr<ReplayResult> r) { promise->set_value(std::move(r)); }));
  if (!sent.ok()) {
    promise->set_value(sent.status());
    return result;
  }
  // The future reads its reply on the thread that waits for it.
  return std::async(std::launch::deferred, [sent = *std::move(sent), result = std::move(result)]() mutable {
    sent.stream->Await(sent.seq);
    return result.get();
  });
}

absl::StatusOr<ReplayResult> Session::Replay(const Graph& graph, const std::vector<ParamArg>& params, bool wait,
                                             const std::vector<View>& reads) {
  v1::SessionRequest request;
  ReplayToProto(graph, params, wait, reads, request.mutable_replay());
  absl::StatusOr<ReplayResult> result = absl::UnknownError("no reply");
  absl::Status ran =
      core_->Run(request, ReplayDone([&result](absl::StatusOr<ReplayResult> r) { result = std::move(r); }));
  if (!ran.ok()) return ran;
  return result;
}

absl::StatusOr<SequenceResult> Session::ReplaySequence(const Graph& graph, const SequenceSpec& spec,
                                                       const SequenceReadsFn& on_reads) {
  v1::SessionRequest request;
  v1::ReplaySequenceRequest* seq = request.mutable_replay_sequence();
  seq->set_graph(graph.handle());
  for (const auto& vector : spec.vectors) ParamsToProto(vector, seq->add_vectors()->mutable_params());
  ParamsToProto(spec.base, seq->mutable_base());
  seq->set_step_param(spec.step_param);
  seq->set_step(spec.step);
  seq->set_count(spec.count);
  for (const View& v : spec.reads) ToProto(v, seq->add_reads());
  seq->set_stream_reads(spec.stream_reads);
  auto to_reads = [](v1::ReplaySequenceReply& r) {
    std::vector<std::string> reads;
    for (std::string& b : *r.mutable_reads()) reads.push_back(std::move(b));
    return reads;
  };
  absl::StatusOr<SequenceResult> result = absl::UnknownError("no reply");
  absl::Status ran = core_->Run(
      request,
      [&](absl::StatusOr<v1::SessionReply> reply) {
        if (!reply.ok()) return void(result = reply.status());
        if (reply->code() != 0) return void(result = ReplyStatus(*reply));
        v1::ReplaySequenceReply* r = reply->mutable_sequence();
        SequenceResult done;
        done.replays = r->replays();
        done.device_seconds = r->device_seconds();
        done.reads = to_reads(*r);
        if (on_reads && spec.stream_reads) on_reads(r->index(), done.reads);
        result = std::move(done);
      },
      [&](const v1::SessionReply& partial) {
        if (!on_reads) return;
        v1::ReplaySequenceReply r = partial.sequence();
        on_reads(r.index(), to_reads(r));
      });
  if (!ran.ok()) return ran;
  return result;
}

absl::StatusOr<v1::GraphReply> Session::DescribeGraph(const Graph& graph) {
  grpc::ClientContext context;
  Authorize(context, core_->token());
  v1::GraphInfoRequest request;
  request.set_session(core_->id());
  request.set_graph(graph.handle());
  v1::GraphReply reply;
  absl::Status s = FromGrpc(core_->stub().GraphInfo(&context, request, &reply));
  if (!s.ok()) return s;
  return reply;
}

absl::StatusOr<v1::CopyBufferReply> Session::Copy(const View& dst, const View& src, bool wait) {
  grpc::ClientContext context;
  Authorize(context, core_->token());
  v1::CopyBufferRequest request;
  request.set_session(core_->id());
  ToProto(dst, request.mutable_dst());
  ToProto(src, request.mutable_src());
  request.set_wait(wait);
  v1::CopyBufferReply reply;
  if (absl::Status s = FromGrpc(core_->stub().CopyBuffer(&context, request, &reply)); !s.ok()) return s;
  return reply;
}

absl::Status Session::Synchronize() {
  grpc::ClientContext context;
  Authorize(context, core_->token());
  v1::SynchronizeRequest request;
  request.set_session(core_->id());
  v1::SynchronizeReply reply;
  return FromGrpc(core_->stub().Synchronize(&context, request, &reply));
}

absl::Status Session::KeepAlive() {
  grpc::ClientContext context;
  Authorize(context, core_->token());
  v1::KeepAliveRequest request;
  request.set_session(core_->id());
  v1::KeepAliveReply reply;
  return FromGrpc(core_->stub().KeepAlive(&context, request, &reply));
}

Client Client::Connect(const std::string& target, ClientOptions options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(20 << 20);
  args.SetMaxSendMessageSize(20 << 20);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.tls_root_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_ca;
    ssl.pem_cert_chain = options.tls_cert;
    ssl.pem_private_key = options.tls_key;
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  }
  auto channel = grpc::CreateCustomChannel(target, credentials, args);
  return Client(std::shared_ptr<v1::Replayd::Stub>(v1::Replayd::NewStub(channel)),
                std::shared_ptr<v1::Admin::Stub>(v1::Admin::NewStub(channel)),
                std::shared_ptr<grpc::health::v1::Health::Stub>(grpc::health::v1::Health::NewStub(channel)),
                std::move(options));
}

absl::StatusOr<std::vector<v1::TenantStatus>> Client::ListTenants() {
  grpc::ClientContext context;
  Authorize(context, options_.token);
  v1::ListTenantsReply reply;
  absl::Status s = FromGrpc(admin_->ListTenants(&context, v1::ListTenantsRequest(), &reply));
  if (!s.ok()) return s;
  return std::vector<v1::TenantStatus>(reply.tenants().begin(), reply.tenants().end());
}

absl::StatusOr<std::string> Client::CloseAnySession(uint64_t session) {
  grpc::ClientContext context;
  Authorize(context, options_.token);
  v1::AdminCloseSessionRequest request;
  request.set_session(session);
  v1::AdminCloseSessionReply reply;
  absl::Status s = FromGrpc(admin_->CloseSession(&context, request, &reply));
  if (!s.ok()) return s;
  return reply.tenant();
}

absl::StatusOr<v1::DrainReply> Client::Drain() {
  grpc::ClientContext context;
  Authorize(context, options_.token);
  v1::DrainReply reply;
  absl::Status s = FromGrpc(admin_->Drain(&context, v1::DrainRequest(), &reply));
  if (!s.ok()) return s;
  return reply;
}

namespace {
// Sets `context`'s deadline `timeout` from now, unless it is infinite.
void SetTimeout(grpc::ClientContext& context, absl::Duration timeout) {
  if (timeout != absl::InfiniteDuration()) context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}
}  // namespace

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Client::Health(const std::string& service,
                                                                                     absl::Duration timeout) {
  grpc::ClientContext context;
  SetTimeout(context, timeout);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse reply;
  absl::Status s = FromGrpc(health_->Check(&context, request, &reply));
  if (!s.ok()) return s;
  return reply.status();
}

absl::StatusOr<std::vector<v1::Device>> Client::ListDevices(absl::Duration timeout) {
  grpc::ClientContext context;
  SetTimeout(context, timeout);
  Authorize(context, options_.token);
  v1::ListDevicesReply reply;
  absl::Status s = FromGrpc(stub_->ListDevices(&context, v1::ListDevicesRequest(), &reply));
  if (!s.ok()) return s;
  return std::vector<v1::Device>(reply.devices().begin(), reply.devices().end());
}

absl::StatusOr<Session> Client::OpenSession(const std::string& device) {
  grpc::ClientContext context;
  Authorize(context, options_.token);
  v1::OpenSessionRequest request;
  request.set_device(device);
  v1::OpenSessionReply reply;
  absl::Status s = FromGrpc(stub_->OpenSession(&context, request, &reply));
  if (!s.ok()) return s;
  auto core = std::make_shared<client_internal::SessionCore>(stub_, options_.token, reply.session(),
                                                             options_.stream_window);
  return Session(std::move(core), reply.lease_seconds());
}

absl::StatusOr<v1::Signature> ParseSignature(const std::string& text, bool core_id) {
  v1::Signature signature;
  signature.set_core_id(core_id);
  for (absl::string_view word : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    v1::Param* p = signature.add_params();
    if (word == "in") {
      p->set_kind(v1::Param::BUFFER), p->set_access(v1::Param::IN);
    } else if (word == "out") {
      p->set_kind(v1::Param::BUFFER), p->set_access(v1::Param::OUT);
    } else if (word == "inout") {
      p->set_kind(v1::Param::BUFFER), p->set_access(v1::Param::INOUT);
    } else if (word == "int32") {
      p->set_kind(v1::Param::INT32);
    } else if (word == "int64") {
      p->set_kind(v1::Param::INT64);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown signature word \"", word, "\""));
    }
  }
  return signature;
}

}  // namespace replayd::client
