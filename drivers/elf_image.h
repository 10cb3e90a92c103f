// Bounds checks of an ELF module image before a vendor loader reads it. cuModuleLoadDataEx
// and hipModuleLoadData take a pointer and no size, so a truncated or crafted cubin or
// code object would make the loader read past the end of the client's bytes: every header
// and every section and segment the image describes must lie inside it first.
#ifndef REPLAYD_DRIVERS_ELF_IMAGE_H_
#define REPLAYD_DRIVERS_ELF_IMAGE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace replayd {

// ELF machine numbers of the GPU module images.
inline constexpr uint16_t kElfMachineCuda = 190;    // EM_CUDA: a cubin
inline constexpr uint16_t kElfMachineAmdgpu = 224;  // EM_AMDGPU: a HIP code object

// OK when `image` is a little-endian ELF64 image for `machine` whose file header, program
// headers, section headers, section contents (but those of SHT_NOBITS), segment contents
// and section-name table all lie inside `image`; otherwise INVALID_ARGUMENT naming
// `format` and the first thing that does not.
absl::Status CheckElfImage(absl::string_view image, uint16_t machine, absl::string_view format);

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_ELF_IMAGE_H_
