// What appending to files through the page cache costs by write size (BENCHMARKS.md, issue 8):
// appends WRITE-byte writes round-robin to FILES files (opened, then unlinked, in DIR) until
// MIB MiB are written, and prints wall and system time. Run two at once for the sort's two
// nodes:  gcc -O2 -o /tmp/append-cost bench/append-cost.c
//         /tmp/append-cost /var/tmp 65500 900 15 & /tmp/append-cost /var/tmp 65500 900 15; wait
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s DIR WRITE MIB FILES\n", argv[0]);
        return 2;
    }
    size_t piece = (size_t)atol(argv[2]), total = (size_t)atol(argv[3]) << 20;
    int files = atoi(argv[4]);
    if (piece == 0 || files < 1 || files > 64) return 2;
    int fd[64];
    char path[4096];
    for (int i = 0; i < files; i++) {
        snprintf(path, sizeof path, "%s/append-cost.%d.%d", argv[1], (int)getpid(), i);
        fd[i] = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd[i] < 0) { perror(path); return 1; }
        unlink(path);
    }
    char *buf = malloc(piece);
    memset(buf, 7, piece);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (size_t done = 0, k = 0; done < total; done += piece, k++)
        if (write(fd[k % files], buf, piece) != (ssize_t)piece) { perror("write"); return 1; }
    clock_gettime(CLOCK_MONOTONIC, &b);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("writes of %zu bytes: %.3f s wall, %.3f s system\n", piece,
           b.tv_sec - a.tv_sec + (b.tv_nsec - a.tv_nsec) * 1e-9, ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6);
    return 0;
}
