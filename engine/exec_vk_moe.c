/* exec_vk_moe.c - a block program's MOE op on the Vulkan device, recorded
 * with the rest of its block (engine/exec_vk.c; docs/vulkan.md, "Routed
 * experts on the device").
 *
 * The router's matvec and its bias run on the device for all the block's
 * rows (a dispatch each), and so does the top-k of softmax routing
 * (moe_route.comp, a workgroup a row); then the
 * recording ends and the picks come down (n_expert_used int32 a row: the one
 * round trip of a MoE block, counted in the activations down). Sigmoid
 * routing (glm4moe, Llama 4) brings the logits down instead (n_expert floats
 * a row, in the same round trip) and routes on the host with the CPU's own
 * jlm_ex_route_pick (sigmoid, the selection bias, groups, norm, scale: the
 * CPU's code on the device's logits, the CPU's own bit for bit where the
 * router is quantized; a float router's may differ in last bits), writing
 * the weights where the combine reads them (counted up); Llama 4's gate
 * scales the routed expert's input on the device (jlm_vk_scale, after the
 * shared expert has read it, as the CPU scales h in place). The chosen
 * experts' pages are acquired through the streamer as the CPU's path
 * acquires them (jlm_stream_experts: host pages, their reads, then their
 * device frames), and a decoded token's experts are recorded: gate and up
 * over the row's int8 rows (quantized once), biases, SwiGLU (or
 * SwiGLU-OAI), down, the down bias, and the weighted mix added to the
 * residual row (moe_combine.comp, the sum of mix_slots/jlm_k_moe_combine
 * bit for bit). A prefill's are grouped by expert (exec_dev.c's
 * jlm_exd_moe_group and jlm_exd_moe_each, the CPU's moe_batch order): the
 * rows gathered by one copy, each used expert's page acquired in turn and
 * its rows through one matmul a matrix, the outputs put back by row, every
 * row's mix in one dispatch.
 * A decode step predicts the next MoE block's experts on the device too
 * (its router over this input, its top-k or, with sigmoid routing, its
 * logits read back with the picks) and hands them to the streamer, as
 * exec_moe.c's predict_next does on the host (Llama 4's from the input
 * before its scale: a hint). What the shaders lack (GELU gates, more than
 * 1024 experts) is JLM_EUNSUPPORTED in the dry run, so the block stays on
 * the host. */
#include "engine/backend_vk_int.h"
#include "engine/exec_dev.h"
#include "engine/exec_int.h"

#include <stdlib.h>
#include <string.h>

#define UNSUP JLM_EUNSUPPORTED

/* The device buffers of the MOE op (rows: of the block being run). */
typedef struct jlm_evk_moebufs {
    jlm_vk_buf *lg;       /* (rows, n_expert) the router's logits, host-visible: sigmoid routing reads them */
    jlm_vk_buf *sel;      /* (rows, n_used) int32 picks, host-visible: they come down */
    jlm_vk_buf *w;        /* (rows, n_used) their weights, host-visible: sigmoid routing writes them */
    jlm_vk_buf *g, *u;    /* (rows * n_used, nff) each pair's gate (then the activation) and up */
    jlm_vk_buf *o;        /* (rows * n_used, n_embd) each pair's output */
    jlm_vk_buf *mh;       /* (rows * n_used, n_embd) a batch's input rows by expert, then its outputs by row */
    jlm_vk_buf **pr;      /* (n_layer,) each block's router for the predictions, NULL until used */
    uint32_t    n_layer;
} moebufs;

void jlm_evk_moe_free(jlm_evk *v)
{
    moebufs *m = v->moe;
    if (!m)
        return;
    jlm_vk_buf *all[] = {m->lg, m->sel, m->w, m->g, m->u, m->o, m->mh};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        jlm_vk_buf_free(v->vk, all[i]);
    for (uint32_t l = 0; m->pr && l < m->n_layer; l++)
        jlm_vk_buf_free(v->vk, m->pr[l]);
    free(m->pr);
    free(m);
    v->moe = NULL;
}

static uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

/* Whether a bank of k-float rows (its shape checked: jlm_exd_moe_plan) has
 * quantized types' int8 rows at offsets the device can bind (matmul_rows's
 * own test). */
static int bank_ok(const jlm_evk *v, const jlm_tensor *t, uint64_t k)
{
    return jlm_fmt_type_traits(t->type)->is_float ||
           (jlm_vk_can_quantize(v->vk) && (k / 8) % jlm_vk_offset_align(v->vk) == 0);
}

/* One MoE block's operands (jlm_exd_moe), checked (plan) before anything
 * is recorded. */
typedef struct moe_blk {
    jlm_exd_moe       p;
    jlm_evk          *v;
    uint64_t          lp, sp;           /* the prediction's row of logits, of picks/weights (aligned bytes) */
    int               host;             /* sigmoid routing: the logits come down, the host picks */
    uint32_t          nl, nl_first;     /* the next MoE block predicted (n_layer: none), its bank's first page */
    jlm_vk_view       rb, bg, bu, bd;   /* the router's and the banks' biases (buf NULL: none) */
    jlm_vk_view       nrb;              /* the predicted block's router bias */
} moe_blk;

/* jlm_exd_moe_plan's JLM_MAX_EXPERTS bounds moe_route.comp's 1024 experts */
_Static_assert(JLM_MAX_EXPERTS <= 1024, "moe_route.comp routes at most 1024 experts");

static int plan(moe_blk *mb)
{
    jlm_evk *v = mb->v;
    jlm_exd_moe *p = &mb->p;
    jlm_engine *e = p->e;
    const jlm_config *c = e->c;
    const jlm_ex_blk *b = p->b;
    const jlm_op *op = p->op;
    uint64_t al = jlm_vk_offset_align(v->vk);
    jlm_vk_view *dev[4] = {&mb->rb, &mb->bg, &mb->bu, &mb->bd};
    mb->host = op->route == JLM_ROUTE_SIGMOID || op->route == JLM_ROUTE_SIGMOID_IN;
    if (op->route > JLM_K_ROUTE_OAI && !mb->host)
        return UNSUP;   /* no shader path */
    if (!bank_ok(v, p->tg, p->E) || !bank_ok(v, p->tu, p->E) || !bank_ok(v, p->td, p->nff) || (p->nff * 4) % al ||
        (p->E * 4) % al)
        return UNSUP;
    jlm_k_mat wr = blk_mat(e, b, op->w[0]);
    if (jlm_evk_matmul_rows(v, &wr, 1, (jlm_vk_view){0}, (jlm_vk_view){0}, 0, 1, NULL))
        return UNSUP;
    for (int i = 0; i < 4; i++)
        if (jlm_evk_vec(v, p->bias[i], p->bias_n[i], dev[i]))
            return UNSUP;
    mb->lp = round_up((uint64_t)b->n * p->ne * 4, al);   /* the rows packed, the prediction's aligned after */
    mb->sp = round_up((uint64_t)b->n * p->nu * 4, al);
    /* a decode step predicts the next MoE block's experts as the CPU's
     * predict_next does (its router over this block's input), once the host
     * keeps that router (e->pred_buf: float routers only) */
    mb->nl = jlm_ex_predict_block(e, b->l);
    const jlm_tensor *tn = mb->nl < c->n_layer ? W(e, mb->nl, JLM_R_ROUTER) : NULL;
    if (b->n != 1 || !tn || jlm_tensor_k(tn) != p->E ||
        jlm_tensor_rows(tn) != p->ne || !jlm_fmt_type_traits(tn->type)->is_float ||
        jlm_evk_vec(v, vec_dense(e, W(e, mb->nl, JLM_R_ROUTER_B)), p->ne, &mb->nrb))
        mb->nl = c->n_layer;
    else
        mb->nl_first = bank_first(e, W(e, mb->nl, JLM_R_EXP_GATE));
    return JLM_OK;
}

/* The buffers for n rows, and the int8 rows (exec_vk.c's) for an input of
 * nff floats; a buffer that grows ends the recording first (grow). */
static int moe_buffers(moe_blk *mb, uint32_t n)
{
    jlm_evk *v = mb->v;
    jlm_err *err = mb->p.err;
    if (!v->moe && !(v->moe = calloc(1, sizeof *v->moe)))
        return jlm_errf(err, JLM_ENOMEM, "vulkan: out of memory");
    moebufs *m = v->moe;
    uint64_t kmax = (mb->p.nff > mb->p.E ? mb->p.nff : mb->p.E) * n, np = (uint64_t)n * mb->p.nu;
    int rc = jlm_evk_grow(v, &m->lg, mb->lp + mb->p.ne * 4ull, 1, err);   /* + the prediction's row */
    if (!rc)
        rc = jlm_evk_grow(v, &m->sel, mb->sp + mb->p.nu * 4ull, 1, err);
    if (!rc)
        rc = jlm_evk_grow(v, &m->w, mb->sp + mb->p.nu * 4ull, 1, err);
    if (!rc && !m->pr) {
        m->n_layer = mb->p.e->c->n_layer;
        if (!(m->pr = calloc(m->n_layer, sizeof *m->pr)))
            rc = jlm_errf(err, JLM_ENOMEM, "vulkan: out of memory");
    }
    if (!rc)
        rc = jlm_evk_grow(v, &m->g, np * mb->p.nff * 4, 0, err);
    if (!rc)
        rc = jlm_evk_grow(v, &m->u, np * mb->p.nff * 4, 0, err);
    if (!rc)
        rc = jlm_evk_grow(v, &m->o, np * mb->p.E * 4, 0, err);
    if (!rc && n > 1)
        rc = jlm_evk_grow(v, &m->mh, np * mb->p.E * 4, 0, err);
    if (!rc)
        rc = jlm_evk_grow(v, &v->blk.aq, kmax, 0, err);
    if (!rc)
        rc = jlm_evk_grow(v, &v->blk.ad, kmax / 8, 0, err);
    if (!rc)
        rc = jlm_evk_grow(v, &v->blk.as, kmax / 8, 0, err);
    return rc;
}

static jlm_vk_view row_of(jlm_vk_buf *b, uint64_t t, uint64_t n) { return (jlm_vk_view){b, t * n * 4, n * 4}; }

/* The next MoE block's top-k by logit of row 0's input into row n of the
 * picks (its router: the host's copy, uploaded once, counted as weights);
 * with sigmoid routing only its logits, the prediction's row of lg (host_route picks). */
static int predict_rec(moe_blk *mb)
{
    jlm_evk *v = mb->v;
    jlm_engine *e = mb->p.e;
    moebufs *m = v->moe;
    const jlm_tensor *tn = W(e, mb->nl, JLM_R_ROUTER);
    int rc = JLM_OK;
    if (!m->pr[mb->nl]) {
        rc = jlm_vk_buf_upload(v->vk, e->pred_buf + (uint64_t)mb->nl * e->rbytes, e->rbytes, &m->pr[mb->nl], mb->p.err);
        v->st.bytes_up += rc ? 0 : e->rbytes;
    }
    jlm_vk_mat vm = {tn->type, mb->p.E, mb->p.ne, {m->pr[mb->nl], 0, 0}, {0}, {0}};
    jlm_vk_view lg = {m->lg, mb->lp, mb->p.ne * 4ull};
    if (!rc)
        rc = jlm_vk_matvec(v->vk, &vm, row_of(v->blk.ab[JLM_B_H], 0, mb->p.E), NULL, lg, mb->p.err);
    if (!rc && mb->nrb.buf)
        rc = jlm_vk_eltwise(v->vk, JLM_VK_ADD, lg, lg, mb->nrb, mb->p.ne, mb->p.err);
    return rc || mb->host ? rc
              : jlm_vk_moe_route(v->vk, lg, mb->p.ne, mb->p.nu, JLM_K_ROUTE_RAW, 0.0f,
                                 (jlm_vk_view){m->sel, mb->sp, mb->p.nu * 4ull},
                                 (jlm_vk_view){m->w, mb->sp, mb->p.nu * 4ull}, mb->p.err);
}

/* Sigmoid routing on the host, from the logits that came down (rows of
 * lg): each row's picks and weights by the CPU's own routing
 * (jlm_ex_route_pick: sigmoid, the selection bias, groups, norm, scale), its
 * weights written where moe_combine.comp reads them, Llama 4's input scale
 * kept for row_experts; the prediction's row (rows > n) as predict_next
 * picks (sigmoid routing's choice, else the top-k by logit). */
static void host_route(moe_blk *mb, int32_t *picks, uint32_t rows)
{
    jlm_evk *v = mb->v;
    moebufs *m = v->moe;
    uint32_t n = mb->p.b->n;
    const uint8_t *lgm = jlm_vk_buf_map(m->lg);
    uint8_t *wm = jlm_vk_buf_map(m->w);
    float lg[JLM_MAX_EXPERTS], w[JLM_MAX_EXPERTS_USED];
    for (uint32_t t = 0; t < rows; t++) {
        memcpy(lg, lgm + (t < n ? t * mb->p.ne * 4ull : mb->lp), mb->p.ne * 4ull);
        int32_t *sel = picks + (uint64_t)t * mb->p.nu;
        if (t == n) {
            int mode = mb->p.op->route == JLM_ROUTE_SIGMOID ? JLM_ROUTE_SIGMOID : JLM_K_ROUTE_RAW;
            jlm_ex_route_pick(mb->p.e, mode, mb->nl, lg, sel, w, NULL);
            continue;
        }
        mb->p.ins[t] = jlm_ex_route_pick(mb->p.e, mb->p.op->route, mb->p.b->l, lg, sel, w, NULL);
        memcpy(wm + t * mb->p.nu * 4ull, w, mb->p.nu * 4ull);
    }
    v->st.act_down += (uint64_t)rows * mb->p.ne * 4;
    v->st.act_up += (uint64_t)n * mb->p.nu * 4;
}

/* Every row's router and bias recorded, and its top-k (moe_route.comp;
 * sigmoid routing: host_route, after), a dispatch each for all the rows,
 * the prediction's too; then the picks (or the logits) read back into picks
 * (n rows of nu, then the prediction's row): the block's round trip. */
static int route_rows(moe_blk *mb, int32_t *picks)
{
    jlm_evk *v = mb->v;
    jlm_engine *e = mb->p.e;
    moebufs *m = v->moe;
    uint32_t n = mb->p.b->n, ne = mb->p.ne, nu = mb->p.nu;
    jlm_k_mat wr = blk_mat(e, mb->p.b, mb->p.op->w[0]);
    jlm_vk_view lg = {m->lg, 0, (uint64_t)n * ne * 4};
    jlm_ex_router_keep(e, mb->p.b->l, mb->p.b->page, mb->p.b->page_off);
    int rc = jlm_vk_rec_begin(v->vk, mb->p.err);
    if (!rc)
        rc = jlm_evk_matmul_rows(v, &wr, n, row_of(v->blk.ab[JLM_B_H], 0, (uint64_t)n * mb->p.E), lg, 0, 0, mb->p.err);
    if (!rc && mb->rb.buf)
        rc = jlm_vk_add_rows(v->vk, lg, lg, mb->rb, ne, n, mb->p.err);
    if (!rc && !mb->host)
        rc = jlm_vk_moe_route_rows(v->vk, lg, ne, nu, mb->p.op->route, e->c->expert_scale, n,
                                   (jlm_vk_view){m->sel, 0, (uint64_t)n * nu * 4},
                                   (jlm_vk_view){m->w, 0, (uint64_t)n * nu * 4}, mb->p.err);
    uint32_t rows = n + (mb->nl < e->c->n_layer);
    if (!rc && rows > n)
        rc = predict_rec(mb);
    if (!rc)
        rc = jlm_evk_rec_end(v, mb->p.err);
    if (rc)
        return rc;
    if (mb->host) {
        host_route(mb, picks, rows);
    } else {
        const uint8_t *sel = jlm_vk_buf_map(m->sel);
        memcpy(picks, sel, (uint64_t)n * nu * 4);
        if (rows > n)
            memcpy(picks + (uint64_t)n * nu, sel + mb->sp, nu * 4ull);
        v->st.act_down += (uint64_t)rows * mb->p.nu * 4;
    }
    for (uint32_t t = 0; t < rows; t++) {
        for (uint32_t s = 0; s < mb->p.nu; s++) {
            int32_t x = picks[(uint64_t)t * mb->p.nu + s];
            if (x < 0 || (uint32_t)x >= mb->p.ne)
                return jlm_errf(mb->p.err, JLM_EIO, "vulkan: block %u: the device's router picked expert %d of %u",
                                mb->p.b->l, x, mb->p.ne);
        }
        if (t < n)
            jlm_ex_trace_route(e, mb->p.b->l, t, picks + (uint64_t)t * mb->p.nu);
    }
    memcpy(e->route + (size_t)mb->p.b->l * mb->p.nu, picks + (uint64_t)(n - 1) * mb->p.nu, mb->p.nu * sizeof(int32_t));
    return JLM_OK;
}

/* The bias rows of expert xe (row width w) of a bank's bias view, or none. */
static jlm_vk_view bias_of(jlm_vk_view bank, uint32_t xe, uint64_t w)
{
    return bank.buf ? (jlm_vk_view){bank.buf, bank.off + xe * w * 4, w * 4} : (jlm_vk_view){0};
}

/* A decoded token's experts sel (frames pinned by the streamer) recorded:
 * x row 0 += their mixture. */
static int row_experts(moe_blk *mb, const int32_t *sel, const void *const *frames)
{
    jlm_evk *v = mb->v;
    jlm_engine *e = mb->p.e;
    moebufs *m = v->moe;
    jlm_err *err = mb->p.err;
    uint64_t nff = mb->p.nff, E = mb->p.E;
    jlm_vk_view h = row_of(v->blk.ab[JLM_B_H], 0, E);
    int rc = jlm_vk_rec_begin(v->vk, err), quantized = 0;
    /* the shared expert has read h: scaled in place, as the CPU's */
    if (!rc && mb->p.op->route == JLM_ROUTE_SIGMOID_IN)
        rc = jlm_vk_scale(v->vk, h, h, mb->p.ins[0], (uint32_t)E, err);
    for (uint32_t s = 0; !rc && s < mb->p.nu; s++) {   /* gate and up of every slot over h's int8 rows */
        uint32_t xe = (uint32_t)sel[s];
        jlm_k_mat wg = mat_expert(e, mb->p.tg, frames[s], mb->p.first, xe);
        jlm_k_mat wu = mat_expert(e, mb->p.tu, frames[s], mb->p.first, xe);
        jlm_vk_view g = row_of(m->g, s, nff), u = row_of(m->u, s, nff);
        rc = jlm_evk_matmul_rows(v, &wg, 1, h, g, quantized, 0, err);
        quantized |= !jlm_fmt_type_traits(wg.type)->is_float;
        if (!rc)
            rc = jlm_evk_matmul_rows(v, &wu, 1, h, u, quantized, 0, err);
        quantized |= !jlm_fmt_type_traits(wu.type)->is_float;
        jlm_vk_view bg = bias_of(mb->bg, xe, nff), bu = bias_of(mb->bu, xe, nff);
        if (!rc && bg.buf)
            rc = jlm_vk_eltwise(v->vk, JLM_VK_ADD, g, g, bg, (uint32_t)nff, err);
        if (!rc && bu.buf)
            rc = jlm_vk_eltwise(v->vk, JLM_VK_ADD, u, u, bu, (uint32_t)nff, err);
    }
    jlm_vk_view g = {m->g, 0, mb->p.nu * nff * 4}, u = {m->u, 0, mb->p.nu * nff * 4};
    if (!rc)
        rc = mb->p.op->act == JLM_ACT_SWIGLU
                 ? jlm_vk_eltwise(v->vk, JLM_VK_SWIGLU, g, g, u, (uint32_t)(mb->p.nu * nff), err)
                 : jlm_vk_swiglu_oai(v->vk, g, g, u, (uint32_t)(mb->p.nu * nff), 1.702f, 7.0f, err);
    for (uint32_t s = 0; !rc && s < mb->p.nu; s++) {   /* each slot's down over its own int8 rows */
        uint32_t xe = (uint32_t)sel[s];
        jlm_k_mat wd = mat_expert(e, mb->p.td, frames[s], mb->p.first, xe);
        jlm_vk_view o = row_of(m->o, s, E), bd = bias_of(mb->bd, xe, E);
        rc = jlm_evk_matmul_rows(v, &wd, 1, row_of(m->g, s, nff), o, 0, 0, err);
        if (!rc && bd.buf)
            rc = jlm_vk_eltwise(v->vk, JLM_VK_ADD, o, o, bd, (uint32_t)E, err);
    }
    v->st.expert_matmuls += 3ull * mb->p.nu;
    jlm_vk_view x = row_of(v->blk.ab[JLM_B_X], 0, E);
    return rc ? rc
              : jlm_vk_moe_combine(v->vk, x, x, (jlm_vk_view){m->o, 0, mb->p.nu * E * 4},
                                   (jlm_vk_view){m->w, 0, mb->p.nu * 4ull}, mb->p.nu, (uint32_t)E, err);
}

/* Expert x's group of a batch (jlm_exd_moe_group's callback; its page
 * resident): the m pairs from g0 of the gathered rows (mh) through gate and
 * up (one matmul each over the m rows, the int8 rows made once), their
 * biases, the activation, down and its bias, the outputs at the same pairs
 * of o. */
static int group_rec(void *ctx, uint32_t x, uint32_t g0, uint32_t m, const void *frame)
{
    moe_blk *mb = ctx;
    jlm_evk *v = mb->v;
    jlm_engine *e = mb->p.e;
    moebufs *mm = v->moe;
    jlm_err *err = mb->p.err;
    uint64_t nff = mb->p.nff, E = mb->p.E;
    jlm_k_mat wg = mat_expert(e, mb->p.tg, frame, mb->p.first, x), wu = mat_expert(e, mb->p.tu, frame, mb->p.first, x);
    jlm_k_mat wd = mat_expert(e, mb->p.td, frame, mb->p.first, x);
    jlm_vk_view h = {mm->mh, g0 * E * 4, m * E * 4}, g = {mm->g, g0 * nff * 4, m * nff * 4};
    jlm_vk_view u = {mm->u, g0 * nff * 4, m * nff * 4}, o = {mm->o, g0 * E * 4, m * E * 4};
    jlm_vk_view bg = bias_of(mb->bg, x, nff), bu = bias_of(mb->bu, x, nff), bd = bias_of(mb->bd, x, E);
    int rc = jlm_evk_matmul_rows(v, &wg, m, h, g, 0, 0, err);
    if (!rc)
        rc = jlm_evk_matmul_rows(v, &wu, m, h, u, !jlm_fmt_type_traits(wg.type)->is_float, 0, err);
    if (!rc && bg.buf)
        rc = jlm_vk_add_rows(v->vk, g, g, bg, (uint32_t)nff, m, err);
    if (!rc && bu.buf)
        rc = jlm_vk_add_rows(v->vk, u, u, bu, (uint32_t)nff, m, err);
    if (!rc)
        rc = mb->p.op->act == JLM_ACT_SWIGLU
                 ? jlm_vk_eltwise(v->vk, JLM_VK_SWIGLU, g, g, u, (uint32_t)(m * nff), err)
                 : jlm_vk_swiglu_oai(v->vk, g, g, u, (uint32_t)(m * nff), 1.702f, 7.0f, err);
    if (!rc)
        rc = jlm_evk_matmul_rows(v, &wd, m, g, o, 0, 0, err);
    if (!rc && bd.buf)
        rc = jlm_vk_add_rows(v->vk, o, o, bd, (uint32_t)E, m, err);
    v->st.expert_matmuls += 3;
    return rc;
}

/* A batch's routed experts (n rows, picks routed): grouped by expert
 * (jlm_exd_moe_group: one matmul per used expert over its rows, as the
 * CPU's moe_batch), recorded with the copies that gather the input rows
 * (Llama 4's scaled first) and put the outputs back in (row, slot) order,
 * then every row's mixture onto x in one dispatch. */
static int batch_experts(moe_blk *mb, const int32_t *picks)
{
    jlm_evk *v = mb->v;
    moebufs *m = v->moe;
    jlm_err *err = mb->p.err;
    uint32_t n = mb->p.b->n, np = n * mb->p.nu;
    uint64_t E = mb->p.E;
    jlm_vk_view h = {v->blk.ab[JLM_B_H], 0, n * E * 4}, x = {v->blk.ab[JLM_B_X], 0, n * E * 4};
    jlm_vk_view mh = {m->mh, 0, np * E * 4};
    int rc = jlm_vk_rec_begin(v->vk, err);
    /* the shared expert has read h: scaled in place, as the CPU's */
    if (!rc && mb->p.op->route == JLM_ROUTE_SIGMOID_IN)
        rc = jlm_vk_scale_rows(v->vk, h, h, mb->p.ins, (uint32_t)E, n, err);
    if (!rc && (rc = jlm_exd_moe_group(&mb->p, picks)) == JLM_OK)
        rc = jlm_vk_copy_index(v->vk, mh, NULL, h, mb->p.row, E * 4, np, err);
    if (!rc)
        rc = jlm_exd_moe_each(&mb->p, group_rec, mb);
    if (!rc)
        rc = jlm_vk_copy_index(v->vk, mh, mb->p.ord, (jlm_vk_view){m->o, 0, np * E * 4}, NULL, E * 4, np, err);
    return rc ? rc
              : jlm_vk_moe_combine_rows(v->vk, x, x, mh, (jlm_vk_view){m->w, 0, np * 4ull}, mb->p.nu, (uint32_t)E,
                                        n, err);
}

int jlm_evk_moe(jlm_evk *v, jlm_engine *e, const jlm_ex_blk *b, const jlm_op *op, int dry, jlm_err *err)
{
    moe_blk mb = {.v = v};
    int rc = jlm_exd_moe_plan(&mb.p, e, b, op, err);
    if (!rc)
        rc = plan(&mb);
    if (rc || dry)
        return rc;
    int32_t *picks = malloc((uint64_t)(b->n + 1) * mb.p.nu * sizeof *picks);
    mb.p.ins = malloc(b->n * sizeof *mb.p.ins);
    if (!picks || !mb.p.ins) {
        free(picks);
        free(mb.p.ins);
        return jlm_errf(err, JLM_ENOMEM, "vulkan: out of memory");
    }
    rc = moe_buffers(&mb, b->n);
    if (!rc)
        rc = route_rows(&mb, picks);
    if (!rc && b->n > 1) {
        rc = batch_experts(&mb, picks);
    } else if (!rc) {
        const void *frames[JLM_MAX_EXPERTS_USED];
        rc = jlm_stream_experts(e, mb.p.first, picks, mb.p.nu, frames, err);
        /* read while these compute and the next block's attention runs; the
         * CPU's gate asked where the CPU asks it */
        if (!rc && mb.nl < e->c->n_layer && jlm_stream_predict_now(e))
            jlm_stream_predict(e, mb.nl_first, picks + mb.p.nu);
        if (!rc) {
            rc = row_experts(&mb, picks, frames);
            jlm_stream_experts_done(e, mb.p.first, picks, mb.p.nu);
        }
    }
    jlm_exd_moe_free(&mb.p);
    free(picks);
    free(mb.p.ins);
    return rc;
}
