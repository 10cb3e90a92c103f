#include "client/decode_model.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace replayd::client::decode {
namespace {

std::vector<float> PseudoRandom(size_t n, uint32_t seed, float scale) {
  std::vector<float> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& f : v) {
    x = x * 1664525u + 1013904223u;
    f = (static_cast<float>((x >> 8) & 0xffff) / 65536.0f - 0.5f) * 2.0f * scale;
  }
  return v;
}

void RmsNorm(std::vector<float>& out, const std::vector<float>& x, const std::vector<float>& g) {
  float ss = 0.0f;
  for (int i = 0; i < kD; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / float(kD) + 1e-5f);
  for (int i = 0; i < kD; ++i) out[i] = x[i] * inv * g[i];
}

// out[j] = sum_i x[i] w[i][j]; mode 0 stores, 1 adds to out (a residual), 2 stores relu.
void MatVec(std::vector<float>& out, const std::vector<float>& x, const std::vector<float>& w, int rows, int cols,
            int mode) {
  std::vector<float> acc(cols, 0.0f);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) acc[j] += x[i] * w[size_t(i) * cols + j];
  for (int j = 0; j < cols; ++j) out[j] = mode == 1 ? out[j] + acc[j] : (mode == 2 ? std::max(acc[j], 0.0f) : acc[j]);
}

}  // namespace

Weights Weights::Make() {
  Weights w;
  uint32_t seed = 1;
  const float row_scale = 1.0f / std::sqrt(float(kD));
  w.tok_emb = PseudoRandom(size_t{kVocab} * kD, seed++, 1.0f);
  w.pos_emb = PseudoRandom(size_t{kCtx} * kD, seed++, 0.1f);
  w.lnf.assign(kD, 1.0f);
  w.wout = PseudoRandom(size_t{kD} * kVocab, seed++, row_scale);
  for (int l = 0; l < kLayers; ++l) {
    Layer layer;
    layer.ln1.assign(kD, 1.0f);
    layer.wqkv = PseudoRandom(size_t{kD} * 3 * kD, seed++, row_scale);
    layer.wo = PseudoRandom(size_t{kD} * kD, seed++, row_scale);
    layer.ln2.assign(kD, 1.0f);
    layer.w1 = PseudoRandom(size_t{kD} * kFf, seed++, row_scale);
    layer.w2 = PseudoRandom(size_t{kFf} * kD, seed++, 1.0f / std::sqrt(float(kFf)));
    w.layers.push_back(std::move(layer));
  }
  return w;
}

HostModel::HostModel(const Weights& w) : w_(w), k_(kLayers), v_(kLayers) {
  for (int l = 0; l < kLayers; ++l) {
    k_[l].assign(size_t{kCtx} * kD, 0.0f);
    v_[l].assign(size_t{kCtx} * kD, 0.0f);
  }
}

std::vector<float> HostModel::Step(int pos, int tok) {
  std::vector<float> x(kD), h(kD), qkv(3 * kD), att(kD), ff(kFf), scores(kCtx);
  for (int i = 0; i < kD; ++i) x[i] = w_.tok_emb[size_t(tok) * kD + i] + w_.pos_emb[size_t(pos - 1) * kD + i];
  for (int l = 0; l < kLayers; ++l) {
    const Weights::Layer& L = w_.layers[l];
    RmsNorm(h, x, L.ln1);
    MatVec(qkv, h, L.wqkv, kD, 3 * kD, 0);
    for (int i = 0; i < kD; ++i) {
      k_[l][size_t(pos - 1) * kD + i] = qkv[kD + i];
      v_[l][size_t(pos - 1) * kD + i] = qkv[2 * kD + i];
    }
    const int hd = kD / kHeads;
    for (int hh = 0; hh < kHeads; ++hh) {
      for (int t = 0; t < pos; ++t) {
        float s = 0.0f;
        for (int i = 0; i < hd; ++i) s += qkv[hh * hd + i] * k_[l][size_t(t) * kD + hh * hd + i];
        scores[t] = s / std::sqrt(float(hd));
      }
      float m = scores[0];
      for (int t = 1; t < pos; ++t) m = std::max(m, scores[t]);
      float sum = 0.0f;
      for (int t = 0; t < pos; ++t) sum += (scores[t] = std::exp(scores[t] - m));
      for (int t = 0; t < pos; ++t) scores[t] /= sum;
      for (int i = 0; i < hd; ++i) att[hh * hd + i] = 0.0f;
      for (int t = 0; t < pos; ++t)
        for (int i = 0; i < hd; ++i) att[hh * hd + i] += scores[t] * v_[l][size_t(t) * kD + hh * hd + i];
    }
    MatVec(x, att, L.wo, kD, kD, 1);
    RmsNorm(h, x, L.ln2);
    MatVec(ff, h, L.w1, kD, kFf, 2);
    MatVec(x, ff, L.w2, kFf, kD, 1);
  }
  RmsNorm(h, x, w_.lnf);
  std::vector<float> logits(kVocab);
  MatVec(logits, h, w_.wout, kD, kVocab, 0);
  return logits;
}

}  // namespace replayd::client::decode
