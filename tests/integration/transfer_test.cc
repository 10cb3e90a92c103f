// Large transfers: 1 GiB written and read back through the chunked streams.
#include <gtest/gtest.h>

#include "tests/integration/daemon_fixture.h"

namespace replayd::client {
namespace {

class TransferTest : public DaemonFixture {
 protected:
  void SetUp() override { Start({absl::Seconds(60), 1ull << 31}); }
};

// A position-dependent pattern, so misplaced chunks are caught.
void Pattern(uint64_t at, std::span<uint8_t> out) {
  for (size_t i = 0; i < out.size(); i += 8) {
    uint64_t v = (at + i) * 0x9E3779B97F4A7C15ull;
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, out.size() - i));
  }
}

TEST_F(TransferTest, OneGibibyteRoundTrip) {
  const uint64_t kBytes = 1ull << 30, kPiece = 64 << 20;
  const uint64_t baseline = FreeMemory();
  Session s = Open();
  auto b = s.Alloc(kBytes);
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<uint8_t> piece(kPiece), back(kPiece), expect(kPiece);
  for (uint64_t at = 0; at < kBytes; at += kPiece) {
    Pattern(at, piece);
    ASSERT_TRUE(s.Write(*b, at, piece).ok()) << at;
  }
  for (uint64_t at = 0; at < kBytes; at += kPiece) {
    ASSERT_TRUE(s.Read(*b, at, back).ok()) << at;
    Pattern(at, expect);
    ASSERT_EQ(back, expect) << "mismatch in the piece at " << at;
  }
  *b = Buffer();
  EXPECT_EQ(FreeMemory(), baseline);
}

TEST_F(TransferTest, UnalignedOffsetsAndOddSizes) {
  Session s = Open();
  const uint64_t kBytes = (3 << 20) + 17;
  auto b = s.Alloc(kBytes);
  std::vector<uint8_t> data(kBytes - 5);
  Pattern(5, data);
  ASSERT_TRUE(s.Write(*b, 5, data).ok());
  std::vector<uint8_t> back(kBytes - 5);
  ASSERT_TRUE(s.Read(*b, 5, back).ok());
  EXPECT_EQ(back, data);
}

}  // namespace
}  // namespace replayd::client
