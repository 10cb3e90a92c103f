// Requests whose bytes do not parse as their message, sent raw over a generic gRPC call:
// each is answered INVALID_ARGUMENT naming the method and the message type (not gRPC's
// INTERNAL), on the sync server, on the completion queue and on the Session stream, and
// the daemon goes on serving.
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

  // Opens a Session stream, sends each of `messages`, half-closes, reads every reply and
  // returns how the stream finished; `replies` counts the replies read.
  grpc::Status Stream(const std::vector<std::string>& messages, int* replies) {
    grpc::ClientContext context;
    grpc::CompletionQueue cq;
    auto call = generic_->PrepareCall(&context, "/replayd.v1.Replayd/Session", &cq);
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

}  // namespace
}  // namespace replayd::client
