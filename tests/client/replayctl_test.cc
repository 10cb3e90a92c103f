// The replayctl program against a real daemon on loopback: --help documents every
// subcommand and run's --args with an example that runs as written; health, sessions,
// graphs and drain report what the daemon holds; bad commands and failures exit non-zero.
#include <gmock/gmock.h>

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/support/child_process.h"
#include "tests/support/status_macros.h"

namespace replayd::client {
namespace {

using ::testing::HasSubstr;

class ReplayctlTest : public DaemonFixture {
 protected:
  // replayctl `args` against the fixture's daemon (or `target`).
  Finished Replayctl(const std::vector<std::string>& args, std::string target = "") {
    std::vector<std::string> argv = {REPLAYCTL_BINARY,
                                     "--target=" + (target.empty() ? daemon_->address() : target)};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunToEnd(argv, dir_.path() / absl::StrCat("replayctl-", ++runs_, ".out"));
  }

  TempDir dir_;
  int runs_ = 0;
};

TEST_F(ReplayctlTest, HelpDocumentsEveryCommandAndTheArgsSyntax) {
  const Finished help = Replayctl({"--help"});
  EXPECT_TRUE(absl::StartsWith(help.output, "replayctl: [flags] COMMAND [ARG]: ")) << help.output;
  for (const char* command :
       {"devices", "run FILE.c", "demo", "health [SERVICE]", "tenants", "sessions", "graphs", "close-session ID",
        "drain", "stats"})
    EXPECT_THAT(help.output, HasSubstr(absl::StrCat("\n  ", command, " "))) << command;
  for (const char* spec : {"in:TYPE:N[:FILL]", "out:TYPE:N", "inout:TYPE:N[:FILL]", "i32:VALUE", "i64:VALUE"})
    EXPECT_THAT(help.output, HasSubstr(spec));
  EXPECT_THAT(help.output, HasSubstr("replayctl run add.c --entry add --args "));
  EXPECT_THAT(help.output, HasSubstr("--args"));  // the flag itself is listed too
  const Finished bare = Replayctl({});
  EXPECT_EQ(bare.code, 2);
  EXPECT_TRUE(absl::StartsWith(bare.output, "replayctl [flags] COMMAND [ARG]: ")) << bare.output;
  EXPECT_THAT(bare.output, HasSubstr("COMMANDS"));
  const Finished unknown = Replayctl({"frobnicate"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.output, HasSubstr("unknown command or wrong arguments: frobnicate"));
}

// The example in --help, run as it is written there: its kernel into add.c, its command
// line with this daemon as the target.
TEST_F(ReplayctlTest, TheHelpsExampleRunsAsWritten) {
  const std::string help = Replayctl({"--help"}).output;
  const size_t holding = help.find("With add.c holding\n"), adds = help.find("  this adds");
  ASSERT_NE(holding, std::string::npos) << help;
  ASSERT_NE(adds, std::string::npos) << help;
  const std::string kernel = help.substr(holding + 19, adds - holding - 19);
  std::ofstream(dir_.path() / "add.c") << kernel;
  std::vector<std::string> command;
  for (absl::string_view line : absl::StrSplit(help.substr(adds), '\n')) {
    line = absl::StripLeadingAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "replayctl run add.c ")) continue;
    command = {"run", (dir_.path() / "add.c").string()};
    for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) command.emplace_back(word);
    break;
  }
  ASSERT_FALSE(command.empty()) << help;
  const Finished ran = Replayctl(command);
  EXPECT_EQ(ran.code, 0) << ran.output;
  EXPECT_THAT(ran.output, HasSubstr("buffer 0 (out f32[1024]): 10 11 12 13 14 15 16 17 ...")) << ran.output;
}

TEST_F(ReplayctlTest, HealthSaysServingUntilTheDrain) {
  const Finished serving = Replayctl({"health"});
  EXPECT_EQ(serving.code, 0) << serving.output;
  EXPECT_EQ(serving.output, "SERVING\n");
  EXPECT_EQ(Replayctl({"health", "replayd.v1.Admin"}).code, 0);
  const Finished unknown = Replayctl({"health", "replayd.v1.NoSuchService"});
  EXPECT_EQ(unknown.code, 1);
  EXPECT_THAT(unknown.output, HasSubstr("NOT_FOUND"));

  Session session = Open();
  const Finished drain = Replayctl({"drain"});
  EXPECT_EQ(drain.code, 0) << drain.output;
  EXPECT_THAT(drain.output, HasSubstr("draining: 1 sessions open; the daemon stops within 30 s"));
  EXPECT_THAT(Replayctl({"drain"}).output, HasSubstr("draining already: 1 sessions open"));
  const Finished drained = Replayctl({"health"});
  EXPECT_EQ(drained.code, 3);
  EXPECT_EQ(drained.output, "NOT_SERVING\n");
  EXPECT_EQ(Replayctl({"health", "replayd.v1.Admin"}).code, 0);

  const std::string address = daemon_->address();
  daemon_.reset();  // nothing listens there now
  const Finished gone = Replayctl({"health"}, address);
  EXPECT_EQ(gone.code, 1);
  EXPECT_THAT(gone.output, HasSubstr("UNAVAILABLE"));
}

TEST_F(ReplayctlTest, SessionsAndGraphsShowWhatTheDaemonHolds) {
  Session session = Open();
  ASSERT_OK_AND_ASSIGN(Program affine,
                       session.Load({"cpu-c", kAffineSource, "affine", *ParseSignature("out,in,int32,int32"), {}}));
  ASSERT_OK_AND_ASSIGN(Buffer in, session.Alloc(64 * 4));
  ASSERT_OK_AND_ASSIGN(Buffer out, session.Alloc(64 * 4));
  const Variable k{"k", 0, 100, 1};
  // The same graph captured twice: one instantiation, then a cache hit.
  std::vector<Graph> graphs;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(session.BeginCapture({&in}, {k}).ok());
    LaunchSpec spec;
    spec.args = {View{&out}, View{&in}, int64_t{64}, Expr{"k"}};
    spec.variables = {{k, 3}};
    ASSERT_TRUE(session.Launch(affine, spec).ok());
    ASSERT_OK_AND_ASSIGN(Graph graph, session.EndCapture({&out}));
    graphs.push_back(std::move(graph));
  }

  const Finished sessions = Replayctl({"sessions"});
  EXPECT_EQ(sessions.code, 0) << sessions.output;
  EXPECT_THAT(sessions.output, HasSubstr("SESSION"));
  // SESSION TENANT DEVICE MEMORY_BYTES PROGRAMS GRAPHS LEASE_S: two buffers of 256 bytes,
  // one program, two graph handles.
  const std::string row = absl::StrFormat("%016x %-16s %-8s %14d %9d %7d ", session.id(), "default", "cpu:0", 512, 1, 2);
  EXPECT_THAT(sessions.output, HasSubstr(row)) << sessions.output;

  const Finished listed = Replayctl({"graphs"});
  EXPECT_EQ(listed.code, 0) << listed.output;
  std::vector<std::string> words;
  for (absl::string_view line : absl::StrSplit(listed.output, '\n'))
    if (absl::StartsWith(line, "default ")) words = absl::StrSplit(line, ' ', absl::SkipEmpty());
  // TENANT DEVICE GRAPHS BYTES HITS MISSES INSTANTIATIONS EVICTIONS
  ASSERT_EQ(words.size(), 8u) << listed.output;
  EXPECT_EQ(words[1], "cpu:0");
  EXPECT_EQ(words[2], "1");  // graphs cached
  EXPECT_EQ(words[4], "1");  // hits
  EXPECT_EQ(words[5], "1");  // misses
  EXPECT_EQ(words[6], "1");  // instantiations
  EXPECT_EQ(words[7], "0");  // evictions
}

}  // namespace
}  // namespace replayd::client
