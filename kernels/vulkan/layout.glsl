// layout.glsl - the shaders' side of kernels/layout.h, written from its field
// lists by kernels/vulkan/gen/layout_glsl.c; every build compares this file
// with that program's output and fails on a difference. Do not edit: change
// kernels/layout.h and run `make layout-glsl`.
// A shader declares its block as
//     layout(push_constant) uniform P { JLM_PUSH_<SHADER> } pc;

// stored type codes (format/jlm_format.h enum jlm_type)
const uint T_F32 = 1u;
const uint T_F16 = 2u;
const uint T_Q4_0 = 3u;
const uint T_Q8_0 = 4u;
const uint T_Q3_K = 5u;
const uint T_Q4_K = 6u;
const uint T_Q5_K = 7u;
const uint T_Q6_K = 8u;
const uint T_BF16 = 9u;
const uint T_Q5_0 = 10u;
const uint T_MXFP4 = 11u;
const uint T_Q5_1 = 12u;

// jlm_push_matvec (kernels/layout.h), 72 bytes; byte offsets: k 0 rows 4 u_lo 8 u_hi 12 qd 16 dd 20 sd 24 accum 28 r0 32 r1 36 ntok 40 tx 44 ty 48 bx 52 by 56 bq 60 bd 64 bs 68
#define JLM_PUSH_MATVEC uint k; uint rows; uint u_lo; uint u_hi; uint qd; uint dd; uint sd; uint accum; uint r0; uint r1; uint ntok; uint tx; uint ty; uint bx; uint by; uint bq; uint bd; uint bs;

// jlm_push_rmsnorm (kernels/layout.h), 16 bytes; byte offsets: n 0 has_w 4 eps 8 stride 12
#define JLM_PUSH_RMSNORM uint n; uint has_w; float eps; uint stride;

// jlm_push_layernorm (kernels/layout.h), 16 bytes; byte offsets: n 0 has_w 4 has_b 8 eps 12
#define JLM_PUSH_LAYERNORM uint n; uint has_w; uint has_b; float eps;

// jlm_push_softmax (kernels/layout.h), 4 bytes; byte offsets: n 0
#define JLM_PUSH_SOFTMAX uint n;

// jlm_push_eltwise (kernels/layout.h), 20 bytes; byte offsets: n 0 op 4 alpha 8 limit 12 m 16
#define JLM_PUSH_ELTWISE uint n; uint op; float alpha; float limit; uint m;

// jlm_push_rope (kernels/layout.h), 24 bytes; byte offsets: n_rot 0 neox 4 n_head 8 head_dim 12 x_stride 16 cs_stride 20
#define JLM_PUSH_ROPE uint n_rot; uint neox; uint n_head; uint head_dim; uint x_stride; uint cs_stride;

// jlm_push_attention (kernels/layout.h), 64 bytes; byte offsets: head_dim 0 head_dim_v 4 k_stride 8 v_stride 12 n_kv 16 group 20 has_mask 24 has_sink 28 scale 32 softcap 36 k_type 40 v_type 44 k_off 48 v_off 52 q_stride 56 o_stride 60
#define JLM_PUSH_ATTENTION uint head_dim; uint head_dim_v; uint k_stride; uint v_stride; uint n_kv; uint group; uint has_mask; uint has_sink; float scale; float softcap; uint k_type; uint v_type; uint k_off; uint v_off; uint q_stride; uint o_stride;

// jlm_push_kv_q8 (kernels/layout.h), 8 bytes; byte offsets: n 0 off 4
#define JLM_PUSH_KV_Q8 uint n; uint off;

// jlm_push_moe_route (kernels/layout.h), 16 bytes; byte offsets: n 0 n_used 4 mode 8 scale 12
#define JLM_PUSH_MOE_ROUTE uint n; uint n_used; uint mode; float scale;

// jlm_push_moe_combine (kernels/layout.h), 8 bytes; byte offsets: n 0 n_used 4
#define JLM_PUSH_MOE_COMBINE uint n; uint n_used;

// matvec.comp's specialization constant ids (jlm_spec_matvec's field index)
#define JLM_SPEC_MATVEC_TYPE 0
#define JLM_SPEC_MATVEC_W 1
#define JLM_SPEC_MATVEC_SUB 2
#define JLM_SPEC_MATVEC_P1 3
#define JLM_SPEC_MATVEC_D_SHARE 4
#define JLM_SPEC_MATVEC_NT 5
