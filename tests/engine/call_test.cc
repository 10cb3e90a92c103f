#include "engine/call.h"

#include <gtest/gtest.h>

namespace replayd {
namespace {

const Dim3 kMax = {1024, 64, 8};

TEST(CheckDimsTest, MissingDimensionsAreOne) {
  absl::StatusOr<Dim3> d = CheckDims({16}, kMax, 1 << 20, "global");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, (Dim3{16, 1, 1}));
  EXPECT_EQ(*CheckDims({}, kMax, 1, "global"), (Dim3{1, 1, 1}));
}

TEST(CheckDimsTest, RejectsZeroTooManyAndPastLimits) {
  EXPECT_EQ(CheckDims({4, 0}, kMax, 1 << 20, "global").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckDims({1, 1, 1, 1}, kMax, 1 << 20, "global").status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status s = CheckDims({1025}, kMax, 1 << 20, "local").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("local[0] = 1025"), absl::string_view::npos) << s;
  // Each dimension within its limit, the product past the total.
  EXPECT_EQ(CheckDims({1024, 64, 8}, kMax, 1024 * 64, "global").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckDims({1024, 64}, kMax, 1024 * 64, "global").ok());
}

TEST(CheckDimsTest, HugeValuesDoNotOverflowIntoAcceptance) {
  const Dim3 max = {~0ull, ~0ull, ~0ull};
  EXPECT_EQ(CheckDims({1ull << 40, 1ull << 40}, max, 1ull << 62, "global").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ResolveViewTest, ZeroLengthMeansToTheEnd) {
  auto r = ResolveView({1, 16, 0}, 64);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first, 16u);
  EXPECT_EQ(r->second, 48u);
}

TEST(ResolveViewTest, RejectsRangesOutsideTheBuffer) {
  EXPECT_FALSE(ResolveView({1, 64, 0}, 64).ok());
  EXPECT_FALSE(ResolveView({1, 60, 8}, 64).ok());
  EXPECT_FALSE(ResolveView({1, 8, ~0ull}, 64).ok());
  EXPECT_FALSE(ResolveView({1, ~0ull, 2}, 64).ok());
  EXPECT_TRUE(ResolveView({1, 56, 8}, 64).ok());
}

}  // namespace
}  // namespace replayd
