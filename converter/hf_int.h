/* hf_int.h - private declarations shared by hf.c (config and tensors) and
 * hf_tok.c (tokenizer.json): the folder being built into a virtual handle. */
#ifndef JLM_HF_INT_H
#define JLM_HF_INT_H

#include "converter/hf.h"
#include "converter/safetensors.h"

#include <jansson.h>
#include <stdio.h>

enum { FAM_LLAMA, FAM_QWEN2, FAM_QWEN3, FAM_QWEN3MOE, FAM_GEMMA3, FAM_PHI3, FAM_OLMOE, FAM_GPTOSS, FAM_DEEPSEEK2,
       FAM_GLM4MOE, FAM_LLAMA4 };

typedef struct cls_def { const char *hf, *gguf; int fam; } cls_def;

typedef struct hfc {
    const cls_def *cls;
    uint32_t n_layer, n_embd, n_ffn, n_head, n_kv, head_dim, n_ctx, n_vocab;
    uint32_t n_expert, n_expert_used, n_ffn_exp, swa, swa_pattern, n_rot;
    double   eps, theta, theta_swa, attn_softcap, final_softcap;
    int      tied, head_dim_given;
    /* rope_scaling: 0 none, 1 linear, 2 yarn, 3 llama3 */
    int      rope_kind;
    double   rope_factor, rope_low, rope_high;
    uint32_t rope_orig_ctx;
    double   yarn_beta_fast, yarn_beta_slow, yarn_log_mul;   /* < 0: absent (no key written) */
    /* deepseek2 / glm4moe / llama4 (section 2 of docs/safetensors.md) */
    uint32_t n_dense_lead, n_shared, n_ffn_shexp, n_group, n_group_used, gating, nextn, moe_step;
    uint32_t q_lora, kv_lora, qk_nope, qk_rope, v_head;
    double   routed_scale;   /* 0: absent */
    int      norm_topk, swa_off;
    const char *prefix;      /* tensor name prefix of the text model ("language_model.") or "" */
} hfc;

typedef struct vsrc {
    const jlm_st_tensor **seg;   /* one per expert (stacked) or one */
    uint32_t n_seg;
    uint64_t seg_rows, row_len;
    uint32_t perm_heads;         /* llama q/k: rows permuted per head (0: none) */
    int      add_one;            /* gemma norms: w + 1 */
    const float *data;           /* a generated F32 tensor (llama3 rope_freqs): no segments */
    /* gpt-oss experts: every segment (expert) is a slice of one HF tensor */
    int      shared;             /* segment k starts at source row k * src_seg_rows of seg[k] */
    uint64_t src_seg_rows;
    uint32_t rstride, rphase;    /* source row of row i: i * rstride + rphase (gate/up rows interleaved) */
    uint32_t cstride, cphase;    /* source element of element j: j * cstride + cphase (gate/up biases) */
    const jlm_st_tensor **scales;/* MXFP4: the _scales tensor of each segment (seg[] are the _blocks) */
    /* transposed: element j of row r of segment k is source row k * src_seg_rows
     * + rphase + j, column cphase + r (rows of src_row_len elements); llama4's
     * [E, in, out] experts and deepseek2's attn_k_b from kv_b_proj */
    int      transposed;
    uint64_t src_row_len;
} vsrc;

typedef struct hf {
    jlm_st_set      *st;
    const char      *dir;
    int              dir_fd;       /* the folder (O_PATH); -1 in memory */
    int              beneath;      /* files opened below dir_fd, no symlink followed */
    hfc              c;
    jlm_gguf_kv     *kv;
    uint64_t         n_kv, cap_kv;
    jlm_gguf_tensor *t;
    vsrc            *src;
    uint64_t         n_t, cap_t, cap_src;
    void           **own;
    uint64_t         n_own, cap_own;
    jlm_err         *err;
    uint64_t         json_bytes;   /* config / tokenizer files read: with the shards, the source's size */
    uint64_t         n_skipped;    /* NextN/MTP layer and vision tensors left out */
} hf;
/* A string (printf) / a malloc'd block owned by h, freed with it; NULL on ENOMEM. */
char *jlm_hf_own(hf *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void *jlm_hf_keep(hf *h, void *p);
/* A new metadata entry ("<arch>.key" when arch_key); NULL on ENOMEM. */
jlm_gguf_kv *jlm_hf_kv(hf *h, const char *key, int arch_key, uint32_t type);
int jlm_hf_kv_str(hf *h, const char *key, const char *v);

/* hf_spm.c: BPE with byte fallback and U+2581 (llama-2 / gemma3 style) as
 * llama.cpp's "llama" model: the parts tokenizer.json must have, and scores. */
int jlm_hf_spm_pre(hf *h, const char *path, json_t *pre);
int jlm_hf_spm_norm_dec(hf *h, const char *path, json_t *norm, json_t *dec, int *prepend);
int jlm_hf_spm_is_byte(const char *s);
int jlm_hf_spm_plain(const char *s, json_t *vocab);
int jlm_hf_spm_scores(hf *h, const char *path, json_t *tok, uint32_t n);

/* tokenizer.json + tokenizer_config.json (+ generation_config.json) of h->dir
 * -> llama.cpp's tokenizer.ggml.* keys; n_vocab: config.json's vocab_size or 0.
 * Without tokenizer.json: tokenizer.ggml.model "none". Notes go to notes. */
int jlm_hf_tokenizer(hf *h, json_t *tok, json_t *tok_cfg, json_t *gen_cfg, uint32_t n_vocab, FILE *notes);

#endif
