// replayd-fault-client: a client that a fault test (fault_process_test.cc) kills with
// SIGKILL in the middle of its work. It opens a session on the daemon at ADDRESS, loads
// the affine kernel, writes its input and captures a graph (affine_work.h), says "ready"
// on stdout once MODE's work is under way, and goes on until it is killed:
//   stream    replays over the Session stream, 32 in flight, each result checked
//   sequence  ReplaySequence of 2^20 replays, each one's reads streamed back
//   write     WriteBuffer of 64 MiB into a buffer of its own, again and again
//
//   replayd-fault-client ADDRESS MODE
// Exits 2 saying why when its work fails (it never ends on its own otherwise).
#include <cstdio>
#include <string>
#include <vector>

#include "tests/integration/affine_work.h"

namespace replayd::client {
namespace {

void Ready() {
  std::printf("ready\n");
  std::fflush(stdout);
}

absl::Status Stream(Work& work) {
  for (int64_t round = 0;; ++round) {
    std::vector<std::future<absl::StatusOr<ReplayResult>>> window;
    for (int64_t pos = 0; pos < 32; ++pos) window.push_back(work.ReplayAsync(pos));
    for (int64_t pos = 0; pos < 32; ++pos)
      if (absl::Status s = Work::Check(window[pos].get(), pos); !s.ok()) return s;
    if (round == 0) Ready();
  }
}

absl::Status Sequence(Work& work) {
  SequenceSpec spec;
  spec.base = {&work.in(), &work.out(), int64_t{0}};
  spec.step_param = 2;
  spec.count = 1 << 20;
  spec.reads = {View{&work.out()}};
  spec.stream_reads = true;
  for (;;) {
    absl::StatusOr<SequenceResult> done =
        work.session().ReplaySequence(work.graph(), spec, [](uint32_t index, std::vector<std::string>) {
          if (index == 0) Ready();
        });
    if (!done.ok()) return done.status();
  }
}

absl::Status Write(Work& work) {
  const std::vector<uint8_t> bytes(64 << 20, 0x5a);
  absl::StatusOr<Buffer> buffer = work.session().Alloc(bytes.size());
  if (!buffer.ok()) return buffer.status();
  Ready();
  for (;;)
    if (absl::Status s = work.session().Write(*buffer, 0, bytes); !s.ok()) return s;
}

int Run(const std::string& address, const std::string& mode) {
  Client client = Client::Connect(address);
  absl::StatusOr<std::unique_ptr<Work>> work = Work::Begin(client);
  absl::Status s = work.status();
  if (s.ok() && mode == "stream") s = Stream(**work);
  else if (s.ok() && mode == "sequence") s = Sequence(**work);
  else if (s.ok() && mode == "write") s = Write(**work);
  else if (s.ok()) s = absl::InvalidArgumentError(absl::StrCat("unknown mode \"", mode, "\""));
  std::fprintf(stderr, "replayd-fault-client %s: %s\n", mode.c_str(), s.ToString().c_str());
  return 2;
}

}  // namespace
}  // namespace replayd::client

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: replayd-fault-client ADDRESS stream|sequence|write\n");
    return 2;
  }
  return replayd::client::Run(argv[1], argv[2]);
}
