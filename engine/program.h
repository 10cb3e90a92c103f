// A loaded kernel and the checks on what a client asks to load.
#ifndef REPLAYD_ENGINE_PROGRAM_H_
#define REPLAYD_ENGINE_PROGRAM_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "drivers/driver.h"

namespace replayd {

// Limits on a program request; larger ones are INVALID_ARGUMENT.
inline constexpr size_t kMaxCodeBytes = 16 << 20;
inline constexpr size_t kMaxEntryLength = 256;
inline constexpr size_t kMaxOptions = 64;
inline constexpr size_t kMaxParamNameLength = 128;

struct Program {
  std::string key;  // content key of the compiled artifact
  std::string entry;
  std::unique_ptr<Kernel> kernel;
};

struct ProgramInfo {
  uint64_t handle = 0;
  std::string key;
  bool cache_hit = false;
  absl::Duration compile_time;
};

// OK when `source` may be compiled for `device`: a format the device accepts, a C
// identifier as entry, sizes within limits, and a well-formed signature (every buffer
// with an access mode, no integer with one, at most the device's argument limit,
// core_id only for cpu-c). Otherwise INVALID_ARGUMENT naming what is wrong.
absl::Status CheckProgramSource(const ProgramSource& source, const DeviceInfo& device);

}  // namespace replayd

#endif  // REPLAYD_ENGINE_PROGRAM_H_
