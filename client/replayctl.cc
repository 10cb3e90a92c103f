// replayctl: the command-line client of replayd.
//
//   replayctl devices
//   replayctl run FILE.c --entry NAME --args SPECS --global N[,N,N] [--core_id]
//   replayctl demo
//   replayctl tenants                  (admin) tenants, usage against quotas, sessions
//   replayctl close-session ID         (admin) close any tenant's session (hex id)
//   replayctl stats --metrics ADDR     the daemon's metrics (its --metrics_listen), summed up
//
// SPECS for run is a comma-separated list, one per kernel argument in order:
//   in:f32:N[:FILL], out:f32:N, inout:f32:N[:FILL]   a buffer of N elements (f32 or i32)
//   i32:VALUE, i64:VALUE                             an integer
// FILL is zero (default), ramp (0, 1, 2, ...), rand, or a number.
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
ABSL_FLAG(std::string, args, "", "run: argument specs (see --help)");
ABSL_FLAG(std::string, global, "1", "run: global dimensions, N[,N,N]");
ABSL_FLAG(bool, core_id, false, "run: pass the invocation index as a trailing int");
ABSL_FLAG(std::vector<std::string>, options, {}, "run: compiler options");
ABSL_FLAG(int, tokens, 128, "demo: tokens to generate");
ABSL_FLAG(int, eager_steps, 32, "demo: decode steps run eagerly for comparison");
ABSL_FLAG(std::string, metrics, "127.0.0.1:9464",
          "stats: the daemon's metrics address (its --metrics_listen), host:port");

namespace replayd::client {
namespace {

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
  std::cout << absl::StrFormat("%-16s %-11s %6s %-22s %-9s %-9s %-9s %-9s %12s %10s %8s\n", "TENANT",
                               "CLASS", "WEIGHT", "MEMORY", "SESSIONS", "PROGRAMS", "GRAPHS",
                               "QUEUED", "DEVICE_MS", "ITEMS", "REJECTED");
  for (const v1::TenantStatus& t : *tenants) {
    std::cout << absl::StrFormat(
        "%-16s %-11s %6d %-22s %-9s %-9s %-9s %-9s %12.1f %10d %8d\n", t.name(),
        t.priority() == v1::PRIORITY_INTERACTIVE ? "interactive" : "batch", t.weight(),
        Quota(t.used().memory_bytes(), t.quotas().memory_bytes()),
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
  absl::SetProgramUsageMessage(
      "replayctl devices | run FILE.c --entry NAME --args SPECS --global N | demo | tenants | "
      "close-session ID | stats --metrics ADDR");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() < 2) {
    std::cerr << absl::ProgramUsageMessage() << "\n";
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
  std::cerr << absl::ProgramUsageMessage() << "\n";
  return 2;
}
