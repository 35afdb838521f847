/* image.c - images in: PNG (libpng), JPEG (libjpeg-turbo) and binary PPM/PGM
 * (here) decoded to RGB with the size checked from the header before any
 * pixel is allocated and corrupt or truncated data refused, and llama.cpp's
 * preprocessing steps (resize, pad, normalise).
 * No engine dependency, so the fuzz target links it alone. See vision.h. */
#include "engine/vision.h"

#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

/* ================================================================ image decoding */
/* PNG through libpng and JPEG through libjpeg-turbo: both are fuzzed
 * continuously upstream (OSS-Fuzz) and patched by Debian's security team.
 * Debian's libstb snapshot was not: our fuzzer found a SEGV inside it that no
 * check of ours in front of it could rule out. PPM/PGM is a header and raw
 * samples, read here. Every decoder writes into a buffer of exactly w*h*3
 * bytes that we allocate after checking w*h from the header. */
enum { IMG_PNG = 1, IMG_JPEG, IMG_PNM };

static int known_magic(const uint8_t *b, size_t n)
{
    if (n >= 8 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8)) return IMG_PNG;
    if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return IMG_JPEG;
    if (n >= 2 && b[0] == 'P' && (b[1] == '5' || b[1] == '6')) return IMG_PNM;   /* binary PGM/PPM */
    return 0;
}

/* A library's message, printable and at most 95 bytes (libpng can quote a
 * chunk's name, libjpeg a marker's code). */
static const char *printable(const char *r, char out[96])
{
    size_t i = 0;
    for (; r && r[i] && i < 95; i++)
        out[i] = r[i] >= 0x20 && r[i] < 0x7f ? r[i] : '?';
    out[i] = 0;
    return out;
}

static int size_ok(const char *what, uint64_t w, uint64_t h, jlm_err *err)
{
    if (w == 0 || h == 0)
        return jlm_errf(err, JLM_EFORMAT, "%s: image of size %llux%llu", what, (unsigned long long)w,
                        (unsigned long long)h);
    if (w * h > JLM_IMAGE_MAX_PIXELS)   /* w, h < 2^32 (every header's field): no overflow */
        return jlm_errf(err, JLM_EFORMAT, "%s: image of %llux%llu pixels, the limit is %u pixels", what,
                        (unsigned long long)w, (unsigned long long)h, JLM_IMAGE_MAX_PIXELS);
    return JLM_OK;
}

/* ---------------------------------------------------------------- PPM/PGM */
/* One header number (whitespace and comments before it) into *v: the index
 * after it; 0 when there is none; SIZE_MAX when its value passes UINT32_MAX
 * (never truncated: "4294967297" is no width 1). */
static size_t pnm_number(const uint8_t *b, size_t n, size_t i, uint32_t *v)
{
    for (;;) {
        while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r' || b[i] == '\v' || b[i] == '\f'))
            i++;
        if (i < n && b[i] == '#') {
            while (i < n && b[i] != '\n' && b[i] != '\r')
                i++;
            continue;
        }
        break;
    }
    uint64_t x = 0;
    size_t s = i;
    while (i < n && b[i] >= '0' && b[i] <= '9') {
        x = x * 10 + (uint64_t)(b[i++] - '0');
        if (x > UINT32_MAX)
            return SIZE_MAX;
    }
    *v = (uint32_t)x;
    return i > s ? i : 0;
}

/* Netpbm: magic, width, height, maxval (whitespace and comments between), one
 * whitespace byte, then w*h*channels samples, 2 bytes big-endian past maxval
 * 255. Samples are scaled to 0..255 (maxval 255: copied, as stb did). */
static int load_pnm(const uint8_t *b, size_t n, const char *what, jlm_image *out, jlm_err *err)
{
    static const char *const FIELD[3] = {"width", "height", "maxval"};
    uint32_t f[3];
    size_t i = 2;
    for (int k = 0; k < 3; k++) {
        i = pnm_number(b, n, i, &f[k]);
        if (i == SIZE_MAX)
            return jlm_errf(err, JLM_EFORMAT, "%s: PPM/PGM %s past %u", what, FIELD[k], UINT32_MAX);
        if (!i)
            return jlm_errf(err, JLM_EFORMAT, "%s: unreadable PPM/PGM header", what);
    }
    uint32_t w = f[0], h = f[1], mx = f[2];
    if (i >= n)
        return jlm_errf(err, JLM_EFORMAT, "%s: unreadable PPM/PGM header", what);
    if (mx == 0 || mx > 65535)
        return jlm_errf(err, JLM_EFORMAT, "%s: PPM/PGM maxval %u (1..65535)", what, mx);
    if (size_ok(what, w, h, err))
        return err->code;
    i++;   /* the single whitespace byte after maxval */
    unsigned ch = b[1] == '6' ? 3 : 1, bps = mx > 255 ? 2 : 1;
    uint64_t need = (uint64_t)w * h * ch * bps;
    if (n - i < need)
        return jlm_errf(err, JLM_EFORMAT, "%s: truncated image data (%ux%u: %llu of %llu sample bytes)", what, w, h,
                        (unsigned long long)(n - i), (unsigned long long)need);
    uint8_t *rgb = malloc((size_t)w * h * 3);
    if (!rgb)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory for %ux%u pixels", what, w, h);
    const uint8_t *s = b + i;
    for (size_t p = 0; p < (size_t)w * h; p++)
        for (unsigned c = 0; c < 3; c++) {
            size_t k = p * ch + (ch == 3 ? c : 0);
            uint32_t v = bps == 2 ? (uint32_t)s[2 * k] << 8 | s[2 * k + 1] : s[k];
            if (v > mx)
                v = mx;
            rgb[p * 3 + c] = mx == 255 ? (uint8_t)v : (uint8_t)((v * 255u + mx / 2) / mx);
        }
    *out = (jlm_image){.w = w, .h = h, .rgb = rgb};
    return JLM_OK;
}

/* ---------------------------------------------------------------- PNG */
typedef struct png_src {
    const uint8_t *p;
    size_t n, off;
    jmp_buf jb;
    char msg[96];
} png_src;

static void png_read_mem(png_structp png, png_bytep dst, size_t len)
{
    png_src *s = png_get_io_ptr(png);
    if (len > s->n - s->off)
        png_error(png, "the file ends early");
    memcpy(dst, s->p + s->off, len);
    s->off += len;
}

static void png_on_error(png_structp png, png_const_charp msg)
{
    png_src *s = png_get_error_ptr(png);
    printable(msg, s->msg);
    longjmp(s->jb, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) { (void)png; (void)msg; }

/* The same conversions stb applied (llama.cpp decodes with stb): palette and
 * low-depth grey expanded, 16 bits to 8 by the high byte, grey to RGB,
 * transparency and alpha dropped (not composited), no gamma correction. */
static int load_png(const uint8_t *b, size_t n, const char *what, jlm_image *out, jlm_err *err)
{
    png_src src = {.p = b, .n = n};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory starting the PNG decoder", what);
    }
    uint8_t *volatile rgb = NULL;
    png_bytep *volatile rows = NULL;
    volatile int rc = JLM_OK;
    if (setjmp(src.jb)) {
        if (rc == JLM_OK)
            rc = jlm_errf(err, JLM_EFORMAT, "%s: corrupt or truncated PNG (%s)", what, src.msg);
        goto done;
    }
    png_set_read_fn(png, &src, png_read_mem);
    png_set_user_limits(png, JLM_IMAGE_MAX_PIXELS, JLM_IMAGE_MAX_PIXELS);
    png_set_chunk_cache_max(png, 1000);             /* ancillary chunks kept */
    png_set_chunk_malloc_max(png, 8u << 20);        /* bytes of any one chunk held */
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    if (size_ok(what, w, h, err)) {
        rc = err->code;
        goto done;
    }
    int ct = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
    if (ct == PNG_COLOR_TYPE_PALETTE)
        png_set_palette_to_rgb(png);
    if (ct == PNG_COLOR_TYPE_GRAY && depth < 8)
        png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16)
        png_set_strip_16(png);
    if (ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA)
        png_set_gray_to_rgb(png);
    png_set_strip_alpha(png);   /* also the alpha that palette expansion makes of a tRNS chunk */
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * 3) {
        rc = jlm_errf(err, JLM_EFORMAT, "%s: PNG of colour type %d, depth %d does not convert to RGB", what, ct, depth);
        goto done;
    }
    rgb = malloc((size_t)w * h * 3);
    rows = malloc(sizeof *rows * h);
    if (!rgb || !rows) {
        rc = jlm_errf(err, JLM_ENOMEM, "%s: out of memory for %ux%u pixels", what, (unsigned)w, (unsigned)h);
        goto done;
    }
    for (png_uint_32 y = 0; y < h; y++)
        rows[y] = rgb + (size_t)y * w * 3;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    *out = (jlm_image){.w = w, .h = h, .rgb = rgb};
    rgb = NULL;
done:
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    free(rgb);
    return rc;
}

/* ---------------------------------------------------------------- JPEG */
typedef struct jpeg_guard {
    struct jpeg_error_mgr pub;
    struct jpeg_progress_mgr progress;
    jmp_buf jb;
    char msg[96];
} jpeg_guard;

static void jpeg_on_error(j_common_ptr c)
{
    jpeg_guard *g = (jpeg_guard *)c->err;
    char buf[JMSG_LENGTH_MAX];
    c->err->format_message(c, buf);
    printable(buf, g->msg);
    longjmp(g->jb, 1);
}

/* Warnings are corrupt data the decoder papers over (a premature end is
 * filled with grey, a damaged segment with zeros): refused, so a truncated
 * file never yields a half-real image. Extraneous bytes between markers are
 * common in camera files and harmless; they pass. */
static void jpeg_on_message(j_common_ptr c, int level)
{
    if (level < 0 && c->err->msg_code != JWRN_EXTRANEOUS_DATA)
        jpeg_on_error(c);
}

/* A progressive file can hold any number of scans, each a pass over the whole
 * image (libjpeg-turbo's own fuzzers cap them the same way). */
static void jpeg_on_progress(j_common_ptr c)
{
    if (c->is_decompressor && ((j_decompress_ptr)c)->input_scan_number > 500) {
        jpeg_guard *g = (jpeg_guard *)c->err;
        snprintf(g->msg, sizeof g->msg, "more than 500 progressive scans");
        longjmp(g->jb, 1);
    }
}

static int load_jpeg(const uint8_t *b, size_t n, const char *what, jlm_image *out, jlm_err *err)
{
    struct jpeg_decompress_struct ci;
    jpeg_guard g;
    memset(&ci, 0, sizeof ci);
    memset(&g, 0, sizeof g);
    ci.err = jpeg_std_error(&g.pub);
    g.pub.error_exit = jpeg_on_error;
    g.pub.emit_message = jpeg_on_message;
    uint8_t *volatile rgb = NULL;
    volatile int rc = JLM_OK, created = 0;
    if (setjmp(g.jb)) {
        if (rc == JLM_OK)
            rc = jlm_errf(err, JLM_EFORMAT, "%s: corrupt or truncated JPEG (%s)", what, g.msg);
        goto done;
    }
    jpeg_create_decompress(&ci);
    created = 1;
    ci.mem->max_memory_to_use = 512L << 20;
    g.progress.progress_monitor = jpeg_on_progress;
    ci.progress = &g.progress;
    jpeg_mem_src(&ci, b, (unsigned long)n);
    jpeg_read_header(&ci, TRUE);
    if (size_ok(what, ci.image_width, ci.image_height, err)) {
        rc = err->code;
        goto done;
    }
    ci.out_color_space = JCS_RGB;   /* grey expanded; CMYK/YCCK has no RGB conversion: refused */
    jpeg_start_decompress(&ci);
    if (ci.output_width != ci.image_width || ci.output_height != ci.image_height || ci.output_components != 3) {
        rc = jlm_errf(err, JLM_EFORMAT, "%s: JPEG decodes to %ux%ux%d, not its header's %ux%u RGB", what,
                      ci.output_width, ci.output_height, ci.output_components, ci.image_width, ci.image_height);
        goto done;
    }
    uint32_t w = ci.output_width, h = ci.output_height;
    rgb = malloc((size_t)w * h * 3);
    if (!rgb) {
        rc = jlm_errf(err, JLM_ENOMEM, "%s: out of memory for %ux%u pixels", what, w, h);
        goto done;
    }
    while (ci.output_scanline < h) {
        JSAMPROW row = rgb + (size_t)ci.output_scanline * w * 3;
        jpeg_read_scanlines(&ci, &row, 1);
    }
    jpeg_finish_decompress(&ci);
    *out = (jlm_image){.w = w, .h = h, .rgb = rgb};
    rgb = NULL;
done:
    if (created)
        jpeg_destroy_decompress(&ci);
    free(rgb);
    return rc;
}

int jlm_image_load_mem(const uint8_t *buf, size_t len, const char *what, jlm_image *out, jlm_err *err)
{
    if (len == 0)
        return jlm_errf(err, JLM_EFORMAT, "%s: empty image file", what);
    if (len > JLM_IMAGE_MAX_BYTES)
        return jlm_errf(err, JLM_EFORMAT, "%s: image file of %zu bytes, the limit is %u", what, len, JLM_IMAGE_MAX_BYTES);
    switch (known_magic(buf, len)) {
    case IMG_PNG: return load_png(buf, len, what, out, err);
    case IMG_JPEG: return load_jpeg(buf, len, what, out, err);
    case IMG_PNM: return load_pnm(buf, len, what, out, err);
    }
    return jlm_errf(err, JLM_EFORMAT, "%s: not a PNG, JPEG or binary PPM image", what);
}

int jlm_image_load(const char *path, jlm_image *out, jlm_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return jlm_errf(err, JLM_EIO, "%s: cannot open the image", path);
    struct stat st;
    if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        fclose(f);
        return jlm_errf(err, JLM_EIO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > JLM_IMAGE_MAX_BYTES) {
        fclose(f);
        return jlm_errf(err, JLM_EFORMAT, "%s: image file of %lld bytes, the limit is %u", path, (long long)st.st_size,
                        JLM_IMAGE_MAX_BYTES);
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf || fread(buf, 1, n, f) != n) {
        free(buf);
        fclose(f);
        return jlm_errf(err, buf ? JLM_EIO : JLM_ENOMEM, "%s: cannot read the image", path);
    }
    fclose(f);
    int rc = jlm_image_load_mem(buf, n, path, out, err);
    free(buf);
    return rc;
}

void jlm_image_free(jlm_image *img)
{
    if (!img)
        return;
    free(img->rgb);
    img->rgb = NULL;
}

/* ================================================================ preprocessing */
/* llama.cpp's resize_bilinear (clip.cpp): align-corners ratios, every step a
 * separately rounded float32 operation, the result truncated to u8. */
static void resize_bilinear(const jlm_image *src, uint32_t nw, uint32_t nh, uint8_t *dst)
{
    float xr = nw > 1 ? (float)(src->w - 1) / (float)(nw - 1) : 0.0f;
    float yr = nh > 1 ? (float)(src->h - 1) / (float)(nh - 1) : 0.0f;
    for (uint32_t y = 0; y < nh; y++) {
        float py = (float)y * yr;
        uint32_t y0 = (uint32_t)py < src->h - 1 ? (uint32_t)py : src->h - 1;
        uint32_t y1 = y0 + 1 < src->h ? y0 + 1 : src->h - 1;
        float yf = py - (float)y0;
        for (uint32_t x = 0; x < nw; x++) {
            float px = (float)x * xr;
            uint32_t x0 = (uint32_t)px < src->w - 1 ? (uint32_t)px : src->w - 1;
            uint32_t x1 = x0 + 1 < src->w ? x0 + 1 : src->w - 1;
            float xf = px - (float)x0;
            for (int c = 0; c < 3; c++) {
                float p00 = src->rgb[((size_t)y0 * src->w + x0) * 3 + c], p10 = src->rgb[((size_t)y0 * src->w + x1) * 3 + c];
                float p01 = src->rgb[((size_t)y1 * src->w + x0) * 3 + c], p11 = src->rgb[((size_t)y1 * src->w + x1) * 3 + c];
                volatile float top = p00 + (p10 - p00) * xf, bot = p01 + (p11 - p01) * xf;   /* no FMA */
                float v = top + (bot - top) * yf;
                dst[((size_t)y * nw + x) * 3 + c] = (uint8_t)v;
            }
        }
    }
}

/* gemma3 (llama.cpp's fixed-size preprocessor, PAD_CEIL): fit inside S x S
 * keeping the aspect ratio, centre on black. */
int jlm_image_fit_pad(const jlm_vision *v, const jlm_image *img, uint8_t *u8, jlm_err *err)
{
    uint32_t S = v->image_size;
    if (img->w == S && img->h == S) {
        memcpy(u8, img->rgb, (size_t)S * S * 3);
        return JLM_OK;
    }
    float sw = (float)S / (float)img->w, sh = (float)S / (float)img->h, sc = sw < sh ? sw : sh;
    float fw = ceilf((float)img->w * sc), fh = ceilf((float)img->h * sc);
    uint32_t nw = fw < (float)S ? (uint32_t)fw : S, nh = fh < (float)S ? (uint32_t)fh : S;
    if (nw == 0) nw = 1;
    if (nh == 0) nh = 1;
    uint8_t *tmp = malloc((size_t)nw * nh * 3);
    if (!tmp)
        return jlm_errf(err, JLM_ENOMEM, "out of memory resizing an image");
    resize_bilinear(img, nw, nh, tmp);
    memset(u8, 0, (size_t)S * S * 3);
    uint32_t ox = (S - nw) / 2, oy = (S - nh) / 2;
    for (uint32_t y = 0; y < nh; y++)
        memcpy(u8 + ((size_t)(y + oy) * S + ox) * 3, tmp + (size_t)y * nw * 3, (size_t)nw * 3);
    free(tmp);
    return JLM_OK;
}

void jlm_image_normalise(const jlm_vision *v, const uint8_t *u8, float *f32)
{
    size_t n = (size_t)v->image_size * v->image_size;
    for (size_t i = 0; i < n; i++)
        for (int c = 0; c < 3; c++)
            f32[i * 3 + c] = ((float)u8[i * 3 + c] / 255.0f - v->mean[c]) / v->std[c];
}
