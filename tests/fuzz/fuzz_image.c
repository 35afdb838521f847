/* fuzz_image.c - libFuzzer target for the image loader (engine/image.c:
 * libpng, libjpeg-turbo and our PPM reader behind the size checks) and the gemma3
 * preprocessing that follows it.
 *
 *   make fuzz && mkdir -p /tmp/corpus-img && \
 *   build-fuzz/fuzz_image -max_total_time=60 /tmp/corpus-img tests/fuzz/seeds-image
 *
 * Every input must be either refused with a one-line message (and *out
 * untouched) or decoded to w*h RGB pixels within the pixel cap, which the
 * preprocessing then reads in full, so ASan sees any short buffer. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/vision.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    jlm_image img = {0};
    jlm_err err;
    err.msg[0] = '\0';
    if (jlm_image_load_mem(data, size, "fuzz.img", &img, &err) != 0) {
        if (img.rgb || !err.msg[0] || strchr(err.msg, '\n'))
            abort();   /* contract: untouched, one line */
        return 0;
    }
    if (!img.w || !img.h || (uint64_t)img.w * img.h > JLM_IMAGE_MAX_PIXELS)
        abort();
    volatile uint8_t sink = img.rgb[(size_t)img.w * img.h * 3 - 1];
    (void)sink;
    static uint8_t u8[32 * 32 * 3];
    static float f32[32 * 32 * 3];
    jlm_vision v = {.image_size = 32, .patch_size = 2, .scale = 1, .projector = JLM_PROJ_GEMMA3,
                    .mean = {0.5f, 0.5f, 0.5f}, .std = {0.5f, 0.5f, 0.5f}};
    if (img.w * (uint64_t)img.h <= 1u << 20) {   /* keep iterations fast */
        if (jlm_image_fit_pad(&v, &img, u8, &err) != 0)
            abort();
        jlm_image_normalise(&v, u8, f32);
        for (size_t i = 0; i < sizeof f32 / sizeof f32[0]; i++)
            if (!(f32[i] >= -1.0f && f32[i] <= 1.0f))
                abort();
    }
    jlm_image_free(&img);
    return 0;
}
