/* exec_cu_moe.c - the routed experts of a whole block on a CUDA device: the
 * MOE op (engine/prog.h) for exec_cu.c (docs/cuda.md, "Routed experts on the
 * device").
 *
 * The router's matvec and its bias run on the compute stream for every row
 * of the block; the logits come down (n_expert floats a row: the one round
 * trip of a MoE block, counted in the activations down) and the host routes
 * each row with the CPU's own code (jlm_ex_route_pick: softmax, raw, gpt-oss's
 * top-k-then-softmax, sigmoid with its selection bias and groups), so the
 * picks and weights are the CPU's bit for bit in every mode. The weights go
 * up with the experts' launches (activations up). The chosen experts' pages
 * are acquired through the streamer as the CPU's path acquires them
 * (jlm_stream_experts: host pages, their reads, then their device frames),
 * and a decoded token's experts are enqueued (a prefill's grouped by
 * expert, exec_dev.c's jlm_exd_moe_group and jlm_exd_moe_each, as
 * batch_experts says): gate and up over the row's int8 row
 * (quantized once on the device, bit-identical to the CPU's), their biases,
 * SwiGLU (or SwiGLU-OAI), the slots' int8 rows, down, the down bias, and the
 * weighted mix added to the residual row (jlm_cu_k_moe_combine, the sum of
 * exec_moe.c's mix_slots bit for bit). A decode step also predicts the next
 * MoE block's experts as the CPU does (docs/pager.md, "Reading ahead"):
 * that block's router (the host's float copy, uploaded once, counted in the
 * bytes uploaded) over this block's input, its logits down with the
 * router's in the same round trip; once this block's experts are pinned the
 * CPU's gate (jlm_stream_predict_now) and pick (jlm_ex_predict_pick) hand
 * them to the streamer. Not here: GELU gates: JLM_EUNSUPPORTED in the dry
 * run, before anything is enqueued, so the block stays on the host. Llama 4's router weight
 * (JLM_ROUTE_SIGMOID_IN: one expert) scales the routed expert's input row
 * in place once the shared expert (the ops before) has read it. */
#include "engine/backend_cu_int.h"
#include "engine/exec_dev.h"
#include "engine/exec_int.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"

#define UNSUP JLM_EUNSUPPORTED
#define CS JLM_CU_S_COMPUTE

/* The device (and pinned) buffers of the MOE op, grown to the largest block
 * seen. q, d, s: the int8 rows of one row's input (record 0, n_embd) or of
 * the slots' activations (records 1..nu, nff each), as jlm_cu_act records
 * in rec (made for rec_E, rec_nff, rec_nu). */
typedef struct jlm_ecu_moebufs {
    scratch  lg, h_lg;    /* (rows + 1, n_expert) the router's logits, the prediction's; their pinned copy */
    scratch  w, h_w;      /* (rows, nu) the routing weights; their pinned copy */
    scratch  g, u, o;     /* (pairs, nff) gate (then the activation), up; (pairs, n_embd) each pair's output */
    scratch  mh;          /* (rows * nu, n_embd) a batch's input rows by expert, then its outputs by row */
    scratch  q, d, s, rec;
    uint64_t rec_E, rec_nff;
    uint32_t rec_nu;
    scratch  brec;        /* a batch's act records: (rows * nu) of n_embd codes, then as many of nff (brec_*) */
    uint64_t brec_np, brec_E, brec_nff;
    scratch *pr;          /* (n_layer,) each block's router for the predictions, empty until used */
    uint32_t n_layer;
} moebufs;

void jlm_ecu_moe_free(jlm_ecu *v)
{
    moebufs *m = v->blk.moe;
    if (!m)
        return;
    scratch *dev[] = {&m->lg, &m->w, &m->g, &m->u, &m->o, &m->mh, &m->q, &m->d, &m->s, &m->rec, &m->brec};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        jlm_ecu_scratch_free(v, dev[i], 0);
    jlm_ecu_scratch_free(v, &m->h_lg, 1);
    jlm_ecu_scratch_free(v, &m->h_w, 1);
    for (uint32_t l = 0; m->pr && l < m->n_layer; l++)
        jlm_ecu_scratch_free(v, &m->pr[l], 0);
    free(m->pr);
    free(m);
    v->blk.moe = NULL;
}

/* One MoE block's operands (jlm_exd_moe), checked (plan) before anything
 * is enqueued. */
typedef struct moe_blk {
    jlm_exd_moe       p;
    jlm_ecu          *v;
    const float      *rb, *bg, *bu, *bd;   /* device addresses of the biases (NULL: none) */
    uint32_t          nl;                  /* the next MoE block predicted (n_layer: none) */
    float             plg[JLM_MAX_EXPERTS];   /* its router's logits (before its bias), come down */
} moe_blk;

static int plan(moe_blk *mb)
{
    jlm_exd_moe *p = &mb->p;
    const float **dev[4] = {&mb->rb, &mb->bg, &mb->bu, &mb->bd};
    jlm_k_mat wr = blk_mat(p->e, p->b, p->op->w[0]);
    if (jlm_ecu_matmul_rows(mb->v, &wr, p->b->n, NULL, JLM_B_H, NULL, 0, 1, NULL))
        return UNSUP;
    for (int i = 0; i < 4; i++)
        if (jlm_ecu_vec(mb->v, p->bias[i], p->bias_n[i], dev[i]))
            return UNSUP;
    return JLM_OK;
}

/* The int8 rows' act records: record 0 an n_embd row at q, record 1 + s
 * slot s's nff row (the slots' rows contiguous, so one quantize makes
 * them all); uploaded once per shape (parameters, counted as activations). */
static int records(moe_blk *mb)
{
    jlm_ecu *v = mb->v;
    moebufs *m = v->blk.moe;
    if (m->rec_E == mb->p.E && m->rec_nff == mb->p.nff && m->rec_nu == mb->p.nu)
        return JLM_OK;
    jlm_cu_act h[1 + JLM_MAX_EXPERTS_USED];
    h[0] = jlm_ecu_act_at(&m->q, &m->d, &m->s, mb->p.E, 0);
    for (uint32_t s = 0; s < mb->p.nu; s++)
        h[1 + s] = jlm_ecu_act_at(&m->q, &m->d, &m->s, mb->p.nff, s * mb->p.nff);
    int rc = jlm_ecu_records_up(v, m->rec.p, h, 1ull + mb->p.nu, mb->p.err);
    if (rc)
        return rc;
    m->rec_E = mb->p.E;
    m->rec_nff = mb->p.nff;
    m->rec_nu = mb->p.nu;
    return JLM_OK;
}

/* The buffers for n rows (growing frees what queued kernels read: the
 * seam's free waits for them). */
static int moe_buffers(moe_blk *mb, uint32_t n)
{
    jlm_ecu *v = mb->v;
    jlm_err *err = mb->p.err;
    if (!v->blk.moe && !(v->blk.moe = calloc(1, sizeof *v->blk.moe)))
        return jlm_errf(err, JLM_ENOMEM, "cuda: out of memory");
    moebufs *m = v->blk.moe;
    uint64_t np = (uint64_t)n * mb->p.nu, kx = mb->p.nff > mb->p.E ? mb->p.nff : mb->p.E;
    uint64_t nk = n > 1 ? np * kx : mb->p.nu * mb->p.nff > mb->p.E ? mb->p.nu * mb->p.nff : mb->p.E;
    const void *at[3] = {m->q.p, m->d.p, m->s.p};
    uint64_t lgb = (n + 1ull) * mb->p.ne * 4, wb = np * 4;
    struct { scratch *s; uint64_t n; int pinned; } want[] = {
        {&m->lg, lgb, 0}, {&m->h_lg, lgb, 1}, {&m->w, wb, 0}, {&m->h_w, wb, 1}, {&m->g, np * mb->p.nff * 4, 0},
        {&m->u, np * mb->p.nff * 4, 0}, {&m->o, np * mb->p.E * 4, 0}, {&m->mh, n > 1 ? np * mb->p.E * 4 : 0, 0},
        {&m->q, nk, 0}, {&m->d, nk / 8, 0}, {&m->s, nk / 8, 0},
        {&m->rec, (1ull + JLM_MAX_EXPERTS_USED) * sizeof(jlm_cu_act), 0},
        {&m->brec, n > 1 ? 2 * np * sizeof(jlm_cu_act) : 0, 0}};
    int rc = JLM_OK;
    if (!m->pr) {
        m->n_layer = mb->p.e->c->n_layer;
        if (!(m->pr = calloc(m->n_layer, sizeof *m->pr)))
            rc = jlm_errf(err, JLM_ENOMEM, "cuda: out of memory");
    }
    for (size_t i = 0; i < sizeof want / sizeof want[0] && !rc; i++)
        if (want[i].s->cap < want[i].n)
            rc = jlm_ecu_grow(v, want[i].s, want[i].n, want[i].pinned, err);
    if (at[0] != m->q.p || at[1] != m->d.p || at[2] != m->s.p)
        m->rec_E = m->brec_np = 0;   /* the records point into the old int8 rows */
    return rc ? rc : records(mb);
}

/* The next MoE block's router logits over row 0's input into row n of the
 * logits (its router: the host's float copy, uploaded once, counted in the
 * bytes uploaded; its bias added on the host, jlm_ex_predict_pick). */
static int predict_rec(moe_blk *mb)
{
    jlm_ecu *v = mb->v;
    jlm_engine *e = mb->p.e;
    scratch *pr = &v->blk.moe->pr[mb->nl];
    const jlm_tensor *t = W(e, mb->nl, JLM_R_ROUTER);
    const uint8_t *host = e->pred_buf + (uint64_t)mb->nl * e->rbytes;
    if (!pr->p) {
        int rc = jlm_ecu_grow(v, pr, e->rbytes, 0, mb->p.err);
        if (rc)
            return rc;
        if (jlm_cu_rt_h2d(v->rt, pr->p, host, e->rbytes, CS)) {   /* pageable: consumed now */
            jlm_ecu_scratch_free(v, pr, 0);
            return jlm_ecu_fail(v, mb->p.err, "the predicted block's router");
        }
        pthread_mutex_lock(&v->mu);
        v->bytes_up += e->rbytes;
        pthread_mutex_unlock(&v->mu);
    }
    jlm_k_mat wr = mat_at(t, host, t->qs_off, 0);
    jlm_cu_mat cm;
    jlm_cu_mat_from(&wr, &cm);
    cm.qs = pr->p;
    v->st.matmuls++;
    v->blk.queued = 1;
    float *y = (float *)v->blk.moe->lg.p + (uint64_t)mb->p.b->n * mb->p.ne;
    return jlm_cu_rt_matvec(v->rt, &cm, 1, v->blk.ab[JLM_B_H].p, NULL, y, CS) ? jlm_ecu_fail(v, mb->p.err, "matvec")
                                                                               : JLM_OK;
}

/* Every row's router logits and bias enqueued (and the prediction's
 * logits), brought down (the block's round trip), and routed on the host as the CPU routes them: picks and
 * weights (n rows of nu each); the weights then go up. */
static int route_rows(moe_blk *mb, int32_t *picks, float *wts)
{
    jlm_ecu *v = mb->v;
    jlm_engine *e = mb->p.e;
    moebufs *m = v->blk.moe;
    uint32_t n = mb->p.b->n, ne = mb->p.ne, nu = mb->p.nu;
    jlm_k_mat wr = blk_mat(e, mb->p.b, mb->p.op->w[0]);
    jlm_ex_router_keep(e, mb->p.b->l, mb->p.b->page, mb->p.b->page_off);
    int rc = jlm_ecu_matmul_rows(v, &wr, n, v->blk.ab[JLM_B_H].p, JLM_B_H, m->lg.p, 0, 0, mb->p.err);
    for (uint32_t t = 0; !rc && mb->rb && t < n; t++) {
        float *lg = (float *)m->lg.p + (uint64_t)t * ne;
        if (jlm_cu_rt_elem(v->rt, JLM_CU_ADD, lg, lg, mb->rb, ne, 0, 0, CS))
            rc = jlm_ecu_fail(v, mb->p.err, "the router's bias");
    }
    uint32_t rows = n + (mb->nl < e->c->n_layer);
    if (!rc && rows > n)
        rc = predict_rec(mb);
    float *lg = rc ? NULL : malloc((uint64_t)rows * ne * sizeof *lg);
    if (!rc && !lg)
        rc = jlm_errf(mb->p.err, JLM_ENOMEM, "cuda: out of memory");
    if (!rc)
        rc = jlm_ecu_down(v, &m->h_lg, lg, m->lg.p, (uint64_t)rows * ne * 4, mb->p.err);
    if (!rc && rows > n)
        memcpy(mb->plg, lg + (uint64_t)n * ne, ne * sizeof *lg);
    for (uint32_t t = 0; !rc && t < n; t++) {
        mb->p.ins[t] = jlm_ex_route_pick(e, mb->p.op->route, mb->p.b->l, lg + (uint64_t)t * ne,
                                         picks + (uint64_t)t * nu, wts + (uint64_t)t * nu, NULL);
        jlm_ex_trace_route(e, mb->p.b->l, t, picks + (uint64_t)t * nu);
    }
    free(lg);
    if (rc)
        return rc;
    memcpy(e->route + (size_t)mb->p.b->l * nu, picks + (uint64_t)(n - 1) * nu, nu * sizeof(int32_t));
    uint64_t wb = (uint64_t)n * nu * 4;
    memcpy(m->h_w.p, wts, wb);   /* pinned: the stream was drained by the logits' copy */
    jlm_dev_prof_op(&v->dev, JLM_DEVP_XFER);
    if (jlm_cu_rt_h2d(v->rt, m->w.p, m->h_w.p, wb, CS))
        return jlm_ecu_fail(v, mb->p.err, "the routing weights");
    v->blk.queued = 1;
    v->st.act_up += wb;
    jlm_dev_prof_op(&v->dev, jlm_dev_op_class(JLM_OP_MOE));
    return JLM_OK;
}

/* y (n rows) = x (n rows) times expert matrix m (planes in a device
 * frame): for quantized types x's int8 rows (their records ra, quantized
 * already). */
static int mm_rows(moe_blk *mb, const jlm_k_mat *m, uint32_t n, const float *x, const jlm_cu_act *ra, float *y)
{
    jlm_ecu *v = mb->v;
    jlm_cu_mat cm;
    int fl = jlm_fmt_type_traits(m->type)->is_float;
    if (jlm_ecu_planes(v, m, &cm, NULL))
        return jlm_errf(mb->p.err, JLM_EIO, "cuda: block %u: an expert's planes are in no device frame", mb->p.b->l);
    v->st.matmuls++;
    v->st.expert_matmuls++;
    return jlm_cu_rt_matvec(v->rt, &cm, n, fl ? x : NULL, fl ? NULL : ra, y, CS) ? jlm_ecu_fail(v, mb->p.err, "matvec")
                                                                                 : JLM_OK;
}

/* One row: its int8 row is record rec of the table. */
static int mm(moe_blk *mb, const jlm_k_mat *m, const float *x, int rec, float *y)
{
    return mm_rows(mb, m, 1, x, (const jlm_cu_act *)mb->v->blk.moe->rec.p + rec, y);
}

/* x's int8 rows (k floats, whole 32-blocks) into q, d, s from element off. */
static int quantize_at(moe_blk *mb, const float *x, uint64_t k, uint64_t off)
{
    moebufs *m = mb->v->blk.moe;
    jlm_cu_act a = jlm_ecu_act_at(&m->q, &m->d, &m->s, k, off);
    return jlm_cu_rt_quantize(mb->v->rt, x, &a, CS) ? jlm_ecu_fail(mb->v, mb->p.err, "quantize") : JLM_OK;
}
static int quantize(moe_blk *mb, const float *x, uint64_t k) { return quantize_at(mb, x, k, 0); }

static int bias(moe_blk *mb, float *y, const float *bank, uint32_t xe, uint64_t n)
{
    if (!bank)
        return JLM_OK;
    return jlm_cu_rt_elem(mb->v->rt, JLM_CU_ADD, y, y, bank + xe * n, n, 0, 0, CS)
               ? jlm_ecu_fail(mb->v, mb->p.err, "bias") : JLM_OK;
}

static int quantized(const jlm_tensor *t) { return !jlm_fmt_type_traits(t->type)->is_float; }

/* Row t's experts sel (frames pinned by the streamer, made resident on the
 * device) enqueued: x row t += their mixture with weights row t. */
static int row_experts(moe_blk *mb, uint32_t t, const int32_t *sel, const void *const *frames)
{
    jlm_ecu *v = mb->v;
    jlm_engine *e = mb->p.e;
    moebufs *m = v->blk.moe;
    uint64_t nff = mb->p.nff, E = mb->p.E;
    float *h = (float *)v->blk.ab[JLM_B_H].p + t * E, *g = m->g.p, *u = m->u.p, *o = m->o.p;
    int rc = JLM_OK;
    if (mb->p.op->route == JLM_ROUTE_SIGMOID_IN &&   /* the shared expert has read h: scaled in place, as the CPU's */
        jlm_cu_rt_elem(v->rt, JLM_CU_SCALE, h, h, NULL, E, mb->p.ins[t], 0, CS))
        rc = jlm_ecu_fail(v, mb->p.err, "the routed expert's input scale");
    if (!rc && (quantized(mb->p.tg) || quantized(mb->p.tu)))
        rc = quantize(mb, h, E);
    for (uint32_t s = 0; !rc && s < mb->p.nu; s++) {   /* gate and up of every slot over h's int8 row */
        uint32_t xe = (uint32_t)sel[s];
        jlm_k_mat wg = mat_expert(e, mb->p.tg, frames[s], mb->p.first, xe);
        jlm_k_mat wu = mat_expert(e, mb->p.tu, frames[s], mb->p.first, xe);
        if (!(rc = mm(mb, &wg, h, 0, g + s * nff)) && !(rc = mm(mb, &wu, h, 0, u + s * nff)) &&
            !(rc = bias(mb, g + s * nff, mb->bg, xe, nff)))
            rc = bias(mb, u + s * nff, mb->bu, xe, nff);
    }
    int oai = mb->p.op->act == JLM_ACT_SWIGLU_OAI;
    if (!rc && jlm_cu_rt_elem(v->rt, oai ? JLM_CU_SWIGLU_OAI : JLM_CU_SWIGLU, g, g, u, mb->p.nu * nff,
                              oai ? 1.702f : 0.0f, oai ? 7.0f : 0.0f, CS))
        rc = jlm_ecu_fail(v, mb->p.err, "the experts' activation");
    if (!rc && quantized(mb->p.td))
        rc = quantize(mb, g, mb->p.nu * nff);   /* each slot's int8 row: quantizing is per 32-block */
    for (uint32_t s = 0; !rc && s < mb->p.nu; s++) {
        uint32_t xe = (uint32_t)sel[s];
        jlm_k_mat wd = mat_expert(e, mb->p.td, frames[s], mb->p.first, xe);
        if (!(rc = mm(mb, &wd, g + s * nff, 1 + (int)s, o + s * E)))
            rc = bias(mb, o + s * E, mb->bd, xe, E);
    }
    float *x = (float *)v->blk.ab[JLM_B_X].p + t * E;
    if (!rc && jlm_cu_rt_moe_combine(v->rt, x, o, (const float *)m->w.p + (uint64_t)t * mb->p.nu, mb->p.nu, E, CS))
        rc = jlm_ecu_fail(v, mb->p.err, "the experts' mixture");
    v->blk.queued = 1;
    return rc;
}

/* A batch's act records (brec): pair i's n_embd codes at i * n_embd of
 * q, d, s, then its nff codes at i * nff; uploaded once per shape. */
static int batch_records(moe_blk *mb, uint64_t np)
{
    jlm_ecu *v = mb->v;
    moebufs *m = v->blk.moe;
    if (m->brec_np == np && m->brec_E == mb->p.E && m->brec_nff == mb->p.nff)
        return JLM_OK;
    jlm_cu_act *h = malloc(2 * np * sizeof *h);
    if (!h)
        return jlm_errf(mb->p.err, JLM_ENOMEM, "cuda: out of memory");
    for (uint64_t i = 0; i < np; i++) {
        h[i] = jlm_ecu_act_at(&m->q, &m->d, &m->s, mb->p.E, i * mb->p.E);
        h[np + i] = jlm_ecu_act_at(&m->q, &m->d, &m->s, mb->p.nff, i * mb->p.nff);
    }
    int rc = jlm_ecu_records_up(v, m->brec.p, h, 2 * np, mb->p.err);
    free(h);
    m->brec_np = rc ? 0 : np;
    m->brec_E = mb->p.E;
    m->brec_nff = mb->p.nff;
    return rc;
}

/* Expert x's group of a batch (jlm_exd_moe_each's callback; its page made
 * resident on the device): the m pairs from g0 of the gathered rows (mh)
 * through gate and up (one matmul each over the m rows, their int8 rows
 * made once), their biases, the activation, the int8 rows of the result,
 * down and its bias, the outputs at the same pairs of o. */
static int group_enq(void *ctx, uint32_t x, uint32_t g0, uint32_t m, const void *frame)
{
    moe_blk *mb = ctx;
    jlm_ecu *v = mb->v;
    jlm_engine *e = mb->p.e;
    moebufs *mm_ = v->blk.moe;
    uint64_t nff = mb->p.nff, E = mb->p.E, np = (uint64_t)mb->p.b->n * mb->p.nu;
    float *h = (float *)mm_->mh.p + g0 * E, *g = (float *)mm_->g.p + g0 * nff, *u = (float *)mm_->u.p + g0 * nff;
    float *o = (float *)mm_->o.p + g0 * E;
    const jlm_cu_act *rh = (const jlm_cu_act *)mm_->brec.p + g0, *rg = rh + np;
    jlm_k_mat wg = mat_expert(e, mb->p.tg, frame, mb->p.first, x), wu = mat_expert(e, mb->p.tu, frame, mb->p.first, x);
    jlm_k_mat wd = mat_expert(e, mb->p.td, frame, mb->p.first, x);
    int rc = jlm_ecu_frames_wait(v, mb->p.err), oai = mb->p.op->act == JLM_ACT_SWIGLU_OAI;   /* the page just paged in */
    if (!rc && (quantized(mb->p.tg) || quantized(mb->p.tu)))
        rc = quantize_at(mb, h, m * E, g0 * E);
    if (!rc && !(rc = mm_rows(mb, &wg, m, h, rh, g)) && !(rc = mm_rows(mb, &wu, m, h, rh, u)))
        for (uint32_t i = 0; !rc && i < m; i++)
            if (!(rc = bias(mb, g + i * nff, mb->bg, x, nff)))
                rc = bias(mb, u + i * nff, mb->bu, x, nff);
    if (!rc && jlm_cu_rt_elem(v->rt, oai ? JLM_CU_SWIGLU_OAI : JLM_CU_SWIGLU, g, g, u, m * nff, oai ? 1.702f : 0.0f,
                              oai ? 7.0f : 0.0f, CS))
        rc = jlm_ecu_fail(v, mb->p.err, "the experts' activation");
    if (!rc && quantized(mb->p.td))
        rc = quantize_at(mb, g, m * nff, g0 * nff);
    if (!rc)
        rc = mm_rows(mb, &wd, m, g, rg, o);
    for (uint32_t i = 0; !rc && i < m; i++)
        rc = bias(mb, o + i * E, mb->bd, x, E);
    v->blk.queued = 1;
    return rc;
}

/* n row-sized copies of E floats: dst row di[i] (NULL: i) from src row si[i]. */
static int copy_rows(moe_blk *mb, float *dst, const uint32_t *di, const float *src, const uint32_t *si, uint64_t n)
{
    uint64_t E = mb->p.E;
    for (uint64_t i = 0; i < n; i++)
        if (jlm_cu_rt_d2d(mb->v->rt, dst + (di ? di[i] : i) * E, src + (si ? si[i] : i) * E, E * 4, CS))
            return jlm_ecu_fail(mb->v, mb->p.err, "the experts' rows");
    return JLM_OK;
}

/* A batch's routed experts (n rows, routed): grouped by expert
 * (jlm_exd_moe_group: one matmul per used expert and matrix over its rows,
 * as the CPU's moe_batch), the input rows gathered (Llama 4's scaled
 * first), the outputs put back in (row, slot) order, then each row's
 * mixture onto x. */
static int batch_experts(moe_blk *mb, const int32_t *picks)
{
    jlm_ecu *v = mb->v;
    moebufs *m = v->blk.moe;
    uint32_t n = mb->p.b->n;
    uint64_t E = mb->p.E, np = (uint64_t)n * mb->p.nu;
    float *h = v->blk.ab[JLM_B_H].p, *x = v->blk.ab[JLM_B_X].p;
    int rc = batch_records(mb, np);
    for (uint32_t t = 0; !rc && mb->p.op->route == JLM_ROUTE_SIGMOID_IN && t < n; t++)   /* as the CPU's, in place */
        if (jlm_cu_rt_elem(v->rt, JLM_CU_SCALE, h + t * E, h + t * E, NULL, E, mb->p.ins[t], 0, CS))
            rc = jlm_ecu_fail(v, mb->p.err, "the routed expert's input scale");
    if (!rc && !(rc = jlm_exd_moe_group(&mb->p, picks)) && !(rc = copy_rows(mb, m->mh.p, NULL, h, mb->p.row, np)))
        rc = jlm_exd_moe_each(&mb->p, group_enq, mb);
    if (!rc)
        rc = copy_rows(mb, m->mh.p, mb->p.ord, m->o.p, NULL, np);
    for (uint32_t t = 0; !rc && t < n; t++)
        if (jlm_cu_rt_moe_combine(v->rt, x + t * E, (const float *)m->mh.p + t * mb->p.nu * E,
                                  (const float *)m->w.p + (uint64_t)t * mb->p.nu, mb->p.nu, E, CS))
            rc = jlm_ecu_fail(v, mb->p.err, "the experts' mixture");
    v->blk.queued = 1;
    return rc;
}

int jlm_ecu_moe(jlm_ecu *v, jlm_engine *e, const jlm_ex_blk *b, const jlm_op *op, int dry, jlm_err *err)
{
    moe_blk mb = {.v = v};
    int rc = jlm_exd_moe_plan(&mb.p, e, b, op, err);
    if (!rc)
        rc = plan(&mb);
    if (rc || dry)
        return rc;
    const jlm_config *c = e->c;
    mb.nl = b->n == 1 ? jlm_ex_predict_block(e, b->l) : c->n_layer;   /* a decode step predicts */
    const jlm_tensor *tn = mb.nl < c->n_layer ? W(e, mb.nl, JLM_R_ROUTER) : NULL;
    if (tn && (jlm_tensor_k(tn) != mb.p.E || jlm_tensor_rows(tn) != mb.p.ne))
        mb.nl = c->n_layer;
    int32_t *picks = malloc((uint64_t)b->n * mb.p.nu * sizeof *picks);
    float *wts = malloc((uint64_t)b->n * mb.p.nu * sizeof *wts);
    mb.p.ins = malloc((uint64_t)b->n * sizeof *mb.p.ins);
    rc = picks && wts && mb.p.ins ? moe_buffers(&mb, b->n) : jlm_errf(err, JLM_ENOMEM, "cuda: out of memory");
    if (!rc)
        rc = route_rows(&mb, picks, wts);
    if (!rc && b->n > 1)
        rc = batch_experts(&mb, picks);
    for (uint32_t t = 0; !rc && b->n == 1 && t < b->n; t++) {
        const int32_t *sel = picks + (uint64_t)t * mb.p.nu;
        const void *frames[JLM_MAX_EXPERTS_USED];
        if ((rc = jlm_stream_experts(e, mb.p.first, sel, mb.p.nu, frames, err)))
            break;
        if (mb.nl < c->n_layer && jlm_stream_predict_now(e)) {   /* as the CPU's predict_next, its gate too */
            int32_t ps[JLM_MAX_EXPERTS];
            jlm_stream_predict(e, jlm_ex_predict_pick(e, mb.p.op->route, mb.nl, mb.plg, ps), ps);
        }
        rc = jlm_ecu_frames_wait(v, err);   /* the kernels read the pages just paged in */
        if (!rc)
            rc = row_experts(&mb, t, sel, frames);
        jlm_stream_experts_done(e, mb.p.first, sel, mb.p.nu);
    }
    jlm_exd_moe_free(&mb.p);
    free(picks);
    free(wts);
    free(mb.p.ins);
    return rc;
}
