// The staging schedule with host memory standing in for the device: the bytes arrive
// whole, and each buffer is reused only after waiting for its previous copy.
#include "drivers/staging.h"

#include <gmock/gmock.h>

#include <numeric>
#include <string>
#include <vector>

namespace replayd {
namespace {

class StagingTest : public ::testing::Test {
 protected:
  // A "device" of `bytes`; copies run at once and log "copy i@offset+n", waits "wait i".
  Staging Make(uint64_t chunk, bool to_device) {
    Staging s;
    for (int i = 0; i < 2; ++i) {
      pinned_[i].assign(chunk, 0);
      s.buffers[i] = pinned_[i].data();
    }
    s.chunk = chunk;
    s.wait = [this](int i) {
      log_.push_back("wait " + std::to_string(i));
      return absl::OkStatus();
    };
    s.copy = [this, to_device](int i, uint64_t offset, uint64_t n) {
      log_.push_back("copy " + std::to_string(i) + "@" + std::to_string(offset) + "+" + std::to_string(n));
      if (to_device) {
        std::memcpy(device_.data() + offset, pinned_[i].data(), n);
      } else {
        std::memcpy(pinned_[i].data(), device_.data() + offset, n);
      }
      return fail_at_ == log_.size() ? absl::InternalError("copy failed") : absl::OkStatus();
    };
    return s;
  }

  std::vector<uint8_t> pinned_[2];
  std::vector<uint8_t> device_ = std::vector<uint8_t>(2500, 0);
  std::vector<std::string> log_;
  size_t fail_at_ = 0;
};

TEST_F(StagingTest, AWriteArrivesWholeAndWaitsBeforeReusingABuffer) {
  std::vector<uint8_t> data(2500);
  std::iota(data.begin(), data.end(), 0);
  ASSERT_TRUE(StagedWrite(Make(1000, true), data).ok());
  EXPECT_EQ(device_, data);
  EXPECT_EQ(log_, (std::vector<std::string>{"wait 0", "copy 0@0+1000", "wait 1", "copy 1@1000+1000", "wait 0",
                                            "copy 0@2000+500"}));
}

TEST_F(StagingTest, AReadQueuesTheNextChunkBeforeTakingOutThisOne) {
  std::iota(device_.begin(), device_.end(), 7);
  std::vector<uint8_t> out(2500);
  ASSERT_TRUE(StagedRead(Make(1000, false), out).ok());
  EXPECT_EQ(out, device_);
  EXPECT_EQ(log_, (std::vector<std::string>{"copy 0@0+1000", "copy 1@1000+1000", "wait 0", "copy 0@2000+500", "wait 1",
                                            "wait 0"}));
}

TEST_F(StagingTest, AFailedCopyStopsTheTransfer) {
  fail_at_ = 2;
  std::vector<uint8_t> data(2500, 1);
  EXPECT_EQ(StagedWrite(Make(1000, true), data).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(log_.size(), 2u);
  std::vector<uint8_t> empty;
  log_.clear();
  EXPECT_TRUE(StagedRead(Make(1000, false), std::span<uint8_t>(empty)).ok());
  EXPECT_TRUE(log_.empty());
}

// A transfer copies straight only when it lies wholly inside one pinned range.
TEST(PinnedRangesTest, HoldOnlyWhatLiesWhollyInsideOneRange) {
  std::vector<uint8_t> host(3 * 4096), other(16);
  const std::span<uint8_t> a = std::span(host).subspan(1024, 4096), b = std::span(host).subspan(8192, 4096);
  PinnedRanges pinned;
  EXPECT_FALSE(pinned.Hold(a.data(), 1));
  pinned.Add(a);
  pinned.Add(b);
  EXPECT_TRUE(pinned.Hold(a.data(), 4096));
  EXPECT_TRUE(pinned.Hold(a.data() + 4000, 96));
  EXPECT_TRUE(pinned.Hold(b.data() + 100, 0));
  EXPECT_FALSE(pinned.Hold(a.data() + 4000, 97)) << "runs past its end";
  EXPECT_FALSE(pinned.Hold(a.data(), 4097));
  EXPECT_FALSE(pinned.Hold(other.data(), 16));
  EXPECT_FALSE(pinned.Hold(host.data() + 1023, 2)) << "starts before it";
  EXPECT_FALSE(pinned.Hold(a.data() + 4000, 4096)) << "spans two ranges' gap";
}

}  // namespace
}  // namespace replayd
