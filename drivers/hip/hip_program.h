// What a HIP device's Compile makes of a program source, without touching a GPU: hip-c
// compiled by hiprtc into a code object for the device's gfx target, with the kernel's
// lowered name; hip-hsaco checked for its form and passed on as it is.
#ifndef REPLAYD_DRIVERS_HIP_HIP_PROGRAM_H_
#define REPLAYD_DRIVERS_HIP_HIP_PROGRAM_H_

#include <string>

#include "absl/status/statusor.h"
#include "drivers/driver.h"
#include "drivers/hip/hip_library.h"
#include "drivers/module_artifact.h"

namespace replayd {

// The module for `source` on a device whose target is `arch` ("gfx90a:sramecc+:xnack-").
// INVALID_ARGUMENT with hiprtc's diagnostics for a hip-c source that does not compile,
// for an option outside the allow-list (-DNAME[=VALUE], -ffast-math, --std=c++17,
// --std=c++20), for options given to hip-hsaco and for a code object that is not an ELF
// image; FAILED_PRECONDITION for hip-c without hiprtc.
absl::StatusOr<ModuleArtifact> BuildHipModule(const ProgramSource& source, const HipLibrary& hip,
                                              const std::string& arch);

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_HIP_HIP_PROGRAM_H_
