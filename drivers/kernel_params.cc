#include "drivers/kernel_params.h"

#include <cstring>

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

}  // namespace replayd
