// replayd::client::Daemons: sessions placed across many daemons, one per node, for
// clients that outgrow one machine. The daemons are given as a list of addresses, or as a
// name that resolves to many (a Kubernetes headless Service lists every ready pod's
// address). Each session is opened on the daemon with the most free memory on a device of
// the kind asked for; it keeps its calls on that daemon for its life (a Session holds its
// daemon's channel). A daemon that is draining (health NOT_SERVING) or does not answer
// within the probe timeout is skipped.
//
// Thread safety: a Daemons may be shared between threads.
#ifndef REPLAYD_CLIENT_PLACEMENT_H_
#define REPLAYD_CLIENT_PLACEMENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"

namespace replayd::client {

struct DaemonsOptions {
  ClientOptions client;  // token, stream window and TLS, the same for every daemon
  // How long each daemon's health check and device list may take at a placement; a
  // daemon slower than this is skipped as unreachable.
  absl::Duration probe_timeout = absl::Seconds(2);
};

// One daemon as a placement found it.
struct DaemonState {
  std::string target;  // "10.0.0.7:7070", "[fd00::7]:7070", or the target as given
  // OK when the daemon takes sessions; else why it was skipped: UNAVAILABLE "draining"
  // (health NOT_SERVING) or the error of its health check or device list.
  absl::Status status;
  std::vector<v1::Device> devices;  // its ListDevices (empty unless status is OK)
};

// A session a placement opened, and where.
struct PlacedSession {
  Session session;
  std::string target;  // the daemon it runs on
  v1::Device device;   // the device it runs on, as listed when it was placed
};

class Daemons {
 public:
  // The daemons at `targets`. Each is "host:port", "[v6 address]:port" or
  // "dns:///host:port"; a host name stands for every address it resolves to, resolved
  // again at each placement (so pods that come and go are followed). A "unix:" target is
  // used as it is. With TLS, the daemons' certificates are checked against the host name
  // given (or options.client.tls_server_name). INVALID_ARGUMENT for an empty list or a
  // target without a port.
  static absl::StatusOr<Daemons> Connect(const std::vector<std::string>& targets, DaemonsOptions options = {});

  // Resolves the targets and asks every daemon, in parallel, for its health and devices.
  // NOT_FOUND when no target resolves to any address.
  absl::StatusOr<std::vector<DaemonState>> Survey();

  // Opens a session on a device of `kind` ("cpu", "cuda", "hip"): of the daemons that are
  // serving, the device with the most free memory (ties go round the daemons in turn). If
  // that daemon refuses the session as UNAVAILABLE or RESOURCE_EXHAUSTED (it began
  // draining, or its tenant quota is full), the next best is tried. UNAVAILABLE, naming
  // each daemon and why, when no serving daemon has such a device or all refused; any
  // other refusal of the session is returned as it is, and so is UNAUTHENTICATED or
  // PERMISSION_DENIED when every daemon answered the survey with it.
  absl::StatusOr<PlacedSession> OpenSession(const std::string& kind);

  // A client of one daemon of a survey, sharing this set's channels.
  absl::StatusOr<Client> ClientOf(const std::string& target);

 private:
  struct State;
  explicit Daemons(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

// `target` split into one target per address its host resolves to ("localhost:7070" ->
// "127.0.0.1:7070", "[::1]:7070"); a numeric address or a "unix:" target as it is.
// INVALID_ARGUMENT without a port; NOT_FOUND when the name does not resolve.
absl::StatusOr<std::vector<std::string>> ResolveTarget(const std::string& target);

}  // namespace replayd::client

#endif  // REPLAYD_CLIENT_PLACEMENT_H_
