/* kv_logits.c - records llama.cpp's logits with a chosen KV cache type, for
 * tests/test_kv.c (tests/reference/kv-*.json). Built against llama.cpp's
 * public API (include/llama.h, libllama), not part of the jlmfs build:
 *
 *   cc -O2 -I$LLAMA/include -I$LLAMA/ggml/include tests/reference/tools/kv_logits.c \
 *      -L$LLAMA/build/bin -lllama -lggml -lggml-base -Wl,-rpath,$LLAMA/build/bin -o kv_logits
 *   ./kv_logits MODEL.gguf q8_0 q8_0 N ID,ID,...   > kv-q8_0-NAME.json
 *
 * One context (CPU, 1 thread, n_ctx 512, flash attention on, as a quantized
 * V cache requires), the prompt's ids evaluated in one batch, then N greedy
 * steps one token at a time: the whole logit vector after the prompt and
 * after each step (n_vocab <= 4096), and the greedy ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llama.h>   /* llama.cpp's, from -I$LLAMA/include */

static enum ggml_type type_of(const char *s)
{
    if (!strcmp(s, "f32")) return GGML_TYPE_F32;
    if (!strcmp(s, "f16")) return GGML_TYPE_F16;
    if (!strcmp(s, "q8_0")) return GGML_TYPE_Q8_0;
    fprintf(stderr, "kv_logits: type '%s': f32, f16 or q8_0\n", s);
    exit(2);
}

static void print_logits(const float *l, int nv)
{
    printf("[");
    for (int i = 0; i < nv; i++)
        printf("%s%.6g", i ? ", " : "", l[i]);
    printf("]");
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: kv_logits MODEL.gguf CTK CTV N ID,ID,...\n");
        return 2;
    }
    int n = atoi(argv[4]), np = 0;
    llama_token ids[512];
    for (char *s = argv[5]; *s && np < 512; s += *s == ',')
        ids[np++] = (llama_token)strtol(s, &s, 10);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m)
        return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 512;
    cp.n_threads = cp.n_threads_batch = 1;
    cp.type_k = type_of(argv[2]);
    cp.type_v = type_of(argv[3]);
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    struct llama_context *ctx = llama_init_from_model(m, cp);
    if (!ctx)
        return 1;
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
    if (llama_decode(ctx, llama_batch_get_one(ids, np)))
        return 1;
    printf("{\"ctk\": \"%s\", \"ctv\": \"%s\", \"prompt_ids\": [", argv[2], argv[3]);
    for (int i = 0; i < np; i++)
        printf("%s%d", i ? ", " : "", ids[i]);
    printf("], \"step_logits\": [");
    llama_token gen[512];
    for (int s = 0; s <= n && s < 512; s++) {
        const float *l = llama_get_logits_ith(ctx, -1);
        if (s) printf(", ");
        print_logits(l, nv);
        if (s == n)
            break;
        int best = 0;
        for (int i = 1; i < nv; i++)
            if (l[i] > l[best]) best = i;
        gen[s] = best;
        if (llama_decode(ctx, llama_batch_get_one(&gen[s], 1)))
            return 1;
    }
    printf("], \"generated_ids\": [");
    for (int s = 0; s < n; s++)
        printf("%s%d", s ? ", " : "", gen[s]);
    printf("]}\n");
    llama_free(ctx);
    llama_model_free(m);
    llama_backend_free();
    return 0;
}
