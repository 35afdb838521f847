/* test_format.c - the .jlm v27 container: header byte map, section round
 * trips, planner placement rules, validating reader refusals, atomic writer. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>

#include "format/jlm_format.h"
#include "tests/testutil.h"

/* ---------------------------------------------------------------- fixtures */
static jlm_str S(const char *s) { jlm_str r = {s, (uint32_t)strlen(s)}; return r; }

static jlm_config small_config(void)
{
    jlm_config c = {0};
    c.arch = JLM_ARCH_LLAMA;
    c.n_layer = 2; c.n_embd = 64; c.n_head = 4; c.n_kv_head = 2; c.head_dim = 16; c.n_rot = 16;
    c.n_ffn = 128; c.n_vocab = 32; c.n_ctx = 256; c.n_expert = 4; c.n_expert_used = 2; c.n_ffn_exp = 64;
    c.rms_eps = 1e-5f; c.rope_base = 10000.0f;
    return c;
}

static jlm_vocab small_vocab(void)
{
    static jlm_str toks[32];
    static char names[32][16];
    for (int i = 0; i < 32; i++) {
        snprintf(names[i], sizeof names[i], "t%d", i);
        toks[i] = S(names[i]);
    }
    jlm_vocab v = {0};
    v.kind = JLM_VOCAB_SPM;
    v.n_tokens = 32; v.tokens = toks;
    v.bos = 1; v.eos = 2; v.unk = 0; v.pad = -1; v.sep = -1; v.mask = -1;
    v.add_bos = 1; v.add_space_prefix = 1; v.byte_fallback = 1;
    return v;
}

#define T(role_, blk_, type_, nd, d0, d1, d2, nm) \
    {.role = role_, .block = blk_, .index = -1, .type = type_, .ndim = nd, .dims = {d0, d1, d2, 1}, .name = {nm, sizeof(nm) - 1}}

static const jlm_tensor SMALL_TENSORS[] = {
    T(JLM_R_TOKEN_EMBD, -1, JLM_T_F32, 2, 64, 32, 1, "token_embd.weight"),
    T(JLM_R_OUTPUT_NORM, -1, JLM_T_F32, 1, 64, 1, 1, "output_norm.weight"),
    T(JLM_R_ATTN_NORM, 0, JLM_T_F32, 1, 64, 1, 1, "blk.0.attn_norm.weight"),
    T(JLM_R_ATTN_Q, 0, JLM_T_Q4_0, 2, 64, 64, 1, "blk.0.attn_q.weight"),
    T(JLM_R_ATTN_K, 0, JLM_T_Q8_0, 2, 64, 32, 1, "blk.0.attn_k.weight"),
    T(JLM_R_ROUTER, 0, JLM_T_F32, 2, 64, 4, 1, "blk.0.ffn_gate_inp.weight"),
    T(JLM_R_EXP_GATE, 0, JLM_T_Q8_0, 3, 64, 64, 4, "blk.0.ffn_gate_exps.weight"),
    T(JLM_R_EXP_DOWN, 0, JLM_T_Q4_0, 3, 64, 64, 4, "blk.0.ffn_down_exps.weight"),
    T(JLM_R_ATTN_NORM, 1, JLM_T_F32, 1, 64, 1, 1, "blk.1.attn_norm.weight"),
    T(JLM_R_ATTN_Q, 1, JLM_T_Q6_K, 2, 256, 64, 1, "blk.1.attn_q.weight"),
    T(JLM_R_FFN_DOWN, 1, JLM_T_Q4_K, 2, 256, 64, 1, "blk.1.ffn_down.weight"),
};
#define N_SMALL (sizeof SMALL_TENSORS / sizeof SMALL_TENSORS[0])

static jlm_config g_cfg;
static jlm_vocab g_voc;
static jlm_fingerprint g_fp;

static int plan_small(jlm_plan *p, jlm_err *err)
{
    g_cfg = small_config();
    g_voc = small_vocab();
    g_fp.host = S("test"); g_fp.device = S("cpu"); g_fp.writer = S("test_format");
    jlm_plan_input in = {.config = &g_cfg, .vocab = &g_voc, .fp = &g_fp, .n_tensors = N_SMALL, .tensors = SMALL_TENSORS};
    return jlm_fmt_plan(&in, p, err);
}

/* Writes the small container to dir/small.jlm; returns its bytes. */
static unsigned char *write_small(const char *dir, size_t *len)
{
    jlm_plan p;
    jlm_err err = {0};
    cr_assert_eq(plan_small(&p, &err), 0, "plan: %s", err.msg);
    char out[512];
    snprintf(out, sizeof out, "%s/small.jlm", dir);
    jlm_writer *w;
    cr_assert_eq(jlm_fmt_writer_open(out, &p, NULL, &w, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_fmt_writer_commit(w, &err), 0, "%s", err.msg);
    jlm_fmt_plan_free(&p);
    return tu_read_file(out, len);
}

static uint64_t rd64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t rd32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* ---------------------------------------------------------------- header */
Test(fmt_header, puts_every_field_at_its_documented_offset)
{
    jlm_header h = {.version = 27, .page_size = 0x1111000, .n_blocks = 0x22, .n_tensors = 0x33,
                    .cfg_off = 0x44, .cfg_len = 0x55, .tab_off = 0x66, .tab_len = 0x77, .data_off = 0x88,
                    .dense_off = 0x99, .dense_len = 0xAA, .fp_off = 0xBB, .fp_len = 0xCC, .voc_off = 0xDD,
                    .voc_len = 0xEE, .vis_off = 0xFF, .vis_len = 0x101, .vis_data_off = 0x202,
                    .vis_page_size = 0x303, .n_vis_blocks = 0x404, .chunk = 0x505, .stream_groups = 0x606,
                    .n_exp_pages = 0x707, .exp_data_off = 0x808, .exp_page_size = 0x909};
    unsigned char b[JLM_HEADER_LEN];
    jlm_fmt_header_encode(&h, b);
    cr_assert(!memcmp(b, "JITLLM\0\0", 8), "magic");
    struct { int off, w; uint64_t v; const char *n; } f[] = {
        {8, 4, 27, "version"}, {12, 4, 0, "reserved"}, {16, 8, 0x1111000, "PageSize"}, {24, 4, 0x22, "NBlocks"},
        {28, 4, 0x33, "NTensors"}, {32, 8, 0x44, "CfgOff"}, {40, 8, 0x55, "CfgLen"}, {48, 8, 0x66, "TabOff"},
        {56, 8, 0x77, "TabLen"}, {64, 8, 0x88, "DataOff"}, {72, 8, 0x99, "DenseOff"}, {80, 8, 0xAA, "DenseLen"},
        {88, 8, 0xBB, "FPOff"}, {96, 8, 0xCC, "FPLen"}, {104, 8, 0xDD, "VocOff"}, {112, 8, 0xEE, "VocLen"},
        {120, 8, 0xFF, "VisOff"}, {128, 8, 0x101, "VisLen"}, {136, 8, 0x202, "VisDataOff"},
        {144, 8, 0x303, "VisPageSize"}, {152, 4, 0x404, "NVisBlocks"}, {156, 4, 0, "unused"},
        {160, 8, 0x505, "Chunk"}, {168, 4, 0x606, "StreamGroups"}, {172, 4, 0x707, "NExpPages"},
        {176, 8, 0x808, "ExpDataOff"}, {184, 8, 0x909, "ExpPageSize"},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        uint64_t got = f[i].w == 8 ? rd64(b + f[i].off) : rd32(b + f[i].off);
        cr_expect_eq(got, f[i].v, "%s at %d: got 0x%llx, expected 0x%llx", f[i].n, f[i].off,
                     (unsigned long long)got, (unsigned long long)f[i].v);
    }
    jlm_header back;
    cr_assert_eq(jlm_fmt_header_decode(b, sizeof b, &back, NULL), 0);
    unsigned char b2[JLM_HEADER_LEN];
    jlm_fmt_header_encode(&back, b2);
    cr_assert(!memcmp(b, b2, sizeof b), "header round trip");
}

Test(fmt_header, refuses_a_wrong_magic)
{
    unsigned char b[JLM_HEADER_LEN] = "GGUF";
    jlm_header h;
    jlm_err err = {0};
    cr_assert_eq(jlm_fmt_header_decode(b, sizeof b, &h, &err), JLM_EFORMAT);
    cr_assert(strstr(err.msg, "not a jlm container"), "message: %s", err.msg);
}

static void version_refused(uint32_t v)
{
    jlm_header h = {.version = v};
    unsigned char b[JLM_HEADER_LEN];
    jlm_fmt_header_encode(&h, b);
    jlm_err err = {0};
    jlm_header out;
    cr_assert_eq(jlm_fmt_header_decode(b, sizeof b, &out, &err), JLM_EVERSION);
    char want[64];
    snprintf(want, sizeof want, "container version %u, this build reads 27", v);
    cr_assert(strstr(err.msg, want), "message '%s' should contain '%s'", err.msg, want);
    cr_assert(strstr(err.msg, "jlm convert"), "message says how to rebuild: %s", err.msg);
}

Test(fmt_header, refuses_version_26_naming_it) { version_refused(26); }
Test(fmt_header, refuses_version_28_naming_it) { version_refused(28); }

/* ---------------------------------------------------------------- config */
static jlm_config full_config(void)
{
    static uint8_t kinds[3] = {1, 2, 1};
    jlm_config c = {0};
    c.arch = JLM_ARCH_DEEPSEEK2;   /* latent attention, groups, dense lead: every field within its relations */
    c.n_layer = 3; c.n_embd = 2; c.n_head = 8; c.n_kv_head = 4; c.head_dim = 5; c.n_rot = 4; c.n_ffn = 7;
    c.n_vocab = 8; c.n_ctx = 9; c.n_expert = 10; c.n_expert_used = 3; c.n_ffn_exp = 11; c.swa_window = 12;
    c.swa_period = 13; c.rms_eps = 1e-6f; c.rope_base = 1e6f; c.attn_factor = 1.5f; c.embd_scale = 16.0f;
    c.rope_base_swa = 1e4f; c.flags = JLM_F_GELU | JLM_F_ROPE_NEOX | JLM_F_LAYER_NORM; c.n_ffn_shexp = 14;
    c.ssm_conv_kernel = 15; c.ssm_groups = 16; c.ssm_inner = 17; c.ssm_state = 18; c.ssm_n_head_v = 19;
    c.n_layer_kinds = 3; c.layer_kinds = kinds;
    c.rope_sections[0] = 20; c.rope_sections[1] = 21; c.rope_sections[2] = 22; c.rope_sections[3] = 23;
    c.attn_softcap = 50; c.final_softcap = 30; c.yarn_factor = 32; c.yarn_orig_ctx = 4096;
    c.yarn_beta_fast = 32; c.yarn_beta_slow = 1; c.rope_linear = 2; c.head_dim_v = 24; c.n_dense_lead = 2;
    c.q_lora_rank = 26; c.kv_lora_rank = 27; c.yarn_log_mul = 0.1f; c.expert_scale = 2.5f;
    c.n_expert_group = 5; c.n_expert_group_used = 4;
    c.moe_step = 3; c.attn_temp_scale = 0.5f; c.attn_temp_floor = 31; c.attn_temp_offset = -1.0f;
    c.attn_scale = 0.125f; c.residual_scale = 1.25f; c.logit_scale = 0.75f; c.clamp_kqv = 8.0f;
    c.head_dim_swa = 32; c.n_kv_head_swa = 33; c.n_rot_swa = 34; c.flags2 = 35; c.n_kv_shared = 36; c.ple_dim = 37;
    return c;
}

static void cfg_equal(const jlm_config *a, const jlm_config *b)
{
    jlm_config x = *a, y = *b;
    cr_assert_eq(x.n_layer_kinds, y.n_layer_kinds);
    if (x.n_layer_kinds)
        cr_assert(!memcmp(x.layer_kinds, y.layer_kinds, x.n_layer_kinds), "layer kinds");
    x.layer_kinds = y.layer_kinds = NULL;
    cr_assert(!memcmp(&x, &y, sizeof x), "every config field survives the round trip");
}

Test(fmt_config, round_trips_every_field_including_all_tails)
{
    jlm_config c = full_config(), back;
    jlm_buf b = {0};
    jlm_fmt_config_encode(&b, &c);
    jlm_arena *a = jlm_arena_new();
    jlm_err err = {0};
    cr_assert_eq(jlm_fmt_config_decode(b.p, b.len, a, &back, "t", &err), 0, "%s", err.msg);
    cfg_equal(&c, &back);
    cr_assert_eq(b.len, 106 + 4 + 3 + 76 + 16 + 12 + 4 + 24, "encoded length %zu", b.len);
    jlm_buf_free(&b);
    jlm_arena_free(a);
}

Test(fmt_config, writes_no_tail_when_all_tail_fields_are_zero_and_reads_them_as_zero)
{
    jlm_config c = small_config(), back;
    jlm_buf b = {0};
    jlm_fmt_config_encode(&b, &c);
    cr_assert_eq(b.len, 106 + 4 + 76, "no tails: %zu bytes", b.len);
    jlm_arena *a = jlm_arena_new();
    cr_assert_eq(jlm_fmt_config_decode(b.p, b.len, a, &back, "t", NULL), 0);
    cfg_equal(&c, &back);
    /* only tail 3 set: tails 1 and 2 are written as zeros before it */
    c.clamp_kqv = 4.0f;
    b.len = 0;
    jlm_fmt_config_encode(&b, &c);
    cr_assert_eq(b.len, 106 + 4 + 76 + 16 + 12 + 4);
    cr_assert_eq(jlm_fmt_config_decode(b.p, b.len, a, &back, "t", NULL), 0);
    cfg_equal(&c, &back);
    jlm_buf_free(&b);
    jlm_arena_free(a);
}

Test(fmt_config, refuses_an_unknown_architecture_code_naming_it)
{
    jlm_config c = small_config(), back;
    c.arch = 99;
    jlm_buf b = {0};
    jlm_fmt_config_encode(&b, &c);
    jlm_arena *a = jlm_arena_new();
    jlm_err err = {0};
    cr_assert_eq(jlm_fmt_config_decode(b.p, b.len, a, &back, "x.jlm", &err), JLM_EFORMAT);
    cr_assert(strstr(err.msg, "unknown architecture code 99"), "%s", err.msg);
    jlm_buf_free(&b);
    jlm_arena_free(a);
}

Test(fmt_config, refuses_the_decode_time_violations)
{
    jlm_arena *a = jlm_arena_new();
    jlm_config c, back;
    jlm_buf b = {0};
    jlm_err err;
#define REFUSE(mut, word) do { c = small_config(); mut; b.len = 0; jlm_fmt_config_encode(&b, &c); \
        memset(&err, 0, sizeof err); \
        cr_expect_eq(jlm_fmt_config_decode(b.p, b.len, a, &back, "x", &err), JLM_EFORMAT, "%s accepted", #mut); \
        cr_expect(strstr(err.msg, word), "'%s' should mention '%s'", err.msg, word); } while (0)
    static uint8_t two[2] = {1, 1};
    REFUSE(c.n_kv_head = 3, "kv heads");
    REFUSE(c.head_dim = 0, "head dim");
    REFUSE(c.n_expert_used = 5, "experts used");
    REFUSE((c.n_layer_kinds = 1, c.layer_kinds = two), "layer kinds");
    REFUSE(c.rms_eps = -1.0f, "rms_eps");
    REFUSE(c.rope_base = NAN, "rope_base");
    REFUSE(c.flags = 1u << 5, "retired");
    /* the MoE / latent-attention relations (format/sanity.c), each naming its field */
    REFUSE(c.n_dense_lead = 3, "n_dense_lead 3 exceeds the 2 blocks");
    REFUSE((c.n_expert = 0, c.n_expert_used = 0, c.n_dense_lead = 1), "n_dense_lead 1 without experts");
    REFUSE(c.moe_step = 3, "moe_step 3");
    REFUSE(c.n_expert_group_used = 1, "n_expert_group_used 1 without n_expert_group");
    REFUSE((c.n_expert_group = 3, c.n_expert_group_used = 1), "n_expert_group 3 does not divide");
    REFUSE((c.n_expert_group = 2, c.n_expert_group_used = 3), "n_expert_group_used 3 of 2 groups");
    REFUSE((c.n_expert_group = 4, c.n_expert_group_used = 1), "n_expert_used 2 exceeds the experts of 1 kept groups");
    REFUSE(c.kv_lora_rank = 32, "kv_lora_rank (latent attention) on architecture llama");
    REFUSE((c.arch = JLM_ARCH_DEEPSEEK2, c.q_lora_rank = 32), "q_lora_rank 32 without kv_lora_rank");
    REFUSE((c.arch = JLM_ARCH_DEEPSEEK2, c.kv_lora_rank = 32), "n_rot 16 < head_dim 16");
#undef REFUSE
    jlm_buf_free(&b);
    jlm_arena_free(a);
}

Test(fmt_config, refuses_a_record_cut_inside_a_field_or_a_tail)
{
    jlm_config c = full_config(), back;
    jlm_buf b = {0};
    jlm_fmt_config_encode(&b, &c);
    jlm_arena *a = jlm_arena_new();
    size_t base = 106 + 4 + 3 + 76;
    size_t ok_ends[] = {base, base + 16, base + 28, base + 32, b.len};
    for (size_t n = 0; n < b.len; n++) {
        int at_boundary = 0;
        for (size_t i = 0; i < 5; i++) at_boundary |= n == ok_ends[i];
        int rc = jlm_fmt_config_decode(b.p, n, a, &back, "x", NULL);
        if (at_boundary)
            cr_expect_eq(rc, 0, "record of %zu bytes ends at a tail boundary and is valid", n);
        else
            cr_expect_eq(rc, JLM_EFORMAT, "record cut at %zu bytes accepted", n);
    }
    jlm_buf_free(&b);
    jlm_arena_free(a);
}

/* ---------------------------------------------------------------- vocab */
Test(fmt_vocab, round_trips_every_field_and_both_tails)
{
    jlm_str toks[4] = {S("<unk>"), S("<s>"), S("a"), S("b")};
    float scores[4] = {0, -1, -2.5f, 3};
    uint8_t kinds[4] = {2, 3, 1, 1};
    jlm_str merges[2] = {S("a"), S("b")};
    jlm_added_token added[1] = {{1, {"<s>", 3}, 1, 0, 1, 0, 1}};
    jlm_preop ops[2] = {{.kind = 1, .contractions = 1, .digit_group = 3, .behavior = {"isolated", 8}, .han_runs = 1},
                        {.kind = 2, .add_prefix_space = 1, .behavior = {"", 0}}};
    jlm_str tmpl[4] = {S(""), S("{{ x }}"), S("tool_use"), S("{% if a %}b{% endif %}")};
    uint8_t pnn[2] = {1, 0};
    int32_t stop[2] = {2, 3};
    jlm_vocab v = {.kind = JLM_VOCAB_BPE, .n_tokens = 4, .tokens = toks, .n_scores = 4, .scores = scores,
                   .n_token_kinds = 4, .token_kinds = kinds, .n_merges = 1, .merges = merges, .n_added = 1,
                   .added = added, .bos = 1, .eos = 2, .unk = 0, .pad = -1, .sep = 3, .mask = -1, .add_bos = 1,
                   .add_eos = 0, .add_space_prefix = 1, .byte_fallback = 0, .ignore_merges = 1, .n_preops = 2,
                   .preops = ops, .pre_name = S("llama3"), .n_templates = 2, .templates = tmpl,
                   .n_punct_no_newline = 2, .punct_no_newline = pnn, .n_stop = 2, .stop = stop};
    jlm_buf b = {0};
    jlm_fmt_vocab_encode(&b, &v);
    jlm_arena *a = jlm_arena_new();
    jlm_vocab w;
    jlm_err err = {0};
    cr_assert_eq(jlm_fmt_vocab_decode(b.p, b.len, a, &w, "t", &err), 0, "%s", err.msg);
    cr_assert_eq(w.kind, v.kind);
    cr_assert_eq(w.n_tokens, 4);
    for (int i = 0; i < 4; i++) {
        cr_assert_str_eq(w.tokens[i].s, toks[i].s);
        cr_assert_eq(w.scores[i], scores[i]);
        cr_assert_eq(w.token_kinds[i], kinds[i]);
    }
    cr_assert_str_eq(w.merges[0].s, "a");
    cr_assert_str_eq(w.merges[1].s, "b");
    cr_assert_eq(w.n_added, 1);
    cr_assert(w.added[0].id == 1 && w.added[0].special && w.added[0].rstrip && w.added[0].single_word && !w.added[0].lstrip);
    cr_assert(w.bos == 1 && w.eos == 2 && w.unk == 0 && w.pad == -1 && w.sep == 3 && w.mask == -1);
    cr_assert(w.add_bos && !w.add_eos && w.add_space_prefix && !w.byte_fallback && w.ignore_merges);
    cr_assert_eq(w.n_preops, 2);
    cr_assert(w.preops[0].kind == 1 && w.preops[0].contractions && w.preops[0].digit_group == 3 && w.preops[0].han_runs);
    cr_assert_str_eq(w.preops[0].behavior.s, "isolated");
    cr_assert(w.preops[1].kind == 2 && w.preops[1].add_prefix_space);
    cr_assert_str_eq(w.pre_name.s, "llama3");
    cr_assert_eq(w.n_templates, 2);
    cr_assert_str_eq(w.templates[3].s, tmpl[3].s);
    cr_assert(w.n_punct_no_newline == 2 && w.punct_no_newline[0] == 1 && w.punct_no_newline[1] == 0);
    cr_assert(w.n_stop == 2 && w.stop[0] == 2 && w.stop[1] == 3);
    /* without the Stop tail, and then without both tails */
    v.n_stop = 0;
    size_t with_both = b.len;
    b.len = 0;
    jlm_fmt_vocab_encode(&b, &v);
    cr_assert_eq(b.len, with_both - 4 - 8, "stop tail dropped");
    v.n_punct_no_newline = 0;
    b.len = 0;
    jlm_fmt_vocab_encode(&b, &v);
    cr_assert_eq(b.len, with_both - 12 - 6, "both tails dropped");
    cr_assert_eq(jlm_fmt_vocab_decode(b.p, b.len, a, &w, "t", &err), 0, "%s", err.msg);
    cr_assert(w.n_stop == 0 && w.n_punct_no_newline == 0);
    jlm_buf_free(&b);
    jlm_arena_free(a);
}

Test(fmt_vocab, refuses_a_record_truncated_at_any_byte)
{
    jlm_vocab v = small_vocab();
    jlm_buf b = {0};
    jlm_fmt_vocab_encode(&b, &v);
    jlm_arena *a = jlm_arena_new();
    jlm_vocab w;
    for (size_t n = 0; n < b.len; n++)
        cr_expect_neq(jlm_fmt_vocab_decode(b.p, n, a, &w, "x", NULL), 0, "truncated at %zu accepted", n);
    jlm_buf_free(&b);
    jlm_arena_free(a);
}

Test(fmt_vocab, refuses_a_huge_token_count_before_allocating)
{
    unsigned char b[16] = {1, 0xff, 0xff, 0xff, 0x7f};
    jlm_arena *a = jlm_arena_new();
    jlm_vocab w;
    jlm_err err = {0};
    cr_assert_eq(jlm_fmt_vocab_decode(b, sizeof b, a, &w, "x.jlm", &err), JLM_EFORMAT);
    cr_assert(strstr(err.msg, "Tokens count"), "%s", err.msg);
    jlm_arena_free(a);
}

/* ---------------------------------------------------------------- planner */
Test(fmt_plan, puts_each_block_inside_its_page_and_each_expert_at_its_stride)
{
    jlm_plan p;
    jlm_err err = {0};
    cr_assert_eq(plan_small(&p, &err), 0, "%s", err.msg);
    const jlm_header *h = &p.hdr;
    cr_assert_eq(h->data_off % 4096, 0);
    cr_assert_eq(h->page_size % 4096, 0);
    cr_assert_eq(h->n_exp_pages, 4, "one MoE block x 4 experts");
    cr_assert_eq(h->exp_data_off, jlm_align_up(h->vis_data_off), "no tower: experts follow VisDataOff");
    cr_assert_eq(p.file_size, h->exp_data_off + 4 * h->exp_page_size);
    for (uint32_t i = 0; i < p.n_tensors; i++) {
        const jlm_tensor *t = &p.tensors[i];
        jlm_tensor_planes pl;
        cr_assert_eq(jlm_fmt_tensor_planes(t, &pl, NULL), 0);
        uint64_t lo, hi;
        if (t->block < 0 || jlm_fmt_role_is_dense(t->role)) { lo = h->dense_off; hi = lo + h->dense_len; }
        else if (jlm_fmt_role_is_bank(t->role)) { lo = h->exp_data_off; hi = lo + h->exp_page_size; }
        else { lo = h->data_off + (uint64_t)t->block * h->page_size; hi = lo + h->page_size; }
        uint64_t off[3] = {t->qs_off, t->d_off, t->sc_off}, len[3] = {pl.qs_len, pl.d_len, pl.sc_len};
        for (int k = 0; k < 3; k++) {
            if (len[k] == 0) {
                cr_expect_eq(off[k], t->qs_off, "%s: empty plane %d must sit at qsOff", t->name.s, k);
                continue;
            }
            cr_expect_eq(off[k] % 4096, 0, "%s plane %d aligned", t->name.s, k);
            cr_expect(off[k] >= lo && off[k] + len[k] <= hi, "%s plane %d [%llu,+%llu) inside [%llu,%llu)",
                      t->name.s, k, (unsigned long long)off[k], (unsigned long long)len[k],
                      (unsigned long long)lo, (unsigned long long)hi);
        }
    }
    jlm_fmt_plan_free(&p);
}

Test(fmt_plan, computes_chunk_from_the_smallest_paged_plane)
{
    jlm_plan p;
    cr_assert_eq(plan_small(&p, NULL), 0);
    /* smallest paged plane: blk.0.attn_k Q8_0 64x32: d = 2 supers * 16 words * 4 = 128 bytes -> 4096 floor;
       recompute independently: */
    uint64_t minp = UINT64_MAX;
    for (uint32_t i = 0; i < p.n_tensors; i++) {
        const jlm_tensor *t = &p.tensors[i];
        if (t->block < 0 || jlm_fmt_role_is_dense(t->role)) continue;
        jlm_tensor_planes pl;
        jlm_fmt_tensor_planes(t, &pl, NULL);
        uint64_t v[3] = {pl.sheet_qs, pl.sheet_d, pl.sheet_sc};
        for (int k = 0; k < 3; k++) if (v[k] && v[k] < minp) minp = v[k];
    }
    uint64_t want = 4096;
    while (want * 2 <= minp && want * 2 <= (1u << 20)) want *= 2;
    cr_assert_eq(p.hdr.chunk, want, "chunk %llu, expected %llu", (unsigned long long)p.hdr.chunk, (unsigned long long)want);
    cr_assert_eq(p.hdr.stream_groups, 1, "sheets far below 64 KiB: one stream group");
    jlm_fmt_plan_free(&p);
}

Test(fmt_plan, refuses_duplicate_identities)
{
    jlm_tensor ts[2] = {SMALL_TENSORS[0], SMALL_TENSORS[0]};
    jlm_config c = small_config();
    jlm_vocab v = small_vocab();
    jlm_fingerprint fp = {0};
    jlm_plan_input in = {.config = &c, .vocab = &v, .fp = &fp, .n_tensors = 2, .tensors = ts};
    jlm_plan p;
    jlm_err err = {0};
    cr_assert_eq(jlm_fmt_plan(&in, &p, &err), JLM_EFORMAT);
    cr_assert(strstr(err.msg, "same identity"), "%s", err.msg);
}

Test(fmt_plan, refuses_overflowing_dims)
{
    jlm_tensor t = SMALL_TENSORS[3];
    t.dims[0] = 1ull << 62;
    t.dims[1] = 1ull << 40;
    jlm_tensor_planes pl;
    jlm_err err = {0};
    cr_assert_eq(jlm_fmt_tensor_planes(&t, &pl, &err), JLM_EFORMAT);
    cr_assert(strstr(err.msg, "overflow"), "%s", err.msg);
}

/* ---------------------------------------------------------------- plane lengths (7.4, 7.6) */
Test(fmt_planes, give_the_documented_bytes_per_256_weights)
{
    struct { uint8_t t; uint64_t per256; } c[] = {
        {JLM_T_Q4_0, 144}, {JLM_T_Q8_0, 272}, {JLM_T_Q5_0, 176}, {JLM_T_Q5_1, 192}, {JLM_T_MXFP4, 136},
        {JLM_T_Q4_K, 144}, {JLM_T_Q5_K, 176}, {JLM_T_Q6_K, 212}, {JLM_T_Q3_K, 148},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        uint64_t q, d, s;
        cr_assert_eq(jlm_fmt_planes(c[i].t, 256, 4, &q, &d, &s, NULL), 0);
        cr_expect_eq(q + d + s, 4 * c[i].per256, "%s: %llu bytes for 4 rows of 256, expected %llu",
                     jlm_fmt_type_traits(c[i].t)->name, (unsigned long long)(q + d + s),
                     (unsigned long long)(4 * c[i].per256));
    }
}

/* ---------------------------------------------------------------- reader */
Test(fmt_reader, opens_what_the_writer_wrote)
{
    char *dir = tu_tmpdir();
    size_t len;
    unsigned char *b = write_small(dir, &len);
    char path[512];
    snprintf(path, sizeof path, "%s/small.jlm", dir);
    jlm_model *m;
    jlm_err err = {0};
    cr_assert_eq(jlm_fmt_open(path, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(m->hdr.n_tensors, N_SMALL);
    cr_assert_eq(m->config.n_layer, 2);
    cr_assert_str_eq(m->vocab.tokens[5].s, "t5");
    cr_assert_str_eq(m->fp.writer.s, "test_format");
    const jlm_tensor *t = jlm_fmt_find(m, JLM_R_EXP_DOWN, 0, -1);
    cr_assert(t);
    jlm_tensor_loc l;
    jlm_fmt_tensor_loc(m, t, &l);
    cr_assert_eq(l.region, JLM_REG_EXPERT);
    cr_assert_eq(l.page, 0);
    cr_assert_eq(jlm_fmt_page_extent(m, JLM_REG_EXPERT, 3) <= m->hdr.exp_page_size, 1);
    cr_assert_eq(len, m->file_size);
    jlm_fmt_close(m);
    free(b);
    tu_rmrf(dir);
    free(dir);
}

Test(fmt_reader, refuses_truncation_at_every_section_boundary)
{
    char *dir = tu_tmpdir();
    size_t len;
    unsigned char *b = write_small(dir, &len);
    jlm_header h;
    cr_assert_eq(jlm_fmt_header_decode(b, len, &h, NULL), 0);
    uint64_t cuts[] = {0, 7, 100, JLM_HEADER_LEN - 1, JLM_HEADER_LEN, h.cfg_off + h.cfg_len - 1, h.vis_off,
                       h.voc_off + 1, h.tab_off, h.tab_off + h.tab_len - 1, h.fp_off, h.fp_off + h.fp_len - 1,
                       h.dense_off, h.dense_off + h.dense_len - 1, h.data_off, h.data_off + h.page_size,
                       h.exp_data_off, h.exp_data_off + h.exp_page_size, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        uint64_t n = cuts[i];
        jlm_model *m = NULL;
        jlm_err err = {0};
        int rc = jlm_fmt_parse(b, n < h.dense_off ? n : h.dense_off, n, "cut.jlm", &m, &err);
        cr_expect_neq(rc, 0, "file cut at %llu of %zu bytes accepted", (unsigned long long)n, len);
        cr_expect(strstr(err.msg, "cut.jlm") || strstr(err.msg, "jlm container"), "message names the file: %s", err.msg);
        jlm_fmt_close(m);
    }
    free(b);
    tu_rmrf(dir);
    free(dir);
}

static void corrupt_u64(unsigned char *b, int off, uint64_t v) { memcpy(b + off, &v, 8); }

Test(fmt_reader, refuses_offsets_past_the_end_and_bad_page_geometry)
{
    char *dir = tu_tmpdir();
    size_t len;
    unsigned char *b = write_small(dir, &len);
    struct { int off; uint64_t v; const char *word; } cases[] = {
        {40, 1ull << 40, "past the end"},      /* CfgLen */
        {16, 4095, "multiple of 4096"},       /* PageSize */
        {160, 3000, "chunk"},                  /* Chunk */
        {160, 1ull << 40, "chunk"},
        {64, 4097, "aligned"},                 /* DataOff */
        {184, 1ull << 62, "past the end"},     /* ExpPageSize */
        {176, 1ull << 63, "page array"},       /* ExpDataOff */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char *c = malloc(len);
        memcpy(c, b, len);
        corrupt_u64(c, cases[i].off, cases[i].v);
        jlm_model *m = NULL;
        jlm_err err = {0};
        cr_expect_neq(jlm_fmt_parse(c, len, len, "bad.jlm", &m, &err), 0, "field at %d = %llu accepted", cases[i].off,
                      (unsigned long long)cases[i].v);
        cr_expect(strstr(err.msg, cases[i].word), "'%s' should mention '%s'", err.msg, cases[i].word);
        jlm_fmt_close(m);
        free(c);
    }
    free(b);
    tu_rmrf(dir);
    free(dir);
}

Test(fmt_reader, refuses_a_tensor_plane_outside_its_page)
{
    char *dir = tu_tmpdir();
    size_t len;
    unsigned char *b = write_small(dir, &len);
    jlm_model *m;
    cr_assert_eq(jlm_fmt_parse(b, len, len, "t", &m, NULL), 0);
    /* move blk.1.attn_q's qs plane into block 0's page: find its record in the table */
    const jlm_tensor *t = jlm_fmt_find(m, JLM_R_ATTN_Q, 1, -1);
    uint64_t want = t->qs_off, page0 = m->hdr.data_off;
    jlm_fmt_close(m);
    int patched = 0;
    for (size_t o = 0; o + 8 <= len && !patched; o++)
        if (rd64(b + o) == want && o > JLM_HEADER_LEN) {
            corrupt_u64(b, (int)o, page0);
            patched = 1;
        }
    cr_assert(patched);
    jlm_err err = {0};
    cr_assert_neq(jlm_fmt_parse(b, len, len, "t.jlm", &m, &err), 0);
    cr_assert(strstr(err.msg, "blk.1.attn_q.weight") && strstr(err.msg, "outside its region"), "%s", err.msg);
    free(b);
    tu_rmrf(dir);
    free(dir);
}

Test(fmt_reader, refuses_a_directory_and_a_missing_file_with_the_path)
{
    jlm_model *m;
    jlm_err err = {0};
    cr_assert_eq(jlm_fmt_open("/nonexistent/x.jlm", &m, &err), JLM_EIO);
    cr_assert(strstr(err.msg, "/nonexistent/x.jlm") && strstr(err.msg, "No such file"), "%s", err.msg);
    cr_assert_eq(jlm_fmt_open("/tmp", &m, &err), JLM_EFORMAT);
    cr_assert(strstr(err.msg, "not a regular file"), "%s", err.msg);
}

/* ---------------------------------------------------------------- writer */
static int g_fail_after, g_writes;
static ssize_t failing_pwrite(int fd, const void *b, size_t n, int64_t off)
{
    if (++g_writes > g_fail_after) {
        errno = ENOSPC;
        return -1;
    }
    return jlm_io_posix.pwrite(fd, b, n, off);
}

Test(fmt_writer, leaves_nothing_behind_when_a_write_fails)
{
    char *dir = tu_tmpdir();
    jlm_plan p;
    cr_assert_eq(plan_small(&p, NULL), 0);
    char out[512], part[600];
    snprintf(out, sizeof out, "%s/x.jlm", dir);
    snprintf(part, sizeof part, "%s.part", out);
    jlm_io io = jlm_io_posix;
    io.pwrite = failing_pwrite;
    for (int k = 0; k < 6; k++) {
        g_fail_after = k;
        g_writes = 0;
        jlm_writer *w = NULL;
        jlm_err err = {0};
        int rc = jlm_fmt_writer_open(out, &p, &io, &w, &err);
        if (rc == 0) {
            uint8_t z[4096] = {0};
            rc = jlm_fmt_writer_pwrite(w, z, sizeof z, p.hdr.data_off, &err);
            if (rc)
                jlm_fmt_writer_abort(w);
            else
                rc = jlm_fmt_writer_commit(w, &err);
        }
        cr_assert_eq(rc, JLM_ENOSPC, "failure after %d writes reported as ENOSPC (got %d: %s)", k, rc, err.msg);
        cr_assert(strstr(err.msg, "x.jlm.part"), "message names the file: %s", err.msg);
        cr_assert(!tu_exists(out) && !tu_exists(part), "nothing left behind after failing at write %d", k);
    }
    jlm_fmt_plan_free(&p);
    tu_rmrf(dir);
    free(dir);
}

Test(fmt_writer, refuses_a_write_outside_the_planned_file)
{
    char *dir = tu_tmpdir();
    jlm_plan p;
    cr_assert_eq(plan_small(&p, NULL), 0);
    char out[512];
    snprintf(out, sizeof out, "%s/x.jlm", dir);
    jlm_writer *w;
    cr_assert_eq(jlm_fmt_writer_open(out, &p, NULL, &w, NULL), 0);
    uint8_t z[16] = {0};
    cr_assert_eq(jlm_fmt_writer_pwrite(w, z, sizeof z, p.file_size - 8, NULL), JLM_EINVAL);
    jlm_fmt_writer_abort(w);
    cr_assert(!tu_exists(out));
    jlm_fmt_plan_free(&p);
    tu_rmrf(dir);
    free(dir);
}
