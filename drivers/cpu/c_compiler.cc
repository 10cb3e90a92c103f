#include "drivers/cpu/c_compiler.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "drivers/client_text.h"
#include "drivers/confinement.h"
#include "drivers/cpu/trampoline.h"
#include "spdlog/spdlog.h"

namespace replayd {
namespace {

constexpr size_t kMaxOutput = 64 * 1024;

// The names of a compile's files in its work directory. The compiler runs there, so its
// diagnostics name the program as the client knows it.
constexpr char kSourceName[] = "program.c";
constexpr char kPreprocessedName[] = "program.i";
constexpr char kAssemblyName[] = "program.s";
constexpr char kAssemblerReadsName[] = "program.as.d";  // the assembler's --MD list
constexpr char kSharedObjectName[] = "program.so";
// Names the preprocessor gives to what is no file: GCC's, then clang's.
constexpr absl::string_view kPseudoFiles[] = {"<built-in>", "<command-line>", "<command line>", "<scratch space>"};

// The environment every run of the compiler gets, whatever the daemon's.
std::vector<std::string> CompilerEnvironment(const std::filesystem::path& work) {
  std::vector<std::string> env = {"PATH=/usr/bin:/bin", "LC_ALL=C"};
  if (!work.empty()) env.push_back(absl::StrCat("TMPDIR=", work.string()));
  return env;
}

// `name` found in PATH as execvp would find it; `name` itself when it has a slash or is
// not found (running it then fails and says so).
std::string FindProgram(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return name;
}

bool IsBeneath(const std::filesystem::path& path, const std::filesystem::path& dir) {
  return std::mismatch(dir.begin(), dir.end(), path.begin(), path.end()).first == dir.end();
}

// The file name of a preprocessor line marker (`# 12 "name" flags`), unquoted as GCC and
// clang quote it (a backslash before `\` and `"`, `\n` for a newline); nullopt for any
// other line. A marker cut short (no closing quote) gives what it has and `complete`
// false.
struct MarkedFile {
  std::string name;
  bool complete = false;
};
std::optional<MarkedFile> LineMarkerFile(absl::string_view line) {
  if (!absl::ConsumePrefix(&line, "# ")) return std::nullopt;
  size_t digits = 0;
  while (digits < line.size() && absl::ascii_isdigit(line[digits])) ++digits;
  if (digits == 0) return std::nullopt;
  line.remove_prefix(digits);
  if (!absl::ConsumePrefix(&line, " \"")) return std::nullopt;
  MarkedFile file;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '"') {
      file.complete = true;
      return file;
    }
    if (line[i] == '\\' && i + 1 < line.size()) {
      ++i;
      file.name += line[i] == 'n' ? '\n' : line[i];
    } else {
      file.name += line[i];
    }
  }
  return file;
}

// Whether the file a step of the compile named `name` (relative to `work`, where the
// compiler runs) is one of `own` (the compile's own files, canonical) or lies beneath one
// of `include_dirs`, after `..` and symbolic links are resolved; a name that does not
// resolve to an existing file is not.
bool IsHarmless(const std::string& name, const std::filesystem::path& work,
                const std::vector<std::filesystem::path>& own,
                const std::vector<std::filesystem::path>& include_dirs) {
  std::error_code ec;
  const std::filesystem::path path = std::filesystem::canonical(work / name, ec);
  if (ec) return false;
  return std::find(own.begin(), own.end(), path) != own.end() ||
         std::any_of(include_dirs.begin(), include_dirs.end(), [&](const auto& dir) { return IsBeneath(path, dir); });
}

// The first file that the preprocessed output at `preprocessed` (its line markers) names
// and that is not harmless (IsHarmless), as the preprocessor named it; nullopt when
// there is none.
absl::StatusOr<std::optional<std::string>> FirstFileOutside(
    const std::filesystem::path& preprocessed, const std::filesystem::path& work,
    const std::vector<std::filesystem::path>& own, const std::vector<std::filesystem::path>& include_dirs) {
  std::ifstream in(preprocessed, std::ios::binary);
  if (!in) return absl::InternalError(absl::StrCat("cannot read ", preprocessed.string()));
  absl::flat_hash_map<std::string, bool> inside;  // by name as marked
  std::string line;
  while (std::getline(in, line)) {
    std::optional<MarkedFile> marked = LineMarkerFile(line);
    if (!marked) continue;
    if (!marked->complete) return marked->name;  // a name that cannot be checked
    const std::string& name = marked->name;
    if (std::find(std::begin(kPseudoFiles), std::end(kPseudoFiles), name) != std::end(kPseudoFiles)) continue;
    auto [it, fresh] = inside.try_emplace(name, false);
    if (fresh) it->second = IsHarmless(name, work, own, include_dirs);
    if (!it->second) return name;
  }
  return std::nullopt;
}

// The files named by a make rule as GNU as writes one for --MD (`target: file file \`,
// continued over lines): white space separates names, and a space or tab preceded by
// 2N+1 backslashes is N backslashes and that character; `$$` is `$`. A name holding a
// newline (which as does not quote) comes back in pieces, each of which is checked.
std::vector<std::string> MakeRuleFiles(absl::string_view rule) {
  std::vector<std::string> files;
  std::string name;
  bool target = true;  // the first name, up to its colon, is what was built
  auto end_name = [&] {
    if (!name.empty() && !target) files.push_back(name);
    name.clear();
  };
  for (size_t i = 0; i < rule.size(); ++i) {
    const char c = rule[i];
    if (c == '\\') {
      size_t run = 0;
      while (i + run < rule.size() && rule[i + run] == '\\') ++run;
      const char next = i + run < rule.size() ? rule[i + run] : '\0';
      if (next == '\n') {  // a continuation: the backslash before it is no name's
        name.append(run - 1, '\\');
        i += run;
        end_name();
      } else if (next == ' ' || next == '\t') {
        name.append(run / 2, '\\');
        if (run % 2 == 1) name += next;
        i += run;
        if (run % 2 == 0) end_name();
      } else {
        name.append(run, '\\');
        i += run - 1;
      }
    } else if (c == '$' && i + 1 < rule.size() && rule[i + 1] == '$') {
      name += '$';
      ++i;
    } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      end_name();
    } else if (target && c == ':' && (i + 1 == rule.size() || rule[i + 1] == ' ' || rule[i + 1] == '\n')) {
      name.clear();
      target = false;
    } else {
      name += c;
    }
  }
  end_name();
  return files;
}

// The assembler's diagnostics as far as they are about the program: its assembly, or its
// source, to which the compiler's line markers around inline assembly attribute the
// lines. A line about any other file (one an `.include` entered) could quote that file,
// so it is left out and counted.
std::string AssemblerDiagnostics(absl::string_view output) {
  std::string shown;
  int withheld = 0;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, absl::StrCat(kAssemblyName, ":")) ||
        absl::StartsWith(line, absl::StrCat(kSourceName, ":"))) {
      absl::StrAppend(&shown, line, "\n");
    } else {
      ++withheld;
    }
  }
  if (withheld > 0) absl::StrAppend(&shown, "(", withheld, withheld == 1 ? " line" : " lines", " about other files withheld)\n");
  return shown;
}

// Removes the work directory's path from the compiler's diagnostics: the client knows
// its program as program.c and has no use for where the daemon keeps it.
std::string Diagnostics(absl::string_view output, const std::filesystem::path& work) {
  return EchoLog(absl::StrReplaceAll(output, {{absl::StrCat(work.string(), "/"), ""}}));
}

bool IsIdentifier(absl::string_view s) {
  if (s.empty() || absl::ascii_isdigit(s[0])) return false;
  for (char c : s)
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  return true;
}

bool IsMacroValue(absl::string_view s) {
  for (char c : s)
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != '-' && c != '+')
      return false;
  return true;
}

}  // namespace

absl::Status CCompiler::CheckOptions(const std::vector<std::string>& options) {
  static constexpr absl::string_view kAllowed[] = {
      "-O0", "-O1", "-O2", "-O3", "-Os", "-ffast-math", "-fno-fast-math", "-march=native"};
  for (const auto& option : options) {
    bool ok = false;
    for (auto allowed : kAllowed) ok = ok || option == allowed;
    if (!ok && absl::StartsWith(option, "-D")) {
      absl::string_view def = absl::string_view(option).substr(2);
      size_t eq = def.find('=');
      ok = IsIdentifier(def.substr(0, eq)) &&
           (eq == absl::string_view::npos || IsMacroValue(def.substr(eq + 1)));
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("option \"", Echo(option), "\" is not allowed for cpu-c"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv,
                                         const ProcessOptions& options) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!options.directory.empty())
    posix_spawn_file_actions_addchdir_np(&actions, options.directory.c_str());
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  if (options.output_file.empty()) {
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  } else {
    posix_spawn_file_actions_addopen(&actions, 1, options.output_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  }
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);  // nothing else of the daemon's
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);

  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> env;
  for (const auto& e : options.environment) env.push_back(const_cast<char*>(e.c_str()));
  env.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawnp(&pid, args[0], &actions, &attr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return absl::InternalError(absl::StrCat("cannot run ", argv[0], ": ", std::strerror(rc)));
  }

  ProcessResult result;
  absl::Time deadline = absl::Now() + options.time_limit;
  char chunk[4096];
  for (;;) {
    int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) {
      result.timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) continue;
    ssize_t got = read(fds[0], chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (result.output.size() < kMaxOutput)
      result.output.append(chunk, std::min<size_t>(got, kMaxOutput - result.output.size()));
  }
  close(fds[0]);
  if (result.timed_out) kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::filesystem::path CageBesideThisProgram() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : self.parent_path() / "replayd-cc";
}

CCompiler::CCompiler(CCompilerOptions options)
    : options_(std::move(options)), compiler_path_(FindProgram(options_.compiler)) {
  // The cage starts in the compile's work directory: a path relative to ours would miss.
  if (!options_.cage.empty()) {
    std::error_code ec;
    std::filesystem::path absolute = std::filesystem::absolute(options_.cage, ec);
    if (!ec) options_.cage = std::move(absolute);
  }
  if (!options_.cage.empty() && !LandlockAvailable())
    spdlog::warn("this kernel has no Landlock: the cpu-c compiler is not confined to the system headers "
                 "(the dependency and assembler checks, its work directory and its limits still apply)");
}

absl::StatusOr<CCompiler::Toolchain> CCompiler::AskToolchain(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  if (toolchain_) return *toolchain_;
  ProcessOptions run;
  run.time_limit = deadline - absl::Now();
  run.environment = CompilerEnvironment({});
  absl::StatusOr<ProcessResult> asked = RunProcess({compiler_path_, "-E", "-v", "-x", "c", "/dev/null"}, run);
  if (!asked.ok()) return asked.status();
  if (asked->timed_out)
    return absl::DeadlineExceededError(absl::StrCat("asking ", options_.compiler, " for its include directories exceeded ",
                                                    absl::FormatDuration(options_.time_limit)));
  if (asked->exit_code != 0)
    return absl::InternalError(absl::StrCat(options_.compiler, " -E -v failed:\n", EchoLog(asked->output)));
  // Between "#include ... search starts here:" and "End of search list.", one directory
  // a line, each indented by a space. Clang names itself ("Debian clang version 16.0.6").
  Toolchain toolchain;
  std::vector<std::filesystem::path>& dirs = toolchain.include_dirs;
  bool listing = false;
  for (absl::string_view line : absl::StrSplit(asked->output, '\n')) {
    if (!listing && absl::StrContains(line, "clang version")) toolchain.clang = true;
    if (absl::StartsWith(line, "#include ")) {
      listing = true;
    } else if (absl::StartsWith(line, "End of search list.")) {
      listing = false;
    } else if (listing && absl::ConsumePrefix(&line, " ")) {
      std::error_code ec;
      std::filesystem::path dir = std::filesystem::canonical(std::string(line), ec);
      if (!ec && dir != dir.root_path()) dirs.push_back(std::move(dir));  // never the whole tree
    }
  }
  if (dirs.empty())
    return absl::InternalError(absl::StrCat(options_.compiler, " -E -v lists no include directory:\n",
                                            EchoLog(asked->output)));
  toolchain_ = toolchain;
  return toolchain;
}

std::vector<std::string> CCompiler::Caged(const std::filesystem::path& work,
                                          const std::vector<std::filesystem::path>& include_dirs,
                                          std::vector<std::string> argv) const {
  if (options_.cage.empty()) return argv;
  std::vector<std::string> caged = {options_.cage.string(), absl::StrCat("--work=", work.string())};
  std::error_code ec;
  const std::filesystem::path compiler = std::filesystem::canonical(compiler_path_, ec);
  if (!ec) caged.push_back(absl::StrCat("--read=", compiler.string()));
  for (const auto& dir : include_dirs) caged.push_back(absl::StrCat("--read=", dir.string()));
  caged.push_back("--");
  caged.insert(caged.end(), argv.begin(), argv.end());
  return caged;
}

absl::Status CCompiler::Compile(const ProgramSource& source,
                                const std::filesystem::path& output) const {
  if (absl::Status s = CheckOptions(source.options); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + options_.time_limit;
  auto exceeded = [&] {
    return absl::DeadlineExceededError(absl::StrCat(
        "cpu-c compile of ", source.entry, " exceeded ", absl::FormatDuration(options_.time_limit)));
  };
  std::string pattern = absl::StrCat(output.string(), ".cc-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr)
    return absl::InternalError(absl::StrCat("cannot make a work directory ", pattern, ": ", std::strerror(errno)));
  const std::filesystem::path work = pattern;
  absl::Cleanup remove_work = [&] {
    std::error_code ignored;
    std::filesystem::remove_all(work, ignored);
  };
  const std::filesystem::path c_file = work / kSourceName;
  {
    std::ofstream out(c_file, std::ios::binary | std::ios::trunc);
    out << source.code << GenerateTrampoline(source.entry, source.signature);
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", c_file.string()));
  }
  absl::StatusOr<Toolchain> toolchain = AskToolchain(deadline);
  if (!toolchain.ok()) return toolchain.status();
  const std::vector<std::filesystem::path>& include_dirs = toolchain->include_dirs;

  std::vector<std::string> argv = {compiler_path_, "-std=gnu11", kOptimization, "-fPIC",
                                   "-shared", "-pthread", "-fvisibility=hidden",
                                   "-Werror=implicit-function-declaration",
                                   "-Werror=int-conversion",
                                   "-Werror=incompatible-pointer-types",
                                   "-Werror=return-type"};
  argv.insert(argv.end(), source.options.begin(), source.options.end());
  ProcessOptions run;
  run.environment = CompilerEnvironment(work);
  run.directory = work;
  auto failed = [&](absl::string_view diagnostics) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu-c compile of ", source.entry, " failed:\n", Diagnostics(diagnostics, work)));
  };
  auto outside = [&](absl::string_view what, const std::string& name) {
    absl::string_view shown = name;
    absl::ConsumePrefix(&shown, absl::StrCat(work.string(), "/"));
    return absl::InvalidArgumentError(absl::StrCat(what, " a file outside the system headers: \"", Echo(shown), "\""));
  };
  // One run of the compiler in its cage, within what is left of the time limit.
  auto step = [&](std::vector<std::string> args) -> absl::StatusOr<ProcessResult> {
    run.time_limit = deadline - absl::Now();
    absl::StatusOr<ProcessResult> ran = RunProcess(Caged(work, include_dirs, std::move(args)), run);
    if (!ran.ok()) return ran.status();
    if (ran->timed_out) return exceeded();
    if (ran->exit_code == kCageFailed && !options_.cage.empty())
      return absl::InternalError(absl::StrCat("cpu-c compiler cage failed: ", EchoLog(ran->output)));
    return ran;
  };
  std::error_code ec;
  std::vector<std::filesystem::path> own = {std::filesystem::canonical(c_file, ec)};

  // The dependency check: the preprocessor alone, with the same options, its output
  // (whose line markers name every file it entered) kept in the work directory and its
  // diagnostics shown only once every file it entered is known to be harmless to quote.
  std::vector<std::string> preprocess = argv;
  preprocess.insert(preprocess.end(), {"-E", kSourceName});
  run.output_file = work / kPreprocessedName;
  absl::StatusOr<ProcessResult> deps = step(std::move(preprocess));
  run.output_file.clear();
  if (!deps.ok()) return deps.status();
  absl::StatusOr<std::optional<std::string>> included =
      FirstFileOutside(work / kPreprocessedName, work, own, include_dirs);
  if (!included.ok()) return included.status();
  if (*included) return outside("cpu-c program includes", **included);
  // Exit status 1 is the compiler's for errors in the program; anything else (a signal,
  // an internal error) may have cut its output short, so its diagnostics stay unread.
  if (deps->exit_code == 1) return failed(deps->output);
  if (deps->exit_code != 0)
    return absl::InvalidArgumentError(absl::StrCat("cpu-c compile of ", source.entry,
                                                   " failed: the preprocessor ended abnormally (status ",
                                                   deps->exit_code, ")"));
  std::filesystem::remove(work / kPreprocessedName, ec);

  // The program into assembly: the compiler proper reads what the preprocessor read.
  std::vector<std::string> compile = argv;
  if (toolchain->clang) compile.push_back("-fno-integrated-as");
  compile.insert(compile.end(), {"-S", "-o", kAssemblyName, kSourceName});
  absl::StatusOr<ProcessResult> compiled = step(std::move(compile));
  if (!compiled.ok()) return compiled.status();
  if (compiled->exit_code != 0) return failed(compiled->output);

  // The assembly into the shared object, with the assembler's own list of every file it
  // read (`.include`, `.incbin`, however a macro spells them), which it writes only when
  // it succeeds. Without the list the assembler failed, and only its lines about the
  // program are shown; with it, the list is checked like the preprocessor's before
  // anything is shown (the linker prints a `.gnu.warning` section's bytes) or kept. This
  // holds without Landlock too. No linker plugin (GCC's): nothing in the object starts a
  // program.
  std::vector<std::string> build = {compiler_path_, "-shared", "-pthread",
                                    toolchain->clang ? "-fno-integrated-as" : "-fno-use-linker-plugin"};
  build.insert(build.end(), {absl::StrCat("-Wa,--MD,", kAssemblerReadsName), "-o", kSharedObjectName, kAssemblyName, "-lm"});
  absl::StatusOr<ProcessResult> built = step(std::move(build));
  if (!built.ok()) return built.status();
  std::ifstream reads_file(work / kAssemblerReadsName, std::ios::binary);
  if (!reads_file && built->exit_code != 0) return failed(AssemblerDiagnostics(built->output));
  const std::vector<std::string> read_files = MakeRuleFiles(
      std::string((std::istreambuf_iterator<char>(reads_file)), std::istreambuf_iterator<char>()));
  if (read_files.empty())  // no list, or an empty one, from an assembler that succeeded
    return absl::InternalError("the assembler listed no file it read (--MD): the assembly cannot be checked");
  own.push_back(std::filesystem::canonical(work / kAssemblyName, ec));
  for (const std::string& name : read_files)
    if (!IsHarmless(name, work, own, include_dirs)) return outside("cpu-c program's assembly reads", name);
  if (built->exit_code != 0) return failed(built->output);
  std::filesystem::rename(work / kSharedObjectName, output, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot move the shared object to ", output.string(), ": ", ec.message()));
  return absl::OkStatus();
}

std::string CCompiler::Identify() const {
  ProcessOptions run;
  run.environment = CompilerEnvironment({});
  absl::StatusOr<ProcessResult> version = RunProcess({compiler_path_, "--version"}, run);
  absl::StatusOr<ProcessResult> machine = RunProcess({compiler_path_, "-dumpmachine"}, run);
  if (!version.ok() || !machine.ok() || version->exit_code != 0 || machine->exit_code != 0)
    return "";
  std::string first_line = version->output.substr(0, version->output.find('\n'));
  return absl::StrCat(absl::StripAsciiWhitespace(first_line), " ",
                      absl::StripAsciiWhitespace(machine->output));
}

}  // namespace replayd
