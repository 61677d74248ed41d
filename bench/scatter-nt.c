// Moving 100-byte records to bucket places in a 230 MB buffer, three ways (issue 8, the
// external sort's second pass; crates/ulnet-river/src/sort/scatter.rs):
//   mode 0: each record stored straight to its place (the sort before f2321f2)
//   mode 1: through a window of WINDOW bytes per bucket, written out with non-temporal stores
//   mode 2: the same windows written out with ordinary copies
// Build: gcc -O2 -mavx2 -o /tmp/scatter-nt bench/scatter-nt.c
// Run:   /tmp/scatter-nt BUCKETS MODE [WINDOW]   (defaults 70, 0, 4096); prints 5 rounds.
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define RS 100

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  int nb = argc > 1 ? atoi(argv[1]) : 70, mode = argc > 2 ? atoi(argv[2]) : 0;
  size_t w = argc > 3 ? (size_t)atol(argv[3]) : 4096;
  size_t half = 230u << 20, n = half / RS, piece = (256 << 10) / RS * RS;
  unsigned char *h = aligned_alloc(4096, half), *p = malloc(piece), *bk = malloc(n);
  memset(h, 1, half);
  size_t *start = calloc(nb + 1, sizeof *start), *fill = malloc(nb * sizeof *fill);
  size_t *win = malloc(nb * sizeof *win), *lo = malloc(nb * sizeof *lo);
  unsigned char *stage = aligned_alloc(64, (size_t)nb * w);
  uint32_t x = 12345;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    bk[i] = x % nb;
    start[bk[i] + 1]++;
  }
  for (int b = 0; b < nb; b++) start[b + 1] += start[b];
  for (int rep = 0; rep < 5; rep++) {
    for (int b = 0; b < nb; b++) fill[b] = start[b] * RS, win[b] = fill[b] & ~(size_t)63, lo[b] = fill[b];
    double t0 = now();
    for (size_t r = 0; r < n;) {
      size_t m = piece / RS < n - r ? piece / RS : n - r;
      for (size_t k = 0; k < m; k++) memset(p + k * RS, bk[r + k], RS);  // the piece a read filled
      for (size_t k = 0; k < m; k++) {
        int b = p[k * RS];
        unsigned char *src = p + k * RS;
        if (mode == 0) {
          memcpy(h + fill[b], src, RS);
          fill[b] += RS;
          continue;
        }
        size_t at = fill[b], off = at - win[b], first = w - off < RS ? w - off : RS;
        unsigned char *st = stage + (size_t)b * w;
        memcpy(st + off, src, first);
        at += first;
        if (at == win[b] + w) {
          if (lo[b] == win[b] && mode == 1) {
            for (size_t q = 0; q < w; q += 32)
              _mm256_stream_si256((void *)(h + win[b] + q), _mm256_load_si256((void *)(st + q)));
          } else {
            memcpy(h + lo[b], st + (lo[b] - win[b]), win[b] + w - lo[b]);
          }
          win[b] += w, lo[b] = win[b];
          memcpy(st, src + first, RS - first);
          at += RS - first;
        }
        fill[b] = at;
      }
      r += m;
    }
    if (mode)
      for (int b = 0; b < nb; b++) memcpy(h + lo[b], stage + (size_t)b * w + (lo[b] - win[b]), fill[b] - lo[b]);
    _mm_sfence();
    double t = now() - t0;
    size_t bad = 0;
    for (int b = 0; b < nb; b++)
      for (size_t i = start[b]; i < start[b + 1]; i++) bad += memcmp(h + i * RS, h + start[b] * RS, RS) != 0 || h[i * RS] != b;
    printf("mode %d, %d buckets, window %zu: %.3f s, %.1f ns a record, %zu misplaced\n", mode, nb, w, t, t / n * 1e9, bad);
  }
  return 0;
}
