// Runs the system C compiler on a cpu-c program: validates the options a client may
// pass, appends the entry trampoline, and builds a shared object under a time limit.
#ifndef REPLAYD_DRIVERS_CPU_C_COMPILER_H_
#define REPLAYD_DRIVERS_CPU_C_COMPILER_H_

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "drivers/driver.h"

namespace replayd {

struct CCompilerOptions {
  std::string compiler = "cc";
  absl::Duration time_limit = absl::Seconds(30);
};

class CCompiler {
 public:
  // The optimization every cpu-c compile starts with (a client's -O option comes after
  // it and wins). -O3: GCC vectorizes loops only from -O3, where clang does from -O2.
  static constexpr char kOptimization[] = "-O3";

  explicit CCompiler(CCompilerOptions options) : options_(std::move(options)) {}

  // Compiles `source` into a shared object at `output`. INVALID_ARGUMENT with the
  // compiler's diagnostics on a compile error or a rejected option; DEADLINE_EXCEEDED
  // past the time limit (the compiler is killed); INTERNAL when it cannot be started.
  absl::Status Compile(const ProgramSource& source,
                       const std::filesystem::path& output) const;

  // The compiler's identity for compile keys, e.g. "gcc 12.2.0 x86_64-linux-gnu".
  // Empty when the compiler cannot be run.
  std::string Identify() const;

  // OK when every option is one a client may pass (-O*, -ffast-math, -march=native,
  // -DNAME[=VALUE]); otherwise INVALID_ARGUMENT naming the option.
  static absl::Status CheckOptions(const std::vector<std::string>& options);

 private:
  CCompilerOptions options_;
};

struct ProcessResult {
  int exit_code = -1;        // exit status, or -1 when killed by a signal
  bool timed_out = false;
  std::string output;        // stdout and stderr together, capped at 64 KiB
};

// Runs argv (argv[0] looked up in PATH) with a time limit, killing its process group
// when the limit passes.
absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv,
                                         absl::Duration time_limit);

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_CPU_C_COMPILER_H_
