/* jlm_format.h - the .jlm v27 container: types, records, plane arithmetic,
 * layout planner, validating reader and atomic writer.
 *
 * Owns: the byte map of ../shared/docs/jlm-format.md (and docs/format.md for
 * what the project decided where that page is silent). Knows nothing of GGUF,
 * safetensors, kernels' math or I/O policy (paging lives in engine/).
 *
 * Invariants (numbered, so a review can cite them):
 *  (1) A decoded jlm_model has passed every open-time check of jlm-format.md
 *      section 3 and every decode-time check of 4.1; every tensor's planes lie
 *      inside the region (dense / text page / vision page / expert page) that
 *      jlm_fmt_tensor_loc() names for it.
 *  (2) Plane lengths are never stored: jlm_fmt_planes() derives them from type
 *      and shape, and is the only place that does.
 *  (3) The planner computes every offset from shapes alone; the writer only
 *      fills bytes at offsets the planner gave.
 *  (4) A failed write leaves neither OUT nor OUT.part behind.
 *
 * Thread safety: a jlm_model is immutable after jlm_fmt_open() and may be
 * shared by readers; the writer is single-threaded.
 * Memory: jlm_model owns everything it points to; jlm_fmt_close frees it all.
 */
#ifndef JLM_FORMAT_H
#define JLM_FORMAT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/io.h"
#include "base/jlm_err.h"

#define JLM_VERSION      27u
/* The writer string of this build's fingerprint (4.7); compared on load. */
#define JLM_WRITER_NAME  "jlm convert 0.1 (format 27)"
#define JLM_ALIGN        4096u
#define JLM_HEADER_LEN   192u
#define JLM_MAGIC        "JITLLM\0\0"
#define JLM_MAX_CHUNK    (1u << 20)

static inline uint64_t jlm_align_up(uint64_t x) { return (x + (JLM_ALIGN - 1)) & ~(uint64_t)(JLM_ALIGN - 1); }

/* ---------------------------------------------------------------- type codes (4.6) */
enum jlm_type {
    JLM_T_NONE = 0, JLM_T_F32 = 1, JLM_T_F16 = 2, JLM_T_Q4_0 = 3, JLM_T_Q8_0 = 4,
    JLM_T_Q3_K = 5, JLM_T_Q4_K = 6, JLM_T_Q5_K = 7, JLM_T_Q6_K = 8, JLM_T_BF16 = 9,
    JLM_T_Q5_0 = 10, JLM_T_MXFP4 = 11, JLM_T_Q5_1 = 12,
    JLM_T_COUNT = 13
};

/* Per-type packing constants (7.1); see jlm_fmt_type_traits(). */
typedef struct jlm_type_traits {
    const char *name;     /* "Q4_K" */
    uint8_t  is_float;    /* F32/F16/BF16: one row-major span */
    uint8_t  elem_bytes;  /* float types: 4 or 2; else 0 */
    uint16_t sub;         /* Sub: elements per sub-block */
    uint8_t  p0, p1;      /* primary / secondary plane bits */
    uint8_t  w;           /* W = Sub*(P0+P1)/32 words per sub-block per row */
    uint8_t  super_sub;   /* sub-blocks per super-block */
    uint8_t  d_share;     /* S: rows sharing one d word (4 MXFP4; 2 Q4_0/Q8_0/Q5_0; else 1) */
    uint8_t  sc_kind;     /* 0 none, 1 byte per 16-wide sub-block (Q3_K, Q6_K), 2 96-bit stream (Q4_K, Q5_K) */
} jlm_type_traits;

/* NULL for an unknown code. Cannot fail. */
const jlm_type_traits *jlm_fmt_type_traits(uint8_t type);

/* Unrounded plane lengths in bytes of one 2-D sheet (k x rows) of `type` (7.4).
 * Returns JLM_EFORMAT if k is not a multiple of the type's super-block width, or
 * on overflow; outputs untouched then. */
int jlm_fmt_planes(uint8_t type, uint64_t k, uint64_t rows,
                   uint64_t *qs_len, uint64_t *d_len, uint64_t *sc_len, jlm_err *err);

/* ---------------------------------------------------------------- arch, roles, flags (4.4, 4.5) */
enum jlm_arch {
    JLM_ARCH_NONE = 0, JLM_ARCH_LLAMA = 1, JLM_ARCH_QWEN2 = 2, JLM_ARCH_QWEN3 = 3,
    JLM_ARCH_QWEN3MOE = 4, JLM_ARCH_OLMOE = 5, JLM_ARCH_GEMMA = 6, JLM_ARCH_PHI3 = 7,
    JLM_ARCH_CLIP = 8, JLM_ARCH_QWEN2VL = 10, JLM_ARCH_GEMMA2 = 11, JLM_ARCH_GEMMA3 = 12,
    JLM_ARCH_GPTOSS = 13, JLM_ARCH_DEEPSEEK2 = 14, JLM_ARCH_QWEN2MOE = 29,
};
const char *jlm_fmt_arch_name(uint16_t arch);   /* NULL if unknown */

enum jlm_role {
    JLM_R_TOKEN_EMBD = 1, JLM_R_OUTPUT = 2, JLM_R_OUTPUT_NORM = 3,
    JLM_R_ATTN_NORM = 16, JLM_R_ATTN_Q = 17, JLM_R_ATTN_K = 18, JLM_R_ATTN_V = 19,
    JLM_R_ATTN_OUT = 20, JLM_R_ATTN_Q_B = 22, JLM_R_ATTN_K_B = 23, JLM_R_ATTN_V_B = 24,
    JLM_R_ATTN_OUT_B = 25, JLM_R_ATTN_Q_NORM = 26, JLM_R_ATTN_K_NORM = 27,
    JLM_R_POST_ATTN_NORM = 28, JLM_R_ATTN_SINKS = 30,
    JLM_R_FFN_NORM = 32, JLM_R_FFN_GATE = 33, JLM_R_FFN_UP = 34, JLM_R_FFN_DOWN = 35,
    JLM_R_POST_FFW_NORM = 36,
    /* multi-head latent attention (deepseek2; docs/format.md "Roles") */
    JLM_R_ATTN_Q_A = 37, JLM_R_ATTN_Q_A_NORM = 38, JLM_R_ATTN_Q_B_MAT = 39,
    JLM_R_ATTN_KV_A_MQA = 40, JLM_R_ATTN_KV_A_NORM = 41, JLM_R_ATTN_K_B_MAT = 42, JLM_R_ATTN_V_B_MAT = 43,
    JLM_R_ROUTER_B = 44, JLM_R_EXP_GATE_B = 45, JLM_R_EXP_UP_B = 46, JLM_R_EXP_DOWN_B = 47,
    JLM_R_ROUTER = 48, JLM_R_EXP_GATE = 49, JLM_R_EXP_UP = 50, JLM_R_EXP_DOWN = 51,
    JLM_R_EXP1_GATE = 52, JLM_R_EXP1_UP = 53, JLM_R_EXP1_DOWN = 54,
    JLM_R_SHEXP_GATE_INP = 55, JLM_R_SHEXP_GATE = 56, JLM_R_SHEXP_UP = 57, JLM_R_SHEXP_DOWN = 58,
    JLM_R_ROPE_LONG = 59, JLM_R_ROPE_SHORT = 60, JLM_R_ROPE_FREQS = 61,
    JLM_R_EXP_PROBS_B = 62,   /* the expert-selection bias (exp_probs_b): chooses, never weighs */
    /* vision tower, 64..93 (docs/vision.md); block -1 unless a tower block's */
    JLM_R_V_PATCH_EMBD = 64, JLM_R_V_PATCH_EMBD_B = 65, JLM_R_V_POS_EMBD = 66,
    JLM_R_V_PRE_LN = 67, JLM_R_V_PRE_LN_B = 68, JLM_R_V_POST_LN = 69, JLM_R_V_POST_LN_B = 70,
    JLM_R_V_LN1 = 71, JLM_R_V_LN1_B = 72, JLM_R_V_ATTN_Q = 73, JLM_R_V_ATTN_Q_B = 74,
    JLM_R_V_ATTN_K = 75, JLM_R_V_ATTN_K_B = 76, JLM_R_V_ATTN_V = 77, JLM_R_V_ATTN_V_B = 78,
    JLM_R_V_ATTN_OUT = 79, JLM_R_V_ATTN_OUT_B = 80, JLM_R_V_LN2 = 81, JLM_R_V_LN2_B = 82,
    JLM_R_V_FFN_UP = 83, JLM_R_V_FFN_UP_B = 84, JLM_R_V_FFN_DOWN = 85, JLM_R_V_FFN_DOWN_B = 86,
    JLM_R_V_FFN_GATE = 87, JLM_R_V_FFN_GATE_B = 88,
    JLM_R_MM_INPUT_PROJ = 89, JLM_R_MM_SOFT_EMB_NORM = 90,   /* gemma3 projector; 91..93 free */
};
#define JLM_R_VISION_FIRST 64
#define JLM_R_VISION_LAST  93
const char *jlm_fmt_role_name(uint16_t role);   /* "attn_q", NULL if unknown */
/* Names of the vision roles 64..93 (docs/vision.md): "v.post_ln", a tower
 * block's "attn_q"; NULL outside the assigned ones. */
const char *jlm_fmt_vision_role_name(uint16_t role);
/* 1 if the role is "expanded" into the dense region even inside a block (5). */
int jlm_fmt_role_is_dense(uint16_t role);
/* 1 for an expert bank (49/50/51). */
int jlm_fmt_role_is_bank(uint16_t role);

enum jlm_flag {
    JLM_F_GELU = 1u << 0, JLM_F_TIED_EMBD = 1u << 1, JLM_F_QK_NORM = 1u << 2,
    JLM_F_QK_NORM_WIDE = 1u << 3, JLM_F_NO_EXPERT_NORM = 1u << 4, JLM_F_ROPE_NEOX = 1u << 7,
    JLM_F_ATTN_OUT_GATE = 1u << 8, JLM_F_QUICK_GELU = 1u << 9, JLM_F_SWIGLU_OAI = 1u << 11,
    JLM_F_EXPERT_SIGMOID = 1u << 13, JLM_F_NO_POS_ENC = 1u << 14, JLM_F_NON_CAUSAL = 1u << 15,
    JLM_F_LAYER_NORM = 1u << 24, JLM_F_PARALLEL_RESIDUAL = 1u << 25,
};
#define JLM_F_KNOWN_MASK 0x0300EB9Fu   /* bits 0-4,7,8,9,11,13,14,15,24,25 */

/* ---------------------------------------------------------------- config record (4.1) */
typedef struct jlm_config {
    uint16_t arch;
    uint32_t n_layer, n_embd, n_head, n_kv_head, head_dim, n_rot, n_ffn, n_vocab, n_ctx;
    uint32_t n_expert, n_expert_used, n_ffn_exp, swa_window, swa_period;
    float    rms_eps, rope_base, attn_factor, embd_scale, rope_base_swa;
    uint32_t flags;
    uint32_t n_ffn_shexp;
    uint32_t ssm_conv_kernel, ssm_groups, ssm_inner, ssm_state, ssm_n_head_v;
    uint32_t n_layer_kinds;      /* 0 or n_layer */
    uint8_t *layer_kinds;        /* (n_layer_kinds,) owned */
    uint32_t rope_sections[4];
    float    attn_softcap, final_softcap, yarn_factor;
    uint32_t yarn_orig_ctx;
    float    yarn_beta_fast, yarn_beta_slow, rope_linear;
    uint32_t head_dim_v, n_dense_lead, q_lora_rank, kv_lora_rank;
    float    yarn_log_mul, expert_scale;
    uint32_t n_expert_group, n_expert_group_used;
    /* tail 1 */
    uint32_t moe_step; float attn_temp_scale; uint32_t attn_temp_floor; float attn_temp_offset;
    /* tail 2 */
    float    attn_scale, residual_scale, logit_scale;
    /* tail 3 */
    float    clamp_kqv;
    /* tail 4 */
    uint32_t head_dim_swa, n_kv_head_swa, n_rot_swa, flags2, n_kv_shared, ple_dim;
} jlm_config;

/* ---------------------------------------------------------------- vision record (4.2) */
typedef struct jlm_vision {
    uint32_t n_layer, n_embd, n_head, n_ffn, image_size, patch_size, proj_dim, scale;
    float    eps;
    uint16_t projector;
    float    mean[3], std[3];
    uint32_t flags;
    uint32_t min_tiles, max_tiles, win_pattern, win_size, min_pixels, max_pixels;
} jlm_vision;
/* Projector codes (4.2) and vision Flags bits (the project's, docs/vision.md). */
enum { JLM_PROJ_NONE = 0, JLM_PROJ_IDEFICS3 = 1, JLM_PROJ_MLP = 2, JLM_PROJ_QWEN2VL = 3, JLM_PROJ_GEMMA3 = 4 };
enum { JLM_VF_GELU = 1u << 0, JLM_VF_QUICK_GELU = 1u << 9 };

/* ---------------------------------------------------------------- vocab record (4.3) */
typedef struct jlm_str { const char *s; uint32_t len; } jlm_str;   /* s is NUL-terminated when decoded */

enum jlm_vocab_kind { JLM_VOCAB_NONE = 0, JLM_VOCAB_SPM = 1, JLM_VOCAB_BPE = 2, JLM_VOCAB_WPM = 3, JLM_VOCAB_SPBPE = 4 };
enum jlm_token_kind { JLM_TOK_NORMAL = 1, JLM_TOK_UNKNOWN = 2, JLM_TOK_CONTROL = 3,
                      JLM_TOK_USER = 4, JLM_TOK_UNUSED = 5, JLM_TOK_BYTE = 6 };

typedef struct jlm_preop {
    uint8_t kind, contractions, case_fold, letter_marks, digit_group, use_regex,
            add_prefix_space, individual;
    jlm_str behavior;
    uint8_t case_runs, suffix_contract, punct_slash, han_runs;
} jlm_preop;

typedef struct jlm_added_token {
    int32_t id;
    jlm_str content;
    uint8_t special, lstrip, rstrip, normalized, single_word;
} jlm_added_token;

typedef struct jlm_vocab {
    uint8_t  kind;
    uint32_t n_tokens;        jlm_str *tokens;        /* (n_tokens,) */
    uint32_t n_scores;        float   *scores;        /* 0 or n_tokens */
    uint32_t n_token_kinds;   uint8_t *token_kinds;   /* 0 or n_tokens */
    uint32_t n_merges;        jlm_str *merges;        /* (n_merges, 2): left, right */
    uint32_t n_added;         jlm_added_token *added;
    int32_t  bos, eos, unk, pad, sep, mask;          /* -1 = none */
    uint8_t  add_bos, add_eos, add_space_prefix, byte_fallback, ignore_merges;
    uint32_t n_preops;        jlm_preop *preops;
    jlm_str  pre_name;
    uint32_t n_templates;     jlm_str *templates;     /* (n_templates, 2): name, body */
    /* tails */
    uint32_t n_punct_no_newline; uint8_t *punct_no_newline;  /* 0 or n_preops */
    uint32_t n_stop;          int32_t *stop;
} jlm_vocab;

/* ---------------------------------------------------------------- tensor table (4.4) */
typedef struct jlm_tensor {
    uint16_t role;
    int32_t  block;           /* -1: no block */
    int32_t  index;           /* -1 unless a single-expert role */
    uint8_t  type;
    uint8_t  ndim;            /* 1..4 */
    uint64_t dims[4];         /* fastest first: k, rows, sheets...; unused = 1 */
    uint64_t qs_off, d_off, sc_off;   /* absolute file offsets */
    jlm_str  name;
} jlm_tensor;

static inline uint64_t jlm_tensor_k(const jlm_tensor *t)    { return t->dims[0]; }
static inline uint64_t jlm_tensor_rows(const jlm_tensor *t) { return t->ndim > 1 ? t->dims[1] : 1; }
static inline uint64_t jlm_tensor_sheets(const jlm_tensor *t)
{ uint64_t n = 1; for (int i = 2; i < t->ndim; i++) n *= t->dims[i]; return n; }

/* Where a tensor's planes live. */
enum jlm_region { JLM_REG_DENSE = 0, JLM_REG_TEXT = 1, JLM_REG_VISION = 2, JLM_REG_EXPERT = 3 };

/* Plane lengths of a whole tensor as stored (per sheet for an expert bank,
 * sheets back to back for other 3-D tensors), unrounded. Cannot fail for a
 * tensor of a decoded model (invariant 1). */
typedef struct jlm_tensor_planes {
    uint64_t qs_len, d_len, sc_len;   /* unrounded, whole tensor (one sheet for a bank) */
    uint64_t sheet_qs, sheet_d, sheet_sc; /* unrounded, one 2-D sheet */
} jlm_tensor_planes;
int jlm_fmt_tensor_planes(const jlm_tensor *t, jlm_tensor_planes *out, jlm_err *err);

/* ---------------------------------------------------------------- fingerprint (4.7) */
typedef struct jlm_fingerprint {
    jlm_str  host, device, writer;
    uint64_t vram;
} jlm_fingerprint;

/* ---------------------------------------------------------------- header (3) */
typedef struct jlm_header {
    uint32_t version;
    uint64_t page_size;
    uint32_t n_blocks, n_tensors;
    uint64_t cfg_off, cfg_len, tab_off, tab_len, data_off, dense_off, dense_len;
    uint64_t fp_off, fp_len, voc_off, voc_len, vis_off, vis_len;
    uint64_t vis_data_off, vis_page_size;
    uint32_t n_vis_blocks;
    uint64_t chunk;
    uint32_t stream_groups, n_exp_pages;
    uint64_t exp_data_off, exp_page_size;
} jlm_header;

/* Header codec. encode writes exactly JLM_HEADER_LEN bytes; decode checks magic
 * and version only (jlm_fmt_header_validate checks the rest against a file size). */
void jlm_fmt_header_encode(const jlm_header *h, uint8_t out[JLM_HEADER_LEN]);
int  jlm_fmt_header_decode(const uint8_t *buf, size_t len, jlm_header *h, jlm_err *err);
/* Every open-time check of section 3 against file_size. */
int  jlm_fmt_header_validate(const jlm_header *h, uint64_t file_size, jlm_err *err);

/* ---------------------------------------------------------------- byte buffer for encoders */
typedef struct jlm_buf { uint8_t *p; size_t len, cap; int oom; } jlm_buf;
void jlm_buf_free(jlm_buf *b);

/* Section encoders append to b (b->oom set on allocation failure). */
void jlm_fmt_config_encode(jlm_buf *b, const jlm_config *c);
void jlm_fmt_vision_encode(jlm_buf *b, const jlm_vision *v);
void jlm_fmt_vocab_encode(jlm_buf *b, const jlm_vocab *v);
void jlm_fmt_tensor_encode(jlm_buf *b, const jlm_tensor *t);
void jlm_fmt_fingerprint_encode(jlm_buf *b, const jlm_fingerprint *f);

/* Section decoders. Strings and arrays are allocated from *arena (freed with
 * jlm_arena_free); on failure nothing is written to *out. `what` names the
 * file in messages. */
typedef struct jlm_arena jlm_arena;
jlm_arena *jlm_arena_new(void);
void       jlm_arena_free(jlm_arena *a);
void      *jlm_arena_alloc(jlm_arena *a, size_t n);   /* zeroed, 16-aligned; NULL on OOM */
int jlm_fmt_config_decode(const uint8_t *p, size_t len, jlm_arena *a, jlm_config *out, const char *what, jlm_err *err);
int jlm_fmt_config_check(const jlm_config *c, const char *what, jlm_err *err);

/* Untrusted sizes (sanity.c, docs/security.md). Limits on config dimensions:
 * far above any published model, low enough that every product the planner
 * and the engine form fits 64 bits and every per-expert stack array holds. */
#define JLM_MAX_LAYERS        4096u
#define JLM_MAX_DIM           (1u << 20)
#define JLM_MAX_HEADS         4096u
#define JLM_MAX_HEAD_DIM      8192u
#define JLM_MAX_VOCAB         (1u << 24)
#define JLM_MAX_EXPERTS       1024u
#define JLM_MAX_EXPERTS_USED  256u
#define JLM_MAX_TENSORS       (1u << 20)
/* JLM_ERANGE naming the field when a dimension exceeds its limit (called by
 * jlm_fmt_config_check). */
int jlm_fmt_config_bounds(const jlm_config *c, const char *what, jlm_err *err);
/* JLM_EFORMAT naming the tensor and dimension when a tensor's shape disagrees
 * with the config, or a block below n_layer has no tensor. Text archs only. */
int jlm_fmt_shapes_check(const jlm_config *c, const jlm_tensor *ts, uint32_t n, const char *what, jlm_err *err);
int jlm_fmt_vision_decode(const uint8_t *p, size_t len, jlm_vision *out, const char *what, jlm_err *err);
int jlm_fmt_vocab_decode(const uint8_t *p, size_t len, jlm_arena *a, jlm_vocab *out, const char *what, jlm_err *err);
int jlm_fmt_table_decode(const uint8_t *p, size_t len, uint32_t n, jlm_arena *a, jlm_tensor **out, const char *what, jlm_err *err);
int jlm_fmt_fingerprint_decode(const uint8_t *p, size_t len, jlm_arena *a, jlm_fingerprint *out, const char *what, jlm_err *err);

/* ---------------------------------------------------------------- layout planner (pass 1, section 5/6) */
/* Input: a config, optional vision record, vocab, fingerprint and the tensor
 * list in table order (offsets ignored). Output: the header and every tensor's
 * offsets, from shapes alone. The plan owns copies of the encoded sections. */
typedef struct jlm_plan {
    jlm_header  hdr;
    uint32_t    n_tensors;
    jlm_tensor *tensors;        /* (n_tensors,) offsets filled; names borrowed */
    jlm_buf     cfg, vis, voc, tab, fp;   /* encoded sections */
    uint64_t    file_size;      /* EOF */
    uint64_t    dense_used;     /* dense bytes before rounding */
} jlm_plan;

typedef struct jlm_plan_input {
    const jlm_config      *config;
    const jlm_vision      *vision;      /* NULL: no tower */
    const jlm_vocab       *vocab;
    const jlm_fingerprint *fp;
    uint32_t               n_tensors;
    const jlm_tensor      *tensors;
} jlm_plan_input;

/* Plans the whole file. JLM_EFORMAT/EUNSUPPORTED on a shape or type that
 * cannot be laid out, JLM_ENOMEM; *out untouched on error. */
int  jlm_fmt_plan(const jlm_plan_input *in, jlm_plan *out, jlm_err *err);
void jlm_fmt_plan_free(jlm_plan *p);   /* accepts NULL */

/* ---------------------------------------------------------------- reader */
typedef struct jlm_model {
    char           *path;
    int             fd;           /* open read-only; -1 for jlm_fmt_parse */
    uint64_t        file_size;
    jlm_header      hdr;
    jlm_config      config;
    jlm_vision      vision;       /* zero when hdr.vis_len == 0 */
    int             has_vision;
    jlm_vocab       vocab;
    jlm_fingerprint fp;
    jlm_tensor     *tensors;      /* (hdr.n_tensors,) */
    uint8_t        *meta;         /* bytes [0, DenseOff) as read at open */
    jlm_arena      *arena;
} jlm_model;

/* Opens and validates a container (one read of [0, DenseOff)). Error messages
 * name the path. *out untouched on error. */
int  jlm_fmt_open(const char *path, jlm_model **out, jlm_err *err);
/* The same on a descriptor already open on the container (O_NONBLOCK, so a
 * FIFO is refused, never waited on), which it takes: it becomes m->fd, or is
 * closed on error. path names it in messages. The engine reads the metadata,
 * the checksum records and the pages through one open file this way, so a
 * path replaced between its reads (a jlmfs view whose source changed) never
 * pairs one version's metadata with another's pages. */
int  jlm_fmt_open_fd(int fd, const char *path, jlm_model **out, jlm_err *err);
/* The descriptor jlm_fmt_open reads through (read-only, close-on-exec,
 * non-blocking): JLM_EIO naming path and errno on failure. */
int  jlm_fmt_open_file(const char *path, int *fd, jlm_err *err);
/* An open, fstat or read of the container at path that failed (errno): JLM_EIO,
 * "PATH: WHAT: strerror" (WHAT NULL: none), and ESTALE said in words (a jlmfs
 * view whose source was replaced between the open and this call). */
int  jlm_fmt_io_error(const char *path, const char *what, jlm_err *err);
/* Same checks on bytes in memory: buf holds at least [0, DenseOff) of a file
 * whose total size is file_size. For tests and fuzzing. */
int  jlm_fmt_parse(const uint8_t *buf, size_t len, uint64_t file_size, const char *what,
                   jlm_model **out, jlm_err *err);
void jlm_fmt_close(jlm_model *m);   /* accepts NULL */

/* Region and page of a tensor: page is the block index (text), vision block,
 * or expert page (expert 0's page for a bank); -1 for dense. Cannot fail for a
 * decoded model. */
typedef struct jlm_tensor_loc {
    int      region;        /* enum jlm_region */
    int64_t  page;
    uint64_t page_off;      /* file offset of that page (DenseOff for dense) */
} jlm_tensor_loc;
void jlm_fmt_tensor_loc(const jlm_model *m, const jlm_tensor *t, jlm_tensor_loc *out);
/* Find by identity; NULL if absent. */
const jlm_tensor *jlm_fmt_find(const jlm_model *m, uint16_t role, int32_t block, int32_t index);
/* Extent of page i of a region: furthest byte any tensor uses, rounded to 4096,
 * relative to the page start. */
uint64_t jlm_fmt_page_extent(const jlm_model *m, int region, uint32_t page);

/* ---------------------------------------------------------------- atomic writer (6) */
/* I/O goes through the jlm_io seam of base/io.h (tests inject EIO/ENOSPC/short writes). */

typedef struct jlm_writer jlm_writer;
/* Creates OUT.part pre-sized to plan->file_size and writes header and
 * sections up to DenseOff. */
int  jlm_fmt_writer_open(const char *out_path, const jlm_plan *plan, const jlm_io *io,
                         jlm_writer **w, jlm_err *err);
/* Writes bytes at an absolute offset (must be inside the file). */
int  jlm_fmt_writer_pwrite(jlm_writer *w, const void *buf, size_t n, uint64_t off, jlm_err *err);
/* fsync, rename OUT.part -> OUT. Frees w whatever the result; on failure the
 * .part is removed. */
int  jlm_fmt_writer_commit(jlm_writer *w, jlm_err *err);
/* Removes OUT.part and frees w. Accepts NULL. */
void jlm_fmt_writer_abort(jlm_writer *w);
/* The .part path (for signal handlers that must unlink it). */
const char *jlm_fmt_writer_part_path(const jlm_writer *w);

#endif
