// The ELF bounds check a cubin or code object passes before a vendor loader (which takes
// no size) reads it, and the reader of a code object's metadata note (MessagePack) that
// HIP kernels' arguments and launch bounds are checked against: any bytes are judged
// without reading past them (AddressSanitizer checks the reads; the input lives in a
// buffer of exactly its size).
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "drivers/amdgpu_metadata.h"
#include "drivers/elf_image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<char[]> exact(new char[size]);
  if (size) std::memcpy(exact.get(), data, size);
  const absl::string_view image(exact.get(), size);
  replayd::CheckElfImage(image, replayd::kElfMachineCuda, "cuda-cubin").IgnoreError();
  replayd::CheckElfImage(image, replayd::kElfMachineAmdgpu, "hip-hsaco").IgnoreError();
  replayd::ReadAmdgpuKernelInfo(image, "scale", "hip-hsaco").IgnoreError();
  return 0;
}
