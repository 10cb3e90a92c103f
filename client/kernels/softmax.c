/* Row-wise softmax of an n x n matrix as four kernels, one invocation per row each. */
#include <math.h>

void row_max(float *m, const float *x, int n, int row) {
  const float *xr = x + (long)row * n;
  float v = xr[0];
  for (int j = 1; j < n; ++j) v = xr[j] > v ? xr[j] : v;
  m[row] = v;
}

void exp_sub(float *e, const float *x, const float *m, int n, int row) {
  const float *xr = x + (long)row * n;
  float *er = e + (long)row * n;
  for (int j = 0; j < n; ++j) er[j] = expf(xr[j] - m[row]);
}

void row_sum(float *s, const float *e, int n, int row) {
  const float *er = e + (long)row * n;
  float v = 0.0f;
  for (int j = 0; j < n; ++j) v += er[j];
  s[row] = v;
}

void normalize(float *y, const float *e, const float *s, int n, int row) {
  const float *er = e + (long)row * n;
  float *yr = y + (long)row * n;
  const float inv = 1.0f / s[row];
  for (int j = 0; j < n; ++j) yr[j] = er[j] * inv;
}
