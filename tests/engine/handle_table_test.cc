#include "engine/handle_table.h"

#include <gtest/gtest.h>

namespace replayd {
namespace {

TEST(HandleTableTest, HandsOutIncreasingHandlesStartingAtOne) {
  HandleTable<int> table("thing");
  EXPECT_EQ(table.Insert(std::make_shared<int>(10)), 1u);
  EXPECT_EQ(table.Insert(std::make_shared<int>(20)), 2u);
  EXPECT_EQ(**table.Find(2), 20);
  EXPECT_EQ(table.size(), 2u);
}

TEST(HandleTableTest, NeverReusesARemovedHandle) {
  HandleTable<int> table("thing");
  Handle a = table.Insert(std::make_shared<int>(1));
  ASSERT_TRUE(table.Remove(a).ok());
  Handle b = table.Insert(std::make_shared<int>(2));
  EXPECT_NE(a, b);
  EXPECT_EQ(table.Find(a).status().code(), absl::StatusCode::kNotFound);
}

TEST(HandleTableTest, UnknownHandleIsNotFoundNamingKindAndHandle) {
  HandleTable<int> table("buffer");
  absl::Status s = table.Find(42).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("buffer 42"), absl::string_view::npos) << s;
  EXPECT_EQ(table.Remove(0).status().code(), absl::StatusCode::kNotFound);
}

TEST(HandleTableTest, RemoveHandsBackTheObjectAndClearDropsAll) {
  HandleTable<int> table("thing");
  auto obj = std::make_shared<int>(7);
  Handle h = table.Insert(obj);
  table.Insert(std::make_shared<int>(8));
  absl::StatusOr<std::shared_ptr<int>> removed = table.Remove(h);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->get(), obj.get());
  table.Clear();
  EXPECT_EQ(table.size(), 0u);
}

}  // namespace
}  // namespace replayd
