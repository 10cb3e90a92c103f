// The client's Session stream against a scripted Session service on loopback: replies
// reach their own operations whichever thread reads them, the window is kept by reading
// on the submitting thread, a stream that ends fails what is outstanding, and a request
// that finds its stream ended goes on a new one.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "client/session_core.h"
#include "client/stream.h"

namespace replayd::client {
namespace {

// Answers each request with its seq as the keep-alive lease, after `hold` has been
// released; ends a stream (returning OK without a reply) at its `end_at`-th request.
class ScriptedService final : public v1::Replayd::Service {
 public:
  grpc::Status Session(grpc::ServerContext*,
                       grpc::ServerReaderWriter<v1::SessionReply, v1::SessionRequest>* stream) override {
    streams_.fetch_add(1);
    v1::SessionRequest request;
    for (int n = 1; stream->Read(&request); ++n) {
      received_.fetch_add(1);
      if (n == end_at_.load()) return grpc::Status::OK;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(+[](bool* held) { return !*held; }, &held_));
      }
      v1::SessionReply reply;
      reply.set_seq(request.seq());
      reply.set_final(true);
      reply.mutable_keep_alive()->set_lease_seconds(static_cast<uint32_t>(request.seq()));
      if (!stream->Write(reply)) break;
      if (n == end_after_.load()) return grpc::Status::OK;
    }
    return grpc::Status::OK;
  }

  void EndAt(int n) { end_at_.store(n); }
  void EndAfter(int n) { end_after_.store(n); }
  void Hold(bool held) {
    absl::MutexLock lock(&mu_);
    held_ = held;
  }
  int streams() const { return streams_.load(); }
  int received() const { return received_.load(); }

 private:
  std::atomic<int> end_at_{0}, end_after_{0}, streams_{0}, received_{0};
  absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
};

class ClientStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    stub_ = v1::Replayd::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(std::chrono::system_clock::now()); }

  // A keep-alive whose reply, or failure, lands in `out`.
  struct Op {
    v1::SessionRequest request;
    Stream::DoneFn done;
    Stream::PartialFn partial;
  };
  static Op KeepAlive(absl::StatusOr<v1::SessionReply>* out) {
    Op op;
    op.request.mutable_keep_alive();
    op.done = [out](absl::StatusOr<v1::SessionReply> reply) { *out = std::move(reply); };
    return op;
  }

  ScriptedService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Replayd::Stub> stub_;
};

TEST_F(ClientStreamTest, EachThreadGetsItsOwnRepliesWhoeverReadsThem) {
  Stream stream(*stub_, "", 7, /*window=*/4);
  constexpr int kThreads = 4, kOps = 200;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kOps; ++i) {
        absl::StatusOr<v1::SessionReply> reply = absl::UnknownError("no reply");
        Op op = KeepAlive(&reply);
        absl::StatusOr<uint64_t> seq = stream.Submit(op.request, op.done, op.partial);
        if (!seq.ok()) return void(++wrong);
        stream.Await(*seq);
        if (!reply.ok() || reply->seq() != *seq || reply->keep_alive().lease_seconds() != *seq) ++wrong;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(service_.received(), kThreads * kOps);
}

TEST_F(ClientStreamTest, SubmitReadsRepliesPastTheWindowAndAwaitCompletesEverythingBefore) {
  Stream stream(*stub_, "", 7, /*window=*/3);
  std::vector<absl::StatusOr<v1::SessionReply>> replies(10, absl::UnknownError("no reply"));
  std::vector<uint64_t> seqs;
  for (auto& r : replies) {
    Op op = KeepAlive(&r);
    // Past three outstanding, Submit reads the oldest reply on this thread.
    seqs.push_back(*stream.Submit(op.request, op.done, op.partial));
  }
  EXPECT_TRUE(replies[6].ok()) << "the window made Submit complete the first seven";
  stream.Await(seqs.back());
  for (size_t i = 0; i < replies.size(); ++i) {
    ASSERT_TRUE(replies[i].ok()) << i << ": " << replies[i].status();
    EXPECT_EQ(replies[i]->seq(), seqs[i]);
  }
}

TEST_F(ClientStreamTest, AStreamThatEndsFailsWhatIsOutstandingAndIsReplaced) {
  service_.EndAt(3);
  // Held, the service answers nothing until all five are sent, so none of them can find
  // the stream already ended.
  service_.Hold(true);
  auto stub = std::shared_ptr<v1::Replayd::Stub>(std::move(stub_));
  client_internal::SessionCore core(stub, /*token=*/"", /*id=*/7, /*window=*/64);
  std::vector<absl::StatusOr<v1::SessionReply>> replies(5, absl::UnknownError("no reply"));
  std::vector<client_internal::Submitted> sent;
  for (auto& r : replies) {
    Op op = KeepAlive(&r);
    absl::StatusOr<client_internal::Submitted> s = core.Submit(op.request, op.done);
    ASSERT_TRUE(s.ok()) << s.status();
    sent.push_back(*std::move(s));
  }
  service_.Hold(false);
  ASSERT_EQ(sent.front().stream, sent.back().stream);
  sent.back().stream->Await(sent.back().seq);
  EXPECT_TRUE(replies[0].ok());
  EXPECT_TRUE(replies[1].ok());
  for (int i = 2; i < 5; ++i) EXPECT_EQ(replies[i].status().code(), absl::StatusCode::kUnavailable) << i;
  EXPECT_FALSE(sent.back().stream->healthy());

  // The next operation goes on a new stream, which the service answers.
  service_.EndAt(0);
  absl::StatusOr<v1::SessionReply> next = absl::UnknownError("no reply");
  Op op = KeepAlive(&next);
  absl::StatusOr<client_internal::Submitted> s = core.Submit(op.request, op.done);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NE(s->stream, sent.back().stream);
  s->stream->Await(s->seq);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(service_.streams(), 2);
  core.CloseStream();
}

TEST_F(ClientStreamTest, ARequestThatFindsAnIdleStreamEndedGoesOnANewOne) {
  service_.EndAfter(1);  // answers the first request, then ends the stream
  auto stub = std::shared_ptr<v1::Replayd::Stub>(std::move(stub_));
  client_internal::SessionCore core(stub, /*token=*/"", /*id=*/7, /*window=*/64);
  absl::StatusOr<v1::SessionReply> first = absl::UnknownError("no reply");
  Op op = KeepAlive(&first);
  absl::StatusOr<client_internal::Submitted> s = core.Submit(op.request, op.done);
  ASSERT_TRUE(s.ok());
  s->stream->Await(s->seq);
  ASSERT_TRUE(first.ok());
  const std::shared_ptr<Stream> old = s->stream;
  absl::SleepFor(absl::Milliseconds(100));  // the end reaches the idle client
  // Nothing reads an idle stream, so the next request finds the end when it is written
  // and goes, unsent and alone, on a new stream.
  service_.EndAfter(0);
  absl::StatusOr<v1::SessionReply> second = absl::UnknownError("no reply");
  Op op2 = KeepAlive(&second);
  s = core.Submit(op2.request, op2.done);
  ASSERT_TRUE(s.ok()) << s.status();
  s->stream->Await(s->seq);
  EXPECT_TRUE(second.ok()) << second.status();
  EXPECT_NE(s->stream, old);
  EXPECT_EQ(service_.streams(), 2);
  core.CloseStream();
}

TEST_F(ClientStreamTest, CloseWaitsForWhatIsOutstanding) {
  Stream stream(*stub_, "", 7, /*window=*/8);
  service_.Hold(true);
  std::vector<absl::StatusOr<v1::SessionReply>> replies(5, absl::UnknownError("no reply"));
  for (auto& r : replies) {
    Op op = KeepAlive(&r);
    ASSERT_TRUE(stream.Submit(op.request, op.done, op.partial).ok());
  }
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(50));
    service_.Hold(false);
  });
  stream.Close();
  release.join();
  for (auto& r : replies) EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(stream.healthy());
  absl::StatusOr<v1::SessionReply> after = absl::UnknownError("no reply");
  Op op = KeepAlive(&after);
  EXPECT_TRUE(Stream::IsNotSent(stream.Submit(op.request, op.done, op.partial).status()));
}

}  // namespace
}  // namespace replayd::client
