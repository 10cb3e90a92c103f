// The cpu-c compiler's containment with the real compiler and real files: the dependency
// and assembler checks (with and without the cage), the cage itself, the work directory and the
// environment.
#include "drivers/cpu/c_compiler.h"

#include <gmock/gmock.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

#include "drivers/confinement.h"
#include "tests/support/status_macros.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_binaries.h"

namespace replayd {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSecret[] = "REPLAYD-SECRET-7f3a9c";

std::string FirstLine(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::vector<std::string> Entries(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename());
  return names;
}

// A shell script as the compiler: it answers the include-directory question as the real
// compiler does, and runs `body` for every compile.
std::filesystem::path FakeCompiler(const std::filesystem::path& dir, const std::string& body) {
  const std::filesystem::path script = dir / "fake-cc";
  std::ofstream(script) << "#!/bin/sh\nif [ \"$2\" = -v ]; then exec cc \"$@\"; fi\n" << body << "\n";
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  return script;
}

// Each case runs without the cage (the dependency and assembler checks alone, as on a
// kernel without Landlock) and in it.
class CCompilerContainmentTest : public ::testing::TestWithParam<bool> {
 protected:
  CCompilerContainmentTest() {
    std::ofstream(secrets_.path() / "secret.h") << kSecret << " 'unterminated\n#include <no_such_header.h>\n";
  }

  CCompilerOptions Options(std::string compiler = "cc") const {
    CCompilerOptions options{std::move(compiler), absl::Seconds(30), {}};
    if (GetParam()) options.cage = testing::CcBinary();
    return options;
  }

  absl::Status Compile(const std::string& code, const CCompiler& compiler) {
    return compiler.Compile({"cpu-c", code, "k", {}, {}}, out_.path() / "k.so");
  }
  absl::Status Compile(const std::string& code) { return Compile(code, CCompiler(Options())); }

  TempDir secrets_;  // a directory the daemon can read, outside the system headers
  TempDir out_;      // where the artifact goes (the compile cache's place)
};

INSTANTIATE_TEST_SUITE_P(Cage, CCompilerContainmentTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Caged" : "Uncaged"; });

TEST_P(CCompilerContainmentTest, IncludesOutsideTheSystemHeadersAreRefusedWithoutQuotingThem) {
  const std::string secret = (secrets_.path() / "secret.h").string();
  const std::string passwd = FirstLine("/etc/passwd");
  const std::string hostname = FirstLine("/etc/hostname");
  for (const std::string& code : std::vector<std::string>{
           std::string("#include \"/etc/passwd\"\nvoid k(void) {}"),
           std::string("#include \"../../../../../../../../etc/hostname\"\nvoid k(void) {}"),
           std::string("#include \"/usr/include/../../etc/passwd\"\nvoid k(void) {}"),
           std::string("#define F \"/etc/passwd\"\n#include F\nvoid k(void) {}"),
           "#include \"" + secret + "\"\nvoid k(void) {}",
           // #line makes the diagnostics quote the file it names, included or not
           "#line 1 \"" + secret + "\"\nint x = ;\nvoid k(void) {}",
           std::string("# 1 \"/etc/passwd\"\nint x = ;\nvoid k(void) {}"),
       }) {
    absl::Status st = Compile(code);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << code << "\n" << st;
    const std::string message(st.message());
    EXPECT_THAT(message, AnyOf(HasSubstr("outside the system headers"), HasSubstr("Permission denied"))) << code;
    EXPECT_THAT(message, Not(HasSubstr(kSecret))) << code;
    EXPECT_THAT(message, Not(HasSubstr("no_such_header"))) << code;  // a line of secret.h
    if (!passwd.empty()) {
      EXPECT_THAT(message, Not(HasSubstr(passwd))) << code;
    }
    if (hostname.size() >= 4) {
      EXPECT_THAT(message, Not(HasSubstr(hostname))) << code;
    }
    EXPECT_TRUE(Entries(out_.path()).empty()) << code;  // no artifact, no work directory left
  }
}

// Inline assembly as C source writes it: `lines` inside __asm__("..."), each quote and
// backslash escaped.
std::string InlineAssembly(const std::string& lines) {
  std::string escaped;
  for (char c : lines) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  return "__asm__(\"" + escaped + "\");\nvoid k(void) {}";
}

// The assembler's own list of what it read is checked like the preprocessor's, so this
// holds without Landlock (uncaged) as in the cage, which refuses the read itself.
TEST_P(CCompilerContainmentTest, AssemblerDirectivesCannotReadOtherFiles) {
  const std::filesystem::path spaced = secrets_.path() / "a dir$ with space";
  std::filesystem::create_directory(spaced);
  std::ofstream(spaced / "secret.s") << kSecret << "\n";
  const std::string secret = (secrets_.path() / "secret.h").string();
  const std::string passwd = FirstLine("/etc/passwd");
  struct Case {
    std::string assembly;
    std::string named;  // the file an uncaged refusal names; empty where as fails first
  };
  for (const Case& c : std::vector<Case>{
           {".incbin \"/etc/passwd\"", "/etc/passwd"},
           {".incbin \"../../../../../../../../etc/hostname\"", "../../../../../../../../etc/hostname"},
           {".incbin \"" + secret + "\"", secret},
           {".incbin \"" + (spaced / "secret.s").string() + "\"", (spaced / "secret.s").string()},
           // a directive spelled by a macro, which no scan of the assembly would see
           {".macro m d\n.\\d \"" + secret + "\"\n.endm\nm incbin", secret},
           // the linker would print this section's bytes as a warning
           {".section .gnu.warning.k\n.incbin \"" + secret + "\"\n.text", secret},
           // as assembles the included lines and its errors quote them
           {".include \"/etc/passwd\"", ""},
           {".include \"" + secret + "\"", ""},
       }) {
    absl::Status st = Compile(InlineAssembly(c.assembly));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.assembly << "\n" << st;
    const std::string message(st.message());
    EXPECT_THAT(message, Not(HasSubstr(kSecret))) << c.assembly;
    EXPECT_THAT(message, Not(HasSubstr("unterminated"))) << c.assembly;  // secret.h's first line
    if (!passwd.empty()) {
      EXPECT_THAT(message, Not(HasSubstr(passwd))) << c.assembly;
    }
    if (!GetParam() && !c.named.empty()) {
      EXPECT_EQ(message, "cpu-c program's assembly reads a file outside the system headers: \"" + c.named + "\"");
    }
    EXPECT_TRUE(Entries(out_.path()).empty()) << c.assembly;
  }
}

TEST_P(CCompilerContainmentTest, InlineAssemblyStillWorksAndItsErrorsAreShown) {
  EXPECT_OK(Compile(InlineAssembly(".section .rodata\n.globl replayd_seven\nreplayd_seven: .quad 7\n.text")));
  EXPECT_OK(Compile(InlineAssembly(".section .rodata\n.incbin \"/usr/include/stdint.h\"\n.text")));
  // At file scope the assembler names the line of program.s; inside a function the
  // compiler's line markers make it name the line of program.c.
  absl::Status bad = Compile(InlineAssembly("no_such_instruction %eax"));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_THAT(std::string(bad.message()), HasSubstr("program.s:"));
  EXPECT_THAT(std::string(bad.message()), HasSubstr("no_such_instruction"));
  EXPECT_THAT(std::string(bad.message()), Not(HasSubstr("withheld")));
  EXPECT_THAT(std::string(bad.message()), Not(HasSubstr(out_.path().string())));
  absl::Status in_function = Compile("void k(void) {\n  __asm__(\"another_bad_instruction\");\n}");
  EXPECT_EQ(in_function.code(), absl::StatusCode::kInvalidArgument) << in_function;
  EXPECT_THAT(std::string(in_function.message()), HasSubstr("program.c:2: Error: no such instruction"));
  EXPECT_THAT(std::string(in_function.message()), Not(HasSubstr("withheld")));
}

// `--cpu_cc=clang`: clang names its preprocessor's pseudo-files its own way ("<command
// line>"), and its own assembler keeps no list of what it read, so it is told to use the
// system's; programs compile, and the check holds the same.
TEST(CCompilerClangTest, TheAssemblerCheckHoldsWithClang) {
  std::string clang;
  for (const char* candidate : {"/usr/bin/clang", "/usr/bin/clang-16", "/usr/bin/clang-14"})
    if (clang.empty() && access(candidate, X_OK) == 0) clang = candidate;
  if (clang.empty()) GTEST_SKIP() << "no clang in /usr/bin";
  TempDir out;
  for (bool caged : {false, true}) {
    CCompilerOptions options{clang, absl::Seconds(30), {}};
    if (caged) options.cage = testing::CcBinary();
    const CCompiler compiler(options);
    EXPECT_OK(compiler.Compile({"cpu-c", InlineAssembly(".section .rodata\nreplayd_seven: .quad 7\n.text"), "k", {}, {}},
                               out.path() / "k.so"))
        << (caged ? "caged" : "uncaged");
    EXPECT_TRUE(std::filesystem::exists(out.path() / "k.so"));
    std::filesystem::remove(out.path() / "k.so");
    absl::Status st = compiler.Compile({"cpu-c", InlineAssembly(".incbin \"/etc/passwd\""), "k", {}, {}},
                                       out.path() / "k.so");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    if (!caged) {
      EXPECT_EQ(st.message(), "cpu-c program's assembly reads a file outside the system headers: \"/etc/passwd\"");
    }
    EXPECT_TRUE(Entries(out.path()).empty());
  }
}

TEST_P(CCompilerContainmentTest, OnlyTheProgramIsNamedWhenTheCheckRefusesIt) {
  absl::Status st = Compile("#include \"../../../../../../../../etc/hostname\"\nvoid k(void) {}");
  if (!GetParam()) {
    EXPECT_EQ(st.message(), "cpu-c program includes a file outside the system headers: "
                            "\"../../../../../../../../etc/hostname\"");
  }
  EXPECT_THAT(std::string(st.message()), Not(HasSubstr(out_.path().string())));  // nor where it was compiled
}

TEST_P(CCompilerContainmentTest, SystemHeadersStillCompile) {
  absl::Status st = Compile(
      "#include <stdio.h>\n#include <math.h>\n#include <stdint.h>\n#include \"stddef.h\"\n"
      "volatile float sink;\nvoid k(void) { sink = sinf((float)INT32_MAX); printf(\"%zu\", sizeof(size_t)); }");
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_THAT(Entries(out_.path()), ::testing::ElementsAre("k.so"));  // the work directory is gone
}

TEST_P(CCompilerContainmentTest, ErrorsInTheProgramAreStillShown) {
  absl::Status missing = Compile("#include <no_such_header.h>\nvoid k(void) {}");
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("program.c:1"));
  EXPECT_THAT(std::string(missing.message()), HasSubstr("no_such_header.h"));
  absl::Status syntax = Compile("#include <stdio.h>\nvoid k(void) { undefined_name(); }");
  EXPECT_EQ(syntax.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(syntax.message()), HasSubstr("program.c:2"));
  EXPECT_THAT(std::string(syntax.message()), HasSubstr("undefined_name"));
  EXPECT_TRUE(Entries(out_.path()).empty());
}

TEST_P(CCompilerContainmentTest, TheCompilerGetsItsOwnEnvironment) {
  setenv("REPLAYD_DAEMON_ONLY", "daemon-value", 1);
  CCompiler compiler(Options(FakeCompiler(secrets_.path(), "env >&2; exit 1")));
  absl::Status st = Compile("void k(void) {}", compiler);
  unsetenv("REPLAYD_DAEMON_ONLY");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  const std::string message(st.message());
  EXPECT_THAT(message, HasSubstr("PATH=/usr/bin:/bin"));
  EXPECT_THAT(message, HasSubstr("LC_ALL=C"));
  EXPECT_THAT(message, HasSubstr("TMPDIR="));
  EXPECT_THAT(message, Not(HasSubstr("REPLAYD_DAEMON_ONLY")));
  EXPECT_THAT(message, Not(HasSubstr("HOME=")));
  EXPECT_TRUE(Entries(out_.path()).empty());
}

TEST_P(CCompilerContainmentTest, TimeLimitKillsTheCompiler) {
  CCompilerOptions options = Options(FakeCompiler(secrets_.path(), "exec sleep 30"));
  options.time_limit = absl::Seconds(2);
  CCompiler compiler(options);
  const absl::Time start = absl::Now();
  absl::Status st = Compile("void k(void) {}", compiler);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_TRUE(Entries(out_.path()).empty());
}

// The cage itself, on whatever it is asked to run.
class CompilerCageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!LandlockAvailable()) GTEST_SKIP() << "this kernel has no Landlock: the cage cannot confine file access";
  }

  ProcessResult Run(std::vector<std::string> command) {
    std::vector<std::string> argv = {testing::CcBinary(), "--work=" + work_.path().string(), "--"};
    argv.insert(argv.end(), command.begin(), command.end());
    ProcessOptions options;
    options.environment = {"PATH=/usr/bin:/bin"};
    options.directory = work_.path();
    absl::StatusOr<ProcessResult> result = RunProcess(argv, options);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : ProcessResult{};
  }

  TempDir work_;
  TempDir elsewhere_;
};

TEST_F(CompilerCageTest, ReadsOnlyTheToolchainAndWritesOnlyTheWorkDirectory) {
  std::ofstream(elsewhere_.path() / "secret") << kSecret;
  ProcessResult read_passwd = Run({"cat", "/etc/passwd"});
  EXPECT_NE(read_passwd.exit_code, 0);
  EXPECT_THAT(read_passwd.output, HasSubstr("Permission denied"));
  ProcessResult read_secret = Run({"cat", (elsewhere_.path() / "secret").string()});
  EXPECT_NE(read_secret.exit_code, 0);
  EXPECT_THAT(read_secret.output, Not(HasSubstr(kSecret)));
  const std::string outside = (elsewhere_.path() / "written").string();
  EXPECT_NE(Run({"sh", "-c", "echo x > " + outside}).exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(outside));

  // What a compile needs still works: the toolchain runs, the work directory is its own.
  ProcessResult inside = Run({"sh", "-c", "echo x > made && cat made && head -c 4 /usr/bin/env > copy"});
  EXPECT_EQ(inside.exit_code, 0) << inside.output;
  EXPECT_TRUE(std::filesystem::exists(work_.path() / "made"));
}

TEST_F(CompilerCageTest, NetworkSocketsAreRefused) {
  ProcessResult result = Run({"/usr/bin/python3", "-c", "import socket\nsocket.socket()"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_THAT(result.output, HasSubstr("Operation not permitted"));
}

TEST_F(CompilerCageTest, ACageThatCannotStartSaysSo) {
  ProcessResult result = Run({"/nonexistent/cc"});
  EXPECT_EQ(result.exit_code, kCageFailed);
  EXPECT_THAT(result.output, HasSubstr("cannot run /nonexistent/cc"));
}

// The cage runs in the compile's work directory: named by a path relative to the
// daemon's working directory (binaries run from a pack, tests/gpu/pack.sh), it is still
// found.
TEST(CCompilerCageTest, ACageNamedByARelativePathIsFound) {
  const std::filesystem::path cage = std::filesystem::absolute(testing::CcBinary());
  const std::filesystem::path before = std::filesystem::current_path();
  std::filesystem::current_path(cage.parent_path().parent_path());
  CCompilerOptions options;
  options.cage = cage.parent_path().filename() / cage.filename();  // server/replayd-cc, say
  const CCompiler compiler(options);
  std::filesystem::current_path(before);
  TempDir out;
  EXPECT_OK(compiler.Compile({"cpu-c", "void k(void) {}", "k", {}, {}}, out.path() / "k.so"));
  EXPECT_TRUE(std::filesystem::exists(out.path() / "k.so"));
}

}  // namespace
}  // namespace replayd
