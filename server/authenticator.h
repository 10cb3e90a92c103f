// Who is calling. With a tenants file, every call carries `authorization: Bearer <token>`
// and is the tenant whose token's SHA-256 the file lists; the comparison takes the same
// time whichever entry matches, or none. Without a file every caller is the tenant
// `default`, trusted and an admin, on every device and format, with the default quotas
// below and the daemon's isolation.
//
// Thread safety: thread-safe; Reload may run while calls authenticate.
#ifndef REPLAYD_SERVER_AUTHENTICATOR_H_
#define REPLAYD_SERVER_AUTHENTICATOR_H_

#include <array>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/engine.h"

namespace grpc {
class ServerContext;
}

namespace replayd {

struct Tenant {
  std::string name;
  std::vector<std::string> devices;  // empty: every device
  std::vector<std::string> formats;  // empty: every format
  bool trusted = false;              // may run in the daemon's process (Isolation::kShared)
  bool admin = false;                // may call the Admin service
  TenantLimits limits;               // quotas, weight, priority class
};

// PERMISSION_DENIED unless `tenant` may use `device`.
absl::Status CheckDevice(const Tenant& tenant, absl::string_view device);
// PERMISSION_DENIED unless `tenant` may load programs of `format`.
absl::Status CheckFormat(const Tenant& tenant, absl::string_view format);

// The quotas of the tenant `default`, every caller of a daemon without a tenants file: no
// memory quota (the devices' memory bounds it), and bounds on the host resources a
// client could otherwise take without end (each session, program and graph handle holds
// daemon memory; a program also a loaded module). A tenants file sets its own.
inline constexpr uint64_t kDefaultTenantSessions = 256;
inline constexpr uint64_t kDefaultTenantPrograms = 2048;
inline constexpr uint64_t kDefaultTenantGraphs = 2048;

// What a tenant gets where its policy says nothing: the daemon's --isolation and
// --max_launch_seconds. An untrusted tenant runs in a process of its own whatever
// `isolation` says.
struct TenantDefaults {
  Isolation isolation = Isolation::kProcess;
  absl::Duration max_launch = absl::Seconds(60);
};
inline constexpr uint32_t kMaxLaunchSeconds = 7 * 24 * 3600;  // the most a tenants file may set

class Authenticator {
 public:
  // Every caller is `default`, with the default quotas above.
  explicit Authenticator(TenantDefaults defaults = {});
  // The policies of the tenants file at `path`; INVALID_ARGUMENT naming the line of a
  // parse error, or the entry that is wrong (a bad digest, a name or token used twice,
  // ISOLATION_SHARED for a tenant that is not trusted, a value out of range).
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromFile(const std::filesystem::path& path,
                                                                 TenantDefaults defaults = {});

  // Reads the file again. On any error the policies in force stay and the error says why.
  // Sessions are not touched: a revoked tenant's open sessions live on until they close.
  absl::Status Reload();

  // The tenant of a call whose `authorization` metadata is `header` (empty when absent).
  // UNAUTHENTICATED for a missing, malformed or unknown token.
  absl::StatusOr<std::shared_ptr<const Tenant>> Authenticate(absl::string_view header) const;
  // The tenant of a call, from its metadata.
  absl::StatusOr<std::shared_ptr<const Tenant>> Authenticate(const grpc::ServerContext& context) const;
  // The limits of every tenant in force, for the engine.
  std::vector<TenantConfig> configs() const;

  bool open() const { return path_.empty(); }
  size_t tenant_count() const;

 private:
  struct Entry {
    std::array<uint8_t, 32> digest;
    std::shared_ptr<const Tenant> tenant;
  };
  static absl::StatusOr<std::vector<Entry>> Parse(const std::filesystem::path& path,
                                                  const TenantDefaults& defaults);

  const TenantDefaults defaults_;
  std::filesystem::path path_;
  std::shared_ptr<const Tenant> open_tenant_;
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace replayd

#endif  // REPLAYD_SERVER_AUTHENTICATOR_H_
