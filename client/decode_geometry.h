// The launch geometry of the decode demo's kernels, in one place: the demo launches every
// kernel with it, and the tests that run the kernels on the host follow it. No gRPC.
//
// Two kernel sets compute the same step with the same arguments:
// - client/kernels/decode.c (cpu-c): one invocation per global index, which a kernel that
//   needs it receives as its trailing `core` (x fastest: core = x + X * y); local is 1.
// - client/kernels/decode.cu (cuda-c, hip-c): global is the grid of blocks, local the
//   threads of a block; a block reads its index from blockIdx, not from an argument.
//
//   kernel        cpu-c global          gpu grid              gpu block
//   embed         1                     1                     256
//   rmsnorm       1                     1                     256
//   matvec        cols / 64 (chunk 64)  cols / 32 (chunk 32)  32 columns x 8 row shares
//   kv_store      1                     1                     256
//   attn_scores   pos x heads           pos x heads           64
//   attn_softmax  heads                 heads                 256
//   attn_mix      heads                 heads                 64 columns x 4 position shares
//   argmax        1                     1                     256
//
// `pos` is the decode position, the demo graph's variable; "cols / n" rounds up.
#ifndef REPLAYD_CLIENT_DECODE_GEOMETRY_H_
#define REPLAYD_CLIENT_DECODE_GEOMETRY_H_

#include <array>
#include <cstdint>

namespace replayd::client::decode {

enum class KernelSet {
  kCpu,  // decode.c
  kGpu,  // decode.cu
};

// decode.cu's kernels keep one partial result per thread in shared arrays of this many
// elements: a block of the GPU set has at most this many threads.
inline constexpr int64_t kGpuMaxThreads = 256;

// One launch dimension: a constant, or the decode position `pos`.
struct Extent {
  int64_t constant = 1;
  bool is_pos = false;

  static Extent Pos() { return {0, true}; }
  int64_t At(int64_t pos) const { return is_pos ? pos : constant; }
};

struct Geometry {
  std::array<Extent, 3> global;              // invocations (cpu-c) or blocks (gpu)
  std::array<int64_t, 3> local = {1, 1, 1};  // threads per block; 1 on the CPU
};

// The `chunk` argument of matvec: the columns one invocation (cpu-c) or one block (gpu)
// computes. At most 256 (decode.c's accumulator).
int MatVecChunk(KernelSet set);

Geometry EmbedGeometry(KernelSet set);
Geometry RmsNormGeometry(KernelSet set);
// A matvec with `cols` output columns.
Geometry MatVecGeometry(KernelSet set, int cols);
Geometry KvStoreGeometry(KernelSet set);
Geometry AttnScoresGeometry(KernelSet set, int heads);
Geometry AttnSoftmaxGeometry(KernelSet set, int heads);
Geometry AttnMixGeometry(KernelSet set, int heads);
Geometry ArgmaxGeometry(KernelSet set);

}  // namespace replayd::client::decode

#endif  // REPLAYD_CLIENT_DECODE_GEOMETRY_H_
