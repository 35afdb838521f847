/* bench_attn.c - the engine's per-token attention (jlm_k_attn_head per query
 * head, as engine/model.c's attend() runs it: the F16 cache widened per KV
 * head first) against the batched jlm_k_fattn of every variant, on
 * Llama-3.2-1B shapes (head_dim 64, 32 query heads, 8 KV heads), one thread,
 * timed by the thread's CPU clock (load from other processes on a shared
 * machine does not count), best of interleaved rounds; prints ms per call and
 * the ratio per-token / batched (the in-run baseline).
 *
 *   build/bench/bench_attn [-r ROUNDS] [--f16] [--rows] [--decode]
 *
 * The batched kernel reads the cache as the engine keeps it (engine/model.c:
 * head-major values, keys in dimension-major tiles of JLM_K_FATTN_BK,
 * k_tiled); --rows gives it the per-token kernel's position-major rows
 * instead (each key tile transposed per call). --decode: the decode cases only.
 *
 * Cases: a prefill batch of 128 rows at positions 0.. (pp128), the last
 * batch of pp512 (rows at 384..511), decode (1 row) at 128, 512 and 2048 keys. */
#include "kernels/cpu/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { HD = 64, NH = 32, NKV = 8, GRP = NH / NKV, KVD = NKV * HD };

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
static float unit(uint64_t *s) { return (float)(rng(s) >> 40) / (float)(1 << 24) * 2.0f - 1.0f; }

typedef struct ctx {
    uint32_t npos, n, pos0;
    int f16;
    float *q, *k, *v, *out, *scores, *k32, *v32, *scratch;
    uint16_t *k16, *v16;
    void *kt, *vh;       /* the engine's layout (tiled keys, head-major values), F32 or F16 */
    uint64_t kvctx;      /* positions a head holds there: npos rounded up to a tile */
    int rows;            /* --rows: the batched kernel reads k/v (position-major rows), not kt/vh */
    uint32_t *lo, *hi;
} ctx;

static void per_token(ctx *c)
{
    float scale = 1.0f / sqrtf((float)HD);
    for (uint32_t r = 0; r < c->n; r++) {
        uint32_t nkv = c->pos0 + r + 1;
        for (uint32_t g = 0; g < NKV; g++) {
            jlm_k_attn a = {.head_dim = HD, .head_dim_v = HD, .k_stride = KVD, .v_stride = KVD, .scale = scale};
            const float *kb = c->k + g * HD, *vb = c->v + g * HD;
            if (c->f16) {   /* attend()'s F16 path: one KV head widened into a slab */
                for (uint32_t p = 0; p < nkv; p++)
                    for (uint32_t i = 0; i < HD; i++) {
                        c->k32[p * HD + i] = jlm_k_fp16_to_f32(c->k16[(uint64_t)p * KVD + g * HD + i]);
                        c->v32[p * HD + i] = jlm_k_fp16_to_f32(c->v16[(uint64_t)p * KVD + g * HD + i]);
                    }
                kb = c->k32;
                vb = c->v32;
                a.k_stride = a.v_stride = HD;
            }
            for (uint32_t h = g * GRP; h < (g + 1) * GRP; h++)
                jlm_k_attn_head(&a, c->q + (uint64_t)r * NH * HD + h * HD, kb, vb, nkv, c->scores,
                                c->out + (uint64_t)r * NH * HD + h * HD);
        }
    }
}

static void batched(ctx *c, jlm_k_fattn_fn fn)
{
    jlm_k_fattn p = {.head_dim = HD, .head_dim_v = HD, .group = GRP, .q_stride = NH * HD, .o_stride = NH * HD,
                     .k_stride = KVD, .v_stride = KVD, .kh_stride = HD, .vh_stride = HD, .kv_f16 = c->f16,
                     .scale = 1.0f / sqrtf((float)HD),
                     .lo = c->lo, .hi = c->hi};
    const void *k = c->f16 ? (const void *)c->k16 : (const void *)c->k;
    const void *v = c->f16 ? (const void *)c->v16 : (const void *)c->v;
    if (!c->rows) {   /* as engine/model.c sets it up */
        p.k_stride = HD;
        p.v_stride = HD;
        p.kh_stride = p.vh_stride = c->kvctx * HD;
        p.k_tiled = 1;
        k = c->kt;
        v = c->vh;
    }
    for (uint32_t g = 0; g < NKV; g++)
        for (uint32_t r0 = 0; r0 < c->n; r0 += JLM_K_FATTN_BQ)
            fn(&p, c->q, k, v, c->out, g, r0, r0 + JLM_K_FATTN_BQ < c->n ? r0 + JLM_K_FATTN_BQ : c->n, c->scratch);
}

int main(int argc, char **argv)
{
    int rounds = 5, f16 = 0, rows = 0, decode = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--f16")) {
            f16 = 1;
        } else if (!strcmp(argv[i], "--rows")) {
            rows = 1;
        } else if (!strcmp(argv[i], "--decode")) {
            decode = 1;
        } else {
            fprintf(stderr, "usage: bench_attn [-r ROUNDS] [--f16] [--rows] [--decode]\n");
            return 2;
        }
    }
    if (rounds < 1) rounds = 1;
    static const struct { const char *name; uint32_t n, pos0; } CASES[] = {
        {"pp128 (rows 0..127)", 128, 0}, {"pp512 last batch (384..511)", 128, 384},
        {"decode at 128 keys", 1, 127}, {"decode at 512 keys", 1, 511}, {"decode at 2048 keys", 1, 2047},
    };
    static const char *VN[JLM_K_NVARIANT] = {"ref", "avx2", "avx512"};
    jlm_k_fattn_fn VF[JLM_K_NVARIANT] = {jlm_k_fattn_ref, jlm_k_fattn_avx2, jlm_k_fattn_avx512};
    printf("bench_attn: head_dim %d, %d heads, %d KV heads, %s cache (batched: %s), 1 thread CPU time, best of %d "
           "rounds\n", HD, NH, NKV, f16 ? "F16" : "F32", rows ? "position-major rows" : "the engine's layout", rounds);
    printf("| case | per-token ms | variant | batched ms | per-token / batched |\n|---|---|---|---|---|\n");
    for (size_t ci = 0; ci < sizeof CASES / sizeof CASES[0]; ci++) {
        if (decode && CASES[ci].n != 1)
            continue;
        ctx c = {.n = CASES[ci].n, .pos0 = CASES[ci].pos0, .f16 = f16, .rows = rows};
        c.npos = c.pos0 + c.n;
        c.kvctx = (c.npos + JLM_K_FATTN_BK - 1) / JLM_K_FATTN_BK * JLM_K_FATTN_BK;
        uint64_t seed = 7 + ci, nk = (uint64_t)c.npos * KVD;
        c.q = malloc((size_t)c.n * NH * HD * 4);
        c.out = malloc((size_t)c.n * NH * HD * 4);
        c.k = malloc(nk * 4);
        c.v = malloc(nk * 4);
        c.k16 = malloc(nk * 2);
        c.v16 = malloc(nk * 2);
        c.k32 = malloc((size_t)c.npos * HD * 4);
        c.v32 = malloc((size_t)c.npos * HD * 4);
        c.scores = malloc((size_t)c.npos * 4);
        c.scratch = malloc(jlm_k_fattn_scratch_floats(HD, HD, GRP) * 4);
        c.kt = calloc(NKV * c.kvctx * HD, f16 ? 2 : 4);
        c.vh = calloc(NKV * c.kvctx * HD, f16 ? 2 : 4);
        c.lo = calloc(c.n, 4);
        c.hi = malloc(c.n * 4);
        if (!c.q || !c.out || !c.k || !c.v || !c.k16 || !c.v16 || !c.k32 || !c.v32 || !c.scores || !c.scratch ||
            !c.kt || !c.vh || !c.lo || !c.hi) {
            fprintf(stderr, "bench_attn: out of memory\n");
            return 1;
        }
        for (uint64_t i = 0; i < (uint64_t)c.n * NH * HD; i++)
            c.q[i] = unit(&seed);
        for (uint64_t i = 0; i < nk; i++) {
            c.k16[i] = jlm_k_f32_to_fp16(unit(&seed));
            c.v16[i] = jlm_k_f32_to_fp16(unit(&seed));
            c.k[i] = jlm_k_fp16_to_f32(c.k16[i]);
            c.v[i] = jlm_k_fp16_to_f32(c.v16[i]);
        }
        for (uint64_t j = 0; j < c.npos; j++)   /* the engine's layout: key j, dim i of head g */
            for (uint64_t g = 0; g < NKV; g++)
                for (uint64_t i = 0; i < HD; i++) {
                    uint64_t src = j * KVD + g * HD + i;
                    uint64_t kd = g * c.kvctx * HD + j / JLM_K_FATTN_BK * JLM_K_FATTN_BK * HD + i * JLM_K_FATTN_BK +
                                  j % JLM_K_FATTN_BK;
                    uint64_t vd = g * c.kvctx * HD + j * HD + i;
                    if (f16) {
                        ((uint16_t *)c.kt)[kd] = c.k16[src];
                        ((uint16_t *)c.vh)[vd] = c.v16[src];
                    } else {
                        ((float *)c.kt)[kd] = c.k[src];
                        ((float *)c.vh)[vd] = c.v[src];
                    }
                }
        for (uint32_t r = 0; r < c.n; r++)
            c.hi[r] = c.pos0 + r + 1;
        double best_tok = 1e30, best[JLM_K_NVARIANT];
        for (int v = 0; v < JLM_K_NVARIANT; v++)
            best[v] = 1e30;
        for (int r = 0; r < rounds; r++) {
            double t0 = cpu_s();
            per_token(&c);
            double t = cpu_s() - t0;
            if (t < best_tok) best_tok = t;
            for (int v = 0; v < JLM_K_NVARIANT; v++) {
                if (!jlm_k_cpu_has(v))
                    continue;
                t0 = cpu_s();
                batched(&c, VF[v]);
                t = cpu_s() - t0;
                if (t < best[v]) best[v] = t;
            }
        }
        for (int v = 0; v < JLM_K_NVARIANT; v++)
            if (jlm_k_cpu_has(v))
                printf("| %s | %.3f | %s | %.3f | %.2f |\n", CASES[ci].name, best_tok * 1e3, VN[v], best[v] * 1e3,
                       best_tok / best[v]);
        free(c.q); free(c.out); free(c.k); free(c.v); free(c.k16); free(c.v16);
        free(c.k32); free(c.v32); free(c.scores); free(c.scratch); free(c.kt); free(c.vh); free(c.lo); free(c.hi);
    }
    return 0;
}
