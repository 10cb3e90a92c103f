// Bad input over the wire: each request gets the right status, and nothing leaks or
// changes (device memory in use returns to its baseline, sessions keep working).
#include <gmock/gmock.h>

#include "tests/integration/daemon_fixture.h"

namespace replayd::client {
namespace {

using ::testing::HasSubstr;

class BadInputTest : public DaemonFixture {
 protected:
  void SetUp() override {
    DaemonFixture::SetUp();
    baseline_ = FreeMemory();
    session_ = std::make_unique<Session>(Open());
    buffer_ = std::make_unique<Buffer>(*session_->Alloc(1024));
    auto p = session_->Load(AddSpec());
    ASSERT_TRUE(p.ok()) << p.status();
    program_ = std::make_unique<Program>(std::move(*p));
    in_use_ = baseline_ - FreeMemory();
  }

  void TearDown() override {
    // Whatever failed, the session's memory is what it was, and all of it goes back.
    EXPECT_EQ(baseline_ - FreeMemory(), in_use_);
    program_.reset();
    buffer_.reset();
    session_.reset();
    EXPECT_EQ(FreeMemory(), baseline_);
  }

  v1::LaunchRequest GoodLaunch() {
    v1::LaunchRequest r;
    r.set_session(session_->id());
    r.set_program(program_->handle());
    for (int i = 0; i < 3; ++i) r.add_args()->mutable_view()->set_buffer(buffer_->handle());
    r.add_args()->set_int_value(256);
    r.add_args()->set_int_value(1);
    r.add_global(1);
    r.set_wait(true);
    return r;
  }

  grpc::Status Launch(const v1::LaunchRequest& r) {
    grpc::ClientContext ctx;
    v1::LaunchReply reply;
    return stub().Launch(&ctx, r, &reply);
  }

  grpc::Status Read(uint64_t session, uint64_t buffer, uint64_t offset, uint64_t length) {
    grpc::ClientContext ctx;
    v1::ReadBufferRequest r;
    r.set_session(session);
    r.set_buffer(buffer);
    r.set_offset(offset);
    r.set_length(length);
    auto reader = stub().ReadBuffer(&ctx, r);
    v1::ReadChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  }

  grpc::Status Write(const std::vector<v1::WriteChunk>& chunks) {
    grpc::ClientContext ctx;
    v1::WriteBufferReply reply;
    auto writer = stub().WriteBuffer(&ctx, &reply);
    for (const auto& c : chunks)
      if (!writer->Write(c)) break;
    writer->WritesDone();
    return writer->Finish();
  }

  v1::WriteChunk Chunk(uint64_t offset, size_t bytes, uint64_t buffer = 0) {
    v1::WriteChunk c;
    c.set_session(session_->id());
    c.set_buffer(buffer ? buffer : buffer_->handle());
    c.set_offset(offset);
    c.set_data(std::string(bytes, 'x'));
    return c;
  }

  grpc::Status LoadWith(const v1::Signature& signature, const std::string& format = "cpu-c") {
    grpc::ClientContext ctx;
    v1::LoadProgramRequest r;
    r.set_session(session_->id());
    r.set_format(format);
    r.set_code(kAddSource);
    r.set_entry("add");
    *r.mutable_signature() = signature;
    v1::LoadProgramReply reply;
    return stub().LoadProgram(&ctx, r, &reply);
  }

  uint64_t baseline_ = 0, in_use_ = 0;
  std::unique_ptr<Session> session_;
  std::unique_ptr<Buffer> buffer_;
  std::unique_ptr<Program> program_;
};

#define EXPECT_CODE(status, code_) EXPECT_EQ((status).error_code(), grpc::StatusCode::code_) << (status).error_message()

TEST_F(BadInputTest, GoodLaunchWorks) { EXPECT_CODE(Launch(GoodLaunch()), OK); }

TEST_F(BadInputTest, UnknownSessionIsNotFoundForEveryOperation) {
  const uint64_t bogus = 0x1234;
  EXPECT_CODE(Read(bogus, buffer_->handle(), 0, 4), NOT_FOUND);
  v1::LaunchRequest l = GoodLaunch();
  l.set_session(bogus);
  EXPECT_CODE(Launch(l), NOT_FOUND);
  v1::WriteChunk c = Chunk(0, 4);
  c.set_session(bogus);
  EXPECT_CODE(Write({c}), NOT_FOUND);
  grpc::ClientContext ctx;
  v1::AllocBufferRequest a;
  a.set_session(bogus);
  a.set_bytes(16);
  v1::AllocBufferReply ar;
  EXPECT_CODE(stub().AllocBuffer(&ctx, a, &ar), NOT_FOUND);
  grpc::ClientContext ctx2;
  v1::KeepAliveRequest k;
  k.set_session(0);
  v1::KeepAliveReply kr;
  EXPECT_CODE(stub().KeepAlive(&ctx2, k, &kr), NOT_FOUND);
}

TEST_F(BadInputTest, AnotherSessionsHandlesAreNotFound) {
  Session other = Open();
  auto theirs = other.Alloc(1024);
  ASSERT_TRUE(theirs.ok());
  // Handles are session-scoped: use session_'s handles in `other`.
  uint64_t foreign_buffer = buffer_->handle() + 100;
  EXPECT_CODE(Read(other.id(), foreign_buffer, 0, 4), NOT_FOUND);
  v1::LaunchRequest l = GoodLaunch();
  l.set_session(other.id());
  EXPECT_CODE(Launch(l), NOT_FOUND) << "program handle of another session";
  v1::LaunchRequest view = GoodLaunch();
  view.mutable_args(1)->mutable_view()->set_buffer(theirs->handle() + 7);
  EXPECT_CODE(Launch(view), NOT_FOUND);
  grpc::ClientContext ctx;
  v1::FreeProgramRequest fp;
  fp.set_session(other.id());
  fp.set_program(program_->handle());
  v1::FreeProgramReply fr;
  EXPECT_CODE(stub().FreeProgram(&ctx, fp, &fr), NOT_FOUND);
  // And session_'s objects are untouched.
  EXPECT_CODE(Launch(GoodLaunch()), OK);
}

TEST_F(BadInputTest, ReadsOutOfRangeAreInvalidArgument) {
  EXPECT_CODE(Read(session_->id(), buffer_->handle(), 1024, 1), INVALID_ARGUMENT);
  EXPECT_CODE(Read(session_->id(), buffer_->handle(), 1000, 25), INVALID_ARGUMENT);
  EXPECT_CODE(Read(session_->id(), buffer_->handle(), 8, ~0ull), INVALID_ARGUMENT);
  EXPECT_CODE(Read(session_->id(), buffer_->handle(), ~0ull, 2), INVALID_ARGUMENT);
  EXPECT_CODE(Read(session_->id(), buffer_->handle() + 1, 0, 4), NOT_FOUND);
  EXPECT_CODE(Read(session_->id(), buffer_->handle(), 1000, 24), OK);
}

TEST_F(BadInputTest, WritesOutOfRangeAreInvalidArgumentAndWriteNothing) {
  ASSERT_TRUE(session_->WriteVector(*buffer_, std::vector<uint8_t>(1024, 7)).ok());
  EXPECT_CODE(Write({Chunk(1020, 8)}), INVALID_ARGUMENT);
  EXPECT_CODE(Write({Chunk(~0ull, 2)}), INVALID_ARGUMENT);
  EXPECT_CODE(Write({Chunk(1024, 1)}), INVALID_ARGUMENT);
  auto back = session_->ReadVector<uint8_t>(*buffer_, 1024);
  EXPECT_EQ(std::count(back->begin(), back->end(), 7), 1024);
}

TEST_F(BadInputTest, WriteChunksOverOneMebibyteAreRejected) {
  auto big = session_->Alloc(4 << 20);
  ASSERT_TRUE(big.ok());
  grpc::Status s = Write({Chunk(0, (1 << 20) + 1, big->handle())});
  EXPECT_CODE(s, INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("exceeds the limit"));
}

TEST_F(BadInputTest, WriteChunksMustNameOneBuffer) {
  auto other = session_->Alloc(64);
  EXPECT_CODE(Write({Chunk(0, 4), Chunk(4, 4, other->handle())}), INVALID_ARGUMENT);
}

TEST_F(BadInputTest, EmptyWriteStreamIsInvalidArgument) { EXPECT_CODE(Write({}), INVALID_ARGUMENT); }

TEST_F(BadInputTest, AWriteStreamCancelledHalfwayLeaksNothing) {
  auto big = session_->Alloc(8 << 20);
  ASSERT_TRUE(big.ok());
  {
    grpc::ClientContext ctx;
    v1::WriteBufferReply reply;
    auto writer = stub().WriteBuffer(&ctx, &reply);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(writer->Write(Chunk(uint64_t(i) << 20, 1 << 20, big->handle())));
    ctx.TryCancel();
    EXPECT_CODE(writer->Finish(), CANCELLED);
  }
  // The session and its buffer still work.
  ASSERT_TRUE(session_->Write(*big, 0, std::vector<uint8_t>(16, 3)).ok());
  auto back = session_->ReadVector<uint8_t>(*big, 16);
  EXPECT_EQ((*back)[15], 3);
  *big = Buffer();
}

TEST_F(BadInputTest, ZeroAndAbsurdAllocationSizes) {
  EXPECT_EQ(session_->Alloc(0).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status huge = session_->Alloc(1ull << 62).status();
  EXPECT_EQ(huge.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(huge.message()), HasSubstr("4611686018427387904"));
  EXPECT_EQ(session_->Alloc(~0ull).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(BadInputTest, AllocationPastTheMemoryLimitFailsAndAllocatesNothing) {
  auto most = session_->Alloc(200 << 20);
  ASSERT_TRUE(most.ok());
  const uint64_t before = FreeMemory();
  EXPECT_EQ(session_->Alloc(100 << 20).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(FreeMemory(), before);
  Session other = Open();
  EXPECT_EQ(other.Alloc(100 << 20).status().code(), absl::StatusCode::kResourceExhausted);
  *most = Buffer();
  EXPECT_TRUE(other.Alloc(100 << 20).ok());
}

TEST_F(BadInputTest, MalformedSignaturesAreInvalidArgument) {
  v1::Signature unknown_kind;
  unknown_kind.add_params()->set_kind(static_cast<v1::Param::Kind>(99));
  EXPECT_CODE(LoadWith(unknown_kind), INVALID_ARGUMENT);
  v1::Signature unspecified;
  unspecified.add_params();
  EXPECT_CODE(LoadWith(unspecified), INVALID_ARGUMENT);
  v1::Signature buffer_without_access = *ParseSignature("out,in,in,int32,int32", true);
  buffer_without_access.mutable_params(1)->set_access(v1::Param::ACCESS_UNSPECIFIED);
  EXPECT_CODE(LoadWith(buffer_without_access), INVALID_ARGUMENT);
  v1::Signature int_with_access = *ParseSignature("out,in,in,int32,int32", true);
  int_with_access.mutable_params(3)->set_access(v1::Param::IN);
  EXPECT_CODE(LoadWith(int_with_access), INVALID_ARGUMENT);
  v1::Signature bad_access = *ParseSignature("out,in,in,int32,int32", true);
  bad_access.mutable_params(0)->set_access(static_cast<v1::Param::Access>(-5));
  EXPECT_CODE(LoadWith(bad_access), INVALID_ARGUMENT);
  v1::Signature too_many;
  for (int i = 0; i < 100; ++i) too_many.add_params()->set_kind(v1::Param::INT32);
  EXPECT_CODE(LoadWith(too_many), INVALID_ARGUMENT);
  // A signature that disagrees with the C function is a compile error.
  EXPECT_CODE(LoadWith(*ParseSignature("int32,in,in,int32,int32", true)), INVALID_ARGUMENT);
  EXPECT_CODE(LoadWith(*ParseSignature("out,in,in,int32,int32", true), "cuda-ptx"), INVALID_ARGUMENT);
}

// A message echoes a client's string only in part: a 4 MiB format, parameter name, entry or
// option comes back as a short message (a whole echo was refused by a default client as
// oversized metadata, and held by the daemon meanwhile).
TEST_F(BadInputTest, ErrorMessagesEchoAtMostAShortPrefixOfClientStrings) {
  const std::string huge(4 << 20, 'x');
  auto load = [&](const std::function<void(v1::LoadProgramRequest&)>& adjust) {
    v1::LoadProgramRequest r;
    r.set_session(session_->id());
    r.set_format("cpu-c");
    r.set_code(kAddSource);
    r.set_entry("add");
    *r.mutable_signature() = *ParseSignature("out,in,in,int32,int32", true);
    adjust(r);
    grpc::ClientContext ctx;
    v1::LoadProgramReply reply;
    return stub().LoadProgram(&ctx, r, &reply);
  };
  const std::vector<std::pair<const char*, std::function<void(v1::LoadProgramRequest&)>>> cases = {
      {"format", [&](v1::LoadProgramRequest& r) { r.set_format(huge); }},
      {"entry", [&](v1::LoadProgramRequest& r) { r.set_entry(huge); }},
      {"parameter name", [&](v1::LoadProgramRequest& r) { r.mutable_signature()->mutable_params(0)->set_name(huge); }},
      {"option", [&](v1::LoadProgramRequest& r) { r.add_options(huge); }},
  };
  for (const auto& [what, adjust] : cases) {
    grpc::Status s = load(adjust);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << what << ": " << s.error_message().substr(0, 200);
    EXPECT_LT(s.error_message().size(), 1024u) << what;
    EXPECT_THAT(s.error_message(), HasSubstr("(4194304 bytes)")) << what << ": " << s.error_message().substr(0, 200);
  }
}

TEST_F(BadInputTest, ProgramThatDoesNotCompileNamesTheLine) {
  ProgramSpec spec;
  spec.code = "void k(float *x) {\n\n  x[0] = nope;\n}\n";
  spec.entry = "k";
  spec.signature = *ParseSignature("out");
  absl::Status s = session_->Load(spec).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("program.c:3"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("nope"));
  spec.entry = "bad entry";
  EXPECT_EQ(session_->Load(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.entry = "k";
  spec.options = {"-fplugin=/tmp/evil.so"};
  EXPECT_EQ(session_->Load(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BadInputTest, WrongArgumentCountOrKind) {
  v1::LaunchRequest fewer = GoodLaunch();
  fewer.mutable_args()->RemoveLast();
  EXPECT_CODE(Launch(fewer), INVALID_ARGUMENT);
  v1::LaunchRequest more = GoodLaunch();
  more.add_args()->set_int_value(1);
  EXPECT_CODE(Launch(more), INVALID_ARGUMENT);
  v1::LaunchRequest int_for_buffer = GoodLaunch();
  int_for_buffer.mutable_args(0)->set_int_value(0x1000);
  EXPECT_CODE(Launch(int_for_buffer), INVALID_ARGUMENT);
  v1::LaunchRequest view_for_int = GoodLaunch();
  view_for_int.mutable_args(3)->mutable_view()->set_buffer(buffer_->handle());
  EXPECT_CODE(Launch(view_for_int), INVALID_ARGUMENT);
  v1::LaunchRequest empty_arg = GoodLaunch();
  empty_arg.mutable_args(4)->Clear();
  EXPECT_CODE(Launch(empty_arg), INVALID_ARGUMENT);
  v1::LaunchRequest int32_overflow = GoodLaunch();
  int32_overflow.mutable_args(3)->set_int_value(1ll << 40);
  grpc::Status s = Launch(int32_overflow);
  EXPECT_CODE(s, INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("int32"));
  v1::LaunchRequest unknown_program = GoodLaunch();
  unknown_program.set_program(999);
  EXPECT_CODE(Launch(unknown_program), NOT_FOUND);
}

TEST_F(BadInputTest, ViewsOutOfRange) {
  v1::LaunchRequest past_end = GoodLaunch();
  past_end.mutable_args(0)->mutable_view()->set_offset(1024);
  EXPECT_CODE(Launch(past_end), INVALID_ARGUMENT);
  v1::LaunchRequest too_long = GoodLaunch();
  too_long.mutable_args(1)->mutable_view()->set_offset(512);
  too_long.mutable_args(1)->mutable_view()->set_length(513);
  EXPECT_CODE(Launch(too_long), INVALID_ARGUMENT);
  v1::LaunchRequest wrapping = GoodLaunch();
  wrapping.mutable_args(2)->mutable_view()->set_offset(16);
  wrapping.mutable_args(2)->mutable_view()->set_length(~0ull - 8);
  EXPECT_CODE(Launch(wrapping), INVALID_ARGUMENT);
}

TEST_F(BadInputTest, LaunchDimensionsZeroOrPastTheLimits) {
  v1::LaunchRequest zero = GoodLaunch();
  zero.set_global(0, 0);
  EXPECT_CODE(Launch(zero), INVALID_ARGUMENT);
  v1::LaunchRequest four = GoodLaunch();
  for (int i = 0; i < 3; ++i) four.add_global(1);
  EXPECT_CODE(Launch(four), INVALID_ARGUMENT);
  v1::LaunchRequest huge = GoodLaunch();
  huge.set_global(0, 1ull << 40);
  EXPECT_CODE(Launch(huge), INVALID_ARGUMENT);
  v1::LaunchRequest product = GoodLaunch();
  product.set_global(0, 1 << 20);
  product.add_global(1 << 20);
  EXPECT_CODE(Launch(product), INVALID_ARGUMENT);
  v1::LaunchRequest local = GoodLaunch();
  local.add_local(2);
  EXPECT_CODE(Launch(local), INVALID_ARGUMENT);
  v1::LaunchRequest local_zero = GoodLaunch();
  local_zero.add_local(0);
  EXPECT_CODE(Launch(local_zero), INVALID_ARGUMENT);
}

TEST_F(BadInputTest, UnknownDeviceIsNotFound) {
  EXPECT_EQ(client().OpenSession("cuda:7").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client().OpenSession(std::string(100000, 'x')).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BadInputTest, AClosedSessionAnswersNotFound) {
  Session other = Open();
  auto b = other.Alloc(64);
  uint64_t id = other.id(), handle = b->handle();
  ASSERT_TRUE(other.Close().ok());
  EXPECT_CODE(Read(id, handle, 0, 4), NOT_FOUND);
  v1::WriteChunk c = Chunk(0, 4, handle);
  c.set_session(id);
  EXPECT_CODE(Write({c}), NOT_FOUND);
}

}  // namespace
}  // namespace replayd::client
