// The tenants file parser: any text is either refused with a status naming what is
// wrong, or gives tenants whose quotas and weights the engine accepts.
#include <cstdint>
#include <fstream>
#include <string>

#include "server/authenticator.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/support/temp_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static replayd::TempDir* dir = new replayd::TempDir();
  const std::filesystem::path path = dir->path() / "tenants.textproto";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  absl::StatusOr<std::unique_ptr<replayd::Authenticator>> auth = replayd::Authenticator::FromFile(path);
  if (!auth.ok()) {
    FUZZ_CHECK(auth.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  for (const replayd::TenantConfig& c : (*auth)->configs()) FUZZ_CHECK(!c.name.empty());
  return 0;
}
