// NVRTC, loaded at run time (libnvrtc.so.13 or .12 of the CUDA toolkit): the
// compiler for cuda-c programs. It needs no GPU, so cuda-c sources are checked and turned
// into PTX or a cubin on any machine that has the toolkit's runtime libraries.
//
// Thread safety: thread-safe (NVRTC programs are independent).
#ifndef REPLAYD_DRIVERS_CUDA_NVRTC_H_
#define REPLAYD_DRIVERS_CUDA_NVRTC_H_

#include <nvrtc.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace replayd {

// What NVRTC makes: PTX for a virtual architecture (the driver JIT-compiles it at load),
// or a cubin of machine code for one real architecture (loaded as it is).
enum class NvrtcOutput { kPtx, kCubin };

struct NvrtcModule {
  std::string image;          // PTX text or a cubin ELF image
  std::string lowered_entry;  // the entry's name in the module (mangled unless extern "C")
  std::string log;            // the compiler's warnings, if any
};

class Nvrtc {
 public:
  // Opens the first of `candidates` that loads. UNAVAILABLE with the loader's reasons
  // when none does.
  static absl::StatusOr<std::unique_ptr<Nvrtc>> Load(const std::vector<std::string>& candidates =
                                                         Candidates(DefaultCudaRoots()));
  // The names NVRTC is looked for under, in order: the versioned sonames on the loader's
  // path, then absolute paths of them under each CUDA install (`cuda_roots` and their
  // versioned siblings, newest first: /usr/local/cuda-13.0), in lib64 and targets/*/lib.
  // The unversioned libnvrtc.so exists only with the -dev package and is not looked for.
  static std::vector<std::string> Candidates(const std::vector<std::filesystem::path>& cuda_roots);
  // $CUDA_HOME, $CUDA_PATH (when set) and /usr/local/cuda.
  static std::vector<std::filesystem::path> DefaultCudaRoots();
  // The library that was opened.
  const std::string& path() const { return path_; }
  ~Nvrtc();

  // "13.0".
  std::string version() const;

  // Compiles `source` for `arch` ("sm_90": PTX for compute_90, or a cubin for sm_90) and
  // returns the module and the lowered name of `entry`. INVALID_ARGUMENT carrying the
  // program log (with line numbers in "program.cu") on a compile error or an option
  // outside the allow-list (-DNAME[=VALUE], --use_fast_math, -lineinfo, --std=c++17,
  // --std=c++20).
  absl::StatusOr<NvrtcModule> Compile(const std::string& source, const std::string& entry, const std::string& arch,
                                      const std::vector<std::string>& options, NvrtcOutput output) const;

  static absl::Status CheckOptions(const std::vector<std::string>& options);

 private:
  Nvrtc() = default;
  void* handle_ = nullptr;
  std::string path_;

#define REPLAYD_NVRTC_ENTRY(name) decltype(&::name) name##_ = nullptr;
  REPLAYD_NVRTC_ENTRY(nvrtcVersion)
  REPLAYD_NVRTC_ENTRY(nvrtcGetErrorString)
  REPLAYD_NVRTC_ENTRY(nvrtcCreateProgram)
  REPLAYD_NVRTC_ENTRY(nvrtcDestroyProgram)
  REPLAYD_NVRTC_ENTRY(nvrtcAddNameExpression)
  REPLAYD_NVRTC_ENTRY(nvrtcCompileProgram)
  REPLAYD_NVRTC_ENTRY(nvrtcGetProgramLogSize)
  REPLAYD_NVRTC_ENTRY(nvrtcGetProgramLog)
  REPLAYD_NVRTC_ENTRY(nvrtcGetPTXSize)
  REPLAYD_NVRTC_ENTRY(nvrtcGetPTX)
  REPLAYD_NVRTC_ENTRY(nvrtcGetCUBINSize)
  REPLAYD_NVRTC_ENTRY(nvrtcGetCUBIN)
  REPLAYD_NVRTC_ENTRY(nvrtcGetLoweredName)
#undef REPLAYD_NVRTC_ENTRY
};

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_CUDA_NVRTC_H_
