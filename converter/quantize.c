/* quantize.c - ggml's reference quantizers and llama-quantize's per-tensor
 * choices (see quantize.h). Expressions follow ggml-quants.c's order and
 * operand types (-std=c11: no FMA contraction), so results equal bit for bit. */
#include "quantize.h"
#include "gguf.h"

#include <math.h>
#include <string.h>

int jlm_quant_parse(const char *name, uint32_t *ggml_type, jlm_err *err)
{
    if (!strcmp(name, "keep")) {
        *ggml_type = 0;
        return 0;
    }
    if (!strcmp(name, "Q8_0")) {
        *ggml_type = GGML_Q8_0;
        return 0;
    }
    return jlm_errf(err, JLM_EUNSUPPORTED, "--type %s is not supported (keep, Q8_0)", name);
}

uint32_t jlm_quant_choice(uint32_t target, const char *name, uint32_t n_dims, uint64_t row_len, uint32_t src_type)
{
    int is_float = src_type == GGML_F32 || src_type == GGML_F16 || src_type == GGML_BF16;
    size_t n = strlen(name);
    int is_weight = n > 7 && !strcmp(name + n - 7, ".weight");
    if (!target || !is_float || n_dims < 2 || !is_weight || strstr(name, "ffn_gate_inp.weight") ||
        row_len % jlm_ggml_block_elems(target))
        return src_type;
    return target;   /* Q8_0: every other 2-D weight, token_embd and output included */
}

/* quantize_row_q8_0_ref */
static void q8_0(const float *x, uint8_t *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, y += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float v = x[i * 32 + j];
            amax = amax > fabsf(v) ? amax : fabsf(v);
        }
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        uint16_t h = jlm_f32_to_f16(d);
        y[0] = (uint8_t)h;
        y[1] = (uint8_t)(h >> 8);
        for (int j = 0; j < 32; j++) {
            const float x0 = x[i * 32 + j] * id;
            y[2 + j] = (uint8_t)(int8_t)roundf(x0);
        }
    }
}

int jlm_quant_row(uint32_t type, const float *src, void *dst, uint64_t k, jlm_err *err)
{
    uint32_t be = jlm_ggml_block_elems(type);
    if (type != GGML_Q8_0 || k % be)
        return jlm_errf(err, JLM_EUNSUPPORTED, "quantize: type %u, row of %llu", type, (unsigned long long)k);
    q8_0(src, dst, k / be);
    return 0;
}
