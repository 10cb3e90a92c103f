// The compile options a client may give a GPU program (cuda-c, hip-c): an allow-list, so
// that no option can read files of the daemon's host (include paths, pre-includes) or
// change where output goes.
#ifndef REPLAYD_DRIVERS_COMPILE_OPTIONS_H_
#define REPLAYD_DRIVERS_COMPILE_OPTIONS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace replayd {

bool IsIdentifier(absl::string_view s);

// OK when every option is -DNAME or -DNAME=VALUE (VALUE of letters, digits, _ . -) or
// one of `flags`; INVALID_ARGUMENT naming the first other option and `format`.
absl::Status CheckCompileOptions(const std::vector<std::string>& options, const std::vector<std::string>& flags,
                                 absl::string_view format);

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_COMPILE_OPTIONS_H_
