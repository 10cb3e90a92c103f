// Writing tenants files for tests: entries with the SHA-256 of a token, as operators write them.
#ifndef REPLAYD_TESTS_SUPPORT_TENANTS_FILE_H_
#define REPLAYD_TESTS_SUPPORT_TENANTS_FILE_H_

#include <openssl/evp.h>

#include <string>

#include "absl/strings/escaping.h"

namespace replayd {

inline std::string Sha256Hex(const std::string& token) {
  unsigned char d[32];
  unsigned int n = 0;
  EVP_Digest(token.data(), token.size(), d, &n, EVP_sha256(), nullptr);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(d), n));
}

// One `tenant { ... }` entry; `extra` is more fields in text format, one per line.
inline std::string TenantText(const std::string& name, const std::string& token, const std::string& extra) {
  return "tenant {\n  name: \"" + name + "\"\n  token_sha256: \"" + Sha256Hex(token) + "\"\n" + extra + "}\n";
}

}  // namespace replayd

#endif  // REPLAYD_TESTS_SUPPORT_TENANTS_FILE_H_
