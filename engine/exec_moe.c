/* exec_moe.c - the executor's MOE op (engine/prog.h): the router, the
 * routed experts' pages through the streamer, and their mixture, one token
 * at a time (fused dispatches) or a batch grouped by expert. See
 * exec_int.h. */
#include "engine/exec_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* llama.cpp's build_moe_ffn with sigmoid gating: p = sigmoid(logits); the
 * experts are chosen by p + exp_probs_b (where the block has it), among the
 * NExpertGroupUsed groups whose two best biased scores sum highest; their
 * weights are the unbiased p, renormalised (sum clamped at 2^-14, unless
 * NoExpertNorm) and times ExpertScale. Ties: the lower index. */
static void route_sigmoid(const jlm_engine *e, uint32_t l, const float *lg, int32_t *sel, float *w)
{
    const jlm_config *c = e->c;
    uint32_t ne = c->n_expert, nu = c->n_expert_used, ng = c->n_expert_group;
    const float *bias = vec_dense(e, W(e, (int32_t)l, JLM_R_EXP_PROBS_B));
    float p[JLM_MAX_EXPERTS], sc[JLM_MAX_EXPERTS];
    for (uint32_t i = 0; i < ne; i++) {
        p[i] = 1.0f / (1.0f + expf(-lg[i]));
        sc[i] = bias ? p[i] + bias[i] : p[i];
    }
    if (ng > 1 && c->n_expert_group_used < ng) {
        uint32_t per = ne / ng;
        float gs[JLM_MAX_EXPERTS];
        uint8_t keep[JLM_MAX_EXPERTS] = {0};
        for (uint32_t g = 0; g < ng; g++) {   /* the sum of the group's two best */
            float a = -INFINITY, b = -INFINITY;
            for (uint32_t i = g * per; i < (g + 1) * per; i++) {
                if (sc[i] > a) { b = a; a = sc[i]; } else if (sc[i] > b) b = sc[i];
            }
            gs[g] = per > 1 ? a + b : a;
        }
        for (uint32_t k = 0; k < c->n_expert_group_used; k++) {
            int32_t best = -1;
            for (uint32_t g = 0; g < ng; g++)
                if (!keep[g] && (best < 0 || gs[g] > gs[best]))
                    best = (int32_t)g;
            keep[best] = 1;
        }
        for (uint32_t i = 0; i < ne; i++)
            if (!keep[i / per])
                sc[i] = -INFINITY;
    }
    uint8_t taken[JLM_MAX_EXPERTS] = {0};
    float sum = 0.0f;
    for (uint32_t s = 0; s < nu; s++) {
        int32_t best = -1;
        for (uint32_t i = 0; i < ne; i++)
            if (!taken[i] && (best < 0 || sc[i] > sc[best]))
                best = (int32_t)i;
        taken[best] = 1;
        sel[s] = best;
        w[s] = p[best];
        sum += w[s];
    }
    if (!(c->flags & JLM_F_NO_EXPERT_NORM))
        for (uint32_t s = 0; s < nu; s++)
            w[s] /= sum > 6.103515625e-5f ? sum : 6.103515625e-5f;
    if (c->expert_scale > 0)
        for (uint32_t s = 0; s < nu; s++)
            w[s] *= c->expert_scale;
}

/* One token's top-k from its router logits lg (bias added), by the op's
 * mode; h: the token's normed input, which JLM_ROUTE_SIGMOID_IN scales (h
 * NULL: only the factor returned). Device executors that route on the host
 * call it too (exec_int.h). */
float jlm_ex_route_pick(const jlm_engine *e, int mode, uint32_t l, float *lg, int32_t *sel, float *w, float *h)
{
    const jlm_config *c = e->c;
    if (mode == JLM_ROUTE_SIGMOID_IN) {   /* one expert (checked at open) */
        jlm_k_moe_route(lg, c->n_expert, 1, JLM_K_ROUTE_RAW, 0.0f, sel, w);   /* the top logit */
        float s = 1.0f / (1.0f + expf(-lg[sel[0]]));
        if (h)
            jlm_k_scale(h, h, s, c->n_embd);
        w[0] = 1.0f;
        return s;
    }
    if (mode == JLM_ROUTE_SIGMOID)
        route_sigmoid(e, l, lg, sel, w);
    else
        jlm_k_moe_route(lg, c->n_expert, c->n_expert_used, mode, c->expert_scale, sel, w);
    return 1.0f;
}

/* ---------------------------------------------------------------- reading ahead */
/* Block l's router (a float one), copied while its page is pinned, for the
 * predictions of the tokens after this one (jlm_stream_open sized them). */
void jlm_ex_router_keep(jlm_engine *e, uint32_t l, const uint8_t *page, uint64_t page_off)
{
    const jlm_tensor *t = W(e, l, JLM_R_ROUTER);
    if (!e->predict || e->pred_ok[l] || !t)
        return;
    memcpy(e->pred_buf + (uint64_t)l * e->rbytes, page + (t->qs_off - page_off), e->rbytes);
    e->pred_ok[l] = 1;
}

uint32_t jlm_ex_predict_block(const jlm_engine *e, uint32_t l)
{
    const jlm_config *c = e->c;
    uint32_t nl = l + 1;
    while (nl < c->n_layer && !W(e, nl, JLM_R_ROUTER))   /* dense blocks between (Llama 4) */
        nl++;
    return e->predict && nl < c->n_layer && e->pred_ok[nl] ? nl : c->n_layer;
}

uint32_t jlm_ex_predict_pick(jlm_engine *e, int route, uint32_t nl, float *lg, int32_t *sel)
{
    const jlm_config *c = e->c;
    float w[JLM_MAX_EXPERTS];
    add_bias(lg, vec_dense(e, W(e, nl, JLM_R_ROUTER_B)), c->n_expert);
    if (route == JLM_ROUTE_SIGMOID)
        route_sigmoid(e, nl, lg, sel, w);
    else
        jlm_k_moe_route(lg, c->n_expert, c->n_expert_used, JLM_K_ROUTE_RAW, 0.0f, sel, w);
    return bank_first(e, W(e, nl, JLM_R_EXP_GATE));
}

/* The next MoE block's experts from this block's normed input h (its router
 * applied early, as pre-gated MoE designs do), read while this block's
 * experts compute (jlm_ex_predict_pick). A hint only: the routing itself is
 * never changed by it. */
static void predict_next(jlm_engine *e, const jlm_op *op, uint32_t l, const float *h)
{
    uint32_t nl = e->dev_here ? e->c->n_layer : jlm_ex_predict_block(e, l);
    if (nl >= e->c->n_layer || !jlm_stream_predict_now(e))
        return;
    const jlm_tensor *t = W(e, nl, JLM_R_ROUTER);
    jlm_k_mat wr = mat_at(t, e->pred_buf + (uint64_t)nl * e->rbytes, t->qs_off, 0);
    int32_t sel[JLM_MAX_EXPERTS];
    jlm_ex_matmul(e, &wr, 1, h, e->mrl);
    jlm_stream_predict(e, jlm_ex_predict_pick(e, op->route, nl, e->mrl, sel), sel);
}

/* Top-k routing of one token (normed input h) as llama.cpp does it per
 * architecture; fills e->route for block l and e->route_w. */
static void route(jlm_engine *e, const jlm_op *op, uint32_t l, const uint8_t *page, uint64_t page_off,
                  float *h)
{
    const jlm_config *c = e->c;
    uint32_t ne = c->n_expert, nu = c->n_expert_used;
    unsigned long long t0 = prof_begin(e);
    jlm_ex_router_keep(e, l, page, page_off);
    jlm_k_mat wr = mat_at(W(e, l, JLM_R_ROUTER), page, page_off, 0);
    jlm_ex_matmul(e, &wr, 1, h, e->router);
    add_bias(e->router, vec_dense(e, W(e, l, JLM_R_ROUTER_B)), ne);
    jlm_ex_route_pick(e, op->route, l, e->router, e->route + (size_t)l * nu, e->route_w, (float *)h);
    jlm_stream_routed(e, l, op->route, e->router, e->route + (size_t)l * nu, 1);
    prof_end(e, JLM_PROF_ROUTE, t0);
}

/* --trace-routing: row t's choice in block l (model.h's line format). */
void jlm_ex_trace_route(const jlm_engine *e, uint32_t l, uint32_t t, const int32_t *sel)
{
    if (!e->rtrace)
        return;
    fprintf(e->rtrace, "%u %u", e->bpos[t], l);
    for (uint32_t s = 0; s < e->c->n_expert_used; s++)
        fprintf(e->rtrace, " %d", sel[s]);
    fputc('\n', e->rtrace);
}

int jlm_engine_trace_routing(jlm_engine *e, FILE *f, jlm_err *err)
{
    const jlm_config *c = e->c;
    if (f && !c->n_expert)
        return jlm_errf(err, JLM_EINVAL, "%s: no routed experts: no routing to trace", e->m->path);
    e->rtrace = f;
    if (!f)
        return JLM_OK;
    uint64_t sum = 0, n = 0, x;
    for (uint32_t i = 0; (x = jlm_pager_extent(e->pager, JLM_PAGER_EXPERTS, i)) != 0; i++, n++)
        sum += x;
    fprintf(f, "# jlm routing trace 1 n_layer %u n_expert %u n_used %u expert_bytes %llu\n", c->n_layer, c->n_expert,
            c->n_expert_used, (unsigned long long)(n ? sum / n : 0));
    return JLM_OK;
}

/* x += the mixture of nu expert outputs (slot s's row of E floats in outs:
 * row s, or row pos[s] where pos is given) weighted by w, summed from zero
 * into mix in slot order (jlm_k_moe_combine's sum): the fused decode step
 * and each row of a grouped batch. */
static void mix_slots(float *x, float *mix, const float *w, const float *outs, const uint32_t *pos, uint32_t nu,
                      uint32_t E)
{
    memset(mix, 0, E * sizeof(float));
    for (uint32_t s = 0; s < nu; s++)
        jlm_k_axpy(mix, w[s], outs + (uint64_t)(pos ? pos[s] : s) * E, E);
    jlm_k_add(x, x, mix, E);
}

/* One token's routed experts in two pool dispatches instead of two (or
 * three, with biases) per expert: gate, up, their biases and the activation
 * of every expert in one, split over the experts' rows end to end; the downs
 * of every expert in another. A decode step of a model with many small
 * experts (Qwen3-MoE: 8 of 128 a layer, 768 rows each) paid a barrier for
 * each. Each row is still one kernel call over the same int8 input row, the
 * biases are added and the activation applied per element on runs that start
 * at multiples of 64 rows (the kernels' vector alignment, as jlm_ex_gate_up_act's
 * slices), and each expert's down reads its own quantized row: the outputs
 * are the per-expert path's bit for bit. */
#define MOE_FUSE_MAX 16
typedef struct moe_job {
    const jlm_k_cpu *k;
    int      act;
    uint32_t nu;
    uint64_t rows;                 /* of each expert's matrices in this dispatch */
    mm_job   a[MOE_FUSE_MAX], b[MOE_FUSE_MAX];   /* gate, up (b unused for downs) */
    const float *ba[MOE_FUSE_MAX], *bb[MOE_FUSE_MAX];   /* their bias rows, or NULL */
    int      gate_up;
} moe_job;

/* Rows [b, en) of the experts' matrices end to end: each expert's slice of
 * its rows over every input row of its job (a[s].n), then (gate_up) the
 * biases and the activation of that slice, or (downs) the bias. */
static void moe_slice(void *ctx, size_t b, size_t en, int tid)
{
    moe_job *j = ctx;
    for (uint32_t s = 0; s < j->nu; s++) {
        uint64_t lo = (uint64_t)s * j->rows, hi = lo + j->rows;
        if (en <= lo || b >= hi)
            continue;
        uint64_t r0 = b > lo ? b - lo : 0, r1 = (en < hi ? en : hi) - lo;
        jlm_ex_mm_slice(&j->a[s], r0, r1, tid);
        if (j->gate_up)
            jlm_ex_mm_slice(&j->b[s], r0, r1, tid);
        for (uint64_t t = 0; t < j->a[s].n; t++) {
            float *g = j->a[s].y + t * j->rows + r0;
            if (j->ba[s]) add_bias(g, j->ba[s] + r0, r1 - r0);
            if (!j->gate_up)
                continue;
            float *u = j->b[s].y + t * j->rows + r0;
            if (j->bb[s]) add_bias(u, j->bb[s] + r0, r1 - r0);
            jlm_ex_activate(j->k, j->act, g, u, r1 - r0);
        }
    }
}

/* One dispatch of the job's experts (n: 1 for a token's, else a batch's
 * rows: pieces claimed, jlm_ex_mm_dispatch). Slices start at multiples of 64
 * rows (the kernels' vector alignment, as jlm_ex_gate_up_act's) or are
 * whole experts. */
static void moe_dispatch(jlm_engine *e, moe_job *j, uint32_t n)
{
    unsigned long long t0 = prof_begin(e);
    size_t grain = j->rows >= 256 && j->rows % 64 == 0 ? 64 : j->rows;
    jlm_ex_mm_dispatch(e, n, (size_t)j->nu * j->rows, grain, moe_slice, j);
    prof_end(e, JLM_PROF_MATMUL, t0);
}

/* An expert's three matrices, kept while its jobs run. */
typedef struct moe_mats { jlm_k_mat g, u, d; } moe_mats;

/* Job i of gu and dn: expert x of block l (its page frame, the bank's page
 * first) over m input rows at in, its gate and up rows into e->g and e->u
 * from row gr, its down's rows into out, with the block's expert biases;
 * *w keeps its matrices. Returns bit 0: its gate or up reads int8 input
 * rows; bit 1: its down does. */
static int moe_expert_jobs(jlm_engine *e, uint32_t l, const void *frame, uint32_t first, uint32_t x, uint64_t m,
                           const float *in, uint64_t gr, float *out, moe_mats *w, moe_job *gu, moe_job *dn, uint32_t i)
{
    const jlm_tensor *tg = W(e, l, JLM_R_EXP_GATE);
    const float *bg = vec_dense(e, W(e, l, JLM_R_EXP_GATE_B)), *bu = vec_dense(e, W(e, l, JLM_R_EXP_UP_B));
    const float *bd = vec_dense(e, W(e, l, JLM_R_EXP_DOWN_B));
    uint64_t nff = jlm_tensor_rows(tg), E = e->c->n_embd;
    w->g = mat_expert(e, tg, frame, first, x);
    w->u = mat_expert(e, W(e, l, JLM_R_EXP_UP), frame, first, x);
    w->d = mat_expert(e, W(e, l, JLM_R_EXP_DOWN), frame, first, x);
    gu->a[i] = (mm_job){e->k->matvec[w->g.type], e->k->matmul[w->g.type], &w->g, m, in, NULL, e->g + gr * nff};
    gu->b[i] = (mm_job){e->k->matvec[w->u.type], e->k->matmul[w->u.type], &w->u, m, in, NULL, e->u + gr * nff};
    gu->ba[i] = bg ? bg + (uint64_t)x * nff : NULL;
    gu->bb[i] = bu ? bu + (uint64_t)x * nff : NULL;
    dn->a[i] = (mm_job){e->k->matvec[w->d.type], e->k->matmul[w->d.type], &w->d, m, e->g + gr * nff, NULL, out};
    dn->ba[i] = bd ? bd + (uint64_t)x * E : NULL;
    return (!jlm_fmt_type_traits(w->g.type)->is_float || !jlm_fmt_type_traits(w->u.type)->is_float) |
           !jlm_fmt_type_traits(w->d.type)->is_float << 1;
}

/* The job reads the int8 rows from xq where its matrix is quantized. */
static void job_xq(mm_job *j, const jlm_act_q8 *xq)
{
    j->xq = jlm_fmt_type_traits(j->m->type)->is_float ? NULL : xq;
}

/* The experts of one token (input h) whose frames are frames[s]: e->o row s
 * = expert sel[s]'s output. */
static void moe_experts_fused(jlm_engine *e, const jlm_op *op, uint32_t l, const void *const *frames, uint32_t first,
                              const int32_t *sel, const float *h, const uint8_t *only)
{
    uint32_t nu = e->c->n_expert_used, E = e->c->n_embd, m = 0, at[MOE_FUSE_MAX];
    uint64_t nff = jlm_tensor_rows(W(e, l, JLM_R_EXP_GATE));
    moe_mats w[MOE_FUSE_MAX];
    int q = 0;
    for (uint32_t s = 0; s < nu; s++)
        if (!only || only[s])
            at[m++] = s;   /* job i computes slot at[i]: its rows of g, u and o */
    moe_job gu = {.k = e->k, .act = op->act, .nu = m, .rows = nff, .gate_up = 1}, dn = {.nu = m, .rows = E};
    for (uint32_t i = 0; i < m; i++)
        q |= moe_expert_jobs(e, l, frames[at[i]], first, (uint32_t)sel[at[i]], 1, h, at[i],
                             e->o + (uint64_t)at[i] * E, &w[i], &gu, &dn, i);
    if (!m)
        return;
    if (q & 1) {   /* h's int8 row, shared by every expert's gate and up */
        jlm_ex_quant_rows(e, h, E, 1);
        for (uint32_t i = 0; i < m; i++) {
            job_xq(&gu.a[i], e->xq);
            job_xq(&gu.b[i], e->xq);
        }
    }
    moe_dispatch(e, &gu, 1);
    if (q & 2) {   /* row s of xq: slot s's activation (every slot's row: quantizing is per row) */
        jlm_ex_quant_rows(e, e->g, nff, nu);
        for (uint32_t i = 0; i < m; i++)
            job_xq(&dn.a[i], &e->xq[at[i]]);
    }
    moe_dispatch(e, &dn, 1);
    e->xq_of = NULL;
}

/* x += the routed experts' mixture for one token (row t). Pages in every
 * routed expert first: the minimum working set counts them all. */
static int moe_token(jlm_engine *e, const jlm_op *op, uint32_t l, const uint8_t *page, uint64_t page_off, uint32_t t,
                     int ahead, jlm_err *err)
{
    const jlm_config *c = e->c;
    uint32_t nu = c->n_expert_used, E = c->n_embd;
    float *h = e->h + t * E, *x = e->x + t * E;
    route(e, op, l, page, page_off, h);   /* h: the MOE op's normed input */
    jlm_ex_trace_route(e, l, t, e->route + (size_t)l * nu);
    const jlm_tensor *tg = W(e, l, JLM_R_EXP_GATE), *tu = W(e, l, JLM_R_EXP_UP), *td = W(e, l, JLM_R_EXP_DOWN);
    const float *bg = vec_dense(e, W(e, l, JLM_R_EXP_GATE_B)), *bu = vec_dense(e, W(e, l, JLM_R_EXP_UP_B));
    const float *bd = vec_dense(e, W(e, l, JLM_R_EXP_DOWN_B));
    uint32_t first = bank_first(e, tg);
    const int32_t *sel = e->route + (size_t)l * nu;
    const void *frames[JLM_MAX_EXPERTS_USED];
    uint8_t ready[JLM_MAX_EXPERTS_USED], rest[JLM_MAX_EXPERTS_USED];
    int fused = !e->dev_here && !e->moe_rows && nu <= MOE_FUSE_MAX && nu <= e->nb;
    int rc = fused ? jlm_stream_experts_begin(e, first, sel, nu, frames, ready, err)
                   : jlm_stream_experts(e, first, sel, nu, frames, err);
    if (!rc && ahead)
        predict_next(e, op, l, h);
    if (!rc && fused) {
        /* the resident experts compute while the others are read, then the
         * others: each expert's output is the same (its own rows), and the
         * mixture sums them in slot order as one dispatch would */
        uint32_t nr = 0;
        for (uint32_t s = 0; s < nu; s++) {
            nr += ready[s];
            rest[s] = !ready[s];
        }
        if (nr && nr < nu)
            moe_experts_fused(e, op, l, frames, first, sel, h, ready);
        if (nr < nu && (rc = jlm_stream_experts_end(e, first, sel, nu, frames, ready, err)))
            return rc;
        moe_experts_fused(e, op, l, frames, first, sel, h, nr && nr < nu ? rest : NULL);
        mix_slots(x, e->moe, e->route_w, e->o, NULL, nu, E);
    } else if (!rc) {
        memset(e->moe, 0, E * sizeof(float));
        uint64_t nff = jlm_tensor_rows(tg);
        for (uint32_t s = 0; s < nu; s++) {
            uint32_t xe = (uint32_t)sel[s];
            jlm_k_mat wg = mat_expert(e, tg, frames[s], first, xe), wu = mat_expert(e, tu, frames[s], first, xe);
            jlm_k_mat wd = mat_expert(e, td, frames[s], first, xe);
            if (!bg && !bu && !e->dev_here) {
                jlm_ex_gate_up_act(e, op->act, &wg, &wu, 1, h);   /* one dispatch (see jlm_ex_matmul_multi) */
            } else {
                jlm_ex_matmul(e, &wg, 1, h, e->g);
                jlm_ex_matmul(e, &wu, 1, h, e->u);
                if (bg) add_bias(e->g, bg + (uint64_t)xe * nff, nff);
                if (bu) add_bias(e->u, bu + (uint64_t)xe * nff, nff);
                jlm_ex_activate(e->k, op->act, e->g, e->u, nff);
            }
            jlm_ex_matmul(e, &wd, 1, e->g, e->o);
            if (bd) add_bias(e->o, bd + (uint64_t)xe * E, E);
            jlm_k_axpy(e->moe, e->route_w[s], e->o, E);   /* jlm_k_moe_combine's sum, one expert at a time */
        }
        jlm_k_add(x, x, e->moe, E);
    }
    if (!rc)
        jlm_stream_experts_done(e, first, sel, nu);
    return rc;
}

/* moe_batch's routing: the router's logits of every row in one matmul (its
 * rows are each row's matvec, the kernels' invariant), then each row's bias
 * and top-k as route() (per row, over the pool). The last row's selection
 * stays in e->route, as moe_token leaves it. */
typedef struct route_ctx { uint32_t l; int mode; } route_ctx;
static void route_row(jlm_engine *e, void *ctx, uint32_t t)
{
    const jlm_config *c = e->c;
    const route_ctx *r = ctx;
    uint32_t ne = c->n_expert, nu = c->n_expert_used;
    float *lg = e->mrl + (uint64_t)t * ne;
    add_bias(lg, vec_dense(e, W(e, r->l, JLM_R_ROUTER_B)), ne);
    jlm_ex_route_pick(e, r->mode, r->l, lg, e->msel + (size_t)t * nu, e->mw + (size_t)t * nu, e->h + (uint64_t)t * c->n_embd);
}

static void route_rows(jlm_engine *e, const jlm_op *op, uint32_t l, const uint8_t *page, uint64_t page_off, uint32_t n)
{
    uint32_t nu = e->c->n_expert_used;
    unsigned long long t0 = prof_begin(e);
    jlm_ex_router_keep(e, l, page, page_off);
    jlm_k_mat wr = mat_at(W(e, l, JLM_R_ROUTER), page, page_off, 0);
    jlm_ex_matmul(e, &wr, n, e->h, e->mrl);
    route_ctx rc = {l, op->route};
    jlm_ex_for_rows(e, n, route_row, &rc);
    jlm_stream_routed(e, l, op->route, e->mrl, e->msel, n);
    for (uint32_t t = 0; e->rtrace && t < n; t++)
        jlm_ex_trace_route(e, l, t, e->msel + (size_t)t * nu);
    memcpy(e->route + (size_t)l * nu, e->msel + (size_t)(n - 1) * nu, nu * sizeof(int32_t));
    prof_end(e, JLM_PROF_ROUTE, t0);
}

/* Row t's mixture (mix_slots) into its h row (read no more), then onto x:
 * its (row, slot) outputs at their positions in mo. */
static void mix_row(jlm_engine *e, void *ctx, uint32_t t)
{
    uint32_t nu = e->c->n_expert_used, E = e->c->n_embd;
    mix_slots(e->x + (uint64_t)t * E, e->h + (uint64_t)t * E, e->mw + (uint64_t)t * nu, e->mo,
              e->mpos + (uint64_t)t * nu, nu, E);
}

/* moe_batch's (row, slot) pairs grouped by expert, rows ascending within
 * an expert: mord (position -> pair), mcnt (each expert's first position,
 * mcnt[n_expert] the end) and mpos (pair -> position). Expert x's rows are
 * positions [mcnt[x], mcnt[x + 1]), and so are its output rows in mo. */
static void group_pairs(jlm_engine *e, uint32_t n)
{
    uint32_t nu = e->c->n_expert_used, ne = e->c->n_expert;
    memset(e->mcnt, 0, (ne + 1) * sizeof *e->mcnt);
    for (uint32_t i = 0; i < n * nu; i++)
        e->mcnt[e->msel[i] + 1]++;
    for (uint32_t x = 0; x < ne; x++)
        e->mcnt[x + 1] += e->mcnt[x];
    for (uint32_t i = 0; i < n * nu; i++) {
        e->mpos[i] = e->mcnt[e->msel[i]]++;
        e->mord[e->mpos[i]] = i;
    }
    for (uint32_t x = ne; x > 0; x--)   /* back to group starts */
        e->mcnt[x] = e->mcnt[x - 1];
    e->mcnt[0] = 0;
}

/* moe_batch, while a group computes: up to k experts of the next groups
 * (from expert x on, those with rows), for the streamer to read ahead (a
 * batch whose experts are not resident, a first prompt or a budget, reads
 * them while the group before computes). */
static void experts_ahead(jlm_engine *e, uint32_t first, uint32_t x, uint32_t k)
{
    for (; x < e->c->n_expert && k; x++)
        if (e->mcnt[x + 1] > e->mcnt[x]) {
            jlm_stream_expert_next(e, first + x);
            k--;
        }
}

/* Row i of a group whose rows start at position p0: its input row gathered
 * from h into mh and (quant) its int8 row into xq[i], as quant_row makes it. */
typedef struct moe_rows { uint32_t p0, x; int quant; const float *bd; } moe_rows;
static void gather_row(jlm_engine *e, void *ctx, uint32_t i)
{
    const moe_rows *r = ctx;
    uint32_t E = e->c->n_embd;
    float *mh = e->mh + (uint64_t)i * E;
    memcpy(mh, e->h + (uint64_t)(e->mord[r->p0 + i] / e->c->n_expert_used) * E, E * sizeof(float));
    if (r->quant) {
        e->xq[i].k = E;
        e->k->quantize_act(mh, &e->xq[i]);
    }
}

/* The CPU's group: experts xs[0..ng) (consecutive among the batch's experts
 * with rows, their rows R <= the batch's n, pinned as frames[i]) in four
 * dispatches, not four or more per expert: the rows gathered (and
 * quantized), every expert's gate, up, biases and activation in one (the
 * experts' rows end to end, moe_slice), the activations' int8 rows, every
 * down (and its bias) in one, writing each expert's output rows where mo
 * keeps them. A batch of 128 rows over 32 experts had ~16-row matmuls split
 * by weight rows, one barrier each; the threads now claim pieces of a
 * group's experts together. Each (row, expert) output is still the kernel's
 * row over the same int8 input row (the invariant), with the same bias and
 * activation per element: the per-expert path's result bit for bit. */
static void moe_group(jlm_engine *e, const jlm_op *op, uint32_t l, uint32_t first, const int32_t *xs, uint32_t ng,
                      const void *const *frames)
{
    uint32_t E = e->c->n_embd, p0 = e->mcnt[xs[0]], R = e->mcnt[xs[ng - 1] + 1] - p0, at[MOE_FUSE_MAX];
    uint64_t nff = jlm_tensor_rows(W(e, l, JLM_R_EXP_GATE));
    moe_mats w[MOE_FUSE_MAX];
    moe_job gu = {.k = e->k, .act = op->act, .nu = ng, .rows = nff, .gate_up = 1}, dn = {.nu = ng, .rows = E};
    int q = 0;
    for (uint32_t i = 0; i < ng; i++) {
        uint32_t x = (uint32_t)xs[i];
        at[i] = e->mcnt[x] - p0;
        q |= moe_expert_jobs(e, l, frames[i], first, x, e->mcnt[x + 1] - e->mcnt[x], e->mh + (uint64_t)at[i] * E,
                             at[i], e->mo + (uint64_t)(p0 + at[i]) * E, &w[i], &gu, &dn, i);
    }
    moe_rows mr = {.p0 = p0, .quant = q & 1};
    jlm_ex_for_rows(e, R, gather_row, &mr);
    for (uint32_t i = 0; (q & 1) && i < ng; i++) {
        job_xq(&gu.a[i], &e->xq[at[i]]);
        job_xq(&gu.b[i], &e->xq[at[i]]);
    }
    moe_dispatch(e, &gu, R);
    if (q & 2) {
        jlm_ex_quant_rows(e, e->g, nff, R);
        for (uint32_t i = 0; i < ng; i++)
            job_xq(&dn.a[i], &e->xq[at[i]]);
    }
    moe_dispatch(e, &dn, R);
}

/* Row i of expert x's output rows (from position p0): its down bias. */
static void bias_row(jlm_engine *e, void *ctx, uint32_t i)
{
    const moe_rows *r = ctx;
    uint32_t E = e->c->n_embd;
    add_bias(e->mo + (uint64_t)(r->p0 + i) * E, r->bd + (uint64_t)r->x * E, E);
}

/* The block's device: expert x alone (its frame pinned), its gate and up in
 * one round trip, its down written where mo keeps its output rows. */
static void moe_expert_dev(jlm_engine *e, const jlm_op *op, uint32_t l, uint32_t first, uint32_t x, const void *frame)
{
    uint32_t E = e->c->n_embd, p0 = e->mcnt[x], m = e->mcnt[x + 1] - p0;
    const jlm_tensor *tg = W(e, l, JLM_R_EXP_GATE), *tu = W(e, l, JLM_R_EXP_UP), *td = W(e, l, JLM_R_EXP_DOWN);
    const float *bg = vec_dense(e, W(e, l, JLM_R_EXP_GATE_B)), *bu = vec_dense(e, W(e, l, JLM_R_EXP_UP_B));
    const float *bd = vec_dense(e, W(e, l, JLM_R_EXP_DOWN_B));
    uint64_t nff = jlm_tensor_rows(tg);
    moe_rows mr = {p0, x, 0, bd};
    jlm_ex_for_rows(e, m, gather_row, &mr);
    jlm_k_mat wg = mat_expert(e, tg, frame, first, x), wu = mat_expert(e, tu, frame, first, x);
    jlm_k_mat wd = mat_expert(e, td, frame, first, x);
    const jlm_k_mat *ms[2] = {&wg, &wu};
    float *ys[2] = {e->g, e->u};
    jlm_ex_matmul_multi(e, ms, ys, 2, m, e->mh);   /* one round trip */
    for (uint32_t i = 0; i < m; i++) {
        float *g = e->g + i * nff, *u = e->u + i * nff;
        if (bg) add_bias(g, bg + (uint64_t)x * nff, nff);
        if (bu) add_bias(u, bu + (uint64_t)x * nff, nff);
        jlm_ex_activate(e->k, op->act, g, u, nff);
    }
    jlm_ex_matmul(e, &wd, m, e->g, e->mo + (uint64_t)p0 * E);
    if (bd)
        jlm_ex_for_rows(e, m, bias_row, &mr);
}

/* Rows [0, n) of the batch (n >= 2; the CPU or the block's device): x[t] += the routed experts'
 * mixture, as moe_token gives it row by row, with each routed expert's
 * weights read once for all the rows routed to it (one matmul of those rows)
 * instead of once per row: a prefill batch of 128 rows routed to 4 of 32
 * experts streams each expert once, not ~16 times. The same result bit for
 * bit: the routing is moe_token's per row (route_rows); every (row, expert) output is the
 * matmul's row for that input row, which is the matvec's (the kernels'
 * invariant, docs/kernels.md), with the biases added and the activation
 * applied per row as moe_token does; and each row's mixture is summed from
 * zero in its own slot order before it is added to x. On the CPU the
 * experts go in groups of up to n_expert_used pinned together (the minimum
 * working set counts that many) whose rows fit the batch's scratch
 * (moe_group); on a device one at a time. */
static int moe_batch(jlm_engine *e, const jlm_op *op, uint32_t l, const uint8_t *page, uint64_t page_off, uint32_t n, jlm_err *err)
{
    const jlm_config *c = e->c;
    const jlm_tensor *tg = W(e, l, JLM_R_EXP_GATE);
    uint32_t nu = c->n_expert_used, ne = c->n_expert;
    uint32_t first = bank_first(e, tg);
    uint32_t gmax = e->dev_here ? 1 : nu < MOE_FUSE_MAX ? nu : MOE_FUSE_MAX;
    route_rows(e, op, l, page, page_off, n);   /* h: the MOE op's normed input */
    group_pairs(e, n);
    for (uint32_t x = 0; x < ne;) {
        int32_t xs[MOE_FUSE_MAX];
        uint32_t ng = 0, p0 = e->mcnt[x];
        for (; x < ne && ng < gmax; x++) {
            if (e->mcnt[x + 1] == e->mcnt[x])
                continue;
            if (ng && e->mcnt[x + 1] - p0 > n)
                break;
            xs[ng++] = (int32_t)x;
        }
        if (!ng)
            break;
        const void *frames[MOE_FUSE_MAX];
        int rc = jlm_stream_experts(e, first, xs, ng, frames, err);
        if (rc)
            return rc;
        experts_ahead(e, first, x, gmax);
        if (e->dev_here)
            moe_expert_dev(e, op, l, first, (uint32_t)xs[0], frames[0]);
        else
            moe_group(e, op, l, first, xs, ng, frames);
        jlm_stream_experts_done(e, first, xs, ng);
    }
    jlm_ex_for_rows(e, n, mix_row, NULL);
    e->xq_of = NULL;
    return JLM_OK;
}


/* x += the routed experts' mixture of every row (h: their normed inputs):
 * grouped by expert for a batch (moe_batch), row by row for one token
 * (moe_token, which fuses its experts' dispatches on the CPU). */
int jlm_ex_moe(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b, jlm_err *err)
{
    int rc = JLM_OK;
    if (b->n > 1 && !e->moe_rows)
        return moe_batch(e, op, b->l, b->page, b->page_off, b->n, err);
    for (uint32_t t = 0; t < b->n && !rc; t++)
        rc = moe_token(e, op, b->l, b->page, b->page_off, t, b->n == 1, err);
    return rc;
}
