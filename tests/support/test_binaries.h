// The programs a unit test starts: replayd-executor and replayd-cc of this build, or the
// ones REPLAYD_TEST_EXECUTOR and REPLAYD_TEST_CC name. The sanitized builds name the
// plain build's: a sanitizer's runtime in a confined child needs what the confinement
// forbids (terabytes of address space for its shadow, /proc), while the daemon's side,
// the code under test, carries the sanitizer.
#ifndef REPLAYD_TESTS_SUPPORT_TEST_BINARIES_H_
#define REPLAYD_TESTS_SUPPORT_TEST_BINARIES_H_

#include <cstdlib>
#include <string>

namespace replayd::testing {

inline std::string ExecutorBinary() {
  const char* named = std::getenv("REPLAYD_TEST_EXECUTOR");
  return named != nullptr && *named != '\0' ? named : REPLAYD_EXECUTOR_BINARY;
}

inline std::string CcBinary() {
  const char* named = std::getenv("REPLAYD_TEST_CC");
  return named != nullptr && *named != '\0' ? named : REPLAYD_CC_BINARY;
}

}  // namespace replayd::testing

#endif  // REPLAYD_TESTS_SUPPORT_TEST_BINARIES_H_
