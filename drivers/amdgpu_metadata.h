// What an AMDGPU code object says of a kernel, read from its metadata note: HIP has no
// query of a kernel's parameters or launch bounds (CUDA has cuFuncGetParamInfo and
// cuFuncGetAttribute), but the ROCm runtime reads both from this note, so replayd checks
// a signature and a block size against the same words before the runtime acts on them.
//
// The note is NT_AMDGPU_METADATA ("AMDGPU", type 32), a MessagePack map that code objects
// of version 3 and later carry (ROCm 4 onwards; the runtime needs it to launch anything):
// "amdhsa.kernels" is an array of maps, each with ".name", ".symbol" ("name.kd"),
// ".args" (maps with ".size", ".offset", ".value_kind"), ".max_flat_workgroup_size",
// ".kernarg_segment_size" and ".kernarg_segment_align".
#ifndef REPLAYD_DRIVERS_AMDGPU_METADATA_H_
#define REPLAYD_DRIVERS_AMDGPU_METADATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace replayd {

struct AmdgpuKernelInfo {
  // The sizes of the arguments a launch passes (kernelParams), in order: the explicit
  // ones. The runtime fills the hidden ones (".value_kind" hidden_*) itself.
  std::vector<size_t> arg_sizes;
  // Each explicit argument's ".value_kind": "global_buffer" for a pointer to global
  // memory, "by_value" for bytes passed as they are, and others LLVM may write.
  std::vector<std::string> arg_kinds;
  // The most work-items a work-group of the kernel may have (its launch bounds; LLVM's
  // default is 1024); 0 when the metadata does not say.
  uint64_t max_flat_workgroup_size = 0;
  // The bytes of the kernel's argument segment, hidden arguments included, and their
  // alignment: what the runtime allocates for each launch of it, and for each update of
  // a graph's node of it; 0 when the metadata does not say.
  uint64_t kernarg_segment_size = 0;
  uint64_t kernarg_segment_align = 0;
};

// What the metadata of `image` says of the kernel `entry` (its ".symbol" is entry.kd or
// its ".name" is entry). `image` is an ELF64 code object for EM_AMDGPU, or a clang
// offload bundle of them (every code object in it that describes the kernel must agree
// on its arguments; the smallest launch bounds and the largest argument segment count).
// Every read is bounds-checked, so any bytes may be passed. INVALID_ARGUMENT naming
// `format` when there is no metadata note, two notes differ, the note is not well-formed
// MessagePack of the form above, or no kernel of it is `entry` ("<format> program has no
// kernel named <entry>", as when the loader cannot find it).
absl::StatusOr<AmdgpuKernelInfo> ReadAmdgpuKernelInfo(absl::string_view image, absl::string_view entry,
                                                      absl::string_view format);

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_AMDGPU_METADATA_H_
