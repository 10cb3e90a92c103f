// replayctl: the command-line client of replayd. kUsage below is its --help: every
// subcommand, and the argument specs of run.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "client/metrics_summary.h"
#include "httplib.h"
#include "demo.h"

ABSL_FLAG(std::string, target, "127.0.0.1:7070", "address of the replayd daemon");
ABSL_FLAG(std::string, device, "cpu:0", "device to run on");
ABSL_FLAG(std::string, token, "", "bearer token, for a daemon with --tenants (or $REPLAYD_TOKEN)");
ABSL_FLAG(std::string, tls_ca, "", "PEM file of the CA that signed the daemon's certificate: use TLS");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of this client (mutual TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, entry, "", "run: the kernel's function name");
ABSL_FLAG(std::string, args, "", "run: the kernel's arguments, comma-separated specs (ARGUMENTS OF run above)");
ABSL_FLAG(std::string, global, "1", "run: global dimensions, N[,N,N]");
ABSL_FLAG(bool, core_id, false, "run: pass the invocation index as a trailing int");
ABSL_FLAG(std::vector<std::string>, options, {}, "run: compiler options");
ABSL_FLAG(int, tokens, 128, "demo: tokens to generate");
ABSL_FLAG(int, eager_steps, 32, "demo: decode steps run eagerly for comparison");
ABSL_FLAG(std::string, metrics, "127.0.0.1:9464",
          "stats: the daemon's metrics address (its --metrics_listen), host:port");

namespace replayd::client {
namespace {

// absl prints it after "replayctl: ".
constexpr char kUsage[] = R"([flags] COMMAND [ARG]: the command-line client of replayd.

COMMANDS
  devices            the daemon's devices: kind, name, memory total and free, program
                     formats, launch limits, driver version
  run FILE.c         compile the cpu-c kernel in FILE.c, run it once on --device with the
                     buffers and integers --args describes, and print the buffers it wrote
                     (needs --entry and --args; --global, --core_id, --options)
  demo               a small transformer decodes tokens on --device: one decode step
                     captured once, replayed per token, pipelined and as a sequence, each
                     step checked against a host reference and timed against eager
                     launches (--tokens, --eager_steps)
  health [SERVICE]   the daemon's grpc.health.v1 status, for the daemon as a whole or for
                     SERVICE (replayd.v1.Replayd, replayd.v1.Admin): SERVING or NOT_SERVING
                     (draining, or no device served); exit 0 when SERVING, 3 when not,
                     1 when the daemon cannot be asked
  tenants            (admin) every tenant: class, weight, usage against its quotas,
                     device time, work items, refusals, and its sessions
  sessions           (admin) every open session: id, tenant, device, memory, programs,
                     graphs, lease left
  graphs             (admin) every tenant's graph cache per device: graphs and arena
                     bytes cached, hits, misses, instantiations, evictions
  close-session ID   (admin) close any tenant's session (ID in hex, as sessions shows it)
  drain              (admin) drain the daemon as SIGTERM does: it turns NOT_SERVING,
                     refuses new sessions, lets open ones finish for up to its
                     --drain_seconds, then exits; prints the time left and sessions open
  stats              the daemon's metrics (its --metrics_listen, given here as --metrics
                     HOST:PORT) summed up: per device memory and queue, per tenant sessions,
                     replays and launches with p50/p99 latency, device seconds, failures

  Admin commands need a token of a tenant with admin: true (without a tenants file every
  caller is the admin tenant default). --token or $REPLAYD_TOKEN gives the token,
  --target the daemon, --tls_ca (with --tls_cert and --tls_key for mutual TLS) TLS.

ARGUMENTS OF run (--args)
  One spec per kernel argument, in the kernel's order, separated by commas:
    in:TYPE:N[:FILL]     a buffer of N elements the kernel reads
    out:TYPE:N           a buffer of N elements the kernel writes (printed after the run)
    inout:TYPE:N[:FILL]  a buffer read and written (printed after the run)
    i32:VALUE            an int argument
    i64:VALUE            a long long argument
  TYPE is f32 or i32. FILL is zero (the default), ramp (0, 1, 2, ...), rand, or a number.
  With --core_id the kernel gets the invocation's index as a trailing int; --global
  N[,N,N] sets how many invocations run.

EXAMPLE
  With add.c holding
    void add(float *out, const float *a, const float *b, int n) {
      for (int i = 0; i < n; ++i) out[i] = a[i] + b[i];
    }
  this adds 0, 1, 2, ... and 10 over 1024 floats and prints out[0..7] = 10 11 12 ...:
    replayctl run add.c --entry add --args out:f32:1024,in:f32:1024:ramp,in:f32:1024:10,i32:1024)";

int Fail(const absl::Status& status) {
  std::cerr << "replayctl: " << status << "\n";
  return 1;
}

int Devices(Client& client) {
  absl::StatusOr<std::vector<v1::Device>> devices = client.ListDevices();
  if (!devices.ok()) return Fail(devices.status());
  for (const v1::Device& d : *devices) {
    std::cout << absl::StrFormat(
        "%-8s %-5s %s (%s)\n  memory %d MiB total, %d MiB free; formats %s; max global %d; %s\n",
        d.id(), d.kind(), d.name(), d.architecture(), d.total_memory() >> 20, d.free_memory() >> 20,
        absl::StrJoin(d.formats(), ","), d.limits().max_global_total(), d.driver_version());
  }
  return 0;
}

std::string Quota(uint64_t used, uint64_t quota) {
  return quota == 0 ? absl::StrCat(used) : absl::StrCat(used, "/", quota);
}

int Tenants(Client& client) {
  absl::StatusOr<std::vector<v1::TenantStatus>> tenants = client.ListTenants();
  if (!tenants.ok()) return Fail(tenants.status());
  std::cout << absl::StrFormat("%-16s %-11s %6s %-22s %-22s %-9s %-9s %-9s %-9s %12s %10s %8s\n", "TENANT",
                               "CLASS", "WEIGHT", "MEMORY", "HOST", "SESSIONS", "PROGRAMS", "GRAPHS",
                               "QUEUED", "DEVICE_MS", "ITEMS", "REJECTED");
  for (const v1::TenantStatus& t : *tenants) {
    std::cout << absl::StrFormat(
        "%-16s %-11s %6d %-22s %-22s %-9s %-9s %-9s %-9s %12.1f %10d %8d\n", t.name(),
        t.priority() == v1::PRIORITY_INTERACTIVE ? "interactive" : "batch", t.weight(),
        Quota(t.used().memory_bytes(), t.quotas().memory_bytes()),
        Quota(t.used().host_bytes(), t.quotas().host_bytes()),
        Quota(t.used().sessions(), t.quotas().sessions()),
        Quota(t.used().programs(), t.quotas().programs()), Quota(t.used().graphs(), t.quotas().graphs()),
        Quota(t.used().queued(), t.quotas().queued()), t.device_time_us() / 1000.0, t.work_items(),
        t.rejected());
    for (const v1::SessionUsage& s : t.sessions())
      std::cout << absl::StrFormat("  session %016x on %s: %d bytes, %d programs, %d graphs, lease %.0f s\n",
                                   s.session(), s.device(), s.memory_bytes(), s.programs(), s.graphs(),
                                   s.lease_seconds_left());
  }
  return 0;
}

int Sessions(Client& client) {
  absl::StatusOr<std::vector<v1::TenantStatus>> tenants = client.ListTenants();
  if (!tenants.ok()) return Fail(tenants.status());
  std::cout << absl::StrFormat("%-16s %-16s %-8s %14s %9s %7s %8s\n", "SESSION", "TENANT", "DEVICE", "MEMORY_BYTES",
                               "PROGRAMS", "GRAPHS", "LEASE_S");
  for (const v1::TenantStatus& t : *tenants)
    for (const v1::SessionUsage& s : t.sessions())
      std::cout << absl::StrFormat("%016x %-16s %-8s %14d %9d %7d %8.0f\n", s.session(), t.name(), s.device(),
                                   s.memory_bytes(), s.programs(), s.graphs(), s.lease_seconds_left());
  return 0;
}

int Graphs(Client& client) {
  absl::StatusOr<std::vector<v1::TenantStatus>> tenants = client.ListTenants();
  if (!tenants.ok()) return Fail(tenants.status());
  std::cout << absl::StrFormat("%-16s %-8s %7s %14s %10s %10s %14s %10s\n", "TENANT", "DEVICE", "GRAPHS",
                               "BYTES", "HITS", "MISSES", "INSTANTIATIONS", "EVICTIONS");
  for (const v1::TenantStatus& t : *tenants)
    for (const v1::GraphCacheUsage& g : t.graph_caches())
      std::cout << absl::StrFormat("%-16s %-8s %7d %14d %10d %10d %14d %10d\n", t.name(), g.device(), g.graphs(),
                                   g.bytes(), g.hits(), g.misses(), g.instantiations(), g.evictions());
  return 0;
}

int Health(Client& client, const std::string& service) {
  auto status = client.Health(service);
  if (!status.ok()) return Fail(status.status());
  std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*status) << "\n";
  return *status == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 3;
}

int Drain(Client& client) {
  absl::StatusOr<v1::DrainReply> reply = client.Drain();
  if (!reply.ok()) return Fail(reply.status());
  std::cout << absl::StrFormat("%s: %d sessions open; the daemon stops within %.0f s\n",
                               reply->already_draining() ? "draining already" : "draining", reply->sessions(),
                               std::ceil(reply->seconds_left()));
  return 0;
}

int Stats(const std::string& address) {
  httplib::Client http(absl::StrCat("http://", address));
  http.set_connection_timeout(5);
  http.set_read_timeout(10);
  httplib::Result got = http.Get("/metrics");
  if (!got)
    return Fail(absl::UnavailableError(
        absl::StrCat("metrics at ", address, ": ", httplib::to_string(got.error()))));
  if (got->status != 200)
    return Fail(absl::UnavailableError(absl::StrCat("metrics at ", address, ": HTTP ", got->status)));
  absl::StatusOr<std::vector<Sample>> samples = ParseExposition(got->body);
  if (!samples.ok()) return Fail(samples.status());
  std::cout << Summarize(*samples);
  return 0;
}

int CloseAnySession(Client& client, const std::string& id) {
  uint64_t session = 0;
  if (!absl::SimpleHexAtoi(id, &session)) return Fail(absl::InvalidArgumentError("session id must be hex"));
  absl::StatusOr<std::string> tenant = client.CloseAnySession(session);
  if (!tenant.ok()) return Fail(tenant.status());
  std::cout << "closed session " << id << " of tenant " << *tenant << "\n";
  return 0;
}

struct BufferArg {
  std::string access, type;
  uint64_t count = 0;
  std::string fill = "zero";
};

absl::StatusOr<std::vector<uint8_t>> FillBytes(const BufferArg& b) {
  std::vector<uint8_t> bytes(b.count * 4);
  uint32_t x = 12345;
  double constant = 0;
  bool is_constant = b.fill != "ramp" && b.fill != "rand";
  if (is_constant && b.fill != "zero" && !absl::SimpleAtod(b.fill, &constant))
    return absl::InvalidArgumentError(absl::StrCat("unknown fill \"", b.fill, "\""));
  for (uint64_t i = 0; i < b.count; ++i) {
    double v = constant;
    if (b.fill == "ramp") v = double(i);
    if (b.fill == "rand") {
      x = x * 1664525u + 1013904223u;
      v = double((x >> 8) & 0xffff) / 65536.0;
    }
    if (b.type == "f32") {
      float f = float(v);
      std::memcpy(&bytes[i * 4], &f, 4);
    } else {
      int32_t n = int32_t(v);
      std::memcpy(&bytes[i * 4], &n, 4);
    }
  }
  return bytes;
}

int Run(Client& client, const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot read ", file)));
  std::stringstream code;
  code << in.rdbuf();

  absl::StatusOr<Session> session = client.OpenSession(absl::GetFlag(FLAGS_device));
  if (!session.ok()) return Fail(session.status());
  ProgramSpec spec;
  spec.code = code.str();
  spec.entry = absl::GetFlag(FLAGS_entry);
  spec.options = absl::GetFlag(FLAGS_options);
  spec.signature.set_core_id(absl::GetFlag(FLAGS_core_id));

  std::vector<BufferArg> buffer_args;
  std::vector<std::pair<bool, int64_t>> arg_kinds;  // (is buffer, buffer index or value)
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_args), ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(s, ':');
    v1::Param* p = spec.signature.add_params();
    if ((parts[0] == "i32" || parts[0] == "i64") && parts.size() == 2) {
      int64_t v;
      if (!absl::SimpleAtoi(parts[1], &v)) return Fail(absl::InvalidArgumentError(absl::StrCat("bad integer in ", s)));
      p->set_kind(parts[0] == "i32" ? v1::Param::INT32 : v1::Param::INT64);
      arg_kinds.push_back({false, v});
      continue;
    }
    BufferArg b;
    if (parts.size() < 3 || (parts[1] != "f32" && parts[1] != "i32") ||
        !absl::SimpleAtoi(parts[2], &b.count) || b.count == 0)
      return Fail(absl::InvalidArgumentError(absl::StrCat("bad argument spec \"", s, "\"")));
    b.access = parts[0];
    b.type = parts[1];
    if (parts.size() > 3) b.fill = parts[3];
    p->set_kind(v1::Param::BUFFER);
    if (b.access == "in") p->set_access(v1::Param::IN);
    else if (b.access == "out") p->set_access(v1::Param::OUT);
    else if (b.access == "inout") p->set_access(v1::Param::INOUT);
    else return Fail(absl::InvalidArgumentError(absl::StrCat("bad access in \"", s, "\"")));
    arg_kinds.push_back({true, int64_t(buffer_args.size())});
    buffer_args.push_back(b);
  }

  absl::StatusOr<Program> program = session->Load(spec);
  if (!program.ok()) return Fail(program.status());
  std::cout << absl::StrFormat("loaded %s: key %s, %s, %.3f s\n", spec.entry,
                               program->info().key().substr(0, 16),
                               program->info().cache_hit() ? "cache hit" : "compiled",
                               program->info().compile_seconds());
  std::vector<Buffer> buffers;
  for (const BufferArg& b : buffer_args) {
    absl::StatusOr<Buffer> buf = session->Alloc(b.count * 4);
    if (!buf.ok()) return Fail(buf.status());
    absl::StatusOr<std::vector<uint8_t>> bytes = FillBytes(b);
    if (!bytes.ok()) return Fail(bytes.status());
    if (absl::Status s = session->Write(*buf, 0, *bytes); !s.ok()) return Fail(s);
    buffers.push_back(std::move(*buf));
  }
  std::vector<KernelArg> args;
  for (auto [is_buffer, v] : arg_kinds) {
    if (is_buffer) args.push_back(View{&buffers[v]});
    else args.push_back(v);
  }
  std::array<uint64_t, 3> global = {1, 1, 1};
  std::vector<std::string> dims = absl::StrSplit(absl::GetFlag(FLAGS_global), ',');
  for (size_t i = 0; i < dims.size() && i < 3; ++i)
    if (!absl::SimpleAtoi(dims[i], &global[i]))
      return Fail(absl::InvalidArgumentError("bad --global"));
  absl::StatusOr<v1::LaunchReply> r = session->Launch(*program, args, global, {1, 1, 1}, true);
  if (!r.ok()) return Fail(r.status());
  std::cout << absl::StrFormat("launched %d invocations: %.3f ms on the device\n",
                               global[0] * global[1] * global[2], r->device_seconds() * 1e3);
  for (size_t i = 0; i < buffer_args.size(); ++i) {
    const BufferArg& b = buffer_args[i];
    if (b.access == "in") continue;
    std::vector<uint8_t> bytes(b.count * 4);
    if (absl::Status s = session->Read(buffers[i], 0, bytes); !s.ok()) return Fail(s);
    std::cout << absl::StrFormat("buffer %d (%s %s[%d]):", i, b.access, b.type, b.count);
    double sum = 0;
    for (uint64_t k = 0; k < b.count; ++k) {
      double v;
      if (b.type == "f32") { float f; std::memcpy(&f, &bytes[k * 4], 4); v = f; }
      else { int32_t n; std::memcpy(&n, &bytes[k * 4], 4); v = n; }
      sum += v;
      if (k < 8) std::cout << " " << v;
    }
    std::cout << (b.count > 8 ? " ..." : "") << absl::StrFormat("  (sum %g)\n", sum);
  }
  return 0;
}

}  // namespace
}  // namespace replayd::client

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(replayd::client::kUsage);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() < 2) {
    std::cerr << "replayctl " << absl::ProgramUsageMessage() << "\n\nreplayctl --help lists the flags too.\n";
    return 2;
  }
  replayd::client::ClientOptions client_options;
  client_options.token = absl::GetFlag(FLAGS_token);
  if (const char* env = std::getenv("REPLAYD_TOKEN"); client_options.token.empty() && env)
    client_options.token = env;
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  if (!absl::GetFlag(FLAGS_tls_ca).empty()) {
    client_options.tls_root_ca = read(absl::GetFlag(FLAGS_tls_ca));
    if (!absl::GetFlag(FLAGS_tls_cert).empty()) client_options.tls_cert = read(absl::GetFlag(FLAGS_tls_cert));
    if (!absl::GetFlag(FLAGS_tls_key).empty()) client_options.tls_key = read(absl::GetFlag(FLAGS_tls_key));
  }
  replayd::Client client = replayd::Client::Connect(absl::GetFlag(FLAGS_target), client_options);
  std::string command = positional[1];
  if (command == "stats") return replayd::client::Stats(absl::GetFlag(FLAGS_metrics));
  if (command == "devices") return replayd::client::Devices(client);
  if (command == "tenants") return replayd::client::Tenants(client);
  if (command == "sessions") return replayd::client::Sessions(client);
  if (command == "graphs") return replayd::client::Graphs(client);
  if (command == "drain") return replayd::client::Drain(client);
  if (command == "health" && positional.size() <= 3)
    return replayd::client::Health(client, positional.size() == 3 ? positional[2] : "");
  if (command == "close-session" && positional.size() == 3)
    return replayd::client::CloseAnySession(client, positional[2]);
  if (command == "run" && positional.size() == 3) return replayd::client::Run(client, positional[2]);
  if (command == "demo") {
    replayd::client::DemoOptions options;
    options.device = absl::GetFlag(FLAGS_device);
    options.tokens = absl::GetFlag(FLAGS_tokens);
    options.eager_steps = absl::GetFlag(FLAGS_eager_steps);
    absl::Status s = replayd::client::RunDemo(client, options, std::cout);
    return s.ok() ? 0 : replayd::client::Fail(s);
  }
  std::cerr << "replayctl: unknown command or wrong arguments: " << absl::StrJoin(positional.begin() + 1, positional.end(), " ")
            << "\n\nreplayctl " << absl::ProgramUsageMessage() << "\n";
  return 2;
}
