// A test with NVRTC loaded, skipped with the loader's reason where there is none.
#ifndef REPLAYD_TESTS_DRIVERS_CUDA_NVRTC_FIXTURE_H_
#define REPLAYD_TESTS_DRIVERS_CUDA_NVRTC_FIXTURE_H_

#include <gtest/gtest.h>

#include <memory>

#include "drivers/cuda/nvrtc.h"

namespace replayd {

class NvrtcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto n = Nvrtc::Load();
    if (!n.ok()) GTEST_SKIP() << "no NVRTC on this machine: " << n.status();
    nvrtc_ = std::move(*n);
  }
  std::unique_ptr<Nvrtc> nvrtc_;
};

}  // namespace replayd

#endif  // REPLAYD_TESTS_DRIVERS_CUDA_NVRTC_FIXTURE_H_
