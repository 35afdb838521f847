/* exec_mla.c - the executor's latent-attention ops (deepseek2; engine/prog.h
 * MLA_KV, MLA_Q, MLA_ATTN), in the absorbed form llama.cpp b10359 runs: the
 * cache holds, per layer and position, the normed latent (KVLoraRank values)
 * and the shared RoPE key (NRot), not expanded heads; each head's query is
 * moved into the latent space by its attn_k_b sheet, attends as one KV head
 * over the cached rows, and its latent output is expanded by its attn_v_b
 * sheet. Scale: mscale^2 / sqrt(HeadDim), mscale = 1 + YarnLogMul ln(YarnFactor)
 * (llama.cpp's deepseek2 graph), the RoPE's own YaRN magnitude cancelled.
 * See exec_int.h. */
#include "engine/exec_int.h"

#include <math.h>
#include <string.h>

/* Scratch regions of e->mla (model_open.c sizes them). */
typedef struct mla_buf { float *a, *b, *ql, *ol, *s, *row; uint64_t R, W, nope, a_len; } mla_buf;

static mla_buf mla_bufs(const jlm_engine *e)
{
    const jlm_config *c = e->c;
    mla_buf m = {.R = c->kv_lora_rank, .W = (uint64_t)c->kv_lora_rank + c->n_rot, .nope = e->hd - c->n_rot};
    m.a_len = c->q_lora_rank > e->hd ? c->q_lora_rank : e->hd;
    if (m.a_len < m.R) m.a_len = m.R;
    m.a = e->mla;
    m.b = m.a + e->nb * m.a_len;
    m.ql = m.b + e->nb * m.a_len;
    m.ol = m.ql + (uint64_t)c->n_head * e->nb * m.W;
    m.s = m.ol + (uint64_t)c->n_head * e->nb * m.W;
    m.row = m.s + e->kv_ctx;
    return m;
}

/* Cache row of (layer l, pos) in cache c: W values of kt's type (F32 or F16). */
static uint8_t *mla_row(const jlm_engine *e, void *c, uint32_t l, uint32_t pos)
{
    return (uint8_t *)c + ((uint64_t)l * e->kv_ctx + pos) * e->krow;
}

/* Sheet s (a head) of a 3-D tensor in the block's page: sheets back to back in each plane. */
jlm_k_mat jlm_ex_mla_sheet(const jlm_engine *e, const jlm_ex_blk *b, uint16_t role, uint32_t s)
{
    const jlm_tensor *t = W(e, (int32_t)b->l, role);
    jlm_tensor_planes pl = {0};
    jlm_fmt_tensor_planes(t, &pl, NULL);
    jlm_k_mat m = mat_at(t, b->page, b->page_off, 0);
    m.qs = (const uint8_t *)m.qs + s * pl.sheet_qs;
    if (m.d) m.d = (const uint8_t *)m.d + s * pl.sheet_d;
    if (m.sc) m.sc = (const uint8_t *)m.sc + s * pl.sheet_sc;
    return m;
}

/* Sheets 0, 1 (0 when there is one) and n_head - 1 of role: what a device
 * needs to bind all heads' sheets as one batch (their stride, their span). */
void jlm_ex_mla_sheet_ends(const jlm_engine *e, const jlm_ex_blk *b, uint16_t role, jlm_k_mat m[3])
{
    uint32_t nh = e->c->n_head;
    m[0] = jlm_ex_mla_sheet(e, b, role, 0);
    m[1] = jlm_ex_mla_sheet(e, b, role, nh > 1 ? 1 : 0);
    m[2] = jlm_ex_mla_sheet(e, b, role, nh - 1);
}

/* Layer l's RoPE with llama.cpp's deepseek2 attn_factor: YaRN's magnitude
 * 1 + 0.1 ln(1/freq_scale) divided out (it is in the score scale instead). */
void jlm_ex_mla_rope(const jlm_engine *e, uint32_t l, jlm_k_rope *rp)
{
    jlm_ex_rope_params(e, l, rp);
    if (rp->ext_factor != 0.0f)
        rp->attn_factor = 1.0f / (1.0f + 0.1f * logf(1.0f / rp->freq_scale));
}

/* kv = h Wkv_a; the latent normed; the shared key rotated; both cached. */
void jlm_ex_mla_kv(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b)
{
    const jlm_config *c = e->c;
    mla_buf mb = mla_bufs(e);
    jlm_k_mat wkv = blk_mat(e, b, op->w[0]);
    const float *norm = blk_vec(e, b, op->w[1]);
    float *kv = e->kk, csb[JLM_MAX_HEAD_DIM];
    jlm_ex_matmul(e, &wkv, b->n, jlm_ex_buf(e, op->src), kv);
    jlm_k_rope rp;
    jlm_ex_mla_rope(e, b->l, &rp);
    for (uint32_t t = 0; t < b->n; t++) {
        float *r = kv + (uint64_t)t * mb.W;
        jlm_k_rmsnorm(r, r, norm, mb.R, c->rms_eps);
        jlm_k_rope_cos_sin(&rp, e->bpos[t], csb);
        jlm_k_rope_rotate(csb, &rp, r + mb.R, 1, c->n_rot);
        jlm_kv_put_row(e->kt, mla_row(e, e->bkc[t], b->l, e->bpos[t]), r, (uint32_t)mb.W);
    }
}

/* q = rmsnorm(h Wq_a) Wq_b (or h Wq); per head the RoPE part rotated and the
 * nope part moved into the latent space by attn_k_b: ql (head, row) = [latent | rope]. */
void jlm_ex_mla_q(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b)
{
    const jlm_config *c = e->c;
    mla_buf mb = mla_bufs(e);
    float *q = jlm_ex_buf(e, op->dst), *h = jlm_ex_buf(e, op->src), csb[JLM_MAX_HEAD_DIM];
    if (c->q_lora_rank) {
        jlm_k_mat wa = blk_mat(e, b, op->w[0]), wb = blk_mat(e, b, op->w[2]);
        const float *qn = blk_vec(e, b, op->w[1]);
        jlm_ex_matmul(e, &wa, b->n, h, mb.a);
        for (uint32_t t = 0; t < b->n; t++)
            jlm_k_rmsnorm(mb.a + (uint64_t)t * c->q_lora_rank, mb.a + (uint64_t)t * c->q_lora_rank, qn,
                          c->q_lora_rank, c->rms_eps);
        jlm_ex_matmul(e, &wb, b->n, mb.a, q);
    } else {
        jlm_k_mat wq = blk_mat(e, b, op->w[3]);
        jlm_ex_matmul(e, &wq, b->n, h, q);
    }
    jlm_k_rope rp;
    jlm_ex_mla_rope(e, b->l, &rp);
    for (uint32_t t = 0; t < b->n; t++) {
        jlm_k_rope_cos_sin(&rp, e->bpos[t], csb);
        for (uint32_t hh = 0; hh < c->n_head; hh++) {
            float *qh = q + ((uint64_t)t * c->n_head + hh) * e->hd;
            jlm_k_rope_rotate(csb, &rp, qh + mb.nope, 1, c->n_rot);
            memcpy(mb.ql + ((uint64_t)hh * e->nb + t) * mb.W + mb.R, qh + mb.nope, c->n_rot * sizeof(float));
        }
    }
    for (uint32_t hh = 0; hh < c->n_head; hh++) {   /* one matmul of every row's nope part per head */
        jlm_k_mat kb = jlm_ex_mla_sheet(e, b, JLM_R_ATTN_K_B_MAT, hh);
        for (uint32_t t = 0; t < b->n; t++)
            memcpy(mb.a + (uint64_t)t * mb.nope, q + ((uint64_t)t * c->n_head + hh) * e->hd, mb.nope * sizeof(float));
        jlm_ex_matmul(e, &kb, b->n, mb.a, mb.b);
        for (uint32_t t = 0; t < b->n; t++)
            memcpy(mb.ql + ((uint64_t)hh * e->nb + t) * mb.W, mb.b + (uint64_t)t * mb.R, mb.R * sizeof(float));
    }
}

float jlm_ex_mla_scale(const jlm_engine *e)
{
    const jlm_config *c = e->c;
    float ms = c->yarn_factor > 0 ? 1.0f + c->yarn_log_mul * logf(c->yarn_factor) : 1.0f;
    return ms * ms / sqrtf((float)e->hd);
}

/* Each head of each row: softmax over positions 0..pos of ql . [latent | key]
 * times the scale; its latent output the weighted latents; then x Wv_b. */
void jlm_ex_mla_attn(jlm_engine *e, const jlm_op *op, jlm_ex_blk *b)
{
    const jlm_config *c = e->c;
    mla_buf mb = mla_bufs(e);
    float scale = jlm_ex_mla_scale(e);
    for (uint32_t t = 0; t < b->n; t++) {
        uint32_t np = e->bpos[t] + 1;
        for (uint32_t hh = 0; hh < c->n_head; hh++) {
            const float *ql = mb.ql + ((uint64_t)hh * e->nb + t) * mb.W;
            float *ol = mb.ol + ((uint64_t)hh * e->nb + t) * mb.W;
            for (uint32_t p = 0; p < np; p++) {
                const uint8_t *src = mla_row(e, e->bkc[t], b->l, p);
                const float *r = (const float *)src;
                if (e->kt != KV_F32) {
                    jlm_kv_get_row(e->kt, src, mb.row, (uint32_t)mb.W);
                    r = mb.row;
                }
                float d = 0.0f;
                for (uint64_t i = 0; i < mb.W; i++)
                    d += ql[i] * r[i];
                mb.s[p] = d * scale;
            }
            jlm_k_softmax(mb.s, np);
            memset(ol, 0, mb.R * sizeof(float));
            for (uint32_t p = 0; p < np; p++) {
                const uint8_t *src = mla_row(e, e->bkc[t], b->l, p);
                if (e->kt == KV_F16) {
                    for (uint64_t i = 0; i < mb.R; i++)
                        ol[i] += mb.s[p] * jlm_k_fp16_to_f32(((const uint16_t *)src)[i]);
                } else {
                    jlm_k_axpy(ol, mb.s[p], (const float *)src, mb.R);
                }
            }
        }
    }
    float *att = jlm_ex_buf(e, op->dst);
    uint32_t hdv = e->hd_v;
    for (uint32_t hh = 0; hh < c->n_head; hh++) {
        jlm_k_mat vb = jlm_ex_mla_sheet(e, b, op->w[1], hh);
        for (uint32_t t = 0; t < b->n; t++)
            memcpy(mb.a + (uint64_t)t * mb.R, mb.ol + ((uint64_t)hh * e->nb + t) * mb.W, mb.R * sizeof(float));
        jlm_ex_matmul(e, &vb, b->n, mb.a, mb.b);
        for (uint32_t t = 0; t < b->n; t++)
            memcpy(att + ((uint64_t)t * c->n_head + hh) * hdv, mb.b + (uint64_t)t * hdv, hdv * sizeof(float));
    }
}
