// replayd::Client (replayd::client::Client): a C++ client of the replayd API with RAII handles. A Session closes
// itself when destroyed; a Buffer or Program frees itself when destroyed, unless its
// session has closed first (which frees everything it owned).
//
// Thread safety: a Client may be shared between threads. A Session and its handles may
// be used from several threads; the daemon orders their operations as they arrive.
//
// Replays go over the session's Session stream (opened on first use); everything else is
// a unary RPC. Stream operations are ordered among themselves; a unary call is not
// ordered with stream operations still in flight, so wait on their futures first.
#ifndef REPLAYD_CLIENT_CLIENT_H_
#define REPLAYD_CLIENT_CLIENT_H_

#include <array>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "replayd/v1/admin.grpc.pb.h"
#include "replayd/v1/replayd.grpc.pb.h"

namespace replayd::client {

absl::Status FromGrpc(const grpc::Status& status);

namespace client_internal {
// A session's connection state: its stub, token, id and stream (client/session_core.h).
struct SessionCore;
}  // namespace client_internal

// A buffer handle; frees the device memory when destroyed.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&& other) noexcept;
  ~Buffer();
  uint64_t handle() const { return handle_; }
  uint64_t bytes() const { return bytes_; }

 private:
  friend class Session;
  Buffer(std::shared_ptr<client_internal::SessionCore> core, uint64_t handle, uint64_t bytes)
      : core_(std::move(core)), handle_(handle), bytes_(bytes) {}
  void Release();
  std::shared_ptr<client_internal::SessionCore> core_;
  uint64_t handle_ = 0;
  uint64_t bytes_ = 0;
};

// A loaded program handle; unloads when destroyed.
class Program {
 public:
  Program() = default;
  Program(Program&&) noexcept = default;
  Program& operator=(Program&& other) noexcept;
  ~Program();
  uint64_t handle() const { return handle_; }
  const v1::LoadProgramReply& info() const { return info_; }

 private:
  friend class Session;
  Program(std::shared_ptr<client_internal::SessionCore> core, v1::LoadProgramReply info)
      : core_(std::move(core)), handle_(info.program()), info_(std::move(info)) {}
  void Release();
  std::shared_ptr<client_internal::SessionCore> core_;
  uint64_t handle_ = 0;
  v1::LoadProgramReply info_;
};

// (buffer, byte offset, byte length); length 0 means to the end of the buffer.
struct View {
  const Buffer* buffer = nullptr;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// An integer expression in the text syntax, e.g. "(pos + 31) // 32".
struct Expr {
  std::string text;
};

// A kernel argument: a view for a buffer parameter; an integer or an expression over the
// launch's variables for an int32 or int64.
using KernelArg = std::variant<View, int64_t, Expr>;

// A launch dimension: a number or an expression.
using Dim = std::variant<uint64_t, Expr>;

struct Variable {
  std::string name;
  int64_t min = 0;
  int64_t max = 0;
  int64_t multiple_of = 1;
};

struct BoundVariable {
  Variable variable;
  int64_t value = 0;
};

// A launch with variables and symbolic dimensions.
struct LaunchSpec {
  std::vector<KernelArg> args;
  std::vector<Dim> global = {uint64_t{1}};
  std::vector<Dim> local;
  std::vector<BoundVariable> variables;
  bool wait = false;
};

// A replay parameter: a buffer for a buffer parameter, a value for a variable.
using ParamArg = std::variant<const Buffer*, int64_t>;

// A graph handle; freed when destroyed.
class Graph {
 public:
  Graph() = default;
  Graph(Graph&&) noexcept = default;
  Graph& operator=(Graph&& other) noexcept;
  ~Graph();
  uint64_t handle() const { return info_.graph(); }
  const v1::GraphReply& info() const { return info_; }

 private:
  friend class Session;
  Graph(std::shared_ptr<client_internal::SessionCore> core, v1::GraphReply info)
      : core_(std::move(core)), info_(std::move(info)) {}
  void Release();
  std::shared_ptr<client_internal::SessionCore> core_;
  v1::GraphReply info_;
};

struct ReplayResult {
  double device_seconds = 0;
  std::vector<std::string> reads;
};

// K replays of one graph in one request: `vectors`, or `base` with the parameter at
// index `step_param` increased by `step` after each of `count` replays.
struct SequenceSpec {
  std::vector<std::vector<ParamArg>> vectors;
  std::vector<ParamArg> base;
  uint32_t step_param = 0;
  int64_t step = 1;
  uint32_t count = 0;
  std::vector<View> reads;
  bool stream_reads = false;  // every replay's reads, as they complete
};

struct SequenceResult {
  uint32_t replays = 0;
  double device_seconds = 0;
  std::vector<std::string> reads;  // the last replay's
};

// Called with each replay's index and reads as they arrive (stream_reads).
using SequenceReadsFn = std::function<void(uint32_t index, std::vector<std::string> reads)>;

struct ProgramSpec {
  std::string format = "cpu-c";
  std::string code;
  std::string entry;
  v1::Signature signature;
  std::vector<std::string> options;
};

class Session {
 public:
  Session(Session&&) noexcept = default;
  Session& operator=(Session&&) noexcept;
  ~Session();  // closes the session

  uint64_t id() const;
  uint32_t lease_seconds() const { return lease_seconds_; }

  absl::StatusOr<Buffer> Alloc(uint64_t bytes);
  // Writes `bytes` at `offset` in chunks of at most 1 MiB on one stream.
  absl::Status Write(const Buffer& buffer, uint64_t offset, std::span<const uint8_t> bytes);
  // Reads `out.size()` bytes at `offset` into `out`.
  absl::Status Read(const Buffer& buffer, uint64_t offset, std::span<uint8_t> out);

  absl::StatusOr<Program> Load(const ProgramSpec& spec);
  // One launch. With wait, the reply carries the device time.
  absl::StatusOr<v1::LaunchReply> Launch(const Program& program, const std::vector<KernelArg>& args,
                                         std::array<uint64_t, 3> global, std::array<uint64_t, 3> local = {1, 1, 1},
                                         bool wait = false);
  absl::StatusOr<v1::LaunchReply> Launch(const Program& program, const LaunchSpec& spec);
  // A device-to-device copy from `src` to `dst` (views of one length that do not
  // overlap), ordered with the launches and recorded by a capture.
  absl::StatusOr<v1::CopyBufferReply> Copy(const View& dst, const View& src, bool wait = false);
  absl::Status Synchronize();
  absl::Status KeepAlive();

  // Graphs: capture launches between BeginCapture and EndCapture, or define one.
  absl::Status BeginCapture(const std::vector<const Buffer*>& inputs, const std::vector<Variable>& variables);
  absl::StatusOr<Graph> EndCapture(const std::vector<const Buffer*>& outputs);
  // Closes the open capture without making a graph.
  absl::Status DiscardCapture();
  absl::StatusOr<Graph> DefineGraph(const v1::GraphDef& def);
  // Replays `graph` with `params` in its parameter layout over the session's stream and
  // returns the bytes of `reads`. ReplayAsync returns at once: replays issued from one
  // thread run in order, and the client may queue many (up to the stream window; past it
  // ReplayAsync first reads the oldest reply) before waiting on any. No thread reads in
  // the background: the future's get() or wait() reads the replies up to its own on the
  // calling thread (its wait_for answers `deferred`), and a future dropped unread leaves
  // its reply to whoever reads next.
  absl::StatusOr<ReplayResult> Replay(const Graph& graph, const std::vector<ParamArg>& params, bool wait = false,
                                      const std::vector<View>& reads = {});
  std::future<absl::StatusOr<ReplayResult>> ReplayAsync(const Graph& graph, const std::vector<ParamArg>& params,
                                                        bool wait = false, const std::vector<View>& reads = {});
  // One request for a whole sequence; `on_reads` gets each replay's reads with
  // stream_reads, on the thread that reads them (usually this one). It must not use this
  // session.
  absl::StatusOr<SequenceResult> ReplaySequence(const Graph& graph, const SequenceSpec& spec,
                                                const SequenceReadsFn& on_reads = nullptr);
  // The same replay as one unary ReplayGraph RPC, without the stream.
  absl::StatusOr<ReplayResult> ReplayUnary(const Graph& graph, const std::vector<ParamArg>& params, bool wait = false,
                                           const std::vector<View>& reads = {});
  absl::StatusOr<v1::GraphReply> DescribeGraph(const Graph& graph);
  // Closes now; everything the session owned is freed. Later calls are NOT_FOUND.
  absl::Status Close();

  // Typed conveniences.
  template <typename T>
  absl::Status WriteVector(const Buffer& buffer, const std::vector<T>& values) {
    return Write(buffer, 0, {reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(T)});
  }
  template <typename T>
  absl::StatusOr<std::vector<T>> ReadVector(const Buffer& buffer, size_t count) {
    std::vector<T> out(count);
    absl::Status s = Read(buffer, 0, {reinterpret_cast<uint8_t*>(out.data()), count * sizeof(T)});
    if (!s.ok()) return s;
    return out;
  }

 private:
  friend class Client;
  Session(std::shared_ptr<client_internal::SessionCore> core, uint32_t lease_seconds)
      : core_(std::move(core)), lease_seconds_(lease_seconds) {}
  std::shared_ptr<client_internal::SessionCore> core_;
  uint32_t lease_seconds_ = 0;
};

struct ClientOptions {
  std::string token;          // sent as authorization: Bearer <token> on every call
  size_t stream_window = 64;  // operations a session's stream may have outstanding
  // TLS, when tls_root_ca (PEM) is set: the CA that signed the daemon's certificate, and
  // for mutual TLS this client's PEM certificate chain and key.
  std::string tls_root_ca, tls_cert, tls_key;
  // The name the daemon's certificate is checked against; empty: the target's host. Set
  // where the target is an address that the certificate does not name.
  std::string tls_server_name;
};

// Adds the bearer token to a call (nothing for an empty token).
void Authorize(grpc::ClientContext& context, const std::string& token);

class Client {
 public:
  // A client of the daemon at `target` ("127.0.0.1:7070"). The connection is made lazily.
  static Client Connect(const std::string& target, ClientOptions options = {});

  // The daemon's devices; DEADLINE_EXCEEDED past `timeout`.
  absl::StatusOr<std::vector<v1::Device>> ListDevices(absl::Duration timeout = absl::InfiniteDuration());
  absl::StatusOr<Session> OpenSession(const std::string& device);
  v1::Replayd::Stub& stub() { return *stub_; }

  // The Admin service; PERMISSION_DENIED unless this client's tenant is an admin.
  absl::StatusOr<std::vector<v1::TenantStatus>> ListTenants();
  // Closes any tenant's session; returns the tenant that owned it.
  absl::StatusOr<std::string> CloseAnySession(uint64_t session);
  // Begins draining the daemon (Admin.Drain); a drain under way goes on unchanged.
  absl::StatusOr<v1::DrainReply> Drain();

  // The daemon's health (grpc.health.v1 Check, which needs no token) for `service`: "" for
  // the daemon as a whole, or a service's full name ("replayd.v1.Replayd"). NOT_FOUND
  // for a service the daemon does not know, DEADLINE_EXCEEDED past `timeout`.
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Health(
      const std::string& service = "", absl::Duration timeout = absl::InfiniteDuration());

 private:
  Client(std::shared_ptr<v1::Replayd::Stub> stub, std::shared_ptr<v1::Admin::Stub> admin,
         std::shared_ptr<grpc::health::v1::Health::Stub> health, ClientOptions options)
      : stub_(std::move(stub)), admin_(std::move(admin)), health_(std::move(health)), options_(std::move(options)) {}
  std::shared_ptr<v1::Replayd::Stub> stub_;
  std::shared_ptr<v1::Admin::Stub> admin_;
  std::shared_ptr<grpc::health::v1::Health::Stub> health_;
  ClientOptions options_;
};

// Builds a signature param list from a compact text: comma-separated "in", "out",
// "inout", "int32", "int64" (e.g. "out,in,in,int32"). INVALID_ARGUMENT on an unknown word.
absl::StatusOr<v1::Signature> ParseSignature(const std::string& text, bool core_id = false);

}  // namespace replayd::client

namespace replayd {
using Client = client::Client;
}  // namespace replayd

#endif  // REPLAYD_CLIENT_CLIENT_H_
