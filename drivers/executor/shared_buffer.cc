#include "drivers/executor/shared_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace replayd::executor {
namespace {

absl::Status Errno(absl::string_view what, uint64_t bytes) {
  return absl::InternalError(absl::StrCat("shared buffer of ", bytes, " bytes: ", what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<SharedBuffer> SharedBuffer::Create(uint64_t bytes, SharedBufferBudget& budget) {
  if (bytes == 0) return absl::InvalidArgumentError("shared buffer of 0 bytes");
  if (!budget.Take()) return absl::UnavailableError("no shared buffer left in the daemon's budget");
  const int fd = memfd_create("replayd-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  absl::Status failed = absl::OkStatus();
  if (fd < 0) {
    failed = Errno("memfd_create", bytes);
  } else if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    failed = Errno("ftruncate", bytes);
  } else if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    failed = Errno("sealing", bytes);
  } else {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) return SharedBuffer(fd, static_cast<uint8_t*>(p), bytes, &budget);
    failed = Errno("mmap", bytes);
  }
  if (fd >= 0) close(fd);
  budget.Give();
  return failed;
}

SharedBuffer::SharedBuffer(SharedBuffer&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)), budget_(std::exchange(other.budget_, nullptr)) {}

SharedBuffer::~SharedBuffer() {
  CloseFd();
  if (data_) munmap(data_, bytes_);
  if (budget_) budget_->Give();
}

void SharedBuffer::CloseFd() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace replayd::executor
