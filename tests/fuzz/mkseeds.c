/* mkseeds.c - writes the fuzz seed corpora (`make fuzz` runs it; nothing is
 * committed): OUT/convert holds the smallest synthetic GGUFs (bench/mkgguf.c
 * presets fuzz, fuzz-moe) and the crafted inputs of issue 10 made from them
 * (block_count that wraps, allocates gigabytes or writes a huge sparse file,
 * too many experts, dimensions that disagree); OUT/engine holds the
 * containers `jlm convert` makes of the seeds, plus the same with an altered
 * config. OUT/tokenizer holds the vocab records of those containers and of
 * tests/models/stories260K.gguf, each with a few texts (fuzz_tokenizer's
 * input: u32 length, record, text); OUT/jinja every template of
 * tests/reference/chat-templates with its first case's variables
 * (fuzz_jinja's input: template, NUL, JSON).
 *   mkseeds OUT */
#define MKGGUF_NO_MAIN
#include "bench/mkgguf.c"
#include "converter/convert.h"
#include "tests/craft.h"
#include "tests/testutil.h"

#include <dirent.h>
#include <jansson.h>
#include <sys/stat.h>

static int convert(const char *gguf, const char *out)
{
    jlm_conv *c;
    jlm_err err = {0};
    int rc = jlm_conv_open(gguf, NULL, &c, &err);
    if (!rc) {
        rc = jlm_conv_write(c, out, NULL, NULL, NULL, &err);
        jlm_conv_close(c);
    }
    if (rc)
        fprintf(stderr, "mkseeds: %s\n", err.msg);
    return rc;
}

/* Container at path with config u32 field i (jlm-format.md 4.1) set to v. */
static void alter(const char *path, const char *out, int field, uint32_t v)
{
    size_t n;
    unsigned char *b = tu_read_file(path, &n);
    if (!b || n < 256)
        return;
    memcpy(b + 192 + 2 + 4 * field, &v, 4);
    FILE *f = fopen(out, "wb");
    if (f) {
        fwrite(b, 1, n, f);
        fclose(f);
    }
    free(b);
}

/* fuzz_tokenizer seeds: the vocab record of container jlm with texts. */
static void tokenizer_seeds(const char *jlm, const char *dir, const char *as)
{
    static const char *const texts[] = {
        "Once upon a time", " Hello  world\n\n<s></s><unk>", "caf\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x98\x80 123 4567",
        "\xff\xfe\xc3", "",
    };
    jlm_model *m = NULL;
    jlm_err err;
    if (jlm_fmt_open(jlm, &m, &err)) {
        fprintf(stderr, "mkseeds: %s\n", err.msg);
        return;
    }
    jlm_buf b = {0};
    jlm_fmt_vocab_encode(&b, &m->vocab);
    for (size_t i = 0; !b.oom && i < sizeof texts / sizeof texts[0]; i++) {
        char p[1200];
        snprintf(p, sizeof p, "%s/%s-%zu", dir, as, i);
        FILE *f = fopen(p, "wb");
        uint32_t n = (uint32_t)b.len;
        if (f) {
            fwrite(&n, 4, 1, f);
            fwrite(b.p, 1, b.len, f);
            fputs(texts[i], f);
            fclose(f);
        }
    }
    jlm_buf_free(&b);
    jlm_fmt_close(m);
}

/* fuzz_jinja seeds: NAME.jinja, NUL, NAME.cases.json's first case. */
static void jinja_seeds(const char *refdir, const char *dir)
{
    DIR *d = opendir(refdir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t l = strlen(de->d_name), n = 0;
        if (l < 7 || strcmp(de->d_name + l - 6, ".jinja"))
            continue;
        char p[1200], q[1200];
        snprintf(p, sizeof p, "%s/%s", refdir, de->d_name);
        snprintf(q, sizeof q, "%s/%.*s.cases.json", refdir, (int)(l - 6), de->d_name);
        unsigned char *tpl = tu_read_file(p, &n);
        json_t *cases = json_load_file(q, 0, NULL);
        char *vars = json_dumps(json_array_get(cases, 0), JSON_COMPACT);
        snprintf(q, sizeof q, "%s/%.*s", dir, (int)(l - 6), de->d_name);
        FILE *f = tpl ? fopen(q, "wb") : NULL;
        if (f) {
            fwrite(tpl, 1, n, f);
            fputc(0, f);
            if (vars)
                fputs(vars, f);
            fclose(f);
        }
        free(vars);
        json_decref(cases);
        free(tpl);
    }
    if (d)
        closedir(d);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fputs("usage: mkseeds OUT\n", stderr);
        return 2;
    }
    char p[1024], q[1024], msg[512];
    snprintf(p, sizeof p, "%s/convert", argv[1]);
    mkdir(argv[1], 0755);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/engine", argv[1]);
    mkdir(p, 0755);
    static const struct { const char *preset, *type; } S[] = {{"fuzz", "F32"}, {"fuzz", "Q8_0"}, {"fuzz-moe", "Q8_0"}};
    for (size_t i = 0; i < sizeof S / sizeof S[0]; i++) {
        mkg_shape sh;
        uint32_t type;
        snprintf(p, sizeof p, "%s/convert/%s-%s.gguf", argv[1], S[i].preset, S[i].type);
        if (mkg_preset(S[i].preset, &sh) || mkg_parse_type(S[i].type, &type) || mkg_write(p, &sh, type, 0, 1, msg, sizeof msg)) {
            fprintf(stderr, "mkseeds: %s\n", msg);
            return 1;
        }
        snprintf(q, sizeof q, "%s/engine/%s-%s.jlm", argv[1], S[i].preset, S[i].type);
        if (convert(p, q))
            return 1;
    }
    /* issue 41's families (latent attention and expert groups, a leading dense
     * block and a shared expert, interleaved MoE with top-1 on the input):
     * each GGUF a convert seed, its container an engine seed (crafted values
     * of their keys below) */
    static const char *const FAM[] = {"deepseek2", "glm4moe", "llama4"};
    for (size_t i = 0; i < sizeof FAM / sizeof FAM[0]; i++) {
        size_t n;
        snprintf(p, sizeof p, "tests/models/synth-%s-256.Q4_K_M.gguf", FAM[i]);
        unsigned char *b = tu_read_file(p, &n);
        snprintf(q, sizeof q, "%s/convert/%s-Q4_K_M.gguf", argv[1], FAM[i]);
        if (!b || tu_write_file(q, b, n))
            fprintf(stderr, "mkseeds: cannot copy %s\n", p);
        free(b);
        snprintf(q, sizeof q, "%s/engine/%s-Q4_K_M.jlm", argv[1], FAM[i]);
        if (convert(p, q))
            return 1;
    }
    /* issue 10's crafted inputs, from the dense and the MoE seed; issue 41's from its families' */
    static const struct { const char *from, *key, *as; uint32_t v; } C[] = {
        {"fuzz-F32", "llama.block_count", "wrap", 0xFFFFFFFFu},
        {"fuzz-F32", "llama.block_count", "alloc", 1000000000u},
        {"fuzz-F32", "llama.block_count", "sparse", 20000000u},
        {"fuzz-F32", "llama.embedding_length", "embd", 0x7FFFFFFFu},
        {"fuzz-F32", "llama.attention.head_count_kv", "kv", 0u},
        {"fuzz-moe-Q8_0", "llama.expert_count", "experts", 5000u},
        {"fuzz-moe-Q8_0", "llama.expert_used_count", "used", 300u},
        {"deepseek2-Q4_K_M", "deepseek2.expert_group_count", "groups", 3u},
        {"deepseek2-Q4_K_M", "deepseek2.expert_group_used_count", "groups-used", 9u},
        {"deepseek2-Q4_K_M", "deepseek2.attention.kv_lora_rank", "kv-lora", 0x7FFFFFFFu},
        {"deepseek2-Q4_K_M", "deepseek2.attention.q_lora_rank", "q-lora", 64u},
        {"deepseek2-Q4_K_M", "deepseek2.leading_dense_block_count", "dense-lead", 5u},
        {"glm4moe-Q4_K_M", "glm4moe.nextn_predict_layers", "nextn", 3u},
        {"llama4-Q4_K_M", "llama4.interleave_moe_layer_step", "moe-step", 9u},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        size_t n;
        snprintf(p, sizeof p, "%s/convert/%s.gguf", argv[1], C[i].from);
        unsigned char *b = tu_read_file(p, &n);
        snprintf(q, sizeof q, "%s/convert/crafted-%s.gguf", argv[1], C[i].as);
        if (!b || tu_gguf_write_with(q, b, n, C[i].key, C[i].v))
            fprintf(stderr, "mkseeds: cannot craft %s\n", q);
        free(b);
    }
    static const struct { int field; uint32_t v; const char *as; } A[] = {
        {0, 0xFFFFFFFFu, "layers"}, {1, 4096, "embd"}, {2, 64, "heads"}, {4, 4096, "head-dim"},
        {5, 64, "rot"}, {6, 1u << 20, "ffn"}, {7, 1u << 24, "vocab"},
    };
    snprintf(p, sizeof p, "%s/engine/fuzz-F32.jlm", argv[1]);
    for (size_t i = 0; i < sizeof A / sizeof A[0]; i++) {
        snprintf(q, sizeof q, "%s/engine/altered-%s.jlm", argv[1], A[i].as);
        alter(p, q, A[i].field, A[i].v);
    }
    snprintf(q, sizeof q, "%s/tokenizer", argv[1]);
    mkdir(q, 0755);
    snprintf(p, sizeof p, "%s/engine/fuzz-F32.jlm", argv[1]);
    tokenizer_seeds(p, q, "fuzz");
    snprintf(p, sizeof p, "%s/stories260K.jlm", argv[1]);
    if (!convert("tests/models/stories260K.gguf", p))
        tokenizer_seeds(p, q, "stories260K");
    unlink(p);
    snprintf(q, sizeof q, "%s/jinja", argv[1]);
    mkdir(q, 0755);
    jinja_seeds("tests/reference/chat-templates", q);
    return 0;
}
