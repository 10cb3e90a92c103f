#include "engine/program.h"

#include <gtest/gtest.h>

namespace replayd {
namespace {

DeviceInfo CpuInfo() {
  DeviceInfo info;
  info.id = "cpu:0";
  info.formats = {"cpu-c"};
  info.limits.max_args = 4;
  return info;
}

ProgramSource Source() {
  ProgramSource s;
  s.format = "cpu-c";
  s.code = "void k(float *x, int n) {}";
  s.entry = "k";
  s.signature.params = {{"x", ParamKind::kBuffer, Access::kOut}, {"n", ParamKind::kInt32, Access::kNone}};
  return s;
}

absl::StatusCode Check(const ProgramSource& s) { return CheckProgramSource(s, CpuInfo()).code(); }

TEST(CheckProgramSourceTest, AcceptsAWellFormedSource) {
  EXPECT_EQ(Check(Source()), absl::StatusCode::kOk);
}

TEST(CheckProgramSourceTest, RejectsFormatsTheDeviceDoesNotAccept) {
  ProgramSource s = Source();
  s.format = "cuda-ptx";
  absl::Status st = CheckProgramSource(s, CpuInfo());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cuda-ptx"), absl::string_view::npos);
}

TEST(CheckProgramSourceTest, RejectsEntriesThatAreNotIdentifiers) {
  for (const char* entry : {"", "1abc", "a-b", "k; system(\"x\")", "a b"}) {
    ProgramSource s = Source();
    s.entry = entry;
    EXPECT_EQ(Check(s), absl::StatusCode::kInvalidArgument) << entry;
  }
  ProgramSource s = Source();
  s.entry = std::string(300, 'a');
  EXPECT_EQ(Check(s), absl::StatusCode::kInvalidArgument);
}

TEST(CheckProgramSourceTest, RejectsMalformedSignatures) {
  ProgramSource no_access = Source();
  no_access.signature.params[0].access = Access::kNone;
  EXPECT_EQ(Check(no_access), absl::StatusCode::kInvalidArgument);

  ProgramSource int_with_access = Source();
  int_with_access.signature.params[1].access = Access::kIn;
  EXPECT_EQ(Check(int_with_access), absl::StatusCode::kInvalidArgument);

  ProgramSource too_many = Source();
  too_many.signature.params.resize(5, {"", ParamKind::kInt64, Access::kNone});
  EXPECT_EQ(Check(too_many), absl::StatusCode::kInvalidArgument);
}

TEST(CheckProgramSourceTest, RejectsEmptyAndOversizedCode) {
  ProgramSource empty = Source();
  empty.code.clear();
  EXPECT_EQ(Check(empty), absl::StatusCode::kInvalidArgument);
  ProgramSource huge = Source();
  huge.code.assign(kMaxCodeBytes + 1, ' ');
  EXPECT_EQ(Check(huge), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace replayd
