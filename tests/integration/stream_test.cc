// The Session stream over loopback: ordered pipelined operations, cancellation after an
// error and resume, inline transfers, replay sequences, broken streams.
#include <gmock/gmock.h>

#include <atomic>
#include <cstring>
#include <future>
#include <fstream>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/integration/daemon_fixture.h"

namespace replayd::client {
namespace {

using ::testing::HasSubstr;

// x = x * 2 + pos over one int64 (exact), so a replay order is visible in the result.
constexpr char kStep[] = R"(
void step(long long *x, int pos) { x[0] = x[0] * 2 + pos; })";

const Variable kPos{"pos", 1, 1000, 1};

// Run with the daemon reading each request after the previous reply (window 0) and
// reading ahead (window 8): the semantics are the same.
class StreamTest : public DaemonFixture, public ::testing::WithParamInterface<size_t> {
 protected:
  void SetUp() override { StartWith(nullptr); }

  // (Re)starts the daemon with `adjust` applied to its options, and makes the session,
  // the step program and its one-call graph.
  void StartWith(std::function<void(DaemonOptions&)> adjust) {
    graph_.reset();
    x_.reset();
    program_.reset();
    session_.reset();
    Options options;
    options.stream_window = GetParam();
    options.adjust = std::move(adjust);
    Start(options);
    session_ = std::make_unique<Session>(Open());
    program_ = std::make_unique<Program>(*session_->Load({"cpu-c", kStep, "step", *ParseSignature("inout,int32"), {}}));
    x_ = std::make_unique<Buffer>(*session_->Alloc(8));
    ASSERT_TRUE(session_->BeginCapture({x_.get()}, {kPos}).ok());
    LaunchSpec spec;
    spec.args = {View{x_.get()}, Expr{"pos"}};
    spec.variables = {{kPos, 1}};
    ASSERT_TRUE(session_->Launch(*program_, spec).ok());
    graph_ = std::make_unique<Graph>(*session_->EndCapture({}));
    Reset(0);
  }

  void Reset(int64_t v) { ASSERT_TRUE(session_->WriteVector(*x_, std::vector<int64_t>{v}).ok()); }
  int64_t Value() { return (*session_->ReadVector<int64_t>(*x_, 1))[0]; }
  static int64_t Expected(int64_t from, std::initializer_list<int64_t> positions) {
    for (int64_t p : positions) from = from * 2 + p;
    return from;
  }

  // A raw stream, for requests the client library does not make.
  struct Raw {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionReply>> stream;
  };
  std::unique_ptr<Raw> OpenRaw() {
    auto raw = std::make_unique<Raw>();
    raw->stream = stub().Session(&raw->context);
    return raw;
  }
  // A request on this session with no operation yet.
  v1::SessionRequest Request(uint64_t seq) {
    v1::SessionRequest r;
    r.set_seq(seq);
    r.set_session(session_->id());
    return r;
  }
  v1::SessionRequest ReplayRequest(uint64_t seq, int64_t pos) {
    v1::SessionRequest r = Request(seq);
    r.mutable_replay()->set_graph(graph_->handle());
    r.mutable_replay()->add_params()->set_buffer(x_->handle());
    r.mutable_replay()->add_params()->set_int_value(pos);
    return r;
  }

  // A sequence of 100000 replays streaming back `length` bytes of `read` after each one:
  // more than any client here reads.
  v1::SessionRequest EndlessStreamedSequence(const Buffer& read, uint64_t length) {
    v1::SessionRequest r = Request(1);
    v1::ReplaySequenceRequest* seq = r.mutable_replay_sequence();
    seq->set_graph(graph_->handle());
    seq->add_base()->set_buffer(x_->handle());
    seq->add_base()->set_int_value(1);
    seq->set_step_param(1);
    seq->set_count(100000);
    seq->set_stream_reads(true);
    v1::View* view = seq->add_reads();
    view->set_buffer(read.handle());
    view->set_length(length);
    return r;
  }

  // A session with a kernel that spins for about a second, and its flag buffer.
  struct Spinner {
    Session session;
    Program program;
    Buffer flag;
  };
  Spinner OpenSpinner() {
    constexpr char kSpin[] = R"(
void spin(long long *x) { for (volatile long long i = 0; i < 1500000000LL; ++i) {} x[0] = 1; })";
    Session s = Open();
    absl::StatusOr<Program> program = s.Load({"cpu-c", kSpin, "spin", *ParseSignature("inout"), {}});
    EXPECT_TRUE(program.ok()) << program.status();
    absl::StatusOr<Buffer> flag = s.Alloc(8);
    EXPECT_TRUE(flag.ok()) << flag.status();
    return {std::move(s), std::move(*program), std::move(*flag)};
  }
  // The spin as one unary Launch RPC with wait.
  grpc::Status UnarySpin(const Spinner& spinner) {
    v1::LaunchRequest r;
    r.set_session(spinner.session.id());
    r.set_program(spinner.program.handle());
    r.add_args()->mutable_view()->set_buffer(spinner.flag.handle());
    r.add_global(1);
    r.set_wait(true);
    grpc::ClientContext context;
    v1::LaunchReply reply;
    return stub().Launch(&context, r, &reply);
  }

  std::unique_ptr<Session> session_;
  std::unique_ptr<Program> program_;
  std::unique_ptr<Buffer> x_;
  std::unique_ptr<Graph> graph_;
};

TEST_P(StreamTest, PipelinedReplaysRunInOrder) {
  std::vector<std::future<absl::StatusOr<ReplayResult>>> futures;
  for (int64_t pos = 1; pos <= 40; ++pos) futures.push_back(session_->ReplayAsync(*graph_, {x_.get(), pos}));
  for (auto& f : futures) ASSERT_TRUE(f.get().ok());
  // Only the exact order 1, 2, ..., 40 gives this (mod 2^64) value.
  int64_t expect = 0;
  for (int64_t pos = 1; pos <= 40; ++pos) expect = expect * 2 + pos;
  EXPECT_EQ(Value(), expect);
}

TEST_P(StreamTest, FuturesDroppedUnreadLeaveTheirRepliesToTheNextReader) {
  for (int64_t pos = 1; pos <= 10; ++pos) (void)session_->ReplayAsync(*graph_, {x_.get(), pos});
  auto last = session_->Replay(*graph_, {x_.get(), int64_t{11}}, true);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(Value(), Expected(0, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
}

TEST_P(StreamTest, AFutureWaitedOnAnotherThreadGetsItsOwnReply) {
  std::vector<std::future<absl::StatusOr<ReplayResult>>> futures;
  for (int64_t pos = 1; pos <= 6; ++pos)
    futures.push_back(session_->ReplayAsync(*graph_, {x_.get(), pos}, false, {View{x_.get(), 0, 8}}));
  std::vector<int64_t> seen(futures.size());
  std::vector<std::thread> waiters;
  for (size_t i = 0; i < futures.size(); ++i)
    waiters.emplace_back([&, i] {
      auto r = futures[i].get();
      if (r.ok()) std::memcpy(&seen[i], r->reads[0].data(), 8);
    });
  for (auto& t : waiters) t.join();
  int64_t expect = 0;
  for (size_t i = 0; i < seen.size(); ++i) {
    expect = expect * 2 + static_cast<int64_t>(i + 1);
    EXPECT_EQ(seen[i], expect) << "replay " << i + 1;
  }
}

TEST_P(StreamTest, MoreThanTheWindowOutstandingAllCompleteInOrder) {
  ClientOptions window4;
  window4.stream_window = 4;
  Client small = Client::Connect(daemon_->address(), window4);
  auto s = small.OpenSession("cpu:0");
  ASSERT_TRUE(s.ok());
  auto p = s->Load({"cpu-c", kStep, "step", *ParseSignature("inout,int32"), {}});
  auto x = s->Alloc(8);
  ASSERT_TRUE(s->BeginCapture({&*x}, {kPos}).ok());
  LaunchSpec spec;
  spec.args = {View{&*x}, Expr{"pos"}};
  spec.variables = {{kPos, 1}};
  ASSERT_TRUE(s->Launch(*p, spec).ok());
  auto g = s->EndCapture({});
  ASSERT_TRUE(g.ok() && s->WriteVector(*x, std::vector<int64_t>{0}).ok());
  std::vector<std::future<absl::StatusOr<ReplayResult>>> futures;
  int64_t expect = 0;
  for (int64_t i = 0; i < 60; ++i) {                          // 60 doublings stay inside int64
    futures.push_back(s->ReplayAsync(*g, {&*x, 1 + i % 3}));  // blocks past 4 outstanding
    expect = expect * 2 + 1 + i % 3;
  }
  for (auto& f : futures) {
    absl::StatusOr<ReplayResult> r = f.get();
    ASSERT_TRUE(r.ok()) << r.status();
  }
  EXPECT_EQ((*s->ReadVector<int64_t>(*x, 1))[0], expect);
}

TEST_P(StreamTest, AFailureCancelsTheOperationsQueuedBehindItUntilResume) {
  auto raw = OpenRaw();
  ASSERT_TRUE(raw->stream->Write(ReplayRequest(1, 1)));
  ASSERT_TRUE(raw->stream->Write(ReplayRequest(2, 5000)));  // out of range
  ASSERT_TRUE(raw->stream->Write(ReplayRequest(3, 2)));     // cancelled
  v1::SessionRequest resumed = ReplayRequest(4, 3);
  resumed.set_resume(true);
  ASSERT_TRUE(raw->stream->Write(resumed));
  ASSERT_TRUE(raw->stream->Write(ReplayRequest(5, 4)));
  raw->stream->WritesDone();
  std::vector<v1::SessionReply> replies;
  v1::SessionReply reply;
  while (raw->stream->Read(&reply)) replies.push_back(reply);
  ASSERT_TRUE(raw->stream->Finish().ok());
  ASSERT_EQ(replies.size(), 5u);
  for (size_t i = 0; i < replies.size(); ++i) EXPECT_EQ(replies[i].seq(), i + 1);
  EXPECT_EQ(replies[0].code(), 0);
  EXPECT_EQ(replies[1].code(), int(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(replies[1].message(), HasSubstr("pos = 5000"));
  EXPECT_EQ(replies[2].code(), int(grpc::StatusCode::ABORTED));
  EXPECT_THAT(replies[2].message(), HasSubstr("operation 2 failed"));
  EXPECT_EQ(replies[3].code(), 0);
  EXPECT_EQ(replies[4].code(), 0);
  EXPECT_EQ(Value(), Expected(0, {1, 3, 4}));
}

TEST_P(StreamTest, ContinueOnErrorLetsLaterOperationsRun) {
  auto raw = OpenRaw();
  v1::SessionRequest bad = ReplayRequest(1, 0);
  bad.set_continue_on_error(true);
  ASSERT_TRUE(raw->stream->Write(bad));
  ASSERT_TRUE(raw->stream->Write(ReplayRequest(2, 7)));
  raw->stream->WritesDone();
  v1::SessionReply a, b;
  ASSERT_TRUE(raw->stream->Read(&a) && raw->stream->Read(&b));
  EXPECT_EQ(a.code(), int(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(b.code(), 0);
  raw->stream->Finish();
  EXPECT_EQ(Value(), 7);
}

TEST_P(StreamTest, TheClientResumesAfterAnErrorItHasSeen) {
  EXPECT_EQ(session_->Replay(*graph_, {x_.get(), int64_t{0}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(session_->Replay(*graph_, {x_.get(), int64_t{9}}).ok());
  EXPECT_EQ(Value(), 9);
}

TEST_P(StreamTest, InlineWritesReadsLaunchesAndKeepAlive) {
  auto raw = OpenRaw();
  v1::SessionRequest write = Request(1);
  int64_t v = 5;
  write.mutable_write()->set_buffer(x_->handle());
  write.mutable_write()->set_data(std::string(reinterpret_cast<char*>(&v), 8));
  v1::SessionRequest launch = Request(2);
  launch.mutable_launch()->set_program(program_->handle());
  launch.mutable_launch()->add_args()->mutable_view()->set_buffer(x_->handle());
  launch.mutable_launch()->add_args()->set_int_value(1);
  launch.mutable_launch()->set_wait(true);
  v1::SessionRequest read = Request(3);
  read.mutable_read()->set_buffer(x_->handle());
  v1::SessionRequest keep = Request(4);
  keep.mutable_keep_alive();
  v1::SessionRequest sync = Request(5);
  sync.mutable_synchronize();
  v1::SessionRequest too_big = Request(6);
  too_big.mutable_write()->set_buffer(x_->handle());
  too_big.mutable_write()->set_data(std::string((1 << 20) + 1, 'x'));
  for (auto* r : {&write, &launch, &read, &keep, &sync, &too_big}) ASSERT_TRUE(raw->stream->Write(*r));
  raw->stream->WritesDone();
  std::vector<v1::SessionReply> replies(6);
  for (auto& r : replies) ASSERT_TRUE(raw->stream->Read(&r));
  raw->stream->Finish();
  EXPECT_EQ(replies[0].write().bytes_written(), 8u);
  EXPECT_GT(replies[1].launch().device_seconds(), 0);
  int64_t got;
  ASSERT_EQ(replies[2].read().data().size(), 8u);
  std::memcpy(&got, replies[2].read().data().data(), 8);
  EXPECT_EQ(got, 11);
  EXPECT_GT(replies[3].keep_alive().lease_seconds(), 0u);
  EXPECT_EQ(replies[4].code(), 0);
  EXPECT_EQ(replies[5].code(), int(grpc::StatusCode::INVALID_ARGUMENT));
}

// A copy on the stream runs in order between the operations around it.
TEST_P(StreamTest, ACopyRunsInOrderOnTheStream) {
  auto y = session_->Alloc(8);
  ASSERT_TRUE(y.ok());
  auto raw = OpenRaw();
  v1::SessionRequest copy = Request(2);
  copy.mutable_copy()->mutable_dst()->set_buffer(y->handle());
  copy.mutable_copy()->mutable_src()->set_buffer(x_->handle());
  copy.mutable_copy()->set_wait(true);
  v1::SessionRequest bad = Request(3);
  bad.set_continue_on_error(true);
  bad.mutable_copy()->mutable_dst()->set_buffer(y->handle());
  bad.mutable_copy()->mutable_src()->set_buffer(y->handle());  // onto itself
  v1::SessionRequest read = Request(4);
  read.mutable_read()->set_buffer(y->handle());
  ASSERT_TRUE(raw->stream->Write(ReplayRequest(1, 7)));  // x = 0 * 2 + 7, before the copy
  for (auto* r : {&copy, &bad, &read}) ASSERT_TRUE(raw->stream->Write(*r));
  raw->stream->WritesDone();
  std::vector<v1::SessionReply> replies(4);
  for (auto& r : replies) ASSERT_TRUE(raw->stream->Read(&r));
  raw->stream->Finish();
  EXPECT_EQ(replies[1].code(), 0) << replies[1].message();
  EXPECT_TRUE(replies[1].has_copy());
  EXPECT_EQ(replies[2].code(), int(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(replies[2].message(), HasSubstr("overlapping"));
  int64_t got;
  ASSERT_EQ(replies[3].read().data().size(), 8u);
  std::memcpy(&got, replies[3].read().data().data(), 8);
  EXPECT_EQ(got, 7);
}

TEST_P(StreamTest, AStreamForAnotherSessionOrNoneIsRefused) {
  auto raw = OpenRaw();
  v1::SessionRequest r = ReplayRequest(1, 1);
  r.set_session(12345);
  ASSERT_TRUE(raw->stream->Write(r));
  v1::SessionRequest empty;
  empty.set_seq(2);
  empty.set_session(session_->id());
  empty.set_resume(true);
  ASSERT_TRUE(raw->stream->Write(empty));
  v1::SessionRequest other = ReplayRequest(3, 1);
  other.set_session(777);
  other.set_resume(true);
  ASSERT_TRUE(raw->stream->Write(other));
  raw->stream->WritesDone();
  v1::SessionReply a, b, c;
  ASSERT_TRUE(raw->stream->Read(&a) && raw->stream->Read(&b) && raw->stream->Read(&c));
  raw->stream->Finish();
  EXPECT_EQ(a.code(), int(grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(b.code(), int(grpc::StatusCode::INVALID_ARGUMENT)) << "no operation";
  EXPECT_EQ(c.code(), int(grpc::StatusCode::INVALID_ARGUMENT)) << "one session per stream";
  EXPECT_EQ(Value(), 0);
}

TEST_P(StreamTest, SequenceWithASteppingVariable) {
  SequenceSpec spec;
  spec.base = {x_.get(), int64_t{17}};
  spec.step_param = 1;
  spec.step = 1;
  spec.count = 20;
  spec.reads = {View{x_.get()}};
  spec.stream_reads = true;
  std::vector<std::pair<uint32_t, int64_t>> seen;
  auto r = session_->ReplaySequence(*graph_, spec, [&](uint32_t index, std::vector<std::string> reads) {
    int64_t v;
    std::memcpy(&v, reads[0].data(), 8);
    seen.push_back({index, v});
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->replays, 20u);
  ASSERT_EQ(seen.size(), 20u);
  int64_t expect = 0;
  for (uint32_t i = 0; i < 20; ++i) {
    expect = expect * 2 + 17 + i;
    EXPECT_EQ(seen[i].first, i);
    EXPECT_EQ(seen[i].second, expect) << "after replay " << i;
  }
  EXPECT_EQ(Value(), expect);
  EXPECT_EQ(session_->DescribeGraph(*graph_)->replays(), 20u);
}

TEST_P(StreamTest, SequenceWithExplicitVectorsReturnsTheLastReads) {
  SequenceSpec spec;
  for (int64_t pos : {3, 1, 4, 1, 5}) spec.vectors.push_back({x_.get(), pos});
  spec.reads = {View{x_.get()}};
  auto r = session_->ReplaySequence(*graph_, spec);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->reads.size(), 1u);
  int64_t v;
  std::memcpy(&v, r->reads[0].data(), 8);
  EXPECT_EQ(v, Expected(0, {3, 1, 4, 1, 5}));
}

TEST_P(StreamTest, ASequenceIsCheckedWholeBeforeAnyReplayRuns) {
  SequenceSpec past_range;
  past_range.base = {x_.get(), int64_t{990}};
  past_range.step_param = 1;
  past_range.count = 20;  // reaches 1009 > 1000
  absl::Status s = session_->ReplaySequence(*graph_, past_range).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("replay 19"));
  SequenceSpec bad_vector;
  bad_vector.vectors = {{x_.get(), int64_t{1}}, {x_.get(), int64_t{0}}};
  EXPECT_THAT(std::string(session_->ReplaySequence(*graph_, bad_vector).status().message()), HasSubstr("replay 1"));
  SequenceSpec not_a_variable;
  not_a_variable.base = {x_.get(), int64_t{1}};
  not_a_variable.step_param = 0;
  not_a_variable.count = 2;
  EXPECT_EQ(session_->ReplaySequence(*graph_, not_a_variable).status().code(), absl::StatusCode::kInvalidArgument);
  SequenceSpec empty;
  EXPECT_EQ(session_->ReplaySequence(*graph_, empty).status().code(), absl::StatusCode::kInvalidArgument);
  SequenceSpec overflow;
  overflow.base = {x_.get(), int64_t{1}};
  overflow.step_param = 1;
  overflow.step = int64_t{1} << 62;
  overflow.count = 8;
  EXPECT_EQ(session_->ReplaySequence(*graph_, overflow).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Value(), 0) << "nothing ran";
  EXPECT_EQ(session_->DescribeGraph(*graph_)->replays(), 0u);
}

TEST_P(StreamTest, ABrokenStreamRunsNothingMoreAndLeavesTheSessionUsable) {
  {
    auto raw = OpenRaw();
    for (uint64_t seq = 1; seq <= 3; ++seq) ASSERT_TRUE(raw->stream->Write(ReplayRequest(seq, 1)));
    v1::SessionReply reply;
    ASSERT_TRUE(raw->stream->Read(&reply));
    raw->context.TryCancel();
    raw->stream->Finish();
  }
  // The daemon learns of the cancel a moment later; an operation it had begun by then
  // completes. After that nothing more runs, and the session is as it was after its
  // last completed operation.
  absl::SleepFor(absl::Milliseconds(100));
  int64_t v = Value();
  EXPECT_TRUE(v == 1 || v == 3 || v == 7) << v;
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(Value(), v) << "nothing ran after the stream broke";
  EXPECT_TRUE(session_->Replay(*graph_, {x_.get(), int64_t{1}}).ok());
  EXPECT_EQ(Value(), v * 2 + 1);
}

// A replay sequence stops at its next replay once its stream is cancelled, streamed reads
// or not (without them it ran to its end, and held its session meanwhile).
TEST_P(StreamTest, ASequenceStopsWhenItsStreamIsCancelled) {
  constexpr char kNap[] = R"(
#include <time.h>
void nap(long long *x, int pos) { struct timespec t = {0, 2000000}; nanosleep(&t, 0); x[0] += pos; })";
  Session s = Open();
  auto program = s.Load({"cpu-c", kNap, "nap", *ParseSignature("inout,int32"), {}});
  auto x = s.Alloc(8);
  ASSERT_TRUE(program.ok() && x.ok()) << program.status() << x.status();
  ASSERT_TRUE(s.BeginCapture({&*x}, {kPos}).ok());
  LaunchSpec spec;
  spec.args = {View{&*x}, Expr{"pos"}};
  spec.variables = {{kPos, 1}};
  ASSERT_TRUE(s.Launch(*program, spec).ok());
  auto graph = s.EndCapture({});
  ASSERT_TRUE(graph.ok()) << graph.status();
  constexpr uint32_t kCount = 5000;  // 2 ms each: 10 s to the end
  {
    auto raw = OpenRaw();
    v1::SessionRequest r;
    r.set_seq(1);
    r.set_session(s.id());
    v1::ReplaySequenceRequest* seq = r.mutable_replay_sequence();
    seq->set_graph(graph->handle());
    seq->add_base()->set_buffer(x->handle());
    seq->add_base()->set_int_value(1);
    seq->set_step_param(1);
    seq->set_step(0);
    seq->set_count(kCount);
    ASSERT_TRUE(raw->stream->Write(r));
    absl::SleepFor(absl::Milliseconds(300));
    raw->context.TryCancel();
    raw->stream->Finish().IgnoreError();
  }
  // GraphInfo waits for the session's running operation: the sequence, until it stops.
  auto info = s.DescribeGraph(*graph);
  ASSERT_TRUE(info.ok()) << info.status();
  const uint64_t replays = info->replays();
  EXPECT_LT(replays, kCount / 2) << "the sequence ran on after its stream was cancelled";
  absl::SleepFor(absl::Milliseconds(200));
  auto later = s.DescribeGraph(*graph);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->replays(), replays) << "nothing ran after it stopped";
}

// Resident memory of this process (client and daemon), in bytes.
int64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

TEST_P(StreamTest, ALongStreamKeepsItsMemoryBounded) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "AddressSanitizer keeps freed memory resident in its quarantine";
#endif
  // Each reply carries 256 KiB: a stream that kept its replies would grow by 250 MiB.
  constexpr uint64_t kRead = 256 << 10;
  absl::StatusOr<Buffer> big = session_->Alloc(kRead);
  ASSERT_TRUE(big.ok());
  const std::vector<View> reads = {View{&*big, 0, kRead}};
  auto replays = [&](int n) {
    for (int i = 0; i < n; ++i) {
      auto r = session_->Replay(*graph_, {x_.get(), int64_t{1}}, false, reads);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->reads[0].size(), kRead);
    }
  };
  replays(50);  // the transport's and allocator's steady state
  const int64_t before = ResidentBytes();
  replays(1000);
  EXPECT_LT(ResidentBytes() - before, int64_t{64} << 20);
}

TEST_P(StreamTest, EightClientsPipelineOnTheirOwnSessions) {
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < 8; ++c) {
    threads.emplace_back([&, c] {
      Client own = Client::Connect(daemon_->address());
      auto s = own.OpenSession("cpu:0");
      auto p = s->Load({"cpu-c", kStep, "step", *ParseSignature("inout,int32"), {}});
      auto x = s->Alloc(8);
      if (!s.ok() || !p.ok() || !x.ok() || !s->BeginCapture({&*x}, {kPos}).ok()) return void(++failures);
      LaunchSpec spec;
      spec.args = {View{&*x}, Expr{"pos"}};
      spec.variables = {{kPos, 1}};
      if (!s->Launch(*p, spec).ok()) return void(++failures);
      auto g = s->EndCapture({});
      if (!g.ok() || !s->WriteVector(*x, std::vector<int64_t>{c}).ok()) return void(++failures);
      std::vector<std::future<absl::StatusOr<ReplayResult>>> futures;
      int64_t expect = c;
      for (int64_t pos = 1; pos <= 50; ++pos) {
        futures.push_back(s->ReplayAsync(*g, {&*x, pos}));
        expect = expect * 2 + pos;
      }
      for (auto& f : futures)
        if (!f.get().ok()) ++failures;
      if ((*s->ReadVector<int64_t>(*x, 1))[0] != expect) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
}

// Keep-alives on a raw stream of `session`, each answered within `deadline` of the first.
bool KeepAliveRoundTrips(v1::Replayd::Stub& stub, uint64_t session, int n, absl::Duration deadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  auto stream = stub.Session(&context);
  for (int i = 1; i <= n; ++i) {
    v1::SessionRequest r;
    r.set_seq(i);
    r.set_session(session);
    r.mutable_keep_alive();
    v1::SessionReply reply;
    if (!stream->Write(r) || !stream->Read(&reply) || reply.code() != 0 || reply.seq() != uint64_t(i)) return false;
  }
  stream->WritesDone();
  return stream->Finish().ok();
}

TEST_P(StreamTest, AClientThatStopsReadingStallsOnlyItsOwnStream) {
  // A sequence streaming 256 KiB per replay to a client that never reads: the transport's
  // windows fill, the daemon's replies wait, and the sequence waits with them.
  constexpr uint64_t kRead = 256 << 10;
  absl::StatusOr<Buffer> big = session_->Alloc(kRead);
  ASSERT_TRUE(big.ok());
  auto stalled = OpenRaw();
  ASSERT_TRUE(stalled->stream->Write(EndlessStreamedSequence(*big, kRead)));
  absl::SleepFor(absl::Milliseconds(200));
  // Other sessions' streams, and the device, keep working.
  Session other = Open();
  EXPECT_TRUE(KeepAliveRoundTrips(stub(), other.id(), 50, absl::Seconds(30)));
  absl::StatusOr<Buffer> y = other.Alloc(8);
  ASSERT_TRUE(y.ok());
  EXPECT_TRUE(other.WriteVector(*y, std::vector<int64_t>{42}).ok());
  EXPECT_EQ((*other.ReadVector<int64_t>(*y, 1))[0], 42);
  // Cancelling the stalled stream ends its sequence; its session works again.
  stalled->context.TryCancel();
  stalled->stream->Finish();
  auto replayed = session_->Replay(*graph_, {x_.get(), int64_t{1}});
  EXPECT_TRUE(replayed.ok()) << replayed.status();
}

TEST_P(StreamTest, ALongOperationDoesNotHoldUpOtherStreams) {
  // A kernel that spins for about a second on one session's stream; meanwhile another
  // session's stream is answered (keep-alives need no device turn).
  Spinner slow = OpenSpinner();
  std::atomic<bool> done{false};
  std::thread spinner([&] {
    LaunchSpec spec;
    spec.args = {View{&slow.flag}};
    spec.wait = true;
    EXPECT_TRUE(slow.session.Launch(slow.program, spec).ok());
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(KeepAliveRoundTrips(stub(), session_->id(), 20, absl::Seconds(30)));
  EXPECT_FALSE(done) << "the keep-alives should have been answered while the kernel ran";
  spinner.join();
}

TEST_P(StreamTest, ALongUnaryLaunchDoesNotHoldUpOtherCalls) {
  // Unary Launch and ReplayGraph are served on the streams' completion queue too: one that
  // runs long must leave the other calls answered.
  Spinner slow = OpenSpinner();
  std::atomic<bool> done{false};
  std::thread spinner([&] {
    EXPECT_TRUE(UnarySpin(slow).ok());
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(KeepAliveRoundTrips(stub(), session_->id(), 20, absl::Seconds(30)));
  // A unary replay of an unknown graph is answered without a device turn.
  v1::ReplayGraphRequest request;
  request.set_session(session_->id());
  request.set_graph(graph_->handle() + 1000);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::ReplayGraphReply reply;
  EXPECT_EQ(stub().ReplayGraph(&context, request, &reply).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_FALSE(done) << "the other calls should have been answered while the kernel ran";
  spinner.join();
  EXPECT_EQ((*slow.session.ReadVector<int64_t>(slow.flag, 1))[0], 1);
}

TEST_P(StreamTest, PastItsWorkersTheDaemonRefusesOperationsAndThenRecovers) {
  StartWith([](DaemonOptions& d) { d.streams.workers = 1; });
  // A sequence streaming to a client that never reads holds the one worker.
  absl::StatusOr<Buffer> big = session_->Alloc(256 << 10);
  ASSERT_TRUE(big.ok());
  auto stalled = OpenRaw();
  ASSERT_TRUE(stalled->stream->Write(EndlessStreamedSequence(*big, 256 << 10)));
  absl::SleepFor(absl::Milliseconds(200));

  // Another stream's sequence needs a worker: refused.
  auto raw = OpenRaw();
  v1::SessionRequest sequence = EndlessStreamedSequence(*x_, 8);
  sequence.mutable_replay_sequence()->set_count(4);
  ASSERT_TRUE(raw->stream->Write(sequence));
  v1::SessionReply reply;
  ASSERT_TRUE(raw->stream->Read(&reply));
  EXPECT_EQ(reply.seq(), 1u);
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kResourceExhausted)) << reply.message();
  EXPECT_THAT(reply.message(), HasSubstr("--stream_workers"));
  // A unary call that would run on a worker (the daemon is busy) is refused the same way.
  v1::ReplayGraphRequest unary;
  unary.set_session(session_->id());
  unary.set_graph(graph_->handle());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::ReplayGraphReply unary_reply;
  EXPECT_EQ(stub().ReplayGraph(&context, unary, &unary_reply).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  // Once the worker is free, the same stream works again. The sequence, which needs a
  // worker (a keep-alive runs on the thread that read it, so it cannot tell), is sent
  // again until the stalled one's worker has been given back; so is the WriteBuffer
  // before it, which the daemon may run on a worker too.
  stalled->context.TryCancel();
  stalled->stream->Finish();
  bool recovered = false;
  for (uint64_t seq = 2; seq < 200 && !recovered; ++seq) {
    const absl::Status reset = session_->WriteVector(*x_, std::vector<int64_t>{0});
    if (reset.code() == absl::StatusCode::kResourceExhausted) {
      absl::SleepFor(absl::Milliseconds(20));
      continue;
    }
    ASSERT_TRUE(reset.ok()) << reset;
    sequence.set_seq(seq);
    sequence.set_resume(true);
    ASSERT_TRUE(raw->stream->Write(sequence));  // 4 replays of x = 2x + pos, pos 1 (no step)
    ASSERT_TRUE(raw->stream->Read(&reply));
    if (reply.code() == static_cast<int>(absl::StatusCode::kResourceExhausted)) {
      absl::SleepFor(absl::Milliseconds(20));
      continue;
    }
    recovered = true;
    for (;;) {
      ASSERT_EQ(reply.code(), 0) << reply.message();
      if (reply.final()) break;
      ASSERT_TRUE(raw->stream->Read(&reply));
    }
  }
  EXPECT_TRUE(recovered) << reply.message();
  raw->stream->WritesDone();
  EXPECT_TRUE(raw->stream->Finish().ok());
  EXPECT_EQ(Value(), Expected(0, {1, 1, 1, 1}));
}

TEST_P(StreamTest, TheDaemonStopsWithAUnaryLaunchRunning) {
  Spinner slow = OpenSpinner();
  std::future<grpc::Status> launched = std::async(std::launch::async, [&] { return UnarySpin(slow); });
  absl::SleepFor(absl::Milliseconds(100));
  auto stopped = std::async(std::launch::async, [&] { daemon_.reset(); });
  ASSERT_EQ(stopped.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "the daemon did not stop";
  // The kernel ran to its end; the call was answered or cancelled by the shutdown.
  const grpc::StatusCode code = launched.get().error_code();
  EXPECT_TRUE(code == grpc::StatusCode::OK || code == grpc::StatusCode::CANCELLED ||
              code == grpc::StatusCode::UNAVAILABLE)
      << code;
}

TEST_P(StreamTest, TheDaemonStopsWithStreamsOpenAndStalled) {
  auto idle = OpenRaw();
  auto stalled = OpenRaw();
  ASSERT_TRUE(stalled->stream->Write(EndlessStreamedSequence(*x_, 8)));
  absl::SleepFor(absl::Milliseconds(200));
  auto stopped = std::async(std::launch::async, [&] { daemon_.reset(); });
  ASSERT_EQ(stopped.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "the daemon did not stop";
  stalled->context.TryCancel();
  stalled->stream->Finish();
  idle->context.TryCancel();
  idle->stream->Finish();
}

INSTANTIATE_TEST_SUITE_P(Window, StreamTest, ::testing::Values(size_t{0}, size_t{8}),
                         [](const auto& info) { return absl::StrCat("window", info.param); });

}  // namespace
}  // namespace replayd::client
