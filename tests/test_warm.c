/* test_warm.c - the cold start below the model by rank (engine/stream.c,
 * warm_pick): which experts the background read takes when the frames hold
 * only part of them, on a model of bench/mkgguf.c's with 32 experts a
 * block (the test models' 4-8 experts leave no room between a block's
 * working set and the whole model). Reads the engine's own ranks
 * (model_int.h) to check the order the pager was asked for. */
#define MKGGUF_NO_MAIN
#include "bench/mkgguf.c"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "converter/convert.h"
#include "engine/model.h"
#include "engine/model_int.h"
#include "engine/pager.h"
#include "engine/routing.h"
#include "engine/sampler.h"
#include "tests/moe_budget.h"
#include "tests/testutil.h"

/* prompt, then n greedy ids into out; the first eval (the prefill) checked
 * by at_prefill (NULL: none) before any id is decoded. */
static void greedy_after(jlm_engine *e, const int32_t *prompt, uint32_t np, int n, int32_t *out,
                         void (*at_prefill)(jlm_engine *, void *), void *ctx)
{
    uint32_t nv = jlm_engine_n_vocab(e);
    float *l = malloc(nv * sizeof *l);
    jlm_err err = {0};
    cr_assert(l);
    cr_assert_eq(jlm_engine_eval(e, prompt, np, l, &err), 0, "%s", err.msg);
    if (at_prefill)
        at_prefill(e, ctx);
    for (int i = 0; i < n; i++) {
        out[i] = jlm_samp_argmax(l, nv);
        cr_assert_eq(jlm_engine_eval(e, &out[i], 1, l, &err), 0, "%s", err.msg);
    }
    free(l);
}

/* The budget that holds the KV cache, scratch, dense region, the text
 * blocks and num/den of the expert pages' bytes. */
static uint64_t text_and_experts(jlm_engine *e, uint64_t num, uint64_t den)
{
    jlm_pager *pg = jlm_engine_pager(e);
    uint64_t text = 0, xp = 0;
    for (uint32_t i = 0; jlm_pager_extent(pg, JLM_PAGER_TEXT, i); i++)
        text += jlm_pager_extent(pg, JLM_PAGER_TEXT, i);
    for (uint32_t i = 0; jlm_pager_extent(pg, JLM_PAGER_EXPERTS, i); i++)
        xp += jlm_pager_extent(pg, JLM_PAGER_EXPERTS, i);
    jlm_engine_mem mi;
    jlm_engine_mem_info(e, &mi);
    return mi.kv + mi.scratch + mi.dense + text + xp * num / den;
}

typedef struct prefill_ctx {
    const char *name;
    FILE *trace;          /* the prefill's --trace-routing, into *buf (*len bytes) */
    char **buf;
    size_t *len;
    uint32_t picked;      /* experts the background read took that no row routed to */
} prefill_ctx;

/* After the prefill, in every MoE block: no expert left unread that its
 * rows did not route to ranks above one the background read took (the
 * block's ranks are its rows' probabilities summed, all of them routed in
 * the prefill's one batch before the block's first pick). */
static void check_ranks(jlm_engine *e, void *arg)
{
    prefill_ctx *x = arg;
    jlm_err err = {0};
    jlm_engine_trace_routing(e, NULL, &err);
    fclose(x->trace);
    jlm_routing_trace t;
    FILE *in = fmemopen(*x->buf, *x->len, "r");
    cr_assert(in);
    cr_assert_eq(jlm_routing_parse(in, "prefill.trace", &t, &err), 0, "%s", err.msg);
    fclose(in);
    uint32_t ne = e->c->n_expert;
    cr_assert(e->warm_rank, "%s: the background read does not rank the experts at 5/8 of them", x->name);
    for (uint32_t l = 0; l < e->c->n_layer; l++) {
        const jlm_tensor *tg = W(e, (int32_t)l, JLM_R_EXP_GATE);
        if (!tg)
            continue;
        uint32_t first = bank_first(e, tg);
        uint8_t routed[JLM_MAX_EXPERTS] = {0};
        for (uint64_t k = 0; k < (uint64_t)t.n_groups * t.n_used; k++)
            if (t.page[k] / ne == l)
                routed[t.page[k] % ne] = 1;   /* a page in the trace: block * n_expert + id */
        const float *sc = e->warm_score + (size_t)l * (ne + 2);
        float lo_taken = 1e30f, hi_left = -1.0f;
        for (uint32_t i = 0; i < ne; i++) {
            if (routed[i])
                continue;
            if (e->warm_done[first + i] & WARM_DONE) {
                x->picked++;
                lo_taken = sc[i] < lo_taken ? sc[i] : lo_taken;
            } else {
                hi_left = sc[i] > hi_left ? sc[i] : hi_left;
            }
        }
        cr_assert(lo_taken >= hi_left, "%s block %u: an expert left unread ranks %g, above one read in the "
                  "background (%g)", x->name, l, (double)hi_left, (double)lo_taken);
    }
    jlm_routing_free(&t);
}

/* dir/m.jlm: bench/mkgguf.c's tiny-moe with n_layer blocks of 32 experts
 * of 2 used, Q8_0, converted from dir/m.gguf; its path into path. */
static void write_moe(const char *dir, uint32_t n_layer, char *path, size_t size)
{
    char src[1024], msg[512];
    mkg_shape s;
    cr_assert_eq(mkg_preset("tiny-moe", &s), 0);
    s.n_layer = n_layer, s.n_expert = 32;
    snprintf(src, sizeof src, "%s/m.gguf", dir);
    snprintf(path, size, "%s/m.jlm", dir);
    cr_assert_eq(mkg_write(src, &s, GGML_Q8_0, 0, 7, msg, sizeof msg), 0, "%s", msg);
    jlm_conv *cv;
    jlm_err err = {0};
    cr_assert_eq(jlm_conv_open(src, NULL, &cv, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_conv_write(cv, path, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    jlm_conv_close(cv);
}

/* A 3-token prompt's prefill (its routing in one batch a block) leaves
 * every MoE block with the experts it routed to and, read in the
 * background, the most probable of the rest (check_ranks); the ids are the
 * unlimited run's, and the frames stay within the budget. */
Test(moe, the_background_read_below_the_model_takes_the_most_probable_experts, .timeout = 60)
{
    char *dir = tu_tmpdir(), path[1024];
    write_moe(dir, 4, path, sizeof path);   /* 4 blocks of 32 experts of 2 used: 128 expert pages */
    jlm_err err = {0};
    int32_t prompt[] = {1, 2, 3}, ref[6], got[6];
    jlm_engine_opts o = {.n_threads = 2, .quiet = 1, .direct = 1, .no_predict = 1};
    jlm_engine *e;
    cr_assert_eq(jlm_engine_open(path, &o, &e, &err), 0, "%s", err.msg);
    greedy_after(e, prompt, 3, 6, ref, NULL, NULL);
    o.budget = text_and_experts(e, 5, 8);   /* each MoE block's share 20 of its 32 experts, below 3/4 (file order) */
    jlm_engine_close(e);
    cr_assert_eq(jlm_engine_open(path, &o, &e, &err), 0, "%s", err.msg);
    char *buf = NULL;
    size_t len = 0;
    prefill_ctx x = {.name = "m.jlm", .trace = open_memstream(&buf, &len), .buf = &buf, .len = &len};
    cr_assert(x.trace);
    cr_assert_eq(jlm_engine_trace_routing(e, x.trace, &err), 0, "%s", err.msg);
    greedy_after(e, prompt, 3, 6, got, check_ranks, &x);
    cr_assert(x.picked > 0, "the background read took no expert the prompt did not route to");
    cr_assert_arr_eq(got, ref, sizeof ref, "ids under the budget differ from the unlimited run");
    tb_within_budget(e);
    jlm_engine_close(e);
    free(buf);
    tu_rmrf(dir);
    free(dir);
}

/* A one-token prompt routes n_expert_used experts in each of the 8 MoE
 * blocks (16 pages), and the frames hold them and 3 pages more. The
 * background read may guess (read an expert no row routed to) only into
 * frames the blocks still to route will not need (warm_spare): no page it
 * read is evicted unused by the prefill's own experts, and it still guesses
 * into the spare. Reading up to each block's share (2.4 pages) as soon as
 * the block routes, as it did, filled the spare by block 3 and the last
 * blocks' routing evicted those guesses unused (issue 42's 25% budget:
 * 15 of 17 guesses). */
Test(moe, the_background_read_guesses_only_into_frames_the_prefill_leaves, .timeout = 60)
{
    char *dir = tu_tmpdir(), path[1024];
    write_moe(dir, 8, path, sizeof path);   /* 8 blocks of 32 experts of 2 used */
    jlm_err err = {0};
    int32_t prompt[] = {5}, ref[4], got[4];
    jlm_engine_opts o = {.n_threads = 2, .quiet = 1, .direct = 1, .no_predict = 1};
    jlm_engine *e;
    cr_assert_eq(jlm_engine_open(path, &o, &e, &err), 0, "%s", err.msg);
    greedy_after(e, prompt, 1, 4, ref, NULL, NULL);
    o.budget = text_and_experts(e, 8 * 2 + 3, 8 * 32);   /* 19 of the 256 expert pages (all one size) */
    jlm_engine_close(e);
    cr_assert_eq(jlm_engine_open(path, &o, &e, &err), 0, "%s", err.msg);
    cr_assert(e->warm_rank, "the background read does not rank the experts at 19 of 256 expert pages");
    uint32_t nv = jlm_engine_n_vocab(e);
    float *l = malloc(nv * sizeof *l);
    cr_assert(l);
    cr_assert_eq(jlm_engine_eval(e, prompt, 1, l, &err), 0, "%s", err.msg);
    jlm_pager_counters pc;
    jlm_pager_stats(jlm_engine_pager(e), &pc);
    uint32_t guessed = 0;
    for (uint32_t pg = 0; pg < 8 * 32; pg++)
        guessed += (e->warm_done[pg] & WARM_SEL) == 0 && jlm_pager_filled(jlm_engine_pager(e), JLM_PAGER_EXPERTS, pg);
    cr_assert_eq(pc.a[JLM_PAGER_EXPERTS].pf_unused, 0, "the prefill evicted %llu pages the background read took, "
                 "unused", (unsigned long long)pc.a[JLM_PAGER_EXPERTS].pf_unused);
    cr_assert(guessed > 0, "the background read guessed no expert into the 3 spare pages");
    for (int i = 0; i < 4; i++) {
        got[i] = jlm_samp_argmax(l, nv);
        cr_assert_eq(jlm_engine_eval(e, &got[i], 1, l, &err), 0, "%s", err.msg);
    }
    cr_assert_arr_eq(got, ref, sizeof ref, "ids under the budget differ from the unlimited run");
    tb_within_budget(e);
    free(l);
    jlm_engine_close(e);
    tu_rmrf(dir);
    free(dir);
}
