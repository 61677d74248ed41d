// The external sort's I/O with no sorting in it: the least a two-pass sort of a file larger
// than its memory must do on this machine (BENCHMARKS.md, issue 8).
//   gcc -O2 -pthread -o /tmp/external-floor bench/external-floor.c
//   /tmp/external-floor INPUT TEMP_DIR OUTPUT RESIDENT_MIB [WORKERS]
// Each of WORKERS threads (default 2, one per core) takes its slice of INPUT.
//   Pass 1: `pread` in 4 MiB pieces; of each piece, the resident share (RESIDENT_MIB over the
//   input) is copied into memory faulted in beforehand, the rest written straight from the
//   read buffer to the worker's temporary file in `write`s of 100 KiB from page boundaries
//   (the sort's stage size),
//   until the temporary files hold the sort's share of the kernel's background threshold for
//   dirty data (0.8 of it, less what is dirty; `spare.rs`). The rest goes, in the same
//   writes, through the page cache into the tail of the worker's own part of OUTPUT (its
//   preallocated blocks, which are never freed, so the file system has nothing to discard),
//   and a thread of its own starts its writeback every millisecond (`sync_file_range`).
//   Pass 2: the resident bytes are written to OUTPUT with O_DIRECT in 1 MiB writes while a
//   loader thread reads the bytes in OUTPUT's tail, then the temporary file, back in 4 MiB
//   pieces; the writer then writes those too (reaching the tail only after it was read), and
//   the file is removed once read.
// Variants, each a design the sort could take instead (BENCHMARKS.md, issue 8, 03:00 UTC):
//   TEMP_DIRECT=1         temporary files written and read back with O_DIRECT (the disk takes
//                         them during pass 1, and the page cache is left to the output).
//   DIRTY_BUDGET_MIB=N    a piece of output goes through the page cache (100 KiB writes) while
//                         the machine's Dirty + Writeback stays below N MiB, else O_DIRECT.
//   PUNCH=1               pass 2 punches each piece out of the temporary file once read, so
//                         its dirty pages are dropped, not written back.
//   OUTPUT_SPLIT=1        each worker writes its own output file (OUTPUT.W), to tell the
//                         disk's pace from contention on one file's inode.
//   SPARE_BUDGET_MIB=N    the temporary files take at most N MiB (all workers together)
//                         before the rest goes to OUTPUT's tail; NO_SPARE=1: none goes there
//                         (all temporary bytes to the files: the sort's design before 4ac455c).
//   SPARE_INLINE=1        each worker starts the writeback of what it wrote there itself.
//   SPARE_FIRST=1         the first temporary bytes go to OUTPUT's tail, the rest to the files.
// Left out, each of which the sort must do: choosing a record's destination, exchanging
// records between nodes, staging records by key range, and sorting. So the time printed is a
// floor for any sort with this design here, not a sort.
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define READ_PIECE (4u << 20)
#define WRITE_PIECE (100u << 10)  // the sort's stage: 1,024 records, 25 pages
#define DIRECT_PIECE (1u << 20)
#define RING 4

static const char *input_path, *temp_dir, *output_path;
static size_t input_len, resident_total;
static int workers;
static pthread_barrier_t between_passes;
static double started, pass1_end[64];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void *aligned(size_t n) {
    void *p;
    if (posix_memalign(&p, 4096, n)) die("posix_memalign");
    memset(p, 0, n);
    return p;
}

static long dirty_budget_kib;
static size_t buffered_bytes, spare_total;

// The machine's Dirty + Writeback, in KiB.
static long dirty_kib(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) die("/proc/meminfo");
    char line[256];
    long v = 0, sum = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Dirty: %ld", &v) == 1 || sscanf(line, "Writeback: %ld", &v) == 1) sum += v;
    fclose(f);
    return sum;
}
// O_DIRECT wants 4 KiB multiples; the unaligned tail of the last slice goes through `buffered`.
static void write_out(int direct, int buffered, const char *src, size_t len, size_t off) {
    if (dirty_budget_kib && dirty_kib() + (long)(len >> 10) < dirty_budget_kib) {
        for (size_t done = 0; done < len;) {
            size_t m = len - done < WRITE_PIECE ? len - done : WRITE_PIECE;
            if (pwrite(buffered, src + done, m, off + done) != (ssize_t)m) die("pwrite buffered");
            done += m;
        }
        __atomic_add_fetch(&buffered_bytes, len, __ATOMIC_RELAXED);
        return;
    }
    size_t whole = len & ~(size_t)4095;
    for (size_t done = 0; done < whole;) {
        size_t n = whole - done < DIRECT_PIECE ? whole - done : DIRECT_PIECE;
        if (pwrite(direct, src + done, n, off + done) != (ssize_t)n) die("pwrite direct");
        done += n;
    }
    if (len > whole && pwrite(buffered, src + whole, len - whole, off + whole) != (ssize_t)(len - whole))
        die("pwrite tail");
}

// The machine's share for the temporary files (as `files_budget` in spare.rs): 0.8 of the
// kernel's background threshold for dirty data, less what is dirty now, in bytes.
static size_t files_budget(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) die("/proc/meminfo");
    char line[256];
    long v, free_kib = 0, file_kib = 0, dirty_kib = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemFree: %ld", &v) == 1) free_kib = v;
        if (sscanf(line, "Active(file): %ld", &v) == 1 || sscanf(line, "Inactive(file): %ld", &v) == 1) file_kib += v;
        if (sscanf(line, "Dirty: %ld", &v) == 1) dirty_kib = v;
    }
    fclose(f);
    long ratio = 10, bytes = 0;
    if ((f = fopen("/proc/sys/vm/dirty_background_bytes", "r"))) { if (fscanf(f, "%ld", &bytes) != 1) bytes = 0; fclose(f); }
    if ((f = fopen("/proc/sys/vm/dirty_background_ratio", "r"))) { if (fscanf(f, "%ld", &ratio) != 1) ratio = 10; fclose(f); }
    double threshold = bytes ? (double)bytes : (double)(free_kib + file_kib) * 1024 * ratio / 100;
    double room = threshold - (double)dirty_kib * 1024;
    return room > 0 ? (size_t)(room * 0.8) : 0;
}

// A thread of its own starts the spare bytes' writeback, every millisecond.
struct push {
    int fd, done;
    size_t from, to;  // [from, to) written; `from` falls as the worker writes
};

static void *push(void *arg) {
    struct push *p = arg;
    size_t pushed = p->to;
    for (;;) {
        int done = __atomic_load_n(&p->done, __ATOMIC_ACQUIRE);
        size_t from = __atomic_load_n(&p->from, __ATOMIC_ACQUIRE);
        if (from < pushed && sync_file_range(p->fd, from, pushed - from, SYNC_FILE_RANGE_WRITE)) die("sync_file_range");
        pushed = from;
        if (done) return NULL;
        usleep(1000);
    }
}

struct ring {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    char *buf[RING];
    size_t len[RING];
    unsigned filled, emptied;
    int temp, punch;
    int spare_fd;  // read first: `spare` bytes ending at `spare_end`
    size_t spare, spare_end;
};

static void *loader(void *arg) {
    struct ring *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->lock);
        while (r->filled - r->emptied == RING) pthread_cond_wait(&r->changed, &r->lock);
        pthread_mutex_unlock(&r->lock);
        char *b = r->buf[r->filled % RING];
        size_t got = 0;
        if (r->spare) {
            size_t n = r->spare < READ_PIECE ? r->spare : READ_PIECE;
            if (pread(r->spare_fd, b, n, r->spare_end - r->spare) != (ssize_t)n) die("pread spare");
            r->spare -= n;
            pthread_mutex_lock(&r->lock);
            r->len[r->filled % RING] = n;
            r->filled++;
            pthread_cond_broadcast(&r->changed);
            pthread_mutex_unlock(&r->lock);
            continue;
        }
        off_t at = lseek(r->temp, 0, SEEK_CUR);
        for (ssize_t n; got < READ_PIECE && (n = read(r->temp, b + got, READ_PIECE - got)) > 0;) got += n;
        if (got && r->punch && fallocate(r->temp, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, at, got)) die("punch");
        pthread_mutex_lock(&r->lock);
        r->len[r->filled % RING] = got;
        r->filled++;
        pthread_cond_broadcast(&r->changed);
        pthread_mutex_unlock(&r->lock);
        if (got == 0) return NULL;
    }
}

static void *worker(void *arg) {
    int w = (int)(long)arg;
    // Slices and the resident share start on 4 KiB boundaries, as O_DIRECT wants.
    size_t lo = (input_len * w / workers) & ~(size_t)4095;
    size_t hi = w + 1 == workers ? input_len : (input_len * (w + 1) / workers) & ~(size_t)4095, len = hi - lo;
    size_t resident_len = (resident_total / workers) & ~(size_t)4095;
    if (resident_len > (len & ~(size_t)4095)) resident_len = len & ~(size_t)4095;
    char *resident = aligned(resident_len + 4096);
    char *piece = aligned(READ_PIECE);
    char temp_path[4096];
    snprintf(temp_path, sizeof temp_path, "%s/floor.%d.tmp", temp_dir, w);
    int in = open(input_path, O_RDONLY), temp = open(temp_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (in < 0 || temp < 0) die("open");

    size_t kept = 0, spare = 0, temp_bytes = 0;
    struct push pusher = {.fd = -1, .from = hi, .to = hi};
    pthread_t push_thread;
    size_t spare_budget = getenv("NO_SPARE")           ? (size_t)-1
                          : getenv("SPARE_BUDGET_MIB") ? ((size_t)atol(getenv("SPARE_BUDGET_MIB")) << 20) / workers
                                                       : files_budget() / workers;
    int spare_fd = spare_budget != (size_t)-1 ? open(output_path, O_RDWR) : -1;
    if (spare_fd >= 0 && !getenv("SPARE_INLINE")) {
        pusher.fd = spare_fd;
        pthread_create(&push_thread, NULL, push, &pusher);
    }
    int temp_direct = getenv("TEMP_DIRECT") ? open(temp_path, O_WRONLY | O_DIRECT) : -1;
    char *stage = temp_direct >= 0 ? aligned(READ_PIECE + 4096) : NULL;
    size_t staged = 0, temp_off = 0;
    for (size_t off = lo; off < hi;) {
        size_t n = hi - off < READ_PIECE ? hi - off : READ_PIECE;
        if (pread(in, piece, n, off) != (ssize_t)n) die("pread");
        // In whole pages, so that every write to the temporary file starts on a page, as the
        // sort's stages do.
        size_t keep = ((size_t)((double)resident_len * (off + n - lo) / len) - kept) & ~(size_t)4095;
        memcpy(resident + kept, piece, keep);
        kept += keep;
        if (temp_direct >= 0) {
            memcpy(stage + staged, piece + keep, n - keep);
            staged += n - keep;
            size_t whole = staged & ~(size_t)4095;
            if (whole && pwrite(temp_direct, stage, whole, temp_off) != (ssize_t)whole) die("pwrite temp direct");
            temp_off += whole;
            memmove(stage, stage + whole, staged - whole);
            staged -= whole;
        } else if ((getenv("SPARE_FIRST") ? len - resident_len > spare_budget + spare + (n - keep) && spare_fd >= 0
                                           : temp_bytes + (n - keep) > spare_budget) &&
                   ((n - keep) & ~(size_t)4095)) {
            // Into the tail of this worker's output, from its end backwards, in 4 KiB
            // multiples (the output is written with O_DIRECT); the rest to the file.
            size_t m = (n - keep) & ~(size_t)4095;
            spare += m;
            for (size_t done = 0; done < m;) {  // in the same writes as the files
                size_t k = m - done < WRITE_PIECE ? m - done : WRITE_PIECE;
                if (pwrite(spare_fd, piece + keep + done, k, hi - spare + done) != (ssize_t)k) die("pwrite spare");
                done += k;
            }
            if (getenv("SPARE_INLINE") && sync_file_range(spare_fd, hi - spare, m, SYNC_FILE_RANGE_WRITE))
                die("sync_file_range");
            __atomic_store_n(&pusher.from, hi - spare, __ATOMIC_RELEASE);
            if (write(temp, piece + keep + m, n - keep - m) != (ssize_t)(n - keep - m)) die("write temp");
        } else {
            temp_bytes += n - keep;
            for (size_t done = keep; done < n;) {
                size_t m = n - done < WRITE_PIECE ? n - done : WRITE_PIECE;
                if (write(temp, piece + done, m) != (ssize_t)m) die("write temp");
                done += m;
            }
        }
        off += n;
    }
    if (temp_direct >= 0) {
        if (staged && pwrite(temp, stage, staged, temp_off) != (ssize_t)staged) die("pwrite temp tail");
        close(temp_direct);
        int rd = open(temp_path, O_RDONLY | O_DIRECT);
        if (rd < 0) die("open temp direct");
        close(temp);
        temp = rd;
    }
    if (pusher.fd >= 0) {
        __atomic_store_n(&pusher.done, 1, __ATOMIC_RELEASE);
        pthread_join(push_thread, NULL);
    }
    __atomic_add_fetch(&spare_total, spare, __ATOMIC_RELAXED);
    pass1_end[w] = now();
    pthread_barrier_wait(&between_passes);

    char split_path[4096];
    const char *opath = output_path;
    size_t base = 0;  // where this worker's slice starts in the file it writes
    if (getenv("OUTPUT_SPLIT")) {
        snprintf(split_path, sizeof split_path, "%s.%d", output_path, w);
        int f = open(split_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (f < 0 || fallocate(f, 0, 0, len)) die("split output");
        close(f);
        opath = split_path, base = lo;
    }
    int direct = open(opath, O_WRONLY | O_DIRECT), buffered = open(opath, O_WRONLY);
    if (direct < 0 || buffered < 0) die("open output");
    struct ring r = {.lock = PTHREAD_MUTEX_INITIALIZER, .changed = PTHREAD_COND_INITIALIZER, .temp = temp, .punch = getenv("PUNCH") != NULL,
                     .spare_fd = spare_fd, .spare = spare, .spare_end = hi};
    if (spare && 2 * spare > len - kept) {
        fprintf(stderr, "worker %d: the spare bytes (%zu) would be overwritten before they are read\n", w, spare);
        exit(1);
    }
    for (int i = 0; i < RING; i++) r.buf[i] = aligned(READ_PIECE);
    if (lseek(temp, 0, SEEK_SET) != 0) die("lseek");
    pthread_t load;
    pthread_create(&load, NULL, loader, &r);
    write_out(direct, buffered, resident, kept, lo - base);
    size_t out = lo + kept;
    for (;;) {
        pthread_mutex_lock(&r.lock);
        while (r.filled == r.emptied) pthread_cond_wait(&r.changed, &r.lock);
        size_t n = r.len[r.emptied % RING];
        pthread_mutex_unlock(&r.lock);
        if (n == 0) break;
        write_out(direct, buffered, r.buf[r.emptied % RING], n, out - base);
        out += n;
        pthread_mutex_lock(&r.lock);
        r.emptied++;
        pthread_cond_broadcast(&r.changed);
        pthread_mutex_unlock(&r.lock);
    }
    pthread_join(load, NULL);
    if (out != hi) {
        fprintf(stderr, "worker %d wrote %zu bytes of %zu\n", w, out - lo, len);
        exit(1);
    }
    unlink(temp_path);
    close(temp), close(in), close(direct), close(buffered);
    if (spare_fd >= 0) close(spare_fd);
    return NULL;
}

int main(int argc, char **argv) {
    started = now();
    if (argc < 5) {
        fprintf(stderr, "usage: %s INPUT TEMP_DIR OUTPUT RESIDENT_MIB [WORKERS]\n", argv[0]);
        return 2;
    }
    input_path = argv[1], temp_dir = argv[2], output_path = argv[3];
    resident_total = (size_t)atol(argv[4]) << 20;
    workers = argc > 5 ? atoi(argv[5]) : 2;
    dirty_budget_kib = getenv("DIRTY_BUDGET_MIB") ? atol(getenv("DIRTY_BUDGET_MIB")) << 10 : 0;
    if (workers < 1 || workers > 64) return 2;
    struct stat st;
    if (stat(input_path, &st)) die("stat input");
    input_len = st.st_size;
    if (!getenv("OUTPUT_SPLIT")) {
        int out = open(output_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (out < 0 || fallocate(out, 0, 0, input_len)) die("output");
        close(out);
    }
    pthread_barrier_init(&between_passes, NULL, workers);
    pthread_t t[64];
    for (long w = 0; w < workers; w++) pthread_create(&t[w], NULL, worker, (void *)w);
    for (int w = 0; w < workers; w++) pthread_join(t[w], NULL);
    double end = now(), pass1 = 0;
    for (int w = 0; w < workers; w++) pass1 = pass1_end[w] - started > pass1 ? pass1_end[w] - started : pass1;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("{\"total_s\": %.3f, \"pass1_s\": %.3f, \"pass2_s\": %.3f, \"user_s\": %.2f, \"sys_s\": %.2f, "
           "\"buffered_bytes\": %zu, \"spare_bytes\": %zu, \"max_rss_kib\": %ld, \"resident_bytes\": %zu, \"temp_bytes\": %zu}\n",
           end - started, pass1, end - started - pass1, ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6,
           ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6, buffered_bytes, spare_total, ru.ru_maxrss, resident_total < input_len ? resident_total : input_len,
           resident_total < input_len ? input_len - resident_total : 0);
    return 0;
}
