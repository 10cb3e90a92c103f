/* c = a @ b for n x n row-major matrices; one invocation per row of c. */
void matmul(float *c, const float *a, const float *b, int n, int row) {
  const float *ar = a + (long)row * n;
  float *cr = c + (long)row * n;
  for (int j = 0; j < n; ++j) cr[j] = 0.0f;
  for (int k = 0; k < n; ++k) {
    const float av = ar[k];
    const float *br = b + (long)k * n;
    for (int j = 0; j < n; ++j) cr[j] += av * br[j];
  }
}
