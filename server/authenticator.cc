#include "server/authenticator.h"

#include <google/protobuf/io/tokenizer.h>
#include <grpcpp/grpcpp.h>
#include <google/protobuf/text_format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "replayd/v1/tenants.pb.h"

namespace replayd {
namespace {

std::array<uint8_t, 32> Sha256(absl::string_view data) {
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), out.data(), &len, EVP_sha256(), nullptr);
  return out;
}

class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (error.empty()) error = absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message);
  }
  std::string error;
};

bool Allowed(const std::vector<std::string>& list, absl::string_view item) {
  return list.empty() || std::find(list.begin(), list.end(), item) != list.end();
}

}  // namespace

absl::Status CheckDevice(const Tenant& tenant, absl::string_view device) {
  if (Allowed(tenant.devices, device)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("tenant ", tenant.name, " may not use device ", device.substr(0, 64)));
}

absl::Status CheckFormat(const Tenant& tenant, absl::string_view format) {
  if (!Allowed(tenant.formats, format))
    return absl::PermissionDeniedError(
        absl::StrCat("tenant ", tenant.name, " may not load programs of format ", format.substr(0, 64)));
  return absl::OkStatus();
}

namespace {

Tenant DefaultTenant(const TenantDefaults& defaults) {
  Tenant t{"default", {}, {}, /*trusted=*/true, /*admin=*/true, {}};
  t.limits.isolation = defaults.isolation;
  t.limits.max_launch = defaults.max_launch;
  t.limits.quotas[static_cast<size_t>(Resource::kSessions)] = kDefaultTenantSessions;
  t.limits.quotas[static_cast<size_t>(Resource::kPrograms)] = kDefaultTenantPrograms;
  t.limits.quotas[static_cast<size_t>(Resource::kGraphs)] = kDefaultTenantGraphs;
  return t;
}

}  // namespace

Authenticator::Authenticator(TenantDefaults defaults)
    : defaults_(defaults), open_tenant_(std::make_shared<const Tenant>(DefaultTenant(defaults))) {}

absl::StatusOr<std::vector<Authenticator::Entry>> Authenticator::Parse(const std::filesystem::path& path,
                                                                       const TenantDefaults& defaults) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read tenants file ", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  v1::TenantsFile file;
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text.str(), &file))
    return absl::InvalidArgumentError(absl::StrCat("tenants file ", path.string(), ": ", errors.error));
  std::vector<Entry> entries;
  absl::flat_hash_set<std::string> names, digests;
  for (int i = 0; i < file.tenant_size(); ++i) {
    const v1::TenantPolicy& p = file.tenant(i);
    const std::string where = absl::StrCat("tenants file ", path.string(), ": tenant ", i, " (", p.name(), ")");
    std::string digest;
    if (p.name().empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": no name"));
    if (p.token_sha256().size() != 64 || !std::all_of(p.token_sha256().begin(), p.token_sha256().end(), [](char c) { return absl::ascii_isxdigit(c); }))
      return absl::InvalidArgumentError(absl::StrCat(where, ": token_sha256 must be 64 hex digits"));
    digest = absl::HexStringToBytes(absl::AsciiStrToLower(p.token_sha256()));
    if (!names.insert(p.name()).second) return absl::InvalidArgumentError(absl::StrCat(where, ": name used twice"));
    if (!digests.insert(digest).second) return absl::InvalidArgumentError(absl::StrCat(where, ": token used twice"));
    if (p.weight() > kMaxWeight)
      return absl::InvalidArgumentError(absl::StrCat(where, ": weight ", p.weight(), " is not in [1, ", kMaxWeight, "]"));
    if (p.isolation() == v1::ISOLATION_SHARED && !p.trusted())
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": isolation ISOLATION_SHARED runs in the daemon's process and needs trusted: true"));
    if (p.isolation() != v1::ISOLATION_DEFAULT && p.isolation() != v1::ISOLATION_PROCESS &&
        p.isolation() != v1::ISOLATION_SHARED)
      return absl::InvalidArgumentError(absl::StrCat(where, ": isolation ", p.isolation(), " is not known"));
    if (p.max_launch_seconds() > kMaxLaunchSeconds)
      return absl::InvalidArgumentError(absl::StrCat(where, ": max_launch_seconds ", p.max_launch_seconds(),
                                                     " is more than ", kMaxLaunchSeconds));
    Tenant t{p.name(), {p.devices().begin(), p.devices().end()}, {p.formats().begin(), p.formats().end()},
             p.trusted(), p.admin(), {}};
    Isolation isolation = p.isolation() == v1::ISOLATION_DEFAULT ? defaults.isolation
                          : p.isolation() == v1::ISOLATION_SHARED ? Isolation::kShared
                                                                  : Isolation::kProcess;
    t.limits.isolation = p.trusted() ? isolation : Isolation::kProcess;
    t.limits.max_launch =
        p.max_launch_seconds() > 0 ? absl::Seconds(p.max_launch_seconds()) : defaults.max_launch;
    const v1::Quotas& q = p.quotas();
    t.limits.quotas = {q.memory_bytes(), q.sessions(), q.programs(), q.graphs(), q.queued(), q.host_bytes()};
    t.limits.weight = std::max<uint32_t>(p.weight(), 1);
    t.limits.priority = p.priority() == v1::PRIORITY_INTERACTIVE ? Priority::kInteractive : Priority::kBatch;
    Entry e;
    std::copy(digest.begin(), digest.end(), e.digest.begin());
    e.tenant = std::make_shared<const Tenant>(std::move(t));
    entries.push_back(std::move(e));
  }
  return entries;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromFile(const std::filesystem::path& path,
                                                                        TenantDefaults defaults) {
  absl::StatusOr<std::vector<Entry>> entries = Parse(path, defaults);
  if (!entries.ok()) return entries.status();
  auto a = std::make_unique<Authenticator>(defaults);
  a->path_ = path;
  absl::MutexLock lock(&a->mu_);
  a->entries_ = std::move(*entries);
  return a;
}

absl::Status Authenticator::Reload() {
  if (open()) return absl::OkStatus();
  absl::StatusOr<std::vector<Entry>> entries = Parse(path_, defaults_);
  if (!entries.ok()) return entries.status();
  absl::MutexLock lock(&mu_);
  entries_ = std::move(*entries);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Tenant>> Authenticator::Authenticate(absl::string_view header) const {
  if (open()) return open_tenant_;
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWith(header, kBearer) || header.size() == kBearer.size())
    return absl::UnauthenticatedError("a call needs metadata authorization: Bearer <token>");
  const std::array<uint8_t, 32> digest = Sha256(header.substr(kBearer.size()));
  std::shared_ptr<const Tenant> found;
  absl::MutexLock lock(&mu_);
  // Every entry is compared, in constant time each, whichever matches.
  for (const Entry& e : entries_)
    if (CRYPTO_memcmp(e.digest.data(), digest.data(), digest.size()) == 0) found = e.tenant;
  if (!found) return absl::UnauthenticatedError("unknown token");
  return found;
}

absl::StatusOr<std::shared_ptr<const Tenant>> Authenticator::Authenticate(
    const grpc::ServerContext& context) const {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  absl::string_view header;
  if (it != metadata.end()) header = absl::string_view(it->second.data(), it->second.size());
  return Authenticate(header);
}

std::vector<TenantConfig> Authenticator::configs() const {
  std::vector<TenantConfig> out;
  if (open()) return {{open_tenant_->name, open_tenant_->limits}};
  absl::MutexLock lock(&mu_);
  for (const Entry& e : entries_) out.push_back({e.tenant->name, e.tenant->limits});
  return out;
}

size_t Authenticator::tenant_count() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace replayd
