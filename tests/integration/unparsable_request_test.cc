// Requests whose bytes do not parse as their message, sent raw over a generic gRPC call:
// each is answered INVALID_ARGUMENT naming the method and the message type (not gRPC's
// INTERNAL), on the sync server, on the completion queue, on the Session stream and in a
// WriteBuffer upload, and the daemon goes on serving.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>

#include <future>
#include <string>

#include "tests/integration/daemon_fixture.h"
#include "tests/support/status_macros.h"

namespace replayd::client {
namespace {

using ::testing::HasSubstr;

// Field 2, length-delimited, announcing 16 bytes of which 3 follow.
constexpr char kTruncated[] = "\x12\x10" "abc";

absl::Status Abseil(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

class BadInputBytesTest : public DaemonFixture {
 protected:
  void SetUp() override {
    DaemonFixture::SetUp();
    channel_ = grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials());
    generic_ = std::make_unique<grpc::GenericStub>(channel_);
  }

  // Sends `bytes` as the one request of the unary `method`.
  grpc::Status Unary(const std::string& method, const std::string& bytes) {
    grpc::ClientContext context;
    grpc::ByteBuffer request = Bytes(bytes), reply;
    std::promise<grpc::Status> done;
    generic_->UnaryCall(&context, method, grpc::StubOptions(), &request, &reply,
                        [&done](grpc::Status s) { done.set_value(std::move(s)); });
    return done.get_future().get();
  }

  // Opens a stream of `method` (Session, or WriteBuffer), sends each of `messages`,
  // half-closes, reads every reply and returns how the stream finished; `replies` counts
  // the replies read.
  grpc::Status Stream(const std::vector<std::string>& messages, int* replies,
                      const std::string& method = "/replayd.v1.Replayd/Session") {
    grpc::ClientContext context;
    grpc::CompletionQueue cq;
    auto call = generic_->PrepareCall(&context, method, &cq);
    auto step = [&cq](intptr_t tag) {
      void* got = nullptr;
      bool ok = false;
      EXPECT_TRUE(cq.Next(&got, &ok));
      EXPECT_EQ(reinterpret_cast<intptr_t>(got), tag);
      return ok;
    };
    call->StartCall(reinterpret_cast<void*>(1));
    step(1);
    for (const std::string& m : messages) {
      call->Write(Bytes(m), reinterpret_cast<void*>(2));
      if (!step(2)) break;
    }
    call->WritesDone(reinterpret_cast<void*>(3));
    step(3);
    *replies = 0;
    grpc::ByteBuffer reply;
    for (;;) {
      call->Read(&reply, reinterpret_cast<void*>(4));
      if (!step(4)) break;
      ++*replies;
    }
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(5));
    step(5);
    cq.Shutdown();
    return status;
  }

  static std::string Serialized(const google::protobuf::Message& m) {
    std::string bytes;
    EXPECT_TRUE(m.SerializeToString(&bytes));
    return bytes;
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> generic_;
};

TEST_F(BadInputBytesTest, MalformedRequestOnTheCompletionQueueIsInvalidArgumentNamingMethodAndType) {
  grpc::Status s = Unary("/replayd.v1.Replayd/ReplayGraph", kTruncated);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(),
            "replayd.v1.Replayd/ReplayGraph: the request does not parse as a replayd.v1.ReplayGraphRequest");
  // The daemon goes on serving the method.
  Session session = Open();
  v1::KeepAliveRequest keep;
  keep.set_session(session.id());
  EXPECT_OK(Abseil(Unary("/replayd.v1.Replayd/KeepAlive", Serialized(keep))));
  v1::ReplayGraphRequest replay;
  replay.set_session(session.id());
  replay.set_graph(12345);
  EXPECT_EQ(Unary("/replayd.v1.Replayd/ReplayGraph", Serialized(replay)).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(BadInputBytesTest, MalformedRequestOnTheSyncServerIsInvalidArgumentNamingMethodAndType) {
  grpc::Status s = Unary("/replayd.v1.Replayd/ListDevices", kTruncated);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(),
            "replayd.v1.Replayd/ListDevices: the request does not parse as a replayd.v1.ListDevicesRequest");
  s = Unary("/replayd.v1.Admin/ListTenants", kTruncated);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("replayd.v1.Admin/ListTenants: the request does not parse as a "
                                           "replayd.v1.ListTenantsRequest"));
  EXPECT_OK(Abseil(Unary("/replayd.v1.Replayd/ListDevices", "")));
  EXPECT_OK(Abseil(Unary("/replayd.v1.Admin/ListTenants", "")));
}

TEST_F(BadInputBytesTest, InvalidUtf8InAStringFieldIsInvalidArgument) {
  // OpenSessionRequest.device (field 1, a proto3 string) holding a lone continuation byte.
  grpc::Status s = Unary("/replayd.v1.Replayd/OpenSession", std::string("\x0a\x03" "c\x80" "0", 5));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("replayd.v1.Replayd/OpenSession: the request does not parse as a "
                                           "replayd.v1.OpenSessionRequest"));
  v1::OpenSessionRequest good;
  good.set_device("cpu:0");
  EXPECT_OK(Abseil(Unary("/replayd.v1.Replayd/OpenSession", Serialized(good))));
}

TEST_F(BadInputBytesTest, ExpressionNestedPastTheRecursionLimitIsInvalidArgument) {
  Session session = Open();
  v1::LaunchRequest launch;
  launch.set_session(session.id());
  v1::Expr* e = launch.add_global_expr();
  for (int depth = 0; depth < 80; ++depth) e = e->mutable_binary()->mutable_lhs();  // 160 messages deep
  e->set_constant(1);
  grpc::Status s = Unary("/replayd.v1.Replayd/Launch", Serialized(launch));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(), "replayd.v1.Replayd/Launch: the request does not parse as a replayd.v1.LaunchRequest");
  v1::KeepAliveRequest keep;
  keep.set_session(session.id());
  EXPECT_OK(Abseil(Unary("/replayd.v1.Replayd/KeepAlive", Serialized(keep))));
}

TEST_F(BadInputBytesTest, MalformedSessionRequestFinishesTheStreamAfterAnsweringWhatCameBefore) {
  Session session = Open();
  v1::SessionRequest keep;
  keep.set_seq(1);
  keep.set_session(session.id());
  keep.mutable_keep_alive();
  int replies = 0;
  grpc::Status s = Stream({Serialized(keep), kTruncated}, &replies);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(),
            "replayd.v1.Replayd/Session: the request does not parse as a replayd.v1.SessionRequest");
  EXPECT_EQ(replies, 1);  // the keep-alive read before it was answered
  // A new stream on the same session works, and a good stream still finishes OK.
  keep.set_seq(2);
  EXPECT_OK(Abseil(Stream({Serialized(keep)}, &replies)));
  EXPECT_EQ(replies, 1);
}

TEST_F(BadInputBytesTest, AWriteBufferChunkThatDoesNotParseEndsTheUploadWithInvalidArgument) {
  Session session = Open();
  ASSERT_OK_AND_ASSIGN(Buffer buffer, session.Alloc(16));
  ASSERT_OK(session.WriteVector(buffer, std::vector<uint8_t>(16, 0)));
  auto chunk = [&](uint64_t offset, uint8_t value) {
    v1::WriteChunk c;
    c.set_session(session.id());
    c.set_buffer(buffer.handle());
    c.set_offset(offset);
    c.set_data(std::string(8, static_cast<char>(value)));
    return Serialized(c);
  };
  const std::string kWriteBuffer = "/replayd.v1.Replayd/WriteBuffer";
  int replies = 0;
  grpc::Status s = Stream({chunk(0, 7), kTruncated, chunk(8, 9)}, &replies, kWriteBuffer);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(),
            "replayd.v1.Replayd/WriteBuffer: the request does not parse as a replayd.v1.WriteChunk");
  EXPECT_EQ(replies, 0);
  // The chunk before it was written; none after it.
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> got, session.ReadVector<uint8_t>(buffer, 16));
  std::vector<uint8_t> want(16, 0);
  std::fill(want.begin(), want.begin() + 8, 7);
  EXPECT_EQ(got, want);
  // A good upload on the same buffer answers OK with what it wrote; one with no chunk is
  // INVALID_ARGUMENT.
  EXPECT_OK(Abseil(Stream({chunk(0, 1), chunk(8, 2)}, &replies, kWriteBuffer)));
  EXPECT_EQ(replies, 1);
  ASSERT_OK_AND_ASSIGN(got, session.ReadVector<uint8_t>(buffer, 16));
  std::fill(want.begin(), want.begin() + 8, 1);
  std::fill(want.begin() + 8, want.end(), 2);
  EXPECT_EQ(got, want);
  s = Stream({}, &replies, kWriteBuffer);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("no chunk"));
}

}  // namespace
}  // namespace replayd::client
