// Kernel arguments packed the way cuLaunchKernel and hipModuleLaunchKernel take them:
// each argument at its natural alignment in one block (a buffer as an 8-byte device
// pointer with the view offset applied, an int32 as 4 bytes, an int64 as 8), and an array
// of pointers into that block, one per argument. Laid out once per signature; packing
// writes values in place, so a device graph node can be patched without reallocating.
#ifndef REPLAYD_DRIVERS_KERNEL_PARAMS_H_
#define REPLAYD_DRIVERS_KERNEL_PARAMS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "drivers/driver.h"

namespace replayd {

class KernelParams {
 public:
  KernelParams() = default;  // no arguments until Layout
  explicit KernelParams(const Signature& signature) { Layout(signature); }
  KernelParams(const KernelParams&) = delete;  // pointers() points into this object
  KernelParams& operator=(const KernelParams&) = delete;

  // The bytes an argument of `kind` takes: 8 for a buffer's address and an int64, 4 for
  // an int32.
  static size_t SizeOf(ParamKind kind);

  // Lays the block out for `signature`, zeroed, reusing the storage it has: an eager
  // launch packs into one thread's KernelParams without allocating once it has grown.
  void Layout(const Signature& signature);

  // Writes `args` (one per signature param, checked by the caller) into the block. True
  // when a byte changed, so a device graph skips patching a node whose values are the same.
  bool Pack(std::span<const ArgValue> args);

  // kernelParams for the launch: pointers()[i] addresses argument i in the block.
  void** pointers() { return pointers_.data(); }
  std::span<const uint8_t> block() const { return {block_.data(), size_}; }
  size_t offset(size_t i) const { return offsets_[i]; }
  size_t size() const { return size_; }

 private:
  std::vector<ParamKind> kinds_;
  std::vector<size_t> offsets_;
  size_t size_ = 0;
  std::vector<uint8_t> block_;  // 8-byte aligned storage of size_ bytes
  std::vector<void*> pointers_;
};

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_KERNEL_PARAMS_H_
