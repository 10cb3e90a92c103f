#include "drivers/kernel_params.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace replayd {

size_t KernelParams::SizeOf(ParamKind kind) { return kind == ParamKind::kInt32 ? 4 : 8; }

void KernelParams::Layout(const Signature& signature) {
  kinds_.clear();
  offsets_.clear();
  pointers_.clear();
  size_ = 0;
  for (const Param& p : signature.params) {
    const size_t size = SizeOf(p.kind);
    size_ = (size_ + size - 1) / size * size;
    kinds_.push_back(p.kind);
    offsets_.push_back(size_);
    size_ += size;
  }
  block_.assign((size_ + 7) / 8 * 8, 0);
  for (size_t offset : offsets_) pointers_.push_back(block_.data() + offset);
}

bool KernelParams::Pack(std::span<const ArgValue> args) {
  bool changed = false;
  for (size_t i = 0; i < kinds_.size() && i < args.size(); ++i) {
    uint8_t* at = block_.data() + offsets_[i];
    const int32_t v32 = static_cast<int32_t>(args[i].integer);
    // A device address or an int64 are both 8 bytes.
    const void* from = kinds_[i] == ParamKind::kInt32 ? static_cast<const void*>(&v32) : &args[i];
    const size_t n = kinds_[i] == ParamKind::kInt32 ? 4 : 8;
    if (std::memcmp(at, from, n) == 0) continue;
    std::memcpy(at, from, n);
    changed = true;
  }
  return changed;
}

absl::Status CheckParamSizes(absl::string_view format, absl::string_view entry, const Signature& signature,
                             std::span<const size_t> taken) {
  std::vector<size_t> declared;
  for (const Param& p : signature.params) declared.push_back(KernelParams::SizeOf(p.kind));
  if (std::equal(declared.begin(), declared.end(), taken.begin(), taken.end())) return absl::OkStatus();
  auto list = [](std::span<const size_t> sizes) {
    if (sizes.empty()) return std::string("no parameters");
    return absl::StrCat(sizes.size(), sizes.size() == 1 ? " parameter (" : " parameters (", absl::StrJoin(sizes, ", "),
                        " bytes)");
  };
  const std::string takes =
      taken.size() > declared.size() ? absl::StrCat("more than ", declared.size(), " parameters") : list(taken);
  return absl::InvalidArgumentError(
      absl::StrCat(format, " kernel ", entry, " takes ", takes, "; its signature declares ", list(declared)));
}

absl::Status CheckBlockThreads(absl::string_view entry, uint64_t max_threads, absl::string_view why,
                               const Dim3& local) {
  const uint64_t threads = local[0] * local[1] * local[2];
  if (threads <= max_threads) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("kernel ", entry, " runs at most ", max_threads, " threads a block (",
                                                 why, "); local ", local[0], "x", local[1], "x", local[2], " is ",
                                                 threads));
}

}  // namespace replayd
