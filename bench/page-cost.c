// What a new anonymous 4 KiB page costs on this machine: first touch, second touch, memset.
// gcc -O2 -o /tmp/page-cost bench/page-cost.c && /tmp/page-cost 1024   (MiB; BENCHMARKS.md, issue 8)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    size_t n = (size_t)atoi(argc > 1 ? argv[1] : "1024") << 20;
    size_t pages = n / 4096;
    for (int round = 0; round < 3; round++) {
        char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return 1;
        double t = now();
        for (size_t o = 0; o < n; o += 4096) m[o] = 1;
        double first = now() - t;
        t = now();
        for (size_t o = 0; o < n; o += 4096) m[o] = 2;
        double second = now() - t;
        t = now();
        memset(m, 3, n);
        double fill = now() - t;
        printf("round %d: first touch %.3f us/page, second %.4f us/page, memset %.2f GB/s\n", round,
               first / pages * 1e6, second / pages * 1e6, n / fill / 1e9);
        munmap(m, n);
    }
    return 0;
}
