/* test_stream.c - the streamer under a budget (engine/stream.c; docs/pager.md,
 * Tensor-granular release): a block computed on the CPU is acquired op by op
 * and what the ops have finished with is released, so a budget's remainder
 * holds part of the next block. Measured on a generated model (bench/mkgguf.c)
 * the way bench/cgroup.sh measures it: bytes read per token after the first
 * pass, against file - budget, at two budgets; the ids stay those of the
 * unlimited run. */
#define MKGGUF_NO_MAIN
#include "bench/mkgguf.c"

#include "tests/testutil.h"

#include <criterion/criterion.h>

#include "engine/model.h"
#include "engine/pager.h"

/* 8 blocks of 15.4 MB (Q4_0: attention 1.5 MB, three FFN matrices of 4.7 MB
 * each), 123 MB in all: blocks many chunks long at the 2 MiB huge-page chunk. */
static const mkg_shape STREAM_SHAPE = {"stream", 1024, 8192, 8, 16, 4, 512, 512, 0, 0, 10000.0f, 0, 0};
enum { NG = 6 };   /* ids: the prompt's pass + 5 decoded tokens' */

static char *make_model(const char *dir)
{
    char gguf[1024], msg[512], *out = NULL;
    snprintf(gguf, sizeof gguf, "%s/stream.gguf", dir);
    cr_assert_eq(mkg_write(gguf, &STREAM_SHAPE, GGML_Q4_0, 0, 7, msg, sizeof msg), 0, "%s", msg);
    cr_assert(asprintf(&out, "%s/stream.jlm", dir) > 0);
    jlm_conv *c = NULL;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open(gguf, NULL, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_conv_write(c, out, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    jlm_conv_close(c);
    unlink(gguf);
    return out;
}

typedef struct run_out {
    int32_t  ids[NG];
    uint64_t bytes;        /* the text array's bytes read */
    uint64_t frames;       /* the pager's budget */
} run_out;

static void run(const char *path, uint64_t budget, int whole, int no_prefetch, run_out *r)
{
    jlm_engine_opts o = {.n_threads = 2, .budget = budget, .quiet = 1, .direct = 1, .n_ctx = 256,
                         .whole_blocks = whole, .no_prefetch = no_prefetch};
    jlm_engine *e = NULL;
    jlm_err err = {0};
    cr_assert_eq(jlm_engine_open(path, &o, &e, &err), 0, "%s", err.msg);
    uint32_t nv = jlm_engine_n_vocab(e);
    float *l = malloc(nv * sizeof *l);
    int32_t prompt[] = {1, 2, 3};
    cr_assert_eq(jlm_engine_eval(e, prompt, 3, l, &err), 0, "%s", err.msg);
    for (int i = 0; i < NG; i++) {
        int32_t best = 0;
        for (uint32_t j = 1; j < nv; j++)
            if (l[j] > l[best])
                best = (int32_t)j;
        r->ids[i] = best;
        if (i + 1 < NG)
            cr_assert_eq(jlm_engine_eval(e, &best, 1, l, &err), 0, "%s", err.msg);
    }
    free(l);
    jlm_pager_counters pc;
    jlm_pager_stats(jlm_engine_pager(e), &pc);
    r->bytes = pc.a[JLM_PAGER_TEXT].bytes_read;
    r->frames = jlm_engine_budget(e);
    cr_assert(!budget || pc.peak_bytes <= r->frames, "peak %llu past the frames' budget %llu",
              (unsigned long long)pc.peak_bytes, (unsigned long long)r->frames);
    cr_assert_eq(jlm_pager_check(jlm_engine_pager(e), &err), 0, "%s", err.msg);
    jlm_engine_close(e);
}

/* At 90% and 50% of the file, ids equal to the unlimited run's every way.
 * With read-ahead, op by op reads one op ahead where whole blocks read a
 * block ahead: fewer bytes. Without it, op by op holds beyond the levels
 * only the missing part of the op in use where a whole block held while it
 * computes holds all of its missing part: never more, and less once that
 * part spans ops (at 50% here: the FFN matrices are 61% of a block, so not
 * at 90%); a release at page granularity reads as much as whole blocks. */
Test(pager, op_by_op_release_reads_near_file_minus_budget_per_token, .timeout = 120)
{
    char *dir = tu_tmpdir();
    char *path = make_model(dir);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    uint64_t file = (uint64_t)st.st_size;
    run_out ref, r[2][2];   /* [whole][no_prefetch] */
    run(path, 0, 0, 0, &ref);
    uint64_t blocks = ref.bytes;   /* the first pass reads every block once */
    const int pct[] = {90, 50};
    for (int i = 0; i < 2; i++) {
        uint64_t budget = file * (uint64_t)pct[i] / 100;
        double per[2][2], fb = (double)(file - budget);
        for (int w = 0; w < 2; w++)
            for (int np = 0; np < 2; np++) {
                run(path, budget, w, np, &r[w][np]);
                for (int t = 0; t < NG; t++)
                    cr_assert_eq(r[w][np].ids[t], ref.ids[t], "%d%%, %s%s: id %d is %d, expected %d", pct[i],
                                 w ? "whole blocks" : "op by op", np ? ", no prefetch" : "", t, r[w][np].ids[t],
                                 ref.ids[t]);
                per[w][np] = (double)(r[w][np].bytes - blocks) / (NG - 1);
            }
        double bf = (double)blocks - (double)r[0][1].frames;
        cr_log_info("%d%%: file - budget %.1f MB, blocks - frames %.1f MB; read/token op by op %.1f MB (%.3fx), "
                    "whole blocks %.1f MB (%.3fx); no prefetch: %.1f MB (%.3fx), %.1f MB (%.3fx)", pct[i], fb / 1e6,
                    bf / 1e6, per[0][0] / 1e6, per[0][0] / fb, per[1][0] / 1e6, per[1][0] / fb, per[0][1] / 1e6,
                    per[0][1] / fb, per[1][1] / 1e6, per[1][1] / fb);
        cr_assert(pct[i] == 90 ? per[0][1] <= per[1][1] : per[0][1] < per[1][1],
                  "%d%%, no prefetch: op by op %.1f MB a token, whole blocks %.1f MB",
                  pct[i], per[0][1] / 1e6, per[1][1] / 1e6);
        cr_assert(per[0][0] < per[1][0], "%d%%: op by op %.1f MB a token, whole blocks %.1f MB", pct[i],
                  per[0][0] / 1e6, per[1][0] / 1e6);
    }
    free(path);
    tu_rmrf(dir);
    free(dir);
}
