// Reading a cached file and touching each 100-byte record: pread (MODE 0) against mmap of the
// same pieces (1), with MAP_POPULATE (2), with MADV_POPULATE_READ (3).
// gcc -O2 -o /tmp/read-vs-map bench/read-vs-map.c && /tmp/read-vs-map FILE MODE PIECE_KIB
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double cpu(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s FILE MODE PIECE_KIB\n", argv[0]);
        return 2;
    }
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) return 1;
    size_t n = lseek(fd, 0, SEEK_END);
    int mode = atoi(argv[2]);
    size_t piece = (size_t)atoi(argv[3]) << 10;
    unsigned long sum = 0;
    double t = now(), c = cpu();
    if (mode == 0) {
        char *b = aligned_alloc(4096, piece);
        for (size_t o = 0; o < n; o += piece) {
            ssize_t r = pread(fd, b, piece, o);
            for (ssize_t i = 0; i < r; i += 100) sum += b[i];
        }
    } else {
        for (size_t o = 0; o < n; o += piece) {
            size_t len = n - o < piece ? n - o : piece;
            char *m = mmap(NULL, len, PROT_READ, MAP_SHARED | (mode == 2 ? MAP_POPULATE : 0), fd, o);
            if (m == MAP_FAILED) return 1;
            if (mode == 3) madvise(m, len, MADV_POPULATE_READ);
            for (size_t i = 0; i < len; i += 100) sum += m[i];
            munmap(m, len);
        }
    }
    printf("mode %d, pieces of %zu KiB: %.3f s wall, %.3f s CPU (sum %lu)\n", mode, piece >> 10, now() - t,
           cpu() - c, sum);
    return 0;
}
