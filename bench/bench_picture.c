/* bench_picture.c - `jlm info --html` (picture/) against `jlm info --json
 * --tensors` on the same container, both as whole commands (median of R runs,
 * in the same run: read the ratio, not the absolute times), for shell
 * containers (tests/shell_jlm.h: real header and table, no weights) with the
 * shapes of a 1B dense model (Llama 3.2 1B) and a 30B MoE (Qwen3-30B-A3B).
 * Also prints the page's size.
 *
 *   build/bench/bench_picture [-r R]
 */
#include "bench/bench_common.h"
#include "tests/shell_jlm.h"

static shell_list g_list;

/* Llama-3.2-1B-like (16 blocks) or Qwen3-30B-A3B-like (48 blocks x 128 experts). */
static int make_model(const char *path, int moe, jlm_err *err)
{
    jlm_config c = {.arch = moe ? JLM_ARCH_QWEN3MOE : JLM_ARCH_LLAMA, .n_layer = moe ? 48 : 16, .n_embd = 2048,
                    .n_head = 32, .n_kv_head = moe ? 4 : 8, .head_dim = moe ? 128 : 64, .n_rot = moe ? 128 : 64,
                    .n_ffn = moe ? 6144 : 8192, .n_vocab = 4, .n_ctx = 4096, .n_expert = moe ? 128 : 0,
                    .n_expert_used = moe ? 8 : 0, .n_ffn_exp = moe ? 768 : 0, .rms_eps = 1e-5f, .rope_base = 5e5f};
    shell_list *L = &g_list;
    memset(L, 0, sizeof *L);
    char nm[48];
    uint64_t q = (uint64_t)c.n_head * c.head_dim, kv = (uint64_t)c.n_kv_head * c.head_dim;
    shell_add(L, JLM_R_TOKEN_EMBD, -1, JLM_T_Q6_K, 2, 2048, 128256, 1, "token_embd.weight");
    shell_add(L, JLM_R_OUTPUT_NORM, -1, JLM_T_F32, 1, 2048, 1, 1, "output_norm.weight");
    for (uint32_t b = 0; b < c.n_layer; b++) {
#define ADD(role, type, nd, d0, d1, d2, fmt) (snprintf(nm, sizeof nm, fmt, b), shell_add(L, role, (int32_t)b, type, nd, d0, d1, d2, nm))
        ADD(JLM_R_ATTN_NORM, JLM_T_F32, 1, 2048, 1, 1, "blk.%u.attn_norm.weight");
        ADD(JLM_R_ATTN_Q, JLM_T_Q4_K, 2, 2048, q, 1, "blk.%u.attn_q.weight");
        ADD(JLM_R_ATTN_K, JLM_T_Q4_K, 2, 2048, kv, 1, "blk.%u.attn_k.weight");
        ADD(JLM_R_ATTN_V, JLM_T_Q6_K, 2, 2048, kv, 1, "blk.%u.attn_v.weight");
        ADD(JLM_R_ATTN_OUT, JLM_T_Q4_K, 2, q, 2048, 1, "blk.%u.attn_output.weight");
        ADD(JLM_R_FFN_NORM, JLM_T_F32, 1, 2048, 1, 1, "blk.%u.ffn_norm.weight");
        if (moe) {
            ADD(JLM_R_ROUTER, JLM_T_F32, 2, 2048, 128, 1, "blk.%u.ffn_gate_inp.weight");
            ADD(JLM_R_EXP_GATE, JLM_T_Q4_K, 3, 2048, 768, 128, "blk.%u.ffn_gate_exps.weight");
            ADD(JLM_R_EXP_UP, JLM_T_Q4_K, 3, 2048, 768, 128, "blk.%u.ffn_up_exps.weight");
            ADD(JLM_R_EXP_DOWN, JLM_T_Q6_K, 3, 768, 2048, 128, "blk.%u.ffn_down_exps.weight");
        } else {
            ADD(JLM_R_FFN_GATE, JLM_T_Q4_K, 2, 2048, 8192, 1, "blk.%u.ffn_gate.weight");
            ADD(JLM_R_FFN_UP, JLM_T_Q4_K, 2, 2048, 8192, 1, "blk.%u.ffn_up.weight");
            ADD(JLM_R_FFN_DOWN, JLM_T_Q6_K, 2, 8192, 2048, 1, "blk.%u.ffn_down.weight");
        }
#undef ADD
    }
    return shell_write(path, &c, NULL, L, err);
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median wall time of R runs of a shell command. */
static double time_cmd(const char *cmd, int r)
{
    double t[64];
    for (int i = 0; i < r; i++) {
        double t0 = bench_now();
        if (system(cmd) != 0) {
            fprintf(stderr, "bench_picture: failed: %s\n", cmd);
            exit(1);
        }
        t[i] = bench_now() - t0;
    }
    qsort(t, (size_t)r, sizeof *t, cmpd);
    return t[r / 2];
}

int main(int argc, char **argv)
{
    int r = 5;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-r") && i + 1 < argc)
            r = atoi(argv[++i]);
    r = r < 1 ? 1 : r > 64 ? 64 : r;
    const char *bin = getenv("JLM_BIN") ? getenv("JLM_BIN") : "build/jlm";
    char *dir = bench_tmpdir();
    if (!dir)
        return 1;
    printf("%-22s %10s %8s %12s %12s %8s %10s\n", "model", "file", "tensors", "info --json", "info --html", "ratio",
           "page");
    for (int moe = 0; moe < 2; moe++) {
        char path[1200], html[1300], cj[4096], ch[4096];
        snprintf(path, sizeof path, "%s/%s.jlm", dir, moe ? "moe30b" : "dense1b");
        snprintf(html, sizeof html, "%s/p.html", dir);
        jlm_err err = {0};
        if (make_model(path, moe, &err)) {
            fprintf(stderr, "bench_picture: %s\n", err.msg);
            return 1;
        }
        snprintf(cj, sizeof cj, "'%s' info '%s' --json --tensors > /dev/null", bin, path);
        snprintf(ch, sizeof ch, "'%s' info '%s' --html -o '%s'", bin, path, html);
        double tj = time_cmd(cj, r), th = time_cmd(ch, r);
        printf("%-22s %9.1fG %8u %10.1fms %10.1fms %7.2fx %8.1fK\n", moe ? "qwen3-30b-a3b shape" : "llama-1b shape",
               (double)bench_file_size(path) / 1e9, g_list.n, tj * 1e3, th * 1e3, th / tj,
               (double)bench_file_size(html) / 1024);
        unlink(path);
        unlink(html);
    }
    rmdir(dir);
    free(dir);
    return 0;
}
