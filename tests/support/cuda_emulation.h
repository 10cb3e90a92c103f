// Runs CUDA C kernels on the host, for tests without a GPU: a translation unit includes
// this header, then the kernel source, compiled as C++. The header supplies what the
// kernels use (__global__, __device__, __shared__, blockIdx, threadIdx, blockDim,
// gridDim, __syncthreads(), and the float math functions of <math.h>), and a
// cuda_emulation::Device runs kernels over grids.
//
// The threads of a block run concurrently, one std::thread each, and meet at a
// std::barrier in __syncthreads(), so a missing __syncthreads() is a data race that
// ThreadSanitizer reports. The blocks run one after another, so a __shared__ variable can
// be a function-local static that every block in turn has to itself. As on a GPU, the
// threads that are still running must all reach each __syncthreads(); a thread that
// returns from the kernel leaves the block's barrier. Warp-level operations (shuffles,
// votes) are not emulated.
#ifndef REPLAYD_TESTS_SUPPORT_CUDA_EMULATION_H_
#define REPLAYD_TESTS_SUPPORT_CUDA_EMULATION_H_

#include <math.h>

#include <barrier>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __syncthreads() ::replayd::cuda_emulation::SyncThreads()

// CUDA's built-in vector type and the per-thread built-ins; blockIdx and threadIdx
// differ per thread, so all of them are thread_local.
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace replayd::cuda_emulation {

namespace internal {
// The barrier of the block that the calling thread runs.
inline thread_local std::barrier<>* block_barrier = nullptr;
}  // namespace internal

inline void SyncThreads() { internal::block_barrier->arrive_and_wait(); }

// A GPU of the emulation: a pool of threads, one per thread of a block, kept between
// launches (starting threads is far slower than running a small block). Launches run one
// at a time: Launch is not to be called concurrently.
class Device {
 public:
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // Runs `kernel(args...)` over `grid` blocks of `block` threads and returns when it has
  // finished: the blocks in order (x fastest), the threads of each block concurrently.
  template <typename... Params, typename... Args>
  void Launch(void (*kernel)(Params...), dim3 grid, dim3 block, Args... args) {
    Run(grid, block, [&] { kernel(args...); });
  }

 private:
  // Replaces the block barrier when every thread has finished a block: a fresh one per
  // block, since threads that return early drop out of it.
  struct NextBlock {
    Device* device;
    void operator()() noexcept { device->block_barrier_ = std::make_unique<std::barrier<>>(device->participants_); }
  };

  void Run(dim3 grid, dim3 block, std::function<void()> body) {
    std::unique_lock<std::mutex> lock(mu_);
    participants_ = block.x * block.y * block.z;
    while (threads_.size() < participants_) threads_.emplace_back([this, i = uint32_t(threads_.size())] { Work(i); });
    grid_ = grid;
    block_ = block;
    body_ = std::move(body);
    block_barrier_ = std::make_unique<std::barrier<>>(participants_);
    between_blocks_.emplace(participants_, NextBlock{this});
    running_ = participants_;
    ++launches_;
    wake_.notify_all();
    done_.wait(lock, [&] { return running_ == 0; });
  }

  void Work(uint32_t index) {
    uint64_t done = 0;  // launches this thread has run
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || (launches_ != done && index < participants_); });
        if (stop_) return;
        done = launches_;
      }
      RunThread(index);
      std::lock_guard<std::mutex> lock(mu_);
      if (--running_ == 0) done_.notify_all();
    }
  }

  // Thread `index` of every block in turn. The launch's fields do not change until every
  // thread has finished it.
  void RunThread(uint32_t index) {
    const dim3 grid = grid_, block = block_;
    threadIdx = {index % block.x, index / block.x % block.y, index / (block.x * block.y)};
    blockDim = block;
    gridDim = grid;
    const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
    for (uint64_t b = 0; b < blocks; ++b) {
      blockIdx = {unsigned(b % grid.x), unsigned(b / grid.x % grid.y), unsigned(b / (uint64_t{grid.x} * grid.y))};
      internal::block_barrier = block_barrier_.get();
      body_();
      internal::block_barrier->arrive_and_drop();
      between_blocks_->arrive_and_wait();
    }
    internal::block_barrier = nullptr;
  }

  std::mutex mu_;
  std::condition_variable wake_, done_;
  bool stop_ = false;
  uint64_t launches_ = 0;
  uint32_t participants_ = 0;  // threads per block of the current launch
  uint32_t running_ = 0;       // of them, those that have not finished it
  dim3 grid_, block_;
  std::function<void()> body_;
  std::unique_ptr<std::barrier<>> block_barrier_;
  std::optional<std::barrier<NextBlock>> between_blocks_;
  std::vector<std::thread> threads_;
};

}  // namespace replayd::cuda_emulation

#endif  // REPLAYD_TESTS_SUPPORT_CUDA_EMULATION_H_
