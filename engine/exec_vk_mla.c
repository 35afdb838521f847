/* exec_vk_mla.c - latent attention (deepseek2: engine/prog.h's MLA_KV,
 * MLA_Q, MLA_ATTN) recorded on the Vulkan device, in exec_mla.c's absorbed
 * form and with its parameters (jlm_ex_mla_rope, jlm_ex_mla_scale,
 * jlm_ex_mla_sheet): the layer's device cache (exec_vk.c's kc, rows of
 * kv_dim = KVLoraRank + NRot, F32 or F16) holds the normed latent and the
 * RoPE'd shared key; each head's query is moved into the latent space by its
 * attn_k_b sheet, all heads attend as one KV head (attention.comp: head_dim
 * KVLoraRank + NRot, the values the latent part of the same rows) and each
 * head's latent output is expanded by its attn_v_b sheet. Each of those two
 * is one batched matvec over all heads and rows (jlm_vk_matmul_batch: head h
 * reads sheet h, its slice of every row, writes its own slice), the input
 * quantized once; where a batch cannot be bound (all sheets past one
 * binding, or a quantized head slice off a 32-block), a matvec a head with
 * its rows gathered and scattered by device copies. Shapes the shaders
 * cannot take (offsets off the device's alignment, planes outside a device
 * frame) are JLM_EUNSUPPORTED in the dry walk. */
#include "engine/backend_vk_int.h"
#include "engine/exec_dev.h"

#include <stdlib.h>
#include <string.h>

#define UNSUP JLM_EUNSUPPORTED

/* The dimensions, and the scratch regions of blk.mla in floats (each at an aligned offset). */
enum { RG_QA, RG_QL, RG_OL, RG_GI, RG_GO, RG_XQ, RG_XD, RG_XS, RG_N };   /* XQ/XD/XS: a batch's int8 rows */
typedef struct mla_dims {
    uint64_t R, W, nope, rot, qa, nh, hd, hdv, E, off[RG_N + 1];
} mla_dims;

static mla_dims dims(jlm_evk *v, const jlm_engine *e, uint64_t rows)
{
    const jlm_config *c = e->c;
    mla_dims d = {.R = c->kv_lora_rank, .W = e->kv_dim, .rot = c->n_rot, .nope = e->hd - c->n_rot,
                  .qa = c->q_lora_rank, .nh = c->n_head, .hd = e->hd, .hdv = e->hd_v, .E = c->n_embd};
    uint64_t xmax = d.nh * (d.hd > d.R ? d.hd : d.R);
    uint64_t len[RG_N] = {rows * d.qa, rows * d.nh * d.W, rows * d.nh * d.R,
                          rows * (d.nope > d.R ? d.nope : d.R), rows * (d.R > d.hdv ? d.R : d.hdv),
                          rows * xmax / 4, rows * xmax / 32, rows * xmax / 32};
    uint64_t al = jlm_vk_offset_align(v->vk) / 4 ? jlm_vk_offset_align(v->vk) / 4 : 1;
    for (int r = 0; r < RG_N; r++)
        d.off[r + 1] = d.off[r] + (len[r] + al - 1) / al * al;
    return d;
}

uint64_t jlm_evk_mla_bytes(jlm_evk *v, const jlm_engine *e, uint32_t rows)
{
    return dims(v, e, rows).off[RG_N] * 4;
}

static jlm_evk *evk(const jlm_exd *k) { return k->be; }

/* floats [off, off + n) of scratch region r, of activation buffer b */
static jlm_vk_view sv(const jlm_exd *k, const mla_dims *d, int r, uint64_t off, uint64_t n)
{
    return (jlm_vk_view){evk(k)->blk.mla, (d->off[r] + off) * 4, n * 4};
}
static jlm_vk_view av(const jlm_exd *k, int b, uint64_t off, uint64_t n)
{
    return (jlm_vk_view){evk(k)->blk.ab[b], off * 4, n * 4};
}

static int mm(const jlm_exd *k, const jlm_k_mat *m, uint64_t kk, uint64_t rows, jlm_vk_view x, jlm_vk_view y)
{
    if (m->k != kk || m->rows != rows)
        return UNSUP;
    return jlm_evk_matmul_rows(evk(k), m, k->b.n, x, y, 0, k->dry, k->err);
}

/* n floats from row t of src (stride ss) to row t of dst (ds), for every row: one copy. */
static int move_rows(const jlm_exd *k, jlm_vk_view dst, uint64_t ds, jlm_vk_view src, uint64_t ss, uint64_t n)
{
    return jlm_vk_copy_rows(evk(k)->vk, dst, ds * 4, src, ss * 4, n * 4, k->b.n, k->err);
}

/* For each head h: rows (src + h * shs, stride ss, m.k floats) times sheet h
 * of role -> rows (dst + h * dhs, stride ds, m.rows floats), through the GI and GO regions. */
typedef struct head_io { jlm_vk_view src; uint64_t ss, shs; jlm_vk_view dst; uint64_t ds, dhs; } head_io;

static int heads_one_by_one(const jlm_exd *k, const mla_dims *d, uint16_t role, uint64_t kk, uint64_t rows,
                            head_io io)
{
    int rc = JLM_OK;
    uint32_t n = k->b.n;
    for (uint64_t h = 0; !rc && h < d->nh; h++) {
        if (!k->dry)
            evk(k)->st.sheet_matvecs++;
        jlm_k_mat m = jlm_ex_mla_sheet(k->e, &k->b, role, (uint32_t)h);
        jlm_vk_view s = io.src, o = io.dst;
        s.off += h * io.shs * 4;
        o.off += h * io.dhs * 4;
        if (!k->dry)
            rc = move_rows(k, sv(k, d, RG_GI, 0, 0), kk, s, io.ss, kk);
        if (!rc)
            rc = mm(k, &m, kk, rows, sv(k, d, RG_GI, 0, n * kk), sv(k, d, RG_GO, 0, n * rows));
        if (!rc && !k->dry)
            rc = move_rows(k, o, io.ds, sv(k, d, RG_GO, 0, 0), rows, rows);
    }
    return rc;
}

/* The same as one batched matvec, if it can be bound: sheet 0's planes and
 * the strides to the next sheet (b->n 0: it cannot). */
static int batch_of(const jlm_exd *k, const mla_dims *d, uint16_t role, uint64_t kk, uint64_t rows, head_io io,
                    jlm_vk_mat *vm, jlm_vk_batch *b)
{
    jlm_evk *v = evk(k);
    jlm_k_mat m[3];
    jlm_vk_mat v1, vl;
    jlm_ex_mla_sheet_ends(k->e, &k->b, role, m);
    *b = (jlm_vk_batch){0};
    int fl = jlm_fmt_type_traits(m[0].type)->is_float;
    if (m[0].k != kk || m[0].rows != rows)
        return UNSUP;
    if ((!fl && (!jlm_vk_can_quantize(v->vk) || io.ss % 32 || io.shs % 32 || kk % 32)) ||
        jlm_evk_planes(v, &m[0], vm, 0, NULL) || jlm_evk_planes(v, &m[1], &v1, 0, NULL) ||
        jlm_evk_planes(v, &m[2], &vl, 0, NULL))
        return JLM_OK;
    const jlm_vk_view *p0[3] = {&vm->qs, &vm->d, &vm->sc}, *p1[3] = {&v1.qs, &v1.d, &v1.sc},
                      *pl[3] = {&vl.qs, &vl.d, &vl.sc};
    uint64_t st[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++) {
        if (!p0[i]->buf)
            continue;
        if (p1[i]->buf != p0[i]->buf || pl[i]->buf != p0[i]->buf ||
            !jlm_exd_sheet_stride(p0[i]->off, p1[i]->off, pl[i]->off, d->nh, &st[i]) ||
            pl[i]->off + pl[i]->len - p0[i]->off > jlm_vk_max_binding(v->vk))
            return JLM_OK;
    }
    *b = (jlm_vk_batch){(uint32_t)d->nh, io.ss, io.ds, io.shs, io.dhs, st[0], st[1], st[2]};
    return JLM_OK;
}

/* For each head h: rows (src + h * shs, stride ss, kk floats) times sheet h
 * of role -> rows (dst + h * dhs, stride ds, rows floats): one batched
 * matvec (quantized: the input's rows quantized once, whole), or a matvec a head. */
static int heads_mm(const jlm_exd *k, const mla_dims *d, uint16_t role, uint64_t kk, uint64_t rows, head_io io)
{
    jlm_evk *v = evk(k);
    jlm_vk_mat vm;
    jlm_vk_batch bt;
    int rc = batch_of(k, d, role, kk, rows, io, &vm, &bt);
    if (rc || !bt.n)
        return rc ? rc : heads_one_by_one(k, d, role, kk, rows, io);
    if (k->dry)
        return JLM_OK;
    uint32_t n = k->b.n;
    uint64_t nx = n * io.ss;
    jlm_vk_view x = {io.src.buf, io.src.off, nx * 4}, y = {io.dst.buf, io.dst.off, n * io.ds * 4};
    jlm_vk_act va = {kk, sv(k, d, RG_XQ, 0, nx / 4), sv(k, d, RG_XD, 0, nx / 32), sv(k, d, RG_XS, 0, nx / 32), n};
    int fl = jlm_fmt_type_traits(vm.type)->is_float;
    rc = fl ? JLM_OK : jlm_vk_quantize(v->vk, x, nx, &va, k->err);
    v->st.matmuls++;
    v->st.sheet_matvecs++;
    return rc ? rc : jlm_vk_matmul_batch(v->vk, &vm, &bt, n, fl ? x : (jlm_vk_view){0}, fl ? NULL : &va, y, k->err);
}

/* The shapes the views need aligned, and the cache's type. */
static int shapes(const jlm_exd *k, const mla_dims *d)
{
    uint64_t al = jlm_vk_offset_align(evk(k)->vk);
    if (!d->R || d->W != d->R + d->rot || d->hd <= d->rot || (d->R * 4) % al || (d->W * 4) % al ||
        (d->hd * 4) % al || (d->nope * 4) % al || (d->qa * 4) % al || (k->e->kt == KV_F16 && (d->W * 2) % al) ||
        jlm_exd_width(k->e, JLM_B_Q) != d->nh * d->hd || jlm_exd_width(k->e, JLM_B_ATT) != d->nh * d->hdv)
        return UNSUP;
    return JLM_OK;
}

/* kv = h Wkv_a; the latent normed, the shared key rotated; both into the cache. */
static int mla_kv(jlm_exd *k, const jlm_op *op, const mla_dims *d)
{
    jlm_evk *v = evk(k);
    jlm_k_mat wkv = blk_mat(k->e, &k->b, op->w[0]);
    jlm_vk_view nw, cs;
    jlm_k_rope rp;
    uint32_t n = k->b.n, css;
    uint64_t es = k->e->kt == KV_F16 ? 2 : 4;
    int rc = jlm_evk_vec(v, blk_vec(k->e, &k->b, op->w[1]), d->R, &nw);
    if (!rc && (!nw.buf || jlm_evk_rope_cs(k, &rp, &cs, &css)))
        rc = UNSUP;
    if (!rc)
        rc = mm(k, &wkv, d->E, d->W, av(k, op->src, 0, n * d->E), av(k, JLM_B_K, 0, n * d->W));
    if (rc || k->dry)
        return rc;
    jlm_vk_view kr = av(k, JLM_B_K, 0, n * d->W);   /* each step one dispatch over the rows */
    rc = jlm_vk_rmsnorm_rows(v->vk, kr, kr, nw, (uint32_t)d->R, 1, n, (uint32_t)d->W, k->c->rms_eps, k->err);
    if (!rc)
        rc = jlm_vk_rope_rows(v->vk, rp.n_rot, rp.neox, av(k, JLM_B_K, d->R, n * d->W - d->R), 1, (uint32_t)d->rot,
                              (uint32_t)d->W, cs, css, n, k->err);
    for (uint32_t t = 0, m; !rc && t < n; t += m) {   /* the rows at consecutive positions, one store */
        m = jlm_evk_run_of(k, t);
        jlm_vk_view r = av(k, JLM_B_K, t * d->W, m * d->W);
        jlm_vk_view dst = {v->blk.kc[k->b.l], jlm_exd_pos(k, t) * d->W * es, m * d->W * es};
        rc = es == 4 ? jlm_vk_copy(v->vk, dst, r, m * d->W * 4, k->err)
                     : jlm_vk_to_f16(v->vk, dst, r, (uint32_t)(m * d->W), k->err);
    }
    return rc;
}

/* q = rmsnorm(h Wq_a) Wq_b (or h Wq) into the Q rows. */
static int q_proj(jlm_exd *k, const jlm_op *op, const mla_dims *d)
{
    const jlm_ex_blk *b = &k->b;
    uint32_t n = b->n;
    uint64_t qd = d->nh * d->hd;
    jlm_vk_view h = av(k, op->src, 0, n * d->E), q = av(k, JLM_B_Q, 0, n * qd), qn;
    if (!d->qa) {
        jlm_k_mat wq = blk_mat(k->e, b, op->w[3]);
        return mm(k, &wq, d->E, qd, h, q);
    }
    jlm_k_mat wa = blk_mat(k->e, b, op->w[0]), wb = blk_mat(k->e, b, op->w[2]);
    int rc = jlm_evk_vec(evk(k), blk_vec(k->e, b, op->w[1]), d->qa, &qn);
    if (!rc && !qn.buf)
        rc = UNSUP;
    if (!rc)
        rc = mm(k, &wa, d->E, d->qa, h, sv(k, d, RG_QA, 0, n * d->qa));
    if (!rc && !k->dry)
        rc = jlm_vk_rmsnorm_rows(evk(k)->vk, sv(k, d, RG_QA, 0, n * d->qa), sv(k, d, RG_QA, 0, n * d->qa), qn,
                                 (uint32_t)d->qa, 1, n, (uint32_t)d->qa, k->c->rms_eps, k->err);
    return rc ? rc : mm(k, &wb, d->qa, qd, sv(k, d, RG_QA, 0, n * d->qa), q);
}

/* q projected, each head's RoPE part rotated; ql (row, head) = [nope Wk_b | rope]. */
static int mla_q(jlm_exd *k, const jlm_op *op, const mla_dims *d)
{
    jlm_evk *v = evk(k);
    uint64_t qd = d->nh * d->hd;
    jlm_vk_view cs;
    jlm_k_rope rp;
    uint32_t n = k->b.n, css;
    int rc = op->dst != JLM_B_Q || jlm_evk_rope_cs(k, &rp, &cs, &css) ? UNSUP : q_proj(k, op, d);
    if (!rc && !k->dry)   /* every row's heads rotated in one dispatch, their RoPE parts moved in one copy */
        rc = jlm_vk_rope_rows(v->vk, rp.n_rot, rp.neox, av(k, JLM_B_Q, d->nope, n * qd - d->nope), (uint32_t)d->nh,
                              (uint32_t)d->hd, (uint32_t)qd, cs, css, n, k->err);
    if (!rc && !k->dry)
        rc = jlm_vk_copy_rows(v->vk, sv(k, d, RG_QL, d->R, (n * d->nh - 1) * d->W + d->rot), d->W * 4,
                              av(k, JLM_B_Q, d->nope, n * qd - d->nope), d->hd * 4, d->rot * 4, (uint32_t)(n * d->nh),
                              k->err);
    if (rc)
        return rc;
    return heads_mm(k, d, JLM_R_ATTN_K_B_MAT, d->nope, d->R,
                    (head_io){av(k, JLM_B_Q, 0, 0), qd, d->hd, sv(k, d, RG_QL, 0, 0), d->nh * d->W, d->W});
}

/* Each row: all heads over the cached rows 0..pos (one KV head, the values
 * the latents), scaled as the CPU scales; each head's latent output x Wv_b -> dst. */
static int mla_attn(jlm_exd *k, const jlm_op *op, const mla_dims *d)
{
    jlm_evk *v = evk(k);
    uint64_t es = k->e->kt == KV_F16 ? 2 : 4;
    jlm_k_attn ap = {.head_dim = d->W, .head_dim_v = d->R, .k_stride = d->W, .v_stride = d->W,
                     .scale = jlm_ex_mla_scale(k->e)};
    int rc = op->dst != JLM_B_ATT ? UNSUP : JLM_OK;
    uint32_t n = k->b.n, *lh = rc || k->dry ? NULL : malloc((uint64_t)n * 2 * sizeof *lh);
    if (!rc && !k->dry && !lh)
        rc = jlm_errf(k->err, JLM_ENOMEM, "vulkan: out of memory");
    for (uint32_t t = 0; lh && t < n; t++)   /* each row over the cached rows 0..pos */
        lh[2 * t] = 0, lh[2 * t + 1] = jlm_exd_pos(k, t) + 1;
    if (lh) {
        int kt = es == 2 ? JLM_VK_KV_F16 : JLM_VK_KV_F32;
        jlm_evk_kv kv = {v->blk.kc[k->b.l], d->W * es, kt, v->blk.kc[k->b.l], d->W * es, kt};
        rc = jlm_evk_attend_rows(k, &ap, (uint32_t)d->nh, 1, lh, sv(k, d, RG_QL, 0, n * d->nh * d->W),
                                 (uint32_t)(d->nh * d->W), kv, NULL, sv(k, d, RG_OL, 0, n * d->nh * d->R),
                                 (uint32_t)(d->nh * d->R));
        free(lh);
    }
    if (rc)
        return rc;
    return heads_mm(k, d, op->w[1], d->R, d->hdv,
                    (head_io){sv(k, d, RG_OL, 0, 0), d->nh * d->R, d->R, av(k, JLM_B_ATT, 0, 0), d->nh * d->hdv,
                              d->hdv});
}

int jlm_evk_mla(jlm_exd *k, const jlm_op *op)
{
    mla_dims d = dims(evk(k), k->e, k->b.n);
    if (shapes(k, &d))
        return UNSUP;
    switch (op->kind) {
    case JLM_OP_MLA_KV: return mla_kv(k, op, &d);
    case JLM_OP_MLA_Q: return mla_q(k, op, &d);
    case JLM_OP_MLA_ATTN: return mla_attn(k, op, &d);
    default: return UNSUP;
    }
}
