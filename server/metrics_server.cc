#include "server/metrics_server.h"

#include <httplib.h>

#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace replayd {

absl::StatusOr<std::pair<std::string, int>> ParseMetricsAddress(absl::string_view listen) {
  const size_t colon = listen.rfind(':');
  std::string host = colon == absl::string_view::npos ? "" : std::string(listen.substr(0, colon));
  const absl::string_view port_text = colon == absl::string_view::npos ? listen : listen.substr(colon + 1);
  int port = -1;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", listen.substr(0, 128), "\": want port, :port or host:port (port 0 to 65535)"));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) host = "127.0.0.1";
  return std::make_pair(host, port);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(absl::string_view listen,
                                                                    std::function<std::string()> text) {
  absl::StatusOr<std::pair<std::string, int>> address = ParseMetricsAddress(listen);
  if (!address.ok()) return address.status();
  auto [host, port] = *address;
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->http_ = std::make_unique<httplib::Server>();
  httplib::Server& http = *server->http_;
  http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  http.set_keep_alive_max_count(1);
  http.Get("/metrics", [text = std::move(text)](const httplib::Request&, httplib::Response& response) {
    response.set_content(text(), "text/plain; version=0.0.4; charset=utf-8");
  });
  const bool bound = port == 0 ? (port = http.bind_to_any_port(host)) > 0 : http.bind_to_port(host, port);
  if (!bound) return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", host, ":", port));
  server->address_ = absl::StrCat(host.find(':') == std::string::npos ? host : absl::StrCat("[", host, "]"), ":", port);
  server->thread_ = std::thread([&http] { http.listen_after_bind(); });
  // stop() ends the listening loop only once it runs: the destructor may come at once.
  while (!http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  spdlog::info("metrics on http://{}/metrics", server->address_);
  return server;
}

MetricsServer::~MetricsServer() {
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace replayd
