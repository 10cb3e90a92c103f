// Faults against the daemon binary on loopback, with real clients and real files: a
// client killed mid-stream, mid-sequence and mid-transfer; a compile cache directory that
// is read-only, one that is full and one with a damaged artifact; sessions opened and
// abandoned by the thousand; the daemon killed and restarted under load. Each case checks
// the results and that the daemon comes back to what it held before.
//
//   REPLAYD_FAULT_ABANDONED  sessions opened and abandoned (2,000 under ctest; 10,000 by hand)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/integration/affine_work.h"
#include "tests/integration/daemon_processes.h"
#include "tests/support/child_process.h"
#include "tests/support/process_footprint.h"
#include "tests/support/status_macros.h"

namespace replayd::client {
namespace {

constexpr int kLeaseSeconds = 1;

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  int64_t n = 0;
  return v && absl::SimpleAtoi(v, &n) ? n : fallback;
}

// What the daemon holds for its clients: every tenant's sessions and memory, and cpu:0's
// free memory.
struct Held {
  std::vector<uint64_t> sessions;
  uint64_t memory_bytes = 0;
  uint64_t programs = 0;
  uint64_t graphs = 0;
  uint64_t free_memory = 0;
};

absl::StatusOr<Held> HeldBy(Client& admin) {
  absl::StatusOr<std::vector<v1::TenantStatus>> tenants = admin.ListTenants();
  if (!tenants.ok()) return tenants.status();
  Held held;
  for (const v1::TenantStatus& t : *tenants) {
    for (const v1::SessionUsage& s : t.sessions()) held.sessions.push_back(s.session());
    held.memory_bytes += t.used().memory_bytes();
    held.programs += t.used().programs();
    held.graphs += t.used().graphs();
  }
  absl::StatusOr<std::vector<v1::Device>> devices = admin.ListDevices();
  if (!devices.ok()) return devices.status();
  for (const v1::Device& d : *devices)
    if (d.id() == "cpu:0") held.free_memory = d.free_memory();
  return held;
}

// Waits (up to a minute) until the daemon holds only the sessions `open`; returns what it
// holds then, and how long that took.
absl::StatusOr<std::pair<Held, absl::Duration>> AwaitOnly(Client& admin, std::vector<uint64_t> open) {
  std::sort(open.begin(), open.end());
  const absl::Time start = absl::Now();
  for (;;) {
    absl::StatusOr<Held> held = HeldBy(admin);
    if (!held.ok()) return held.status();
    std::sort(held->sessions.begin(), held->sessions.end());
    if (held->sessions == open) return std::make_pair(*held, absl::Now() - start);
    if (absl::Now() - start > absl::Minutes(1))
      return absl::DeadlineExceededError(absl::StrCat(held->sessions.size(), " sessions still open after a minute"));
    absl::SleepFor(absl::Milliseconds(50));
  }
}

void ExpectBaseline(const Held& held, const Held& baseline) {
  EXPECT_TRUE(held.sessions.empty());
  EXPECT_EQ(held.memory_bytes, 0u);
  EXPECT_EQ(held.programs, 0u);
  EXPECT_EQ(held.graphs, 0u);
  EXPECT_EQ(held.free_memory, baseline.free_memory);
}

// A client that replays and checks in a thread of its own until stopped.
class Bystander {
 public:
  explicit Bystander(const std::string& address) : client_(Client::Connect(address)) {}
  ~Bystander() { Stop().IgnoreError(); }

  absl::Status Begin() {
    absl::StatusOr<std::unique_ptr<Work>> work = Work::Begin(client_);
    if (!work.ok()) return work.status();
    work_ = std::move(*work);
    thread_ = std::thread([this] {
      for (int64_t pos = 0; !stop_ && status_.ok(); pos = (pos + 1) % 1000) {
        status_ = work_->ReplayAndCheck(pos);
        if (status_.ok()) ++checked_;
      }
    });
    return absl::OkStatus();
  }
  uint64_t session() { return work_->session().id(); }
  // Stops replaying and closes the session; the first failure, if any.
  absl::Status Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (work_ && status_.ok()) status_ = work_->Close();
    work_.reset();
    return status_;
  }
  uint64_t checked() const { return checked_; }

 private:
  Client client_;
  std::unique_ptr<Work> work_;
  std::thread thread_;
  std::atomic<bool> stop_ = false;
  std::atomic<uint64_t> checked_ = 0;
  absl::Status status_;
};

// Waits (up to a minute) until `path` holds `text`.
bool AwaitText(const std::filesystem::path& path, absl::string_view text) {
  for (int i = 0; i < 1200; ++i) {
    if (absl::StrContains(ReadText(path), text)) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

size_t CountOf(absl::string_view text, absl::string_view what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != absl::string_view::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::vector<std::filesystem::path> ArtifactsIn(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (entry.path().extension() == ".artifact") found.push_back(entry.path());
  return found;
}

class FaultProcessTest : public ::testing::Test {
 protected:
  DaemonProcesses daemons_;
};

// A client killed with SIGKILL in the middle of its work: once its lease has passed, the
// daemon holds nothing of it, and a client beside it replays on unaffected.
class KilledClientTest : public FaultProcessTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(KilledClientTest, FreesEverythingAfterTheLeaseAndOthersCarryOn) {
  const DaemonProcess d = daemons_.Start({absl::StrCat("--lease_seconds=", kLeaseSeconds)});
  ASSERT_GT(d.pid, 0);
  Client admin = Client::Connect(d.address);
  ASSERT_OK_AND_ASSIGN(const Held baseline, HeldBy(admin));
  Bystander bystander(d.address);
  ASSERT_OK(bystander.Begin());

  const std::filesystem::path out = daemons_.dir() / absl::StrCat("client-", GetParam(), ".out");
  RunningChild child(SpawnChild({REPLAYD_FAULT_CLIENT_BINARY, d.address, GetParam()}, out));
  ASSERT_GT(child.pid(), 0);
  ASSERT_TRUE(AwaitText(out, "ready")) << ReadText(out);
  absl::SleepFor(absl::Milliseconds(200));  // well into its work
  ASSERT_OK_AND_ASSIGN(const Held during, HeldBy(admin));
  EXPECT_EQ(during.sessions.size(), 2u);  // the bystander's and the client's
  EXPECT_LT(during.free_memory, baseline.free_memory);
  ASSERT_EQ(waitpid(child.pid(), nullptr, WNOHANG), 0) << "the client ended by itself: " << ReadText(out);
  EXPECT_EQ(child.Stop(SIGKILL), -1);

  ASSERT_OK_AND_ASSIGN(const auto left, AwaitOnly(admin, {bystander.session()}));
  const uint64_t checked_before = bystander.checked();
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_GT(bystander.checked(), checked_before);  // still replaying after the reap
  EXPECT_OK(bystander.Stop());
  ASSERT_OK_AND_ASSIGN(const auto after, AwaitOnly(admin, {}));
  ExpectBaseline(after.first, baseline);
  std::printf(
      "killed %s client (%llu bytes held with the bystander's): freed %.2f s after the kill (lease %d s); "
      "the bystander checked %llu replays\n",
      GetParam(), static_cast<unsigned long long>(baseline.free_memory - during.free_memory),
      absl::ToDoubleSeconds(left.second), kLeaseSeconds, static_cast<unsigned long long>(bystander.checked()));
}

INSTANTIATE_TEST_SUITE_P(MidStreamSequenceAndWrite, KilledClientTest, ::testing::Values("stream", "sequence", "write"));

// A cache directory that refuses writes. Mode 0500 does for a user; root passes over mode
// bits, so as root the directory is made immutable (chattr +i), which fails every write
// in it with EPERM. Undone when the object goes.
class UnwritableDirectory {
 public:
  explicit UnwritableDirectory(std::filesystem::path path) : path_(std::move(path)) {
    std::filesystem::create_directories(path_);
    chmod(path_.c_str(), 0700);
    immutable_ = geteuid() == 0;
    const int rc = immutable_ ? std::system(absl::StrCat("chattr +i '", path_.string(), "' 2>/dev/null").c_str())
                              : chmod(path_.c_str(), 0500);
    ok_ = rc == 0 && !Writable();
  }
  ~UnwritableDirectory() {
    if (immutable_) std::system(absl::StrCat("chattr -i '", path_.string(), "' 2>/dev/null").c_str());
    chmod(path_.c_str(), 0700);
  }
  // Whether a file can be made in it: false once it refuses writes.
  bool Writable() const {
    const std::filesystem::path probe = path_ / "probe";
    if (!std::ofstream(probe)) return false;
    std::filesystem::remove(probe);
    return true;
  }
  bool ok() const { return ok_; }
  absl::string_view how() const { return immutable_ ? "chattr +i" : "mode 0500"; }

 private:
  const std::filesystem::path path_;
  bool immutable_ = false;
  bool ok_ = false;
};

// A file system of 64 KiB (tmpfs) filled to the last byte; root only. Unmounted when the
// object goes.
class FullFileSystem {
 public:
  explicit FullFileSystem(std::filesystem::path path) : path_(std::move(path)) {
    std::filesystem::create_directories(path_);
    mounted_ = mount("tmpfs", path_.c_str(), "tmpfs", 0, "size=64k,mode=0700") == 0;
    if (!mounted_) return;
    std::ofstream fill(path_ / "fill", std::ios::binary);
    const std::string block(4096, 'x');
    while (fill.write(block.data(), block.size())) fill.flush();
    fill.clear();
    fill.close();
    std::ofstream one_more(path_ / "probe");
    full_ = !(one_more << "x" << std::flush);
  }
  ~FullFileSystem() {
    if (mounted_) umount2(path_.c_str(), MNT_DETACH);
  }
  bool ok() const { return mounted_ && full_; }

 private:
  const std::filesystem::path path_;
  bool mounted_ = false;
  bool full_ = false;
};

// Programs compiled with a cache directory that cannot take them: three distinct programs
// load and compute, a second load of one finds it in this run, the daemon logs one line
// about the cache, and nothing is left in the directory.
void ExpectCompilesWithoutTheCache(DaemonProcesses& daemons, const std::filesystem::path& cache) {
  const DaemonProcess d = daemons.Start({"--cache_dir=" + cache.string()});
  ASSERT_GT(d.pid, 0);
  Client client = Client::Connect(d.address);
  for (int variant = 0; variant < 3; ++variant) {
    const std::string code = absl::StrCat(kAffineSource, "\n/* variant ", variant, " */\n");
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> work, Work::Begin(client, code));
    EXPECT_FALSE(work->program().info().cache_hit());
    EXPECT_OK(work->ReplayAndCheck(variant + 1));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> again, Work::Begin(client, code));
    EXPECT_TRUE(again->program().info().cache_hit());
    EXPECT_OK(again->ReplayAndCheck(variant + 7));
  }
  const std::string log = ReadText(d.log);
  EXPECT_EQ(CountOf(log, "cannot store artifacts"), 1u) << log;
  EXPECT_TRUE(ArtifactsIn(cache).empty());
  for (absl::string_view line : absl::StrSplit(log, '\n'))
    if (absl::StrContains(line, "cannot store artifacts")) std::printf("%.*s\n", static_cast<int>(line.size()), line.data());
}

TEST_F(FaultProcessTest, ReadOnlyCacheDirectoryStillCompilesAndSaysSoOnce) {
  const std::filesystem::path cache = daemons_.dir() / "read-only-cache";
  UnwritableDirectory read_only(cache);
  if (!read_only.ok()) GTEST_SKIP() << "cannot make " << cache << " refuse writes (" << read_only.how() << ")";
  ExpectCompilesWithoutTheCache(daemons_, cache);
}

TEST_F(FaultProcessTest, FullCacheFileSystemStillCompilesAndSaysSoOnce) {
  const std::filesystem::path cache = daemons_.dir() / "full-cache";
  FullFileSystem full(cache);
  if (!full.ok()) GTEST_SKIP() << "cannot mount a full tmpfs at " << cache << " (needs root)";
  ExpectCompilesWithoutTheCache(daemons_, cache);
}

// An artifact damaged between two runs of the daemon (cut short, overwritten with other
// bytes, emptied): the second run finds it does not load, compiles it again, says so,
// and the kernel computes.
TEST_F(FaultProcessTest, DamagedArtifactIsCompiledAgain) {
  const std::filesystem::path cache = daemons_.dir() / "cache";
  for (const char* damage : {"cut", "overwritten", "empty"}) {
    SCOPED_TRACE(damage);
    {
      const DaemonProcess first = daemons_.Start({});
      ASSERT_GT(first.pid, 0);
      Client client = Client::Connect(first.address);
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> work, Work::Begin(client));
      EXPECT_OK(work->ReplayAndCheck(3));
      work.reset();
      ASSERT_EQ(kill(first.pid, SIGTERM), 0);
      ASSERT_EQ(WaitExit(first.pid), 0) << ReadText(first.log);
    }
    const std::vector<std::filesystem::path> artifacts = ArtifactsIn(cache);
    ASSERT_EQ(artifacts.size(), 1u);
    const uintmax_t size = std::filesystem::file_size(artifacts[0]);
    if (std::string(damage) == "cut") {
      std::filesystem::resize_file(artifacts[0], size / 2);
    } else {
      std::ofstream(artifacts[0], std::ios::binary | std::ios::trunc)
          << (std::string(damage) == "empty" ? std::string() : std::string(size, '\x7f'));
    }

    const DaemonProcess second = daemons_.Start({});
    ASSERT_GT(second.pid, 0);
    Client client = Client::Connect(second.address);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Work> work, Work::Begin(client));
    EXPECT_FALSE(work->program().info().cache_hit());
    for (int64_t pos : {0, 5, 999}) EXPECT_OK(work->ReplayAndCheck(pos));
    EXPECT_EQ(std::filesystem::file_size(artifacts[0]), size);  // stored again whole
    work.reset();
    ASSERT_EQ(kill(second.pid, SIGTERM), 0);
    ASSERT_EQ(WaitExit(second.pid), 0);
    EXPECT_EQ(CountOf(ReadText(second.log), "does not load"), 1u) << ReadText(second.log);
  }
}

// Sessions opened and abandoned (no CloseSession, the channel dropped): they hold the
// tenant's sessions quota (256 by default) until their lease passes, then the reaper frees
// them all; the daemon's resident memory and threads come back near where a warm-up of
// the same left them.
TEST_F(FaultProcessTest, AbandonedSessionsAreAllReaped) {
  const int64_t abandoned = EnvInt("REPLAYD_FAULT_ABANDONED", 2000);
  // No linger: the executor ends with the last session, so idle is the daemon alone.
  const DaemonProcess d = daemons_.Start(
      {absl::StrCat("--lease_seconds=", kLeaseSeconds), "--log_level=warn", "--executor_linger=0"});
  ASSERT_GT(d.pid, 0);
  Client admin = Client::Connect(d.address);
  ASSERT_OK_AND_ASSIGN(const Held baseline, HeldBy(admin));
  int64_t refused = 0;  // OpenSessions answered RESOURCE_EXHAUSTED while the quota was full
  auto abandon = [&](int64_t count) -> absl::Status {
    for (int64_t i = 0; i < count;) {
      Client client = Client::Connect(d.address);  // a channel per hundred sessions
      for (int j = 0; j < 100 && i < count;) {
        grpc::ClientContext context;
        v1::OpenSessionRequest request;
        request.set_device("cpu:0");
        v1::OpenSessionReply reply;
        const grpc::Status opened = client.stub().OpenSession(&context, request, &reply);
        if (opened.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
          ++refused;
          absl::SleepFor(absl::Milliseconds(20));  // until the reaper frees some
          continue;
        }
        if (!opened.ok()) return absl::InternalError(absl::StrCat("session ", i, ": ", opened.error_message()));
        ++j;
        ++i;
      }
    }
    return absl::OkStatus();
  };
  // The daemon alone, once the tenant's executor, which ends with its last session, has gone.
  auto idle_footprint = [&] {
    Footprint f = FootprintOf(d.pid);
    for (int i = 0; i < 1200 && f.processes > 1; ++i) {
      absl::SleepFor(absl::Milliseconds(50));
      f = FootprintOf(d.pid);
    }
    EXPECT_EQ(f.processes, 1);
    return f;
  };
  ASSERT_OK(abandon(200));  // the warm-up
  ASSERT_OK(AwaitOnly(admin, {}).status());
  const Footprint before = idle_footprint();

  const absl::Time start = absl::Now();
  ASSERT_OK(abandon(abandoned));
  const absl::Duration opening = absl::Now() - start;
  const Footprint peak = FootprintOf(d.pid);
  ASSERT_OK_AND_ASSIGN(const auto reaped, AwaitOnly(admin, {}));
  ExpectBaseline(reaped.first, baseline);
  const Footprint after = idle_footprint();
  const double growth_mib = (static_cast<double>(after.rss_bytes) - static_cast<double>(before.rss_bytes)) / (1 << 20);
  std::printf(
      "abandoned %lld sessions in %.1f s (%lld opens refused by the full quota), all reaped %.1f s later (lease %d s)\n"
      "the daemon (and its executor at the peak): RSS %.1f MiB after the warm-up, %.1f MiB at the peak, %.1f MiB "
      "after (%+.1f MiB); threads %lld -> %lld -> %lld; processes %d -> %d -> %d\n",
      static_cast<long long>(abandoned), absl::ToDoubleSeconds(opening), static_cast<long long>(refused),
      absl::ToDoubleSeconds(reaped.second),
      kLeaseSeconds, static_cast<double>(before.rss_bytes) / (1 << 20), static_cast<double>(peak.rss_bytes) / (1 << 20),
      static_cast<double>(after.rss_bytes) / (1 << 20), growth_mib, static_cast<long long>(before.threads),
      static_cast<long long>(peak.threads), static_cast<long long>(after.threads), before.processes, peak.processes,
      after.processes);
  // Bounded whatever the count: 16 MiB (the allocator keeps some freed pages), no thread
  // more than the warm-up left.
  EXPECT_LT(growth_mib, 16.0);
  EXPECT_LE(after.threads, before.threads);
}

// The daemon killed and started again on its address under load: the clients see
// UNAVAILABLE while it is down, open new sessions once it is back and carry on, every
// result checked. The time from start to a first checked replay, cold (an empty compile
// cache) and warm (the same cache), is printed.
TEST_F(FaultProcessTest, RestartUnderLoadClientsReconnectAndCarryOn) {
  // Starts a daemon and replays once; the program comes from the cache when `warm`.
  auto start_and_replay = [&](const std::string& address, bool warm, absl::Duration& took) -> DaemonProcess {
    const absl::Time start = absl::Now();
    DaemonProcess d = daemons_.Start({}, address);
    Client client = Client::Connect(d.address);
    absl::StatusOr<std::unique_ptr<Work>> work = Work::Begin(client);
    EXPECT_OK(work.status());
    if (work.ok()) {
      EXPECT_OK((*work)->ReplayAndCheck(1));
      EXPECT_EQ((*work)->program().info().cache_hit(), warm);
    }
    took = absl::Now() - start;
    return d;
  };
  absl::Duration cold, warm;
  const DaemonProcess first = start_and_replay("", false, cold);
  ASSERT_GT(first.pid, 0);

  struct Seen {
    std::mutex mu;
    std::map<absl::StatusCode, int> errors;
    uint64_t checked_before = 0, checked_after = 0;
  };
  std::atomic<bool> restarted = false, stop = false;
  constexpr int kClients = 4;
  std::vector<Seen> seen(kClients);
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      Client client = Client::Connect(first.address);
      std::unique_ptr<Work> work;
      for (int64_t pos = c; !stop; pos = (pos + 1) % 1000) {
        absl::Status s;
        if (!work) {
          absl::StatusOr<std::unique_ptr<Work>> begun = Work::Begin(client);
          s = begun.status();
          if (s.ok()) work = std::move(*begun);
        }
        if (s.ok()) s = work->ReplayAndCheck(pos);
        std::lock_guard<std::mutex> lock(seen[c].mu);
        if (s.ok()) {
          ++(restarted ? seen[c].checked_after : seen[c].checked_before);
          continue;
        }
        ++seen[c].errors[s.code()];
        work.reset();  // a new session on the next try
        absl::SleepFor(absl::Milliseconds(20));
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(500));
  ASSERT_EQ(kill(first.pid, SIGKILL), 0);
  WaitExit(first.pid);
  absl::SleepFor(absl::Milliseconds(500));  // down: the clients' calls fail
  restarted = true;
  const DaemonProcess second = start_and_replay(first.address, true, warm);
  // Each client's channel reconnects after its own backoff: wait (up to a minute) until
  // every one has checked a replay on the second daemon, then a little longer.
  auto all_back = [&] {
    for (Seen& s : seen) {
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.checked_after == 0) return false;
    }
    return true;
  };
  for (int i = 0; i < 1200 && !all_back(); ++i) absl::SleepFor(absl::Milliseconds(50));
  absl::SleepFor(absl::Milliseconds(500));
  stop = true;
  for (std::thread& t : clients) t.join();

  for (int c = 0; c < kClients; ++c) {
    SCOPED_TRACE(c);
    EXPECT_GT(seen[c].checked_before, 0u);
    EXPECT_GT(seen[c].checked_after, 0u);
    EXPECT_GT(seen[c].errors[absl::StatusCode::kUnavailable], 0);
    std::string errors;
    for (const auto& [code, n] : seen[c].errors) absl::StrAppend(&errors, " ", absl::StatusCodeToString(code), " x", n);
    EXPECT_EQ(seen[c].errors.size(), 1u) << errors;
    std::printf("client %d: %llu replays checked before the kill, %llu after the restart; errors:%s\n", c,
                static_cast<unsigned long long>(seen[c].checked_before),
                static_cast<unsigned long long>(seen[c].checked_after), errors.c_str());
  }
  ASSERT_EQ(kill(second.pid, SIGTERM), 0);
  EXPECT_EQ(WaitExit(second.pid), 0) << ReadText(second.log);
  // The warm start again without the clients' load, for comparison.
  absl::Duration warm_idle;
  const DaemonProcess third = start_and_replay("", true, warm_idle);
  std::printf(
      "start to first checked replay: cold cache %.0f ms; warm cache %.0f ms under the clients' reconnections, "
      "%.0f ms idle\n",
      absl::ToDoubleMilliseconds(cold), absl::ToDoubleMilliseconds(warm), absl::ToDoubleMilliseconds(warm_idle));
}

}  // namespace
}  // namespace replayd::client
