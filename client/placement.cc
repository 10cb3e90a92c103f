#include "client/placement.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <future>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"

namespace replayd::client {
namespace {

using grpc::health::v1::HealthCheckResponse;

// The health service a daemon that takes sessions says SERVING for.
constexpr char kReplaydService[] = "replayd.v1.Replayd";

struct HostPort {
  std::string host, port;
};

absl::StatusOr<HostPort> SplitHostPort(absl::string_view target) {
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("daemon target \"", target, "\": ", why));
  };
  absl::string_view rest = target;
  if (!absl::ConsumePrefix(&rest, "dns:///")) absl::ConsumePrefix(&rest, "dns:");
  HostPort split;
  if (absl::ConsumePrefix(&rest, "[")) {
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) return refuse("no ']' after an IPv6 address");
    split.host = std::string(rest.substr(0, close));
    rest.remove_prefix(close + 1);
    if (!absl::ConsumePrefix(&rest, ":")) return refuse("no port (host:port)");
    split.port = std::string(rest);
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == absl::string_view::npos) return refuse("no port (host:port)");
    split.host = std::string(rest.substr(0, colon));
    split.port = std::string(rest.substr(colon + 1));
    if (absl::StrContains(split.host, ':')) return refuse("an IPv6 address goes in brackets: [address]:port");
  }
  int port = 0;
  if (!absl::SimpleAtoi(split.port, &port) || port < 1 || port > 65535) return refuse("the port is not 1 to 65535");
  if (split.host.empty()) return refuse("no host");
  return split;
}

// `address` (an IPv4 or IPv6 socket address) as a gRPC target with `port`.
std::string TargetOf(const sockaddr* address, const std::string& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, text, sizeof text);
    return absl::StrCat("[", text, "]:", port);
  }
  inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text, sizeof text);
  return absl::StrCat(text, ":", port);
}

// A resolved daemon: its address, and the host name its certificate is checked against.
struct Address {
  std::string target, host;
};

}  // namespace

absl::StatusOr<std::vector<std::string>> ResolveTarget(const std::string& target) {
  if (absl::StartsWith(target, "unix:")) return std::vector<std::string>{target};
  absl::StatusOr<HostPort> split = SplitHostPort(target);
  if (!split.ok()) return split.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(split->host.c_str(), split->port.c_str(), &hints, &found); error != 0)
    return absl::NotFoundError(absl::StrCat("daemon target \"", target, "\": ", gai_strerror(error)));
  std::vector<std::string> targets;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    std::string one = TargetOf(a->ai_addr, split->port);
    if (std::find(targets.begin(), targets.end(), one) == targets.end()) targets.push_back(std::move(one));
  }
  freeaddrinfo(found);
  if (targets.empty()) return absl::NotFoundError(absl::StrCat("daemon target \"", target, "\": no address"));
  return targets;
}

struct Daemons::State {
  std::vector<std::string> targets;
  DaemonsOptions options;
  absl::Mutex mu;
  std::map<std::string, Client> clients ABSL_GUARDED_BY(mu);  // by resolved target; channels kept
  uint64_t turn ABSL_GUARDED_BY(mu) = 0;                       // where ties start, one further each placement

  Client ClientFor(const Address& address) {
    absl::MutexLock lock(&mu);
    auto it = clients.find(address.target);
    if (it == clients.end()) {
      ClientOptions client = options.client;
      if (client.tls_server_name.empty()) client.tls_server_name = address.host;
      it = clients.emplace(address.target, Client::Connect(address.target, std::move(client))).first;
    }
    return it->second;
  }

  // Every target's addresses, and a state for each target that does not resolve.
  std::vector<Address> Resolve(std::vector<DaemonState>& unresolved) {
    std::vector<Address> addresses;
    for (const std::string& target : targets) {
      absl::StatusOr<std::vector<std::string>> resolved = ResolveTarget(target);
      if (!resolved.ok()) {
        unresolved.push_back({target, resolved.status(), {}});
        continue;
      }
      const absl::StatusOr<HostPort> split = SplitHostPort(target);
      const std::string host = split.ok() ? split->host : "";
      for (std::string& one : *resolved) {
        const bool seen = std::any_of(addresses.begin(), addresses.end(), [&](const Address& a) { return a.target == one; });
        if (!seen) addresses.push_back({std::move(one), host});
      }
    }
    return addresses;
  }

  DaemonState Probe(const Address& address) {
    DaemonState state{address.target, absl::OkStatus(), {}};
    Client client = ClientFor(address);
    absl::StatusOr<HealthCheckResponse::ServingStatus> health = client.Health(kReplaydService, options.probe_timeout);
    if (!health.ok()) {
      state.status = health.status();
    } else if (*health != HealthCheckResponse::SERVING) {
      state.status = absl::UnavailableError(*health == HealthCheckResponse::NOT_SERVING ? "draining" : "not serving");
    } else if (absl::StatusOr<std::vector<v1::Device>> devices = client.ListDevices(options.probe_timeout);
               devices.ok()) {
      state.devices = *std::move(devices);
    } else {
      state.status = devices.status();
    }
    return state;
  }
};

absl::StatusOr<Daemons> Daemons::Connect(const std::vector<std::string>& targets, DaemonsOptions options) {
  if (targets.empty()) return absl::InvalidArgumentError("no daemon targets");
  for (const std::string& target : targets) {
    if (absl::StartsWith(target, "unix:")) continue;
    if (absl::StatusOr<HostPort> split = SplitHostPort(target); !split.ok()) return split.status();
  }
  if (options.probe_timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError(absl::StrCat("probe timeout ", absl::FormatDuration(options.probe_timeout),
                                                   " is not positive"));
  auto state = std::make_shared<State>();
  state->targets = targets;
  state->options = std::move(options);
  return Daemons(std::move(state));
}

absl::StatusOr<std::vector<DaemonState>> Daemons::Survey() {
  std::vector<DaemonState> survey;
  const std::vector<Address> addresses = state_->Resolve(survey);
  if (addresses.empty()) {
    std::vector<std::string> why;
    for (const DaemonState& d : survey) why.push_back(std::string(d.status.message()));
    return absl::NotFoundError(absl::StrCat("no daemon target resolves: ", absl::StrJoin(why, "; ")));
  }
  std::vector<std::future<DaemonState>> probes;
  for (const Address& address : addresses)
    probes.push_back(std::async(std::launch::async, [this, &address] { return state_->Probe(address); }));
  std::vector<DaemonState> probed;
  for (auto& probe : probes) probed.push_back(probe.get());
  probed.insert(probed.end(), std::make_move_iterator(survey.begin()), std::make_move_iterator(survey.end()));
  return probed;
}

absl::StatusOr<PlacedSession> Daemons::OpenSession(const std::string& kind) {
  absl::StatusOr<std::vector<DaemonState>> survey = Survey();
  if (!survey.ok()) return survey.status();
  uint64_t turn = 0;
  {
    absl::MutexLock lock(&state_->mu);
    turn = state_->turn++;
  }
  struct Candidate {
    size_t daemon;
    const v1::Device* device;
  };
  std::vector<Candidate> candidates;
  std::vector<std::string> why;  // each daemon that cannot take the session, and why
  for (size_t i = 0; i < survey->size(); ++i) {
    const DaemonState& d = (*survey)[i];
    if (!d.status.ok()) {
      why.push_back(absl::StrCat(d.target, ": ", d.status.ToString()));
      continue;
    }
    size_t before = candidates.size();
    for (const v1::Device& device : d.devices)
      if (device.kind() == kind) candidates.push_back({i, &device});
    if (candidates.size() == before) why.push_back(absl::StrCat(d.target, ": no ", kind, " device"));
  }
  // Every daemon refused this client's credentials: that is the answer, not unavailability.
  const auto refuses_credentials = [](const DaemonState& d) {
    return d.status.code() == absl::StatusCode::kUnauthenticated ||
           d.status.code() == absl::StatusCode::kPermissionDenied;
  };
  if (candidates.empty() && std::all_of(survey->begin(), survey->end(), refuses_credentials))
    return absl::Status(survey->front().status.code(),
                        absl::StrCat("no daemon takes this client's sessions: ", absl::StrJoin(why, "; ")));
  const size_t n = survey->size();
  std::stable_sort(candidates.begin(), candidates.end(), [&](const Candidate& a, const Candidate& b) {
    if (a.device->free_memory() != b.device->free_memory()) return a.device->free_memory() > b.device->free_memory();
    return (a.daemon + n - turn % n) % n < (b.daemon + n - turn % n) % n;
  });
  std::vector<size_t> refused;  // daemons that refused a session: their other devices are not tried
  for (const Candidate& c : candidates) {
    if (std::find(refused.begin(), refused.end(), c.daemon) != refused.end()) continue;
    const DaemonState& d = (*survey)[c.daemon];
    Client client = state_->ClientFor({d.target, ""});
    absl::StatusOr<Session> session = client.OpenSession(c.device->id());
    if (session.ok()) return PlacedSession{*std::move(session), d.target, *c.device};
    const absl::StatusCode code = session.status().code();
    if (code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kResourceExhausted &&
        code != absl::StatusCode::kDeadlineExceeded)
      return absl::Status(code, absl::StrCat(d.target, ": ", session.status().message()));
    why.push_back(absl::StrCat(d.target, ": ", session.status().ToString()));
    refused.push_back(c.daemon);
  }
  return absl::UnavailableError(
      absl::StrCat("no daemon takes a session on a ", kind, " device: ", absl::StrJoin(why, "; ")));
}

absl::StatusOr<Client> Daemons::ClientOf(const std::string& target) {
  absl::MutexLock lock(&state_->mu);
  const auto it = state_->clients.find(target);
  if (it == state_->clients.end())
    return absl::NotFoundError(absl::StrCat("no daemon \"", target, "\" in this set's surveys"));
  return it->second;
}

}  // namespace replayd::client
