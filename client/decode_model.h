// The decode demo's model: a small decoder-only transformer (its sizes and its
// pseudo-random weights) and the host reference that computes one decode step's logits.
// The demo checks the daemon's logits against the reference at every step; tests check
// the demo's kernels (client/kernels/) against it on the host. No gRPC.
#ifndef REPLAYD_CLIENT_DECODE_MODEL_H_
#define REPLAYD_CLIENT_DECODE_MODEL_H_

#include <vector>

namespace replayd::client::decode {

// Layers, model width, attention heads, vocabulary, context (the largest position) and
// the feed-forward width.
inline constexpr int kLayers = 2, kD = 256, kHeads = 4, kVocab = 512, kCtx = 256, kFf = 1024;

// float32 weights; matrices row-major [rows][cols], applied as out[j] = sum_i x[i] w[i][j].
struct Weights {
  std::vector<float> tok_emb, pos_emb, lnf, wout;  // [kVocab][kD], [kCtx][kD], [kD], [kD][kVocab]
  struct Layer {
    // [kD], [kD][3 kD] (q | k | v), [kD][kD], [kD], [kD][kFf], [kFf][kD]
    std::vector<float> ln1, wqkv, wo, ln2, w1, w2;
  };
  std::vector<Layer> layers;

  // The same weights on every call: they are generated from fixed seeds.
  static Weights Make();
};

// The reference: the arithmetic of client/kernels/decode.c, in the same order, on the
// host. Keeps a reference to the weights, which must outlive it. Not thread-safe.
class HostModel {
 public:
  explicit HostModel(const Weights& w);

  // The logits of one decode step: token `tok` at position `pos` (1-based, at most kCtx).
  // The step appends pos's key and value to the model's cache, so steps come in order
  // 1, 2, ...; a step at an earlier position overwrites that position and reads the cache
  // as it is.
  std::vector<float> Step(int pos, int tok);

 private:
  const Weights& w_;
  std::vector<std::vector<float>> k_, v_;  // per layer, [kCtx][kD]
};

}  // namespace replayd::client::decode

#endif  // REPLAYD_CLIENT_DECODE_MODEL_H_
