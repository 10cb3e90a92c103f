#include "engine/call.h"

#include <gmock/gmock.h>

#include "engine/graph.h"

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

TEST(CheckBoundVariablesTest, SplitsDefinitionsAndValuesOrNamesWhatIsWrong) {
  const VariableDecl pos{"pos", 1, 256, 1}, n{"n", 0, 64, 8};
  absl::StatusOr<BoundValues> bound = CheckBoundVariables({{pos, 17}, {n, 16}});
  ASSERT_TRUE(bound.ok()) << bound.status();
  ASSERT_EQ(bound->variables.size(), 2u);
  EXPECT_EQ(bound->variables[1].name, "n");
  EXPECT_EQ(bound->values, (std::vector<int64_t>{17, 16}));
  EXPECT_THAT(std::string(CheckBoundVariables({{pos, 1}, {pos, 2}}).status().message()),
              ::testing::HasSubstr("pos is bound twice"));
  EXPECT_THAT(std::string(CheckBoundVariables({{n, 12}}).status().message()),
              ::testing::HasSubstr("not a multiple of 8"));
}

// One rule and one message for every path that builds a graph: a definition, a capture
// as it grows, a request off the wire.
TEST(CheckGraphLimitsTest, NamesTheCountOverItsLimit) {
  EXPECT_TRUE(CheckGraphLimits(kMaxGraphVariables, kMaxGraphSlots, kMaxGraphCalls).ok());
  absl::Status calls = CheckGraphLimits(0, 0, kMaxGraphCalls + 1);
  EXPECT_EQ(calls.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(calls.message()), ::testing::HasSubstr("at most 65536 calls; this one would have 65537"));
  EXPECT_THAT(std::string(CheckGraphLimits(65, 0, 0).message()), ::testing::HasSubstr("at most 64 variables"));
  EXPECT_THAT(std::string(CheckGraphLimits(0, kMaxGraphSlots + 1, 0).message()), ::testing::HasSubstr("slots"));
}

}  // namespace
}  // namespace replayd
