/* prog.h - a block program: one transformer block's forward pass as a short
 * list of ops over named tensors, written once per architecture family
 * (engine/arch/<family>.c, as llama.cpp's src/models/) and run by the
 * executor (engine/exec.c; docs/engine.md, "Block programs").
 *
 * Owns: the op set, the names of the activation buffers the ops read and
 * write, and the family table. A program names its weights by role
 * (format/jlm_format.h JLM_R_*); a role whose tensor a layer lacks (a bias,
 * a q/k norm) is an op's optional operand and is skipped there, as the
 * converter's tensor list decides. A program holds no pointers: the same
 * program runs every layer of its kind (dense or MoE), on the CPU or with its
 * matmuls on a device backend. Internal to engine/.
 *
 * Failure: jlm_arch_program fails (JLM_EFORMAT, one line) for an
 * architecture without a family file. Programs are constant after open:
 * any thread may read them. */
#ifndef JLM_ENGINE_PROG_H
#define JLM_ENGINE_PROG_H

#include <stdint.h>

#include "base/jlm_err.h"

/* The activation buffers of a batch of rows (model_int.h's scratch). */
typedef enum jlm_actbuf {
    JLM_B_X,     /* (n, n_embd) the residual stream */
    JLM_B_H,     /* (n, n_embd) a normed copy of x */
    JLM_B_Q,     /* (n, q_dim) */
    JLM_B_K,     /* (n, kv_dim) */
    JLM_B_V,     /* (n, kv_dim_v) */
    JLM_B_ATT,   /* (n, n_head * head_dim_v) the attention's output */
    JLM_B_O,     /* (n, n_embd) a sub-layer's output, before the residual add */
    JLM_B_G,     /* (n, n_ff) gate, then the activation */
    JLM_B_U,     /* (n, n_ff) up */
    JLM_B_COUNT
} jlm_actbuf;

typedef enum jlm_op_kind {
    JLM_OP_NORM,        /* dst = rmsnorm(src) * w[0] (w[1]: the weight where w[0] is absent) */
    JLM_OP_QKV,         /* q, k, v = src Wq, Wk, Wv (w[0..2]) in one fused matmul (Q optional) */
    JLM_OP_KV_STORE,    /* k, v += biases (w[0], w[1]); k: q/k norm (w[2]), RoPE; into the KV cache */
    JLM_OP_KEYS_DONE,   /* every row's keys are cached before any row attends (a batch over chunks) */
    JLM_OP_Q,           /* q = rmsnorm(x) w[0] times Wq (w[1]), unless QKV left these rows' q */
    JLM_OP_Q_ROPE,      /* q += bias (w[0]); q/k norm (w[1]); RoPE */
    JLM_OP_ATTENTION,   /* att = softmax(q K^T) V over the cache (sinks: w[0]; SWA by layer) */
    JLM_OP_MATMUL,      /* dst = src W (w[0]) + bias (w[1], optional) */
    JLM_OP_RESIDUAL,    /* x += rmsnorm(src + bias w[0]) * w[1] (each optional) */
    JLM_OP_GATE_UP,     /* g = act(src Wg + b) * (src Wu + b): w[0] Wg, w[1] Wu, w[2], w[3] biases */
    JLM_OP_MOE,         /* x += the routed experts' mixture of src (router, experts: the MoE roles) */
    JLM_OP_LAYERNORM,   /* dst = layernorm(src) * w[0] + w[1] (the vision tower) */
    JLM_OP_SELF_ATTN,   /* att = softmax(q k^T / sqrt(hd)) v over every row, no cache, no mask (an image's patches) */
    JLM_OP_ACT,         /* dst = act(dst), elementwise (JLM_ACT_GELU, JLM_ACT_GELU_QUICK) */
    JLM_OP_MLA_KV,      /* latent attention: src Wkv_a -> normed latent + RoPE'd shared key, into the cache */
    JLM_OP_MLA_Q,       /* latent attention: q through the q-LoRA (or Wq), RoPE part rotated, nope part x Wk_b */
    JLM_OP_MLA_ATTN,    /* latent attention: MQA over the cached latents, each head's output x Wv_b -> dst */
    JLM_OP_COUNT
} jlm_op_kind;

typedef enum jlm_act {
    JLM_ACT_SWIGLU,       /* silu(g) * u */
    JLM_ACT_GELU_FP16,    /* gelu(g) * u, GELU through llama.cpp's fp16 table (gemma3) */
    JLM_ACT_SWIGLU_OAI,   /* gpt-oss: alpha 1.702, limit 7 */
    JLM_ACT_GELU,         /* gelu(x) through ggml's fp16 table (ungated: ACT) */
    JLM_ACT_GELU_QUICK,   /* x * sigmoid(1.702 x) (ungated: ACT) */
} jlm_act;

/* op flags */
enum {
    JLM_OPF_QK_WIDE = 1u << 0,   /* KV_STORE / Q_ROPE: the q/k norm over the whole projection (OLMoE) */
};

#define JLM_OP_W 4
typedef struct jlm_op {
    uint8_t  kind;            /* jlm_op_kind */
    uint8_t  dst, src;        /* jlm_actbuf */
    uint8_t  act;             /* jlm_act (GATE_UP, MOE) */
    uint8_t  route;           /* MOE: jlm_k_moe_route's mode (JLM_K_ROUTE_*) */
    uint8_t  flags;           /* JLM_OPF_* */
    uint16_t w[JLM_OP_W];     /* roles (JLM_R_*); 0: none */
} jlm_op;

#define JLM_PROG_MAX 20
typedef struct jlm_prog {
    const char *family;       /* "llama", "gemma3", ...: the file that wrote it */
    uint32_t    n;
    jlm_op      op[JLM_PROG_MAX];
} jlm_prog;

/* The op's name ("norm", "qkv", ...), for docs, --stats and the tests. */
const char *jlm_op_name(int kind);

/* The program of a block of architecture arch (JLM_ARCH_*): moe non-zero for
 * a block with routed experts. */
int jlm_arch_program(uint16_t arch, int moe, jlm_prog *out, jlm_err *err);
/* The program for config c: jlm_arch_program's, except deepseek2 with latent
 * attention (KVLoraRank > 0), which has its own family file (code 14 without
 * it is glm4moe, docs/format.md). */
struct jlm_config;
int jlm_arch_program_for(const struct jlm_config *c, int moe, jlm_prog *out, jlm_err *err);
void jlm_arch_deepseek2(jlm_prog *p, int moe);
void jlm_arch_llama4(jlm_prog *p, int moe);   /* llama with MoEStep > 0 */

/* ---------------------------------------------------------------- for the family files */
/* Appends one op (the builder below), or marks the program full: its n then
 * exceeds JLM_PROG_MAX and jlm_arch_program refuses it. */
void jlm_prog_op(jlm_prog *p, jlm_op op);

/* The parts most families share, with what differs as parameters:
 * the attention half (norm, fused QKV, the cache, attention, output matrix,
 * residual with an optional post-norm role) and the FFN half (dense
 * gate/up/down or the routed experts). */
typedef struct jlm_prog_attn {
    uint16_t post_norm;   /* role of the norm after the attention output (gemma3), 0: none */
    uint8_t  qk_norm;     /* q and k RMS norms (ATTN_Q_NORM, ATTN_K_NORM) */
    uint8_t  qk_flags;    /* JLM_OPF_QK_WIDE: those norms over the whole projection */
    uint8_t  sinks;       /* a learned sink logit per head (ATTN_SINKS) */
} jlm_prog_attn;
typedef struct jlm_prog_ffn {
    uint16_t norm, norm_alt;   /* pre-FFN norm role, and the role used where it is absent */
    uint16_t post_norm;        /* role of the norm after the FFN output, 0: none */
    uint8_t  act, route;
    uint8_t  shared;           /* MoE blocks: a shared expert (SHEXP_*) every token runs */
} jlm_prog_ffn;

/* MOE's route beyond the kernels' JLM_K_ROUTE_* modes, done by the executor
 * (exec_moe.c): sigmoid (ExpertSigmoid) or softmax probabilities, the exp_probs_b selection bias,
 * expert groups, renormalisation (unless NoExpertNorm) and ExpertScale, as
 * llama.cpp's build_moe_ffn with sigmoid gating (deepseek2, glm4moe). */
#define JLM_ROUTE_SIGMOID 8
/* Llama 4: the top-1 expert by router logit, its sigmoid multiplying the
 * expert's input (not its output; llama.cpp's weight_before_ffn). */
#define JLM_ROUTE_SIGMOID_IN 9
void jlm_prog_attn_part(jlm_prog *p, const jlm_prog_attn *a);
void jlm_prog_ffn_part(jlm_prog *p, const jlm_prog_ffn *f, int moe);

/* The family files' entries (engine/arch/). */
void jlm_arch_llama(jlm_prog *p, int moe);
void jlm_arch_qwen2(jlm_prog *p, int moe);
void jlm_arch_qwen3(jlm_prog *p, int moe);
void jlm_arch_olmoe(jlm_prog *p, int moe);
void jlm_arch_gemma3(jlm_prog *p, int moe);
void jlm_arch_phi3(jlm_prog *p, int moe);
void jlm_arch_gpt_oss(jlm_prog *p, int moe);
void jlm_arch_glm4moe(jlm_prog *p, int moe);
/* The vision tower's block (SigLIP / CLIP style: pre-LayerNorm, biased
 * projections, full self-attention, a GELU MLP); quick_gelu: its activation. */
void jlm_arch_clip(jlm_prog *p, int quick_gelu);

#endif
