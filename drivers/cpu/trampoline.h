// The entry trampoline of a cpu-c program. Kernels keep natural C signatures such as
// `void add(float *out, const float *a, int n)`; the daemon appends a generated
// function with one fixed ABI that unpacks an argument array into that call:
//
//   void replayd_entry(const long long *args, int core_id);
//
// args[i] holds a buffer's address or an integer's value, in signature order. The
// trampoline is compiled in the same translation unit as the kernel, so the C compiler
// checks every argument against the kernel's declaration.
#ifndef REPLAYD_DRIVERS_CPU_TRAMPOLINE_H_
#define REPLAYD_DRIVERS_CPU_TRAMPOLINE_H_

#include <string>
#include "absl/strings/string_view.h"

#include "drivers/driver.h"

namespace replayd {

inline constexpr absl::string_view kTrampolineSymbol = "replayd_entry";

// The C source of the trampoline calling `entry` with `signature`. `entry` must be a
// C identifier (checked by the caller).
std::string GenerateTrampoline(absl::string_view entry, const Signature& signature);

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_CPU_TRAMPOLINE_H_
