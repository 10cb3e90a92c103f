// The HTTP endpoint Prometheus scrapes: GET /metrics answers the daemon's metrics in the
// text exposition format; every other path is 404. Served by cpp-httplib on two threads
// of its own, one request per connection, so a scrape never waits on another client's
// idle connection.
#ifndef REPLAYD_SERVER_METRICS_SERVER_H_
#define REPLAYD_SERVER_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace httplib {
class Server;
}

namespace replayd {

// The host and port of a --metrics_listen value: "9090" and ":9090" are 127.0.0.1:9090;
// "host:port" and "[v6]:port" as given. INVALID_ARGUMENT for anything else (a port out of
// [0, 65535]; 0 picks a free one).
absl::StatusOr<std::pair<std::string, int>> ParseMetricsAddress(absl::string_view listen);

class MetricsServer {
 public:
  // Listens on `listen` (see ParseMetricsAddress) and answers each scrape with `text()`.
  // INVALID_ARGUMENT for a bad address, UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(absl::string_view listen,
                                                              std::function<std::string()> text);
  // Stops listening and waits for a scrape in progress.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // host:port with the port bound ("127.0.0.1:9464").
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::string address_;
};

}  // namespace replayd

#endif  // REPLAYD_SERVER_METRICS_SERVER_H_
