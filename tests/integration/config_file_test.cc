// replayd --config: the file's settings take effect in a running daemon, flags given on
// the command line win, a bad file stops the daemon naming its line, column and field, and
// --print_config prints the effective config in a form --config reads back.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/flags/flag.h"
#include "client/client.h"
#include "server/config.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/text_format.h"
#include "replayd/v1/config.pb.h"
#include "tests/support/child_process.h"
#include "tests/support/free_port.h"
#include "tests/support/status_macros.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tenants_file.h"

ABSL_FLAG(int, config_test_flag, 0, "a flag of this file, which DaemonConfig does not hold");

namespace replayd {
namespace {

struct Exit {
  int code = -1;
  std::string out;  // stdout, or stdout and stderr together
  std::string err;
};

// Runs replayd with `args` to its exit; with `split`, its stderr apart from its stdout.
Exit RunReplayd(const TempDir& dir, std::vector<std::string> args, bool split = false) {
  args.insert(args.begin(), REPLAYD_BINARY);
  const auto out = dir.path() / "run.out", err = dir.path() / "run.err";
  Exit run;
  run.code = WaitExit(SpawnChild(args, out, split ? err : std::filesystem::path()));
  run.out = ReadWholeFile(out);
  if (split) run.err = ReadWholeFile(err);
  return run;
}

std::filesystem::path WriteFile(const TempDir& dir, const std::string& name, const std::string& text) {
  const auto path = dir.path() / name;
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

// Opens a session on cpu:0 with `token` once the daemon at `address` answers.
absl::StatusOr<client::Session> OpenWhenUp(const std::string& address, const std::string& token) {
  client::ClientOptions options;
  options.token = token;
  client::Client c = client::Client::Connect(address, options);
  absl::StatusOr<client::Session> session = absl::UnavailableError("not tried");
  for (int i = 0; i < 100; ++i) {
    session = c.OpenSession("cpu:0");
    if (session.status().code() != absl::StatusCode::kUnavailable) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return session;
}

// A daemon's config: the tenants file holding token "t", the cache in `dir`, on cpu only.
std::string ConfigText(const TempDir& dir, const std::string& listen, int lease_seconds) {
  const auto tenants = WriteFile(dir, "tenants.textproto", TenantText("alice", "t", "  trusted: true\n"));
  return absl::StrCat("# a test's daemon\n", "listen: \"", listen, "\"\n", "lease_seconds: ", lease_seconds, "\n",
                      "tenants: \"", tenants.string(), "\"\n", "cache_dir: \"", (dir.path() / "cache").string(),
                      "\"\n", "devices: \"cpu\"\n", "log_level: \"warn\"\n");
}

TEST(ConfigFileTest, TheFileSetsTheDaemonsFlags) {
  TempDir dir;
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  const auto config = WriteFile(dir, "replayd.conf", ConfigText(dir, address, 17));

  const Exit printed = RunReplayd(dir, {"--config=" + config.string(), "--print_config"}, /*split=*/true);
  ASSERT_EQ(printed.code, 0) << printed.out << printed.err;
  EXPECT_TRUE(absl::StrContains(printed.out, "lease_seconds: 17\n")) << printed.out;
  EXPECT_TRUE(absl::StrContains(printed.out, absl::StrCat("listen: \"", address, "\"\n"))) << printed.out;

  RunningChild daemon(SpawnChild({REPLAYD_BINARY, "--config=" + config.string()}, dir.path() / "log"));
  ASSERT_GT(daemon.pid(), 0);
  {
    ASSERT_OK_AND_ASSIGN(client::Session session, OpenWhenUp(address, "t"));
    EXPECT_EQ(session.lease_seconds(), 17u);
    // The tenants file the config names is in force: without its token the daemon refuses.
    EXPECT_EQ(OpenWhenUp(address, "").status().code(), absl::StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(daemon.Stop(SIGTERM), 0) << ReadWholeFile(dir.path() / "log");
}

TEST(ConfigFileTest, FlagsOnTheCommandLineWin) {
  TempDir dir;
  const std::string in_file = absl::StrCat("127.0.0.1:", FreePort());
  const std::string given = absl::StrCat("127.0.0.1:", FreePort());
  const auto config = WriteFile(dir, "replayd.conf", ConfigText(dir, in_file, 17));
  // Both orders and both spellings of --config: the command line wins wherever it stands.
  const Exit printed =
      RunReplayd(dir, {"--lease_seconds=23", "--config", config.string(), "--listen=" + given, "--print_config"},
                 /*split=*/true);
  ASSERT_EQ(printed.code, 0) << printed.out << printed.err;
  EXPECT_TRUE(absl::StrContains(printed.out, "lease_seconds: 23\n")) << printed.out;
  EXPECT_TRUE(absl::StrContains(printed.out, absl::StrCat("listen: \"", given, "\"\n"))) << printed.out;
  EXPECT_TRUE(absl::StrContains(printed.out, "devices: \"cpu\"\n")) << printed.out;  // the file's, not overridden

  RunningChild daemon(SpawnChild(
      {REPLAYD_BINARY, "-config=" + config.string(), "--listen=" + given, "--lease_seconds", "23"}, dir.path() / "log"));
  ASSERT_GT(daemon.pid(), 0);
  {
    ASSERT_OK_AND_ASSIGN(client::Session session, OpenWhenUp(given, "t"));
    EXPECT_EQ(session.lease_seconds(), 23u);
    // Nothing serves the file's address.
    EXPECT_EQ(client::Client::Connect(in_file).ListDevices().status().code(), absl::StatusCode::kUnavailable);
  }
  EXPECT_EQ(daemon.Stop(SIGTERM), 0) << ReadWholeFile(dir.path() / "log");
}

struct BadFile {
  std::string name;
  std::string text;
  std::string where;  // "LINE:COLUMN" the message must name
  std::string field;  // the field it must name
};

// The case's name, for the test's name in ctest.
void PrintTo(const BadFile& file, std::ostream* os) { *os << file.name; }

class BadConfigFileTest : public ::testing::TestWithParam<BadFile> {};

TEST_P(BadConfigFileTest, IsRefusedNamingItsLineColumnAndField) {
  TempDir dir;
  const auto config = WriteFile(dir, "replayd.conf", GetParam().text);
  for (bool print : {false, true}) {
    std::vector<std::string> args = {"--config=" + config.string(), "--cache_dir=" + (dir.path() / "c").string(),
                                     "--listen=127.0.0.1:0"};
    if (print) args.push_back("--print_config");
    const Exit run = RunReplayd(dir, args);
    EXPECT_EQ(run.code, 2) << run.out;
    EXPECT_TRUE(absl::StrContains(run.out, absl::StrCat(config.string(), ":", GetParam().where, ": field ",
                                                        GetParam().field, ": ")) ||
                absl::StrContains(run.out, absl::StrCat(config.string(), ":", GetParam().where, " sets ",
                                                        GetParam().field, ")")))
        << run.out;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Files, BadConfigFileTest,
    ::testing::Values(BadFile{"SyntaxError", "devices: \"cpu\"\nlease_seconds 17\n", "2:15", "lease_seconds"},
                      BadFile{"UnknownField", "devices: \"cpu\"\nlease_second: 17\n", "2:13", "lease_second"},
                      BadFile{"WrongType", "lease_seconds: \"soon\"\n", "1:16", "lease_seconds"},
                      BadFile{"OutOfItsType", "# big\n  lease_seconds: 99999999999\n", "2:18", "lease_seconds"},
                      BadFile{"GivenTwice", "lease_seconds: 1\nlease_seconds: 2\n", "2:14", "lease_seconds"},
                      BadFile{"ItsFlagRefusesIt", "devices: \"cpu\"\n\nscheduler_quantum: \"soon\"\n", "3:1",
                              "scheduler_quantum"},
                      BadFile{"OutOfRange", "devices: \"cpu\"\n  lease_seconds: 0\n", "2:3", "lease_seconds"},
                      // Named as the flag does not write it ("1ms"), and still pointed at.
                      BadFile{"OutOfRangeDuration", "batch_max_wait: \"0.000s\"\n", "1:1", "batch_max_wait"},
                      BadFile{"NotALogLevel", "log_level: \"loud\"\n", "1:1", "log_level"}),
    [](const ::testing::TestParamInfo<BadFile>& info) { return info.param.name; });

// The daemon checks at start that its flags and DaemonConfig agree; here the flags of this
// file stand for the daemon's.
TEST(ConfigMatchesFlagsTest, AFlagWithoutAFieldIsNamed) {
  const absl::Status without_field = CheckConfigMatchesFlags(__FILE__, {});
  EXPECT_EQ(without_field.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(without_field.message(), "--config_test_flag has no field in DaemonConfig"))
      << without_field;
  // Exempt, it passes to the fields, whose flags this file does not declare.
  const absl::Status without_flag = CheckConfigMatchesFlags(__FILE__, {"config_test_flag"});
  EXPECT_TRUE(absl::StrContains(without_flag.message(), "config field listen names no flag of")) << without_flag;
}

TEST(ConfigFileTest, AMissingFileOrADirectoryIsRefused) {
  TempDir dir;
  for (const std::filesystem::path& path : {dir.path() / "absent.conf", dir.path()}) {
    const Exit run = RunReplayd(dir, {"--config=" + path.string(), "--print_config"});
    EXPECT_EQ(run.code, 2) << run.out;
    EXPECT_TRUE(absl::StrContains(run.out, "cannot read config file " + path.string() + ": ")) << run.out;
  }
}

// --print_config gives every field, and its output read back with --config gives the same
// config again.
TEST(ConfigFileTest, PrintConfigRoundTrips) {
  TempDir dir;
  const Exit first = RunReplayd(dir,
                               {"--print_config", "--lease_seconds=29", "--scheduler_quantum=2ms", "--cpu_batch_idle=false",
                                "--listen=127.0.0.1:0", "--cpu_cc=cc -O1", "--graph_cache_bytes=1234567"},
                               /*split=*/true);
  ASSERT_EQ(first.code, 0) << first.out << first.err;
  v1::DaemonConfig config;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(first.out, &config)) << first.out;
  const google::protobuf::Descriptor& descriptor = *config.GetDescriptor();
  // Every field is printed but the drain's older name, folded into drain_seconds.
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor.field(i);
    if (field->name() == "shutdown_grace_seconds") continue;
    EXPECT_TRUE(config.GetReflection()->HasField(config, field)) << field->name();
  }
  EXPECT_FALSE(config.has_shutdown_grace_seconds());
  EXPECT_EQ(config.drain_seconds(), 30);
  EXPECT_EQ(config.lease_seconds(), 29);
  EXPECT_EQ(config.scheduler_quantum(), "2ms");
  EXPECT_FALSE(config.cpu_batch_idle());
  EXPECT_EQ(config.cpu_cc(), "cc -O1");
  EXPECT_EQ(config.graph_cache_bytes(), 1234567u);

  const auto file = WriteFile(dir, "printed.conf", first.out);
  const Exit second = RunReplayd(dir, {"--config=" + file.string(), "--print_config"}, /*split=*/true);
  ASSERT_EQ(second.code, 0) << second.out << second.err;
  EXPECT_EQ(second.out, first.out);
}

// --shutdown_grace_seconds, the drain's older name, is printed as the drain_seconds it sets.
TEST(ConfigFileTest, PrintConfigFoldsTheOlderDrainName) {
  TempDir dir;
  const Exit run = RunReplayd(dir, {"--print_config", "--shutdown_grace_seconds=7"}, /*split=*/true);
  ASSERT_EQ(run.code, 0) << run.out << run.err;
  v1::DaemonConfig config;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(run.out, &config)) << run.out;
  EXPECT_EQ(config.drain_seconds(), 7);
  EXPECT_FALSE(config.has_shutdown_grace_seconds());
}

// The example in deploy/ is a config the daemon accepts, as written.
TEST(ConfigFileTest, TheExampleFileIsAccepted) {
  TempDir dir;
  const std::string example = std::string(REPLAYD_SOURCE_DIR) + "/deploy/replayd.conf.example";
  const Exit run = RunReplayd(dir, {"--config=" + example, "--print_config"}, /*split=*/true);
  EXPECT_EQ(run.code, 0) << run.out << run.err;
  v1::DaemonConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(run.out, &config)) << run.out;
}

}  // namespace
}  // namespace replayd
