// Runs the system C compiler on a cpu-c program: validates the options a client may
// pass, appends the entry trampoline, and builds a shared object under a time limit.
//
// A client's source must not read the daemon's files, so each compile is contained:
// - it runs in a private work directory made for it beside the output (the source, the
//   compiler's temporary files and the shared object are written there; the directory is
//   removed afterwards, whatever the outcome), with an environment of its own (PATH,
//   TMPDIR set to the work directory, LC_ALL=C; nothing of the daemon's) and no
//   descriptors but /dev/null, its output and its diagnostics;
// - a dependency check: the preprocessor runs first, alone, with the same options, and
//   every file it enters or names (#include, #line) must be the program itself or lie
//   beneath the compiler's own system include directories (asked of it: `cc -E -v`),
//   after `..` and symbolic links are resolved. Anything else is refused, naming the file
//   as the program wrote it and never quoting it; the preprocessor's diagnostics are
//   shown only when every file it entered passed. This works on any kernel, and covers
//   what the preprocessor reads;
// - an assembler check: the compile runs in two steps (the program into assembly, the
//   assembly into the shared object), and the assembler's own list of every file it read
//   (--MD: `.incbin`, `.include`, however a macro spells them) is checked like the
//   preprocessor's before anything is shown or kept. When the assembler fails, only its
//   lines about the program are shown (an `.include`d file's lines would be quoted).
//   This works on any kernel too;
// - with a cage (CCompilerOptions::cage, replayd-cc: drivers/cpu/cc_main.cc), every run
//   of the compiler is confined by Landlock to reading the toolchain and the include
//   directories and writing the work directory, so neither an assembler directive nor a
//   subverted compiler reaches any other file; it also bounds the compiler's memory and
//   refuses it network sockets. Where the kernel has no Landlock the cage applies the
//   rest, and the constructor logs that the compiler is not confined.
// What stays visible either way: whether a path exists (__has_include, an assembler's
// "can't open") and a file's size (`.incbin` past its end); without Landlock also a
// file's modification time against the program's (#pragma GCC dependency).
#ifndef REPLAYD_DRIVERS_CPU_C_COMPILER_H_
#define REPLAYD_DRIVERS_CPU_C_COMPILER_H_

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "drivers/driver.h"

namespace replayd {

struct CCompilerOptions {
  std::string compiler = "cc";  // looked up in the daemon's PATH once
  absl::Duration time_limit = absl::Seconds(30);  // for the whole compile, every run
  // The cage program (replayd-cc) each run of the compiler starts in. Empty: the
  // compiler runs without Landlock (library use); the dependency check, the work
  // directory and the environment apply either way. The daemon always sets it. A
  // relative path is taken from the working directory at construction.
  std::filesystem::path cage = {};
};

// The cage's exit status when it could not confine itself (the compiler did not run);
// its standard error says why.
inline constexpr int kCageFailed = 125;

// replayd-cc beside the running program (/proc/self/exe), as the daemon is installed;
// empty when that cannot be read.
std::filesystem::path CageBesideThisProgram();

class CCompiler {
 public:
  // The optimization every cpu-c compile starts with (a client's -O option comes after
  // it and wins). -O3: GCC vectorizes loops only from -O3, where clang does from -O2.
  static constexpr char kOptimization[] = "-O3";

  // Logs a warning when a cage is given but this kernel has no Landlock.
  explicit CCompiler(CCompilerOptions options);

  // Compiles `source` into a shared object at `output`, by way of a work directory
  // beside it. INVALID_ARGUMENT with the compiler's diagnostics on a compile error or a
  // rejected option, or naming (as the program wrote it, never quoting it) the first file
  // the program includes, or its assembly reads, outside the system headers;
  // DEADLINE_EXCEEDED past the time limit (the compiler is killed); INTERNAL when the
  // compiler or its cage cannot be started. Thread-safe.
  absl::Status Compile(const ProgramSource& source,
                       const std::filesystem::path& output) const;

  // The compiler's identity for compile keys, e.g. "gcc 12.2.0 x86_64-linux-gnu".
  // Empty when the compiler cannot be run.
  std::string Identify() const;

  // OK when every option is one a client may pass (-O*, -ffast-math, -march=native,
  // -DNAME[=VALUE]); otherwise INVALID_ARGUMENT naming the option.
  static absl::Status CheckOptions(const std::vector<std::string>& options);

 private:
  // What the compiler says of itself (`cc -E -v`), asked once (a failure is not
  // remembered).
  struct Toolchain {
    std::vector<std::filesystem::path> include_dirs;  // its system include directories, resolved
    // Clang, not GCC: it is told to use the system's assembler (GNU as), whose --MD list
    // the assembler check reads (clang's own keeps none), and has no linker plugin.
    bool clang = false;
  };
  absl::StatusOr<Toolchain> AskToolchain(absl::Time deadline) const;
  // `argv` as run for a compile in `work`: inside the cage when there is one.
  std::vector<std::string> Caged(const std::filesystem::path& work,
                                 const std::vector<std::filesystem::path>& include_dirs,
                                 std::vector<std::string> argv) const;

  CCompilerOptions options_;
  std::string compiler_path_;  // options_.compiler found in PATH
  mutable absl::Mutex mu_;
  mutable std::optional<Toolchain> toolchain_ ABSL_GUARDED_BY(mu_);
};

struct ProcessOptions {
  absl::Duration time_limit = absl::Seconds(10);
  std::vector<std::string> environment;  // NAME=VALUE each: the whole environment
  std::filesystem::path directory;       // where it runs; empty: where this process does
  std::filesystem::path output_file;     // standard output, created; empty: with stderr
};

struct ProcessResult {
  int exit_code = -1;        // exit status, or -1 when killed by a signal
  bool timed_out = false;
  std::string output;        // stderr (and stdout unless sent to a file), capped at 64 KiB
};

// Runs argv (argv[0] looked up in this process's PATH) with standard input /dev/null and
// no other descriptors but standard output and error, in a process group of its own that
// is killed when the time limit passes. INTERNAL when it cannot be started.
absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv,
                                         const ProcessOptions& options);

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_CPU_C_COMPILER_H_
