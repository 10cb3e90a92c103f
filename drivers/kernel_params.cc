#include "drivers/kernel_params.h"

#include <cstring>

namespace replayd {
namespace {

size_t SizeOf(ParamKind kind) { return kind == ParamKind::kInt32 ? 4 : 8; }

}  // namespace

KernelParams::KernelParams(const Signature& signature) {
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

void KernelParams::Pack(std::span<const ArgValue> args) {
  for (size_t i = 0; i < kinds_.size() && i < args.size(); ++i) {
    uint8_t* at = block_.data() + offsets_[i];
    if (kinds_[i] == ParamKind::kInt32) {
      const int32_t v = static_cast<int32_t>(args[i].integer);
      std::memcpy(at, &v, 4);
    } else {
      std::memcpy(at, &args[i], 8);  // a device address or an int64, both 8 bytes
    }
  }
}

}  // namespace replayd
