/* The kernels of decode.c for GPUs, in CUDA C that is also HIP C (the cuda-c and hip-c formats): the same arguments
 * and the same results, computed by blocks of many threads. The block index is blockIdx, not an argument. The launch
 * geometry (grid and block of every kernel) is in client/decode_geometry.h. Threads stride over their work, so a
 * kernel is correct for any block of up to DECODE_MAX_THREADS threads (the size of the shared arrays) over the grid
 * that the geometry gives.
 *
 * Reductions go through shared memory, not warp shuffles: the source does not depend on the warp size (32 on NVIDIA,
 * 64 on AMD) and runs under the host emulation of tests/support/cuda_emulation.h. Every thread of a block reaches
 * every __syncthreads(). Buffers hold float32; matrices are row-major [rows][cols]. */

#define DECODE_MAX_THREADS 256

/* The sum (take_max 0) or the maximum (take_max 1) of `v` over the threads of a one-dimensional block, returned to
 * every thread. `part` is a shared array of DECODE_MAX_THREADS floats. */
static __device__ float block_reduce(float v, float *part, int take_max) {
  const int tid = threadIdx.x;
  part[tid] = v;
  __syncthreads();
  for (int width = blockDim.x; width > 1;) {
    const int half = (width + 1) / 2;
    if (tid < width - half) part[tid] = take_max ? fmaxf(part[tid], part[tid + half]) : part[tid] + part[tid + half];
    __syncthreads();
    width = half;
  }
  const float r = part[0];
  __syncthreads();
  return r;
}

/* out[j] = sum_{i < rows} x[i] w[i * stride + j] for the columns j in [lo, hi), computed by a two-dimensional block:
 * threadIdx.x picks a column, so that adjacent threads read adjacent weights (coalesced), threadIdx.y a share of the
 * rows; the shares are summed in order through `part`, a shared array of DECODE_MAX_THREADS floats. mode 0 stores,
 * 1 adds to out (a residual), 2 stores relu. */
static __device__ void column_sums(float *out, const float *x, const float *w, long stride, int rows, int lo, int hi,
                                   int mode, float *part) {
  const int tx = threadIdx.x, ty = threadIdx.y, nx = blockDim.x, ny = blockDim.y;
  for (int j0 = lo; j0 < hi; j0 += nx) {
    const int j = j0 + tx;
    float acc = 0.0f;
    if (j < hi)
      for (int i = ty; i < rows; i += ny) acc += x[i] * w[(long)i * stride + j];
    part[ty * nx + tx] = acc;
    __syncthreads();
    if (ty == 0 && j < hi) {
      float v = 0.0f;
      for (int r = 0; r < ny; ++r) v += part[r * nx + tx];
      out[j] = mode == 1 ? out[j] + v : (mode == 2 ? fmaxf(v, 0.0f) : v);
    }
    __syncthreads();
  }
}

/* x = tok_emb[tok[0]] + pos_emb[pos - 1] */
extern "C" __global__ void embed(float *x, const float *tok_emb, const float *pos_emb, const int *tok, int pos, int d) {
  const long row = tok[0];
  const int step = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < d; i += step)
    x[i] = tok_emb[row * d + i] + pos_emb[(long)(pos - 1) * d + i];
}

/* out = x / rms(x) * g */
extern "C" __global__ void rmsnorm(float *out, const float *x, const float *g, int d) {
  __shared__ float part[DECODE_MAX_THREADS];
  const int tid = threadIdx.x, n = blockDim.x;
  float ss = 0.0f;
  for (int i = tid; i < d; i += n) ss += x[i] * x[i];
  const float inv = 1.0f / sqrtf(block_reduce(ss, part, 0) / (float)d + 1e-5f);
  for (int i = tid; i < d; i += n) out[i] = x[i] * inv * g[i];
}

/* out[j] = sum_i x[i] w[i][j] for the `chunk` columns of block blockIdx.x; mode 0 stores, 1 adds to out (a residual),
 * 2 stores relu. */
extern "C" __global__ void matvec(float *out, const float *x, const float *w, int rows, int cols, int chunk, int mode) {
  __shared__ float part[DECODE_MAX_THREADS];
  const int lo = (int)blockIdx.x * chunk, hi = lo + chunk < cols ? lo + chunk : cols;
  column_sums(out, x, w, cols, rows, lo, hi, mode, part);
}

/* k_cache[pos - 1] = k, v_cache[pos - 1] = v, where qkv = [q | k | v]. */
extern "C" __global__ void kv_store(float *k_cache, float *v_cache, const float *qkv, int pos, int d) {
  const int step = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < d; i += step) {
    k_cache[(long)(pos - 1) * d + i] = qkv[d + i];
    v_cache[(long)(pos - 1) * d + i] = qkv[2 * d + i];
  }
}

/* Block (t, h) of the grid (pos, heads): scores[h][t] = q_h . k_t,h / sqrt(hd). */
extern "C" __global__ void attn_scores(float *scores, const float *qkv, const float *k_cache, int pos, int d, int heads,
                                       int ctx) {
  __shared__ float part[DECODE_MAX_THREADS];
  const int t = blockIdx.x, h = blockIdx.y, hd = d / heads;
  if (t >= pos || h >= heads) return; /* the whole block */
  const float *q = qkv + h * hd;
  const float *k = k_cache + (long)t * d + h * hd;
  float s = 0.0f;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) s += q[i] * k[i];
  s = block_reduce(s, part, 0);
  if (threadIdx.x == 0) scores[(long)h * ctx + t] = s / sqrtf((float)hd);
}

/* Block h: softmax over scores[h][0 .. pos). */
extern "C" __global__ void attn_softmax(float *scores, int pos, int ctx) {
  __shared__ float part[DECODE_MAX_THREADS];
  const int tid = threadIdx.x, n = blockDim.x;
  float *s = scores + (long)blockIdx.x * ctx;
  float m = s[0];
  for (int t = tid; t < pos; t += n) m = fmaxf(m, s[t]);
  m = block_reduce(m, part, 1);
  float sum = 0.0f;
  for (int t = tid; t < pos; t += n) {
    s[t] = expf(s[t] - m);
    sum += s[t];
  }
  sum = block_reduce(sum, part, 0);
  for (int t = tid; t < pos; t += n) s[t] /= sum;
}

/* Block h: att_h = sum_t scores[h][t] v_t,h. */
extern "C" __global__ void attn_mix(float *att, const float *scores, const float *v_cache, int pos, int d, int heads,
                                    int ctx) {
  __shared__ float part[DECODE_MAX_THREADS];
  const int h = blockIdx.x, hd = d / heads;
  if (h >= heads) return; /* the whole block */
  column_sums(att + h * hd, scores + (long)h * ctx, v_cache + h * hd, d, pos, 0, hd, 0, part);
}

/* tok[0] = argmax(logits), the first of equal maxima: the next step's input, chosen on the device. */
extern "C" __global__ void argmax(int *tok, const float *logits, int n) {
  __shared__ float best_value[DECODE_MAX_THREADS];
  __shared__ int best_index[DECODE_MAX_THREADS];
  const int tid = threadIdx.x, nt = blockDim.x;
  int best = tid < n ? tid : 0;
  for (int i = tid + nt; i < n; i += nt) best = logits[i] > logits[best] ? i : best;
  best_value[tid] = logits[best];
  best_index[tid] = best;
  __syncthreads();
  for (int width = nt; width > 1;) {
    const int half = (width + 1) / 2;
    if (tid < width - half) {
      const float v = best_value[tid + half];
      const int k = best_index[tid + half];
      if (v > best_value[tid] || (v == best_value[tid] && k < best_index[tid])) {
        best_value[tid] = v;
        best_index[tid] = k;
      }
    }
    __syncthreads();
    width = half;
  }
  if (tid == 0) tok[0] = best_index[0];
}
