/* bench_qd.c - the disk's read bandwidth by queue depth: O_DIRECT preads of
 * one file in pieces of 1 and 4 MiB, with 1, 2, 4, 8 and 16 reads in flight
 * (threads each taking every n-th piece), printed as GB/s and as a ratio of
 * one read in flight at the same piece size, R rounds interleaved (best of
 * them). This is the measurement issue 14 asks for before the pager reads
 * with several reads in flight: if the device gives no more with more in
 * flight, one prefetch reader is enough (docs/pager.md).
 *
 *   build/bench/bench_qd FILE [ROUNDS] [MIB]   (a file of at least 64 MiB, on
 *                                              the disk the models live on;
 *                                              MIB: read only its first MIB)
 */
#include "bench/bench_common.h"

#include <fcntl.h>

typedef struct job { int fd, nt, t; size_t piece, size; int failed; } job;

static void *reader(void *arg)
{
    job *j = arg;
    void *b = NULL;
    if (posix_memalign(&b, 4096, j->piece)) {
        j->failed = 1;
        return NULL;
    }
    for (size_t off = (size_t)j->t * j->piece; off + j->piece <= j->size; off += (size_t)j->nt * j->piece)
        if (pread(j->fd, b, j->piece, (off_t)off) != (ssize_t)j->piece) {
            j->failed = 1;
            break;
        }
    free(b);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_qd FILE [ROUNDS]  (needs a file: nothing measured)\n");
        return 0;
    }
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    int fd = open(argv[1], O_RDONLY | O_DIRECT);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    off_t end = lseek(fd, 0, SEEK_END);
    size_t size = end > 0 ? (size_t)end & ~(size_t)((4 << 20) - 1) : 0;
    size_t cap = argc > 3 ? (size_t)strtoull(argv[3], NULL, 10) << 20 : 0;
    if (cap && cap < size)
        size = cap & ~(size_t)((4 << 20) - 1);
    if (size < (64u << 20)) {
        fprintf(stderr, "bench_qd: %s: need at least 64 MiB\n", argv[1]);
        return 1;
    }
    static const size_t PIECE[] = {1 << 20, 4 << 20};
    static const int NT[] = {1, 2, 4, 8, 16};
    double best[2][5] = {{0}};
    for (int r = 0; r < (rounds > 0 ? rounds : 1); r++)
        for (int p = 0; p < 2; p++)
            for (int i = 0; i < 5; i++) {
                pthread_t th[16];
                job js[16];
                double t0 = bench_now();
                for (int t = 0; t < NT[i]; t++) {
                    js[t] = (job){fd, NT[i], t, PIECE[p], size, 0};
                    pthread_create(&th[t], NULL, reader, &js[t]);
                }
                int failed = 0;
                for (int t = 0; t < NT[i]; t++) {
                    pthread_join(th[t], NULL);
                    failed |= js[t].failed;
                }
                if (failed) {
                    fprintf(stderr, "bench_qd: %s: a read failed\n", argv[1]);
                    return 1;
                }
                double gbs = (double)size / (bench_now() - t0) / 1e9;
                if (gbs > best[p][i])
                    best[p][i] = gbs;
            }
    printf("%s: %.0f MiB, O_DIRECT, best of %d rounds\n", argv[1], size / 1048576.0, rounds);
    printf("| piece | 1 in flight | 2 | 4 | 8 | 16 |\n|---|---|---|---|---|---|\n");
    for (int p = 0; p < 2; p++)
        printf("| %zu MiB | %.2f GB/s | %.2fx | %.2fx | %.2fx | %.2fx |\n", PIECE[p] >> 20, best[p][0],
               best[p][1] / best[p][0], best[p][2] / best[p][0], best[p][3] / best[p][0], best[p][4] / best[p][0]);
    close(fd);
    return 0;
}
