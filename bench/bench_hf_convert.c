/* bench_hf_convert.c - converting a generated BF16 Hugging Face folder
 * (LlamaForCausalLM, random weights) with `jlm convert --type keep`, `Q8_0` and
 * `Q4_K_M`, as a ratio to reading the folder once (`cat > /dev/null`) in
 * the same run, plus the converter's peak RSS. The folder is ~330 MB by
 * default (hidden 1024, 8 layers, vocab 32000); `--1b` makes a 1.2B-parameter
 * one (2.4 GB: hidden 2048, 16 layers, ffn 8192, vocab 128256, Llama-3.2-1B's shape).
 *
 *   JLM_BIN=build/jlm build/bench/bench_hf_convert [--1b]
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct shape { uint32_t hidden, layers, ffn, heads, kv, vocab; } shape;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Runs cmd through sh; returns wall seconds and the child's peak RSS (KiB). */
static double run(const char *cmd, long *rss_kib)
{
    double t0 = now();
    pid_t p = fork();
    if (p == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    struct rusage ru;
    if (p < 0 || wait4(p, &st, 0, &ru) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "bench_hf_convert: failed: %s\n", cmd);
        exit(1);
    }
    if (rss_kib)
        *rss_kib = ru.ru_maxrss;
    return now() - t0;
}

typedef struct ent { char name[96]; uint64_t rows, cols; } ent;

static int entries(const shape *s, ent *e)
{
    int n = 0;
    uint64_t hd = s->hidden / s->heads;
    e[n++] = (ent){"model.embed_tokens.weight", s->vocab, s->hidden};
    e[n++] = (ent){"lm_head.weight", s->vocab, s->hidden};
    e[n++] = (ent){"model.norm.weight", s->hidden, 0};
    for (uint32_t l = 0; l < s->layers; l++) {
        static const char *const nm[] = {"input_layernorm", "post_attention_layernorm", "self_attn.q_proj",
                                         "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
        uint64_t r[] = {s->hidden, s->hidden, s->heads * hd, s->kv * hd, s->kv * hd, s->hidden, s->ffn, s->ffn, s->hidden};
        uint64_t c[] = {0, 0, s->hidden, s->hidden, s->hidden, s->heads * hd, s->hidden, s->hidden, s->ffn};
        for (int k = 0; k < 9; k++) {
            snprintf(e[n].name, sizeof e[n].name, "model.layers.%u.%s.weight", l, nm[k]);
            e[n].rows = r[k];
            e[n++].cols = c[k];
        }
    }
    return n;
}

/* model.safetensors (BF16, small random values) + config.json. */
static uint64_t make_folder(const char *dir, const shape *s)
{
    ent *e = calloc(3 + 9 * (size_t)s->layers, sizeof *e);
    int n = entries(s, e);
    size_t cap = 256 + (size_t)n * 160, hl = 0;
    char *h = malloc(cap);
    uint64_t off = 0;
    hl += (size_t)snprintf(h + hl, cap - hl, "{");
    for (int i = 0; i < n; i++) {
        uint64_t bytes = 2 * e[i].rows * (e[i].cols ? e[i].cols : 1);
        if (e[i].cols)
            hl += (size_t)snprintf(h + hl, cap - hl, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%" PRIu64 ",%" PRIu64
                                   "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", i ? "," : "", e[i].name,
                                   e[i].rows, e[i].cols, off, off + bytes);
        else
            hl += (size_t)snprintf(h + hl, cap - hl, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%" PRIu64
                                   "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", i ? "," : "", e[i].name,
                                   e[i].rows, off, off + bytes);
        off += bytes;
    }
    hl += (size_t)snprintf(h + hl, cap - hl, "}");
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    FILE *f = fopen(p, "wb");
    uint64_t hl64 = hl;
    fwrite(&hl64, 8, 1, f);
    fwrite(h, 1, hl, f);
    uint16_t buf[1 << 16];
    uint32_t x = 12345;
    for (uint64_t done = 0; done < off; done += sizeof buf) {
        for (size_t i = 0; i < sizeof buf / 2; i++) {
            x = x * 1664525u + 1013904223u;
            buf[i] = (uint16_t)(0x3c00 | (x >> 24 & 0x7f) | (x >> 16 & 0x8000));   /* ~ +-0.008..0.016 */
        }
        fwrite(buf, 1, off - done < sizeof buf ? off - done : sizeof buf, f);
    }
    fclose(f);
    snprintf(p, sizeof p, "%s/config.json", dir);
    f = fopen(p, "w");
    fprintf(f, "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":%u,\"intermediate_size\":%u,"
               "\"num_attention_heads\":%u,\"num_hidden_layers\":%u,\"num_key_value_heads\":%u,\"vocab_size\":%u,"
               "\"max_position_embeddings\":4096,\"rms_norm_eps\":1e-5,\"rope_theta\":500000.0}\n",
            s->hidden, s->ffn, s->heads, s->layers, s->kv, s->vocab);
    fclose(f);
    free(h);
    free(e);
    return 8 + hl + off;
}

int main(int argc, char **argv)
{
    shape s = {1024, 8, 2816, 16, 4, 32000};
    if (argc > 1 && !strcmp(argv[1], "--1b"))
        s = (shape){2048, 16, 8192, 32, 8, 128256};
    const char *jlm = getenv("JLM_BIN") ? getenv("JLM_BIN") : "build/jlm";
    char dir[] = "/tmp/jlmbench-hf.XXXXXX", cmd[4096];
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char folder[1100];
    snprintf(folder, sizeof folder, "%s/m", dir);
    snprintf(cmd, sizeof cmd, "mkdir '%s'", folder);
    run(cmd, NULL);
    uint64_t bytes = make_folder(folder, &s);
    snprintf(cmd, sizeof cmd, "cat '%s'/* > /dev/null", folder);
    run(cmd, NULL);   /* warm the page cache: both sides read from it */
    double tcat = run(cmd, NULL);
    printf("folder %.1f MiB (BF16, hidden %u, %u layers, vocab %u); cat %.2f s\n", bytes / 1048576.0, s.hidden,
           s.layers, s.vocab, tcat);
    const char *types[] = {"keep", "Q8_0", "Q4_K_M"};
    for (int i = 0; i < 3; i++) {
        long rss;
        snprintf(cmd, sizeof cmd, "'%s' convert '%s' --type %s -o '%s/out.jlm' 2>/dev/null", jlm, folder, types[i], dir);
        double t = run(cmd, &rss);
        printf("--type %-5s %.2f s = %.1f x cat, peak RSS %.1f MiB (%.2f of the folder)\n", types[i], t, t / tcat,
               rss / 1024.0, rss * 1024.0 / (double)bytes);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    run(cmd, NULL);
    return 0;
}
