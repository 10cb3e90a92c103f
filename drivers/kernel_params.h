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

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
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

// OK when the kernel `entry`, whose image takes parameters of `taken` sizes in order, is
// declared with parameters of the same sizes by `signature`. The driver reads one
// argument pointer per parameter the kernel takes, and each parameter's bytes through
// it, whatever the signature says: a kernel that takes more or larger parameters than
// declared would have it read past the packed block. Otherwise INVALID_ARGUMENT naming
// `format` and both lists ("more than N" when `taken` has more than the signature).
absl::Status CheckParamSizes(absl::string_view format, absl::string_view entry, const Signature& signature,
                             std::span<const size_t> taken);

// INVALID_ARGUMENT when a block of `local` has more threads than `max_threads`, the most
// the kernel `entry` runs in one (`why`: where that limit comes from), which the driver
// would refuse only at the launch or a node's update, or not at all.
absl::Status CheckBlockThreads(absl::string_view entry, uint64_t max_threads, absl::string_view why,
                               const Dim3& local);

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_KERNEL_PARAMS_H_
