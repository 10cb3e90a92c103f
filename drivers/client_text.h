// Client text in error messages, bounded. A message that echoed a client's string whole
// would come back as large as the string (a 10 MiB format name made a 10 MiB message,
// which a default client refuses as oversized metadata), and the daemon would hold it
// meanwhile. Names are echoed up to 64 bytes, compiler logs up to 64 KiB.
#ifndef REPLAYD_DRIVERS_CLIENT_TEXT_H_
#define REPLAYD_DRIVERS_CLIENT_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace replayd {

inline constexpr size_t kMaxEchoedName = 64;
inline constexpr size_t kMaxEchoedLog = 64 << 10;

// `text` as it is when it has at most `max` bytes; otherwise its first `max` bytes and a
// note of how many there were.
inline std::string Echo(absl::string_view text, size_t max = kMaxEchoedName) {
  if (text.size() <= max) return std::string(text);
  return absl::StrCat(text.substr(0, max), "... (", text.size(), " bytes)");
}

// A compiler's log, at most kMaxEchoedLog bytes of it.
inline std::string EchoLog(absl::string_view log) { return Echo(log, kMaxEchoedLog); }

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_CLIENT_TEXT_H_
