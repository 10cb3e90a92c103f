/* Kernels of a small decoder-only transformer, one decode step at a time.
 * Buffers hold float32; matrices are row-major [rows][cols]. A kernel runs once per
 * invocation (the product of the launch's global dimensions); those that take a trailing
 * `core` receive the invocation's index. The launch geometry of every kernel is in
 * client/decode_geometry.h. */
#include <math.h>

/* x = tok_emb[tok[0]] + pos_emb[pos - 1] */
void embed(float *x, const float *tok_emb, const float *pos_emb, const int *tok, int pos, int d) {
  for (int i = 0; i < d; ++i) x[i] = tok_emb[(long)tok[0] * d + i] + pos_emb[(long)(pos - 1) * d + i];
}

/* out = x / rms(x) * g */
void rmsnorm(float *out, const float *x, const float *g, int d) {
  float ss = 0.0f;
  for (int i = 0; i < d; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / sqrtf(ss / (float)d + 1e-5f);
  for (int i = 0; i < d; ++i) out[i] = x[i] * inv * g[i];
}

/* out[j] = sum_i x[i] w[i][j] for the `chunk` columns of this invocation; mode 0 stores,
 * 1 adds to out (a residual), 2 stores relu. */
void matvec(float *out, const float *x, const float *w, int rows, int cols, int chunk, int mode,
            int core) {
  const int lo = core * chunk, hi = lo + chunk < cols ? lo + chunk : cols;
  float acc[256];
  for (int j = lo; j < hi; ++j) acc[j - lo] = 0.0f;
  for (int i = 0; i < rows; ++i) {
    const float xi = x[i];
    const float *wr = w + (long)i * cols;
    for (int j = lo; j < hi; ++j) acc[j - lo] += xi * wr[j];
  }
  for (int j = lo; j < hi; ++j) {
    const float v = acc[j - lo];
    out[j] = mode == 1 ? out[j] + v : (mode == 2 ? (v > 0.0f ? v : 0.0f) : v);
  }
}

/* k_cache[pos - 1] = k, v_cache[pos - 1] = v, where qkv = [q | k | v]. */
void kv_store(float *k_cache, float *v_cache, const float *qkv, int pos, int d) {
  for (int i = 0; i < d; ++i) {
    k_cache[(long)(pos - 1) * d + i] = qkv[d + i];
    v_cache[(long)(pos - 1) * d + i] = qkv[2 * d + i];
  }
}

/* One invocation per (position t < pos, head h), global (pos, heads), so core = t + pos * h:
 * scores[h][t] = q_h . k_t,h / sqrt(hd). */
void attn_scores(float *scores, const float *qkv, const float *k_cache, int pos, int d, int heads,
                 int ctx, int core) {
  const int t = core % pos, h = core / pos, hd = d / heads;
  const float *q = qkv + h * hd;
  const float *k = k_cache + (long)t * d + h * hd;
  float s = 0.0f;
  for (int i = 0; i < hd; ++i) s += q[i] * k[i];
  scores[(long)h * ctx + t] = s / sqrtf((float)hd);
}

/* One invocation per head: softmax over scores[h][0 .. pos). */
void attn_softmax(float *scores, int pos, int ctx, int core) {
  float *s = scores + (long)core * ctx;
  float m = s[0];
  for (int t = 1; t < pos; ++t) m = s[t] > m ? s[t] : m;
  float sum = 0.0f;
  for (int t = 0; t < pos; ++t) {
    s[t] = expf(s[t] - m);
    sum += s[t];
  }
  for (int t = 0; t < pos; ++t) s[t] /= sum;
}

/* One invocation per head: att_h = sum_t scores[h][t] v_t,h. */
void attn_mix(float *att, const float *scores, const float *v_cache, int pos, int d, int heads,
              int ctx, int core) {
  const int h = core, hd = d / heads;
  float *out = att + h * hd;
  for (int i = 0; i < hd; ++i) out[i] = 0.0f;
  for (int t = 0; t < pos; ++t) {
    const float p = scores[(long)h * ctx + t];
    const float *v = v_cache + (long)t * d + h * hd;
    for (int i = 0; i < hd; ++i) out[i] += p * v[i];
  }
}

/* tok[0] = argmax(logits): the next step's input, chosen on the device. */
void argmax(int *tok, const float *logits, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) best = logits[i] > logits[best] ? i : best;
  tok[0] = best;
}
