// The decode demo's two kernel sets run on the host through the launch geometry the demo
// uses (client/decode_geometry.h): decode.cu compiled as C++ over a CUDA emulation, its
// blocks' threads running concurrently, and decode.c compiled as C, called once per
// invocation. Over several decode steps both must give the host reference's logits to
// within the demo's tolerance: every head and, past the first step, several positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "client/decode_geometry.h"
#include "client/decode_model.h"
#include "tests/support/cuda_emulation.h"

// decode.cu's entries get other names here: decode.c's, linked into this test, have
// theirs (with C linkage too).
#define embed gpu_embed
#define rmsnorm gpu_rmsnorm
#define matvec gpu_matvec
#define kv_store gpu_kv_store
#define attn_scores gpu_attn_scores
#define attn_softmax gpu_attn_softmax
#define attn_mix gpu_attn_mix
#define argmax gpu_argmax
#include "client/kernels/decode.cu"
#undef embed
#undef rmsnorm
#undef matvec
#undef kv_store
#undef attn_scores
#undef attn_softmax
#undef attn_mix
#undef argmax

// client/kernels/decode.c, compiled as C.
extern "C" {
void embed(float* x, const float* tok_emb, const float* pos_emb, const int* tok, int pos, int d);
void rmsnorm(float* out, const float* x, const float* g, int d);
void matvec(float* out, const float* x, const float* w, int rows, int cols, int chunk, int mode, int core);
void kv_store(float* k_cache, float* v_cache, const float* qkv, int pos, int d);
void attn_scores(float* scores, const float* qkv, const float* k_cache, int pos, int d, int heads, int ctx, int core);
void attn_softmax(float* scores, int pos, int ctx, int core);
void attn_mix(float* att, const float* scores, const float* v_cache, int pos, int d, int heads, int ctx, int core);
void argmax(int* tok, const float* logits, int n);
}

namespace replayd::client::decode {
namespace {

constexpr double kTolerance = 1e-4;  // the demo's
constexpr int kBos = 1;
constexpr int kSteps = 4;  // positions 1 to 4

static_assert(DECODE_MAX_THREADS == kGpuMaxThreads, "decode.cu's shared arrays and the GPU geometry disagree");

// What the demo keeps on a device, in host memory: the KV cache, one step's
// temporaries, and the token that each step's argmax overwrites.
struct State {
  std::vector<std::vector<float>> k, v;
  std::vector<float> x, h, qkv, scores, att, ff, logits;
  int tok = kBos;

  State()
      : k(kLayers, std::vector<float>(size_t{kCtx} * kD)),
        v(kLayers, std::vector<float>(size_t{kCtx} * kD)),
        x(kD),
        h(kD),
        qkv(3 * kD),
        scores(size_t{kHeads} * kCtx),
        att(kD),
        ff(kFf),
        logits(kVocab) {}
};

// Runs a kernel of one set over its geometry at position `pos`: the GPU set on `gpu`.
class Kernels {
 public:
  Kernels(KernelSet set, cuda_emulation::Device& gpu) : set_(set), gpu_(gpu) {}

  KernelSet set() const { return set_; }

  // The GPU set launches `gpu` over the grid; the CPU set calls `cpu` once per
  // invocation, with the invocation's index as a trailing `core` if it takes one.
  template <typename Cpu, typename Gpu, typename... Args>
  void Run(Cpu* cpu, Gpu* gpu, const Geometry& g, int pos, Args... args) const {
    if (set_ == KernelSet::kGpu) {
      gpu_.Launch(gpu, Dim3(g.global, pos), Dim3(g.local), args...);
      return;
    }
    for (int core = 0; core < g.global[0].At(pos) * g.global[1].At(pos) * g.global[2].At(pos); ++core) {
      if constexpr (std::is_invocable_v<Cpu*, Args..., int>) {
        cpu(args..., core);
      } else {
        cpu(args...);
      }
    }
  }

 private:
  static dim3 Dim3(const std::array<Extent, 3>& e, int pos) {
    return {unsigned(e[0].At(pos)), unsigned(e[1].At(pos)), unsigned(e[2].At(pos))};
  }
  static dim3 Dim3(const std::array<int64_t, 3>& n) { return {unsigned(n[0]), unsigned(n[1]), unsigned(n[2])}; }

  const KernelSet set_;
  cuda_emulation::Device& gpu_;
};

// One decode step of token s.tok at `pos`, as client/demo.cc launches it: logits into
// s.logits, the next token into s.tok.
void Step(const Kernels& k, const Weights& w, State& s, int pos) {
  const KernelSet set = k.set();
  const int chunk = MatVecChunk(set);
  auto mat_vec = [&](float* out, const float* x, const std::vector<float>& m, int rows, int cols, int mode) {
    k.Run(matvec, gpu_matvec, MatVecGeometry(set, cols), pos, out, x, m.data(), rows, cols, chunk, mode);
  };
  k.Run(embed, gpu_embed, EmbedGeometry(set), pos, s.x.data(), w.tok_emb.data(), w.pos_emb.data(), &s.tok, pos, kD);
  for (int l = 0; l < kLayers; ++l) {
    const Weights::Layer& L = w.layers[l];
    float *kc = s.k[l].data(), *vc = s.v[l].data();
    k.Run(rmsnorm, gpu_rmsnorm, RmsNormGeometry(set), pos, s.h.data(), s.x.data(), L.ln1.data(), kD);
    mat_vec(s.qkv.data(), s.h.data(), L.wqkv, kD, 3 * kD, 0);
    k.Run(kv_store, gpu_kv_store, KvStoreGeometry(set), pos, kc, vc, s.qkv.data(), pos, kD);
    k.Run(attn_scores, gpu_attn_scores, AttnScoresGeometry(set, kHeads), pos, s.scores.data(), s.qkv.data(), kc, pos,
          kD, kHeads, kCtx);
    k.Run(attn_softmax, gpu_attn_softmax, AttnSoftmaxGeometry(set, kHeads), pos, s.scores.data(), pos, kCtx);
    k.Run(attn_mix, gpu_attn_mix, AttnMixGeometry(set, kHeads), pos, s.att.data(), s.scores.data(), vc, pos, kD, kHeads,
          kCtx);
    mat_vec(s.x.data(), s.att.data(), L.wo, kD, kD, 1);
    k.Run(rmsnorm, gpu_rmsnorm, RmsNormGeometry(set), pos, s.h.data(), s.x.data(), L.ln2.data(), kD);
    mat_vec(s.ff.data(), s.h.data(), L.w1, kD, kFf, 2);
    mat_vec(s.x.data(), s.ff.data(), L.w2, kFf, kD, 1);
  }
  k.Run(rmsnorm, gpu_rmsnorm, RmsNormGeometry(set), pos, s.h.data(), s.x.data(), w.lnf.data(), kD);
  mat_vec(s.logits.data(), s.h.data(), w.wout, kD, kVocab, 0);
  k.Run(argmax, gpu_argmax, ArgmaxGeometry(set), pos, &s.tok, s.logits.data(), kVocab);
}

double MaxError(const std::vector<float>& a, const std::vector<float>& b) {
  double e = a.size() == b.size() ? 0 : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) e = std::max(e, std::abs(double(a[i]) - double(b[i])));
  return e;
}

// Decodes kSteps tokens from kBos with one kernel set, each step's token the previous
// step's argmax on the "device", and compares every step's logits with the reference's
// for the same tokens.
void ExpectTheHostReferencesLogits(KernelSet set) {
  const Weights w = Weights::Make();
  HostModel host(w);
  State s;
  cuda_emulation::Device gpu;
  const Kernels kernels(set, gpu);
  for (int pos = 1; pos <= kSteps; ++pos) {
    const int tok = s.tok;
    Step(kernels, w, s, pos);
    const std::vector<float> expected = host.Step(pos, tok);
    EXPECT_LE(MaxError(s.logits, expected), kTolerance) << "position " << pos << ", token " << tok;
    EXPECT_EQ(s.tok, std::max_element(s.logits.begin(), s.logits.end()) - s.logits.begin())
        << "argmax at position " << pos;
  }
}

TEST(DecodeKernelsTest, TheGpuKernelsGiveTheHostReferencesLogits) { ExpectTheHostReferencesLogits(KernelSet::kGpu); }

TEST(DecodeKernelsTest, TheCpuKernelsGiveTheHostReferencesLogits) { ExpectTheHostReferencesLogits(KernelSet::kCpu); }

// The geometry fits each set: CPU invocations are single threads, GPU blocks fit
// decode.cu's shared arrays, matvec's chunk fits decode.c's accumulator, and attention
// scores one (position, head) pair per invocation or block.
TEST(DecodeGeometryTest, FitsEachKernelSet) {
  for (KernelSet set : {KernelSet::kCpu, KernelSet::kGpu}) {
    const int chunk = MatVecChunk(set);
    EXPECT_GE(chunk, 1);
    EXPECT_LE(chunk, 256);
    for (const Geometry& g : {EmbedGeometry(set), RmsNormGeometry(set), MatVecGeometry(set, kFf), KvStoreGeometry(set),
                              AttnScoresGeometry(set, kHeads), AttnSoftmaxGeometry(set, kHeads),
                              AttnMixGeometry(set, kHeads), ArgmaxGeometry(set)}) {
      const int64_t threads = g.local[0] * g.local[1] * g.local[2];
      EXPECT_GE(threads, 1);
      EXPECT_LE(threads, set == KernelSet::kCpu ? 1 : kGpuMaxThreads);
    }
    const Geometry mv = MatVecGeometry(set, 3 * kD + 1);
    EXPECT_EQ(mv.global[0].At(7), (3 * kD + 1 + chunk - 1) / chunk) << "matvec covers every column";
    const Geometry scores = AttnScoresGeometry(set, kHeads);
    EXPECT_EQ(scores.global[0].At(7) * scores.global[1].At(7) * scores.global[2].At(7), 7 * kHeads);
  }
}

}  // namespace
}  // namespace replayd::client::decode
