// Health and discovery over loopback: grpc.health.v1 Check and Watch with a real health
// client, for the daemon as a whole and per service; a drain (Daemon::Drain, Admin.Drain)
// turning it NOT_SERVING and refusing new sessions; a daemon without devices; and server
// reflection listing and describing the services, as grpcurl asks.
#include <gmock/gmock.h>

#include <fstream>

#include "absl/strings/match.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "replayd/v1/admin.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/support/reflection_wire.pb.h"
#include "tests/support/status_macros.h"
#include "tests/support/tenants_file.h"

namespace replayd::client {
namespace {

using ::testing::IsSupersetOf;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using ServingStatus = HealthCheckResponse::ServingStatus;
namespace reflection = ::replayd::test::reflection;

class HealthTest : public DaemonFixture {
 protected:
  // grpc.health.v1 Check for `service`, through the generated health stub.
  absl::StatusOr<ServingStatus> Check(const std::string& service) {
    auto stub = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse reply;
    absl::Status s = FromGrpc(stub->Check(&context, request, &reply));
    if (!s.ok()) return s;
    return reply.status();
  }

  // One request of the server reflection stream, and its reply.
  absl::StatusOr<reflection::ServerReflectionResponse> Reflect(const reflection::ServerReflectionRequest& request) {
    auto channel = grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials());
    const grpc::internal::RpcMethod method("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                           grpc::internal::RpcMethod::BIDI_STREAMING);
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<reflection::ServerReflectionRequest, reflection::ServerReflectionResponse>>
        stream(grpc::internal::ClientReaderWriterFactory<
               reflection::ServerReflectionRequest, reflection::ServerReflectionResponse>::Create(channel.get(), method,
                                                                                                   &context));
    reflection::ServerReflectionResponse reply;
    const bool sent = stream->Write(request) && stream->WritesDone();
    const bool read = sent && stream->Read(&reply);
    absl::Status s = FromGrpc(stream->Finish());
    if (!s.ok()) return s;
    if (!read) return absl::InternalError("the reflection stream ended without a reply");
    return reply;
  }
};

TEST_F(HealthTest, TheDaemonAndEachServiceAreServing) {
  for (const std::string service : {"", "replayd.v1.Replayd", "replayd.v1.Admin"}) {
    ASSERT_OK_AND_ASSIGN(ServingStatus status, Check(service));
    EXPECT_EQ(status, HealthCheckResponse::SERVING) << "\"" << service << "\"";
  }
  EXPECT_EQ(Check("replayd.v1.NoSuchService").status().code(), absl::StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(ServingStatus through_client, client().Health());
  EXPECT_EQ(through_client, HealthCheckResponse::SERVING);
}

// A Watch sees the drain begin; Check agrees; new sessions are refused while a session
// opened before goes on working; the stop ends the Watch.
TEST_F(HealthTest, ADrainTurnsTheDaemonNotServingAndRefusesNewSessions) {
  Session open = Open();
  ASSERT_OK_AND_ASSIGN(Buffer buffer, open.Alloc(64));
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext watch_context;
  HealthCheckRequest everything;
  auto watch = stub->Watch(&watch_context, everything);
  HealthCheckResponse seen;
  ASSERT_TRUE(watch->Read(&seen));
  EXPECT_EQ(seen.status(), HealthCheckResponse::SERVING);

  EXPECT_TRUE(daemon_->Drain());
  EXPECT_FALSE(daemon_->Drain());  // once
  ASSERT_TRUE(watch->Read(&seen));
  EXPECT_EQ(seen.status(), HealthCheckResponse::NOT_SERVING);
  for (const std::string service : {"", "replayd.v1.Replayd"}) {
    ASSERT_OK_AND_ASSIGN(ServingStatus status, Check(service));
    EXPECT_EQ(status, HealthCheckResponse::NOT_SERVING) << "\"" << service << "\"";
  }
  ASSERT_OK_AND_ASSIGN(ServingStatus admin, Check("replayd.v1.Admin"));
  EXPECT_EQ(admin, HealthCheckResponse::SERVING);

  absl::StatusOr<Session> refused = client().OpenSession("cpu:0");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "draining")) << refused.status();
  const std::vector<uint8_t> bytes(64, 7);
  EXPECT_TRUE(open.Write(buffer, 0, bytes).ok());
  std::vector<uint8_t> back(64);
  EXPECT_TRUE(open.Read(buffer, 0, back).ok());
  EXPECT_EQ(back, bytes);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::Device> devices, client().ListDevices());
  EXPECT_FALSE(devices.empty());

  EXPECT_TRUE(open.Close().ok());
  EXPECT_EQ(daemon_->Stop(), 0u);  // every session closed: the stop does not wait for one
  // The stop ends the Watch; whatever it still says before that is NOT_SERVING.
  while (watch->Read(&seen)) EXPECT_EQ(seen.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(watch->Finish().ok());
}

TEST_F(HealthTest, ADaemonWithoutDevicesIsNotReady) {
  Options options;
  options.adjust = [](DaemonOptions& d) { d.devices.clear(); };
  Start(options);
  for (const std::string service : {"", "replayd.v1.Replayd"}) {
    ASSERT_OK_AND_ASSIGN(ServingStatus status, Check(service));
    EXPECT_EQ(status, HealthCheckResponse::NOT_SERVING) << "\"" << service << "\"";
  }
  ASSERT_OK_AND_ASSIGN(ServingStatus admin, Check("replayd.v1.Admin"));
  EXPECT_EQ(admin, HealthCheckResponse::SERVING);
}

TEST_F(HealthTest, AdminDrainNeedsAnAdmin) {
  const auto file = cache_.path() / "tenants.textproto";
  std::ofstream(file) << TenantText("root", "root-token", "  admin: true\n  trusted: true\n")
                      << TenantText("alice", "alice-token", "  trusted: true\n");
  Options options;
  options.tenants_file = file;
  Start(options);
  ClientOptions alice_options, root_options;
  alice_options.token = "alice-token";
  root_options.token = "root-token";
  Client alice = Client::Connect(daemon_->address(), alice_options);
  Client root = Client::Connect(daemon_->address(), root_options);
  ASSERT_OK_AND_ASSIGN(Session session, alice.OpenSession("cpu:0"));

  EXPECT_EQ(alice.Drain().status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(client().Drain().status().code(), absl::StatusCode::kUnauthenticated);
  ASSERT_OK_AND_ASSIGN(ServingStatus still, Check(""));
  EXPECT_EQ(still, HealthCheckResponse::SERVING);  // a refused Drain changes nothing

  ASSERT_OK_AND_ASSIGN(v1::DrainReply first, root.Drain());
  EXPECT_FALSE(first.already_draining());
  EXPECT_EQ(first.sessions(), 1u);
  EXPECT_GT(first.seconds_left(), 0);
  ASSERT_OK_AND_ASSIGN(v1::DrainReply second, root.Drain());
  EXPECT_TRUE(second.already_draining());
  EXPECT_LE(second.seconds_left(), first.seconds_left());
  ASSERT_OK_AND_ASSIGN(ServingStatus drained, Check(""));
  EXPECT_EQ(drained, HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(alice.OpenSession("cpu:0").status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(HealthTest, ReflectionListsAndDescribesTheServices) {
  reflection::ServerReflectionRequest list;
  list.set_list_services("");
  ASSERT_OK_AND_ASSIGN(reflection::ServerReflectionResponse listed, Reflect(list));
  ASSERT_TRUE(listed.has_list_services_response()) << listed.DebugString();
  std::vector<std::string> names;
  for (const reflection::ServiceResponse& s : listed.list_services_response().service()) names.push_back(s.name());
  EXPECT_THAT(names, IsSupersetOf({"replayd.v1.Replayd", "replayd.v1.Admin", "grpc.health.v1.Health",
                                   "grpc.reflection.v1alpha.ServerReflection"}));

  // What grpcurl asks before it calls a method: the file that defines a service.
  for (const auto& [symbol, file] : std::vector<std::pair<std::string, std::string>>{
           {"replayd.v1.Replayd", "replayd/v1/replayd.proto"},
           {"replayd.v1.Admin", "replayd/v1/admin.proto"},
           {"grpc.health.v1.Health", "grpc/health/v1/health.proto"}}) {
    reflection::ServerReflectionRequest describe;
    describe.set_file_containing_symbol(symbol);
    ASSERT_OK_AND_ASSIGN(reflection::ServerReflectionResponse described, Reflect(describe));
    ASSERT_TRUE(described.has_file_descriptor_response()) << symbol << ": " << described.DebugString();
    ASSERT_GE(described.file_descriptor_response().file_descriptor_proto_size(), 1) << symbol;
    google::protobuf::FileDescriptorProto proto;
    ASSERT_TRUE(proto.ParseFromString(described.file_descriptor_response().file_descriptor_proto(0))) << symbol;
    EXPECT_EQ(proto.name(), file);
  }
}

}  // namespace
}  // namespace replayd::client
