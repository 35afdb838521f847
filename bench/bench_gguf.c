/* bench_gguf.c - opening a GGUF (metadata parse, 32000-token vocab) as a ratio
 * against reading the same file's bytes into memory, measured in the same run
 * (warm page cache, best of R). Was a 100 ms assertion in tests/test_gguf.c;
 * the suite checks correctness, speed lives here.
 *
 *   build/bench/bench_gguf [FILE.gguf] [-r R]
 */
#include "bench/bench_common.h"
#include "converter/gguf.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The baseline: every byte of the file read into one buffer. */
static double read_all(const char *path)
{
    double t0 = bench_now();
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    off_t n = lseek(fd, 0, SEEK_END);
    char *buf = malloc(n > 0 ? (size_t)n : 1);
    ssize_t r = buf ? pread(fd, buf, (size_t)n, 0) : -1;
    close(fd);
    free(buf);
    return r == n ? bench_now() - t0 : -1;
}

static double open_gguf(const char *path, uint64_t *n_tok)
{
    jlm_err err = {0};
    jlm_gguf *g = NULL;
    double t0 = bench_now();
    if (jlm_gguf_open(path, &g, &err)) {
        fprintf(stderr, "bench_gguf: %s\n", err.msg);
        return -1;
    }
    double t = bench_now() - t0;
    const jlm_gguf_kv *kv = jlm_gguf_find(g, "tokenizer.ggml.tokens");
    *n_tok = kv ? kv->n : 0;
    jlm_gguf_close(g);
    return t;
}

int main(int argc, char **argv)
{
    const char *path = "tests/models/vocab/ggml-vocab-llama-spm.gguf";
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else path = argv[i];
    }
    double best_read = 1e9, best_open = 1e9;
    uint64_t n_tok = 0;
    for (int r = 0; r < reps; r++) {
        double a = read_all(path), b = open_gguf(path, &n_tok);
        if (a < 0 || b < 0) {
            fprintf(stderr, "bench_gguf: %s: cannot read\n", path);
            return 1;
        }
        best_read = a < best_read ? a : best_read;
        best_open = b < best_open ? b : best_open;
    }
    printf("gguf open  %-48s %8llu tokens  %8.2f ms  read-all %8.2f ms  ratio %.2f\n", path,
           (unsigned long long)n_tok, best_open * 1e3, best_read * 1e3, best_open / best_read);
    return 0;
}
