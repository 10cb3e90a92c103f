// Context::PinHost's promise, checked on a GPU driver over its fake (fake_cuda, fake_hip),
// whose count(what) says how many host ranges are "registered" and how many copies went
// straight from or into them ("registered_copies").
#ifndef REPLAYD_TESTS_SUPPORT_PINNED_TRANSFERS_H_
#define REPLAYD_TESTS_SUPPORT_PINNED_TRANSFERS_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "drivers/driver.h"
#include "tests/support/status_macros.h"

namespace replayd::testing {

// In `c`, freshly opened: a pinned range (standing for an executor's data area) is
// registered once and cannot be registered again; a write from it and a read into it are
// one copy each, straight; a read into memory elsewhere is staged and right. The caller
// checks that the registration goes with the context.
inline void CheckPinnedTransfers(Context& c, const std::function<int(const char*)>& count) {
  std::vector<uint8_t> area(1 << 20);
  ASSERT_OK(c.PinHost(area));
  EXPECT_EQ(count("registered"), 1);
  EXPECT_FALSE(c.PinHost(std::span(area).subspan(4096, 4096)).ok()) << "memory already registered";
  std::vector<uint8_t> pattern(64 << 10);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 7 + i / 256);
  ASSERT_OK_AND_ASSIGN(Allocation a, c.Allocate(pattern.size()));
  std::copy(pattern.begin(), pattern.end(), area.begin() + 100);
  ASSERT_OK(c.Write(a, 0, std::span(area).subspan(100, pattern.size())));
  EXPECT_EQ(count("registered_copies"), 1);
  std::fill(area.begin(), area.end(), 0);
  ASSERT_OK(c.Read(a, 0, std::span(area).subspan(8, pattern.size())));
  EXPECT_EQ(count("registered_copies"), 2);
  EXPECT_TRUE(std::equal(pattern.begin(), pattern.end(), area.begin() + 8));
  std::vector<uint8_t> elsewhere(pattern.size());
  ASSERT_OK(c.Read(a, 0, elsewhere));
  EXPECT_EQ(elsewhere, pattern);
  EXPECT_EQ(count("registered_copies"), 2) << "memory elsewhere is staged";
  c.Free(a);
}

}  // namespace replayd::testing

#endif  // REPLAYD_TESTS_SUPPORT_PINNED_TRANSFERS_H_
