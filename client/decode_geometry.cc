#include "client/decode_geometry.h"

namespace replayd::client::decode {
namespace {

// Threads of a GPU block that strides over a vector (embed, rmsnorm, kv_store, the
// softmax and argmax over a row).
constexpr int64_t kGpuRowThreads = 256;
// Threads of an attn_scores block: one dot product of a head's width (64 in the demo).
constexpr int64_t kGpuDotThreads = 64;

// One invocation (cpu-c) or one block of threads striding over a vector (gpu).
Geometry Single(KernelSet set) {
  Geometry g;
  if (set == KernelSet::kGpu) g.local = {kGpuRowThreads, 1, 1};
  return g;
}

}  // namespace

int MatVecChunk(KernelSet set) { return set == KernelSet::kGpu ? 32 : 64; }

Geometry EmbedGeometry(KernelSet set) { return Single(set); }

Geometry RmsNormGeometry(KernelSet set) { return Single(set); }

Geometry MatVecGeometry(KernelSet set, int cols) {
  const int chunk = MatVecChunk(set);
  Geometry g;
  g.global[0].constant = (cols + chunk - 1) / chunk;
  // A block's threads: threadIdx.x picks one of the chunk's columns, so that adjacent
  // threads read adjacent weights; threadIdx.y one of 8 shares of the rows.
  if (set == KernelSet::kGpu) g.local = {chunk, 8, 1};
  return g;
}

Geometry KvStoreGeometry(KernelSet set) { return Single(set); }

Geometry AttnScoresGeometry(KernelSet set, int heads) {
  Geometry g;
  g.global[0] = Extent::Pos();
  g.global[1].constant = heads;
  if (set == KernelSet::kGpu) g.local = {kGpuDotThreads, 1, 1};
  return g;
}

Geometry AttnSoftmaxGeometry(KernelSet set, int heads) {
  Geometry g = Single(set);
  g.global[0].constant = heads;
  return g;
}

Geometry AttnMixGeometry(KernelSet set, int heads) {
  Geometry g;
  g.global[0].constant = heads;
  // As matvec's: threadIdx.x a column of the head, threadIdx.y a share of the positions.
  if (set == KernelSet::kGpu) g.local = {64, 4, 1};
  return g;
}

Geometry ArgmaxGeometry(KernelSet set) { return Single(set); }

}  // namespace replayd::client::decode
