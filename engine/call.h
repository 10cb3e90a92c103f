// One eager kernel launch as the engine receives it, and the checks that turn its
// arguments and dimensions into what a driver launches.
#ifndef REPLAYD_ENGINE_CALL_H_
#define REPLAYD_ENGINE_CALL_H_

#include <cstdint>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "drivers/driver.h"
#include "engine/handle_table.h"

namespace replayd {

// (buffer, byte offset, byte length); a length of 0 means "to the end of the buffer".
struct ViewArg {
  Handle buffer = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

using CallArg = std::variant<ViewArg, int64_t>;

struct LaunchOp {
  Handle program = 0;
  std::vector<CallArg> args;
  std::vector<uint64_t> global;  // up to 3; missing dimensions are 1
  std::vector<uint64_t> local;
  bool wait = false;
};

struct LaunchResult {
  std::optional<absl::Duration> device_time;
};

// The three dimensions of `dims` within `max` per dimension and `max_total` in product;
// INVALID_ARGUMENT naming `what` ("global", "local") and the value otherwise.
absl::StatusOr<Dim3> CheckDims(const std::vector<uint64_t>& dims, const Dim3& max,
                               uint64_t max_total, absl::string_view what);

// The byte range a view covers in a buffer of `size` bytes: (offset, length) with the
// zero length resolved, or INVALID_ARGUMENT when it is empty or out of range.
absl::StatusOr<std::pair<uint64_t, uint64_t>> ResolveView(const ViewArg& view, uint64_t size);

}  // namespace replayd

#endif  // REPLAYD_ENGINE_CALL_H_
