#include "drivers/staging.h"

#include <algorithm>
#include <cstring>

namespace replayd {

bool PinnedRanges::Hold(const void* host, uint64_t bytes) const {
  const auto* p = static_cast<const uint8_t*>(host);
  return std::any_of(ranges_.begin(), ranges_.end(), [&](std::span<uint8_t> r) {
    return p >= r.data() && bytes <= r.size() && static_cast<uint64_t>(p - r.data()) <= r.size() - bytes;
  });
}

absl::Status StagedWrite(const Staging& s, std::span<const uint8_t> bytes) {
  for (uint64_t done = 0, i = 0; done < bytes.size(); done += s.chunk, i ^= 1) {
    const uint64_t n = std::min<uint64_t>(s.chunk, bytes.size() - done);
    if (absl::Status st = s.wait(static_cast<int>(i)); !st.ok()) return st;
    std::memcpy(s.buffers[i], bytes.data() + done, n);
    if (absl::Status st = s.copy(static_cast<int>(i), done, n); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status StagedRead(const Staging& s, std::span<uint8_t> bytes) {
  if (bytes.empty()) return absl::OkStatus();
  auto chunk_at = [&](uint64_t done) { return std::min<uint64_t>(s.chunk, bytes.size() - done); };
  if (absl::Status st = s.copy(0, 0, chunk_at(0)); !st.ok()) return st;
  for (uint64_t done = 0, i = 0; done < bytes.size(); done += s.chunk, i ^= 1) {
    const uint64_t n = chunk_at(done);
    if (done + n < bytes.size())
      if (absl::Status st = s.copy(static_cast<int>(i ^ 1), done + n, chunk_at(done + n)); !st.ok()) return st;
    if (absl::Status st = s.wait(static_cast<int>(i)); !st.ok()) return st;
    std::memcpy(bytes.data() + done, s.buffers[i], n);
  }
  return absl::OkStatus();
}

}  // namespace replayd
