/* image.c - images in: decoding through libstb (PNG, JPEG, binary PPM/PGM)
 * with the size checked from the header and truncation caught before stb
 * zero-fills, and llama.cpp's preprocessing steps (resize, pad, normalise).
 * No engine dependency, so the fuzz target links it alone. See vision.h. */
#include "engine/vision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <stb_image.h>
#include <zlib.h>

/* ================================================================ image decoding */
static int known_magic(const uint8_t *b, size_t n)
{
    if (n >= 8 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8)) return 1;
    if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return 1;
    if (n >= 2 && b[0] == 'P' && (b[1] == '5' || b[1] == '6')) return 1;   /* binary PGM/PPM */
    return 0;
}

/* stb decodes a truncated PPM or JPEG without complaint (zero fill), and a
 * truncated PNG by reading zeros: check that the data is all there first. PNM: the header (magic, width, height,
 * maxval, comments) then w*h*channels samples. JPEG: the end-of-image marker
 * near the end (entropy-coded data never holds FF D9: FF is stuffed). */
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
    while (i < n && b[i] >= '0' && b[i] <= '9' && x < (1u << 30))
        x = x * 10 + (uint64_t)(b[i++] - '0');
    *v = (uint32_t)x;
    return i > s ? i : 0;
}

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* Bytes the IHDR's image inflates to (filter byte per row; Adam7 adds at
 * most a filter byte and a partial byte per pass row). 0: a bad IHDR. */
static uint64_t png_raw_bound(const uint8_t *ihdr)
{
    static const uint8_t chans[7] = {1, 0, 3, 1, 2, 0, 4};
    uint64_t w = be32(ihdr), h = be32(ihdr + 4), depth = ihdr[8], ct = ihdr[9];
    if (ct > 6 || !chans[ct] || !depth || depth > 16)
        return 0;
    uint64_t raw = h * (1 + (w * chans[ct] * depth + 7) / 8);
    return ihdr[12] ? raw + 15 * h + 64 : raw;
}

/* Inflates one IDAT's bytes into a scratch buffer, counting the output. */
static int png_inflate(z_stream *z, const uint8_t *p, uint32_t len, uint64_t *total, uint64_t limit)
{
    uint8_t out[16384];
    int zrc = Z_OK;
    z->next_in = (Bytef *)p;
    z->avail_in = len;
    do {
        z->next_out = out;
        z->avail_out = sizeof out;
        zrc = inflate(z, Z_NO_FLUSH);
        *total += sizeof out - z->avail_out;
        if (*total > limit)
            return Z_DATA_ERROR;
    } while (zrc == Z_OK && (z->avail_in || z->avail_out == 0));
    return zrc == Z_BUF_ERROR && !z->avail_in ? Z_OK : zrc;
}

/* PNG: the IDAT stream must end (Z_STREAM_END) inside the file and inflate
 * to no more than the IHDR's size. This stb version reads zeros past the end
 * of a truncated stream and grows its output without bound: a 100-byte file
 * could allocate gigabytes. zlib checks it first. */
static int png_complete(const uint8_t *b, size_t n)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit(&z) != Z_OK)
        return 0;
    uint64_t limit = 0, total = 0;
    int zrc = Z_OK;
    for (size_t i = 8; i + 12 <= n && zrc == Z_OK;) {
        uint32_t len = be32(b + i);
        if (len > n - i - 12)
            break;
        if (!memcmp(b + i + 4, "IHDR", 4) && len >= 13)
            limit = png_raw_bound(b + i + 8);
        else if (!memcmp(b + i + 4, "IDAT", 4))
            zrc = png_inflate(&z, b + i + 8, len, &total, limit);
        i += 12 + (size_t)len;
    }
    inflateEnd(&z);
    return zrc == Z_STREAM_END;
}

static int complete(const uint8_t *b, size_t n)
{
    if (b[0] == 0x89)
        return png_complete(b, n);
    if (b[0] == 0xFF) {
        for (size_t i = n >= 1024 ? n - 1024 : 0; i + 1 < n; i++)
            if (b[i] == 0xFF && b[i + 1] == 0xD9)
                return 1;
        return 0;
    }
    uint32_t w, h, mx;
    size_t i = 2;
    if (!(i = pnm_number(b, n, i, &w)) || !(i = pnm_number(b, n, i, &h)) || !(i = pnm_number(b, n, i, &mx)) || i >= n)
        return 0;
    uint64_t need = (uint64_t)w * h * (b[1] == '6' ? 3 : 1) * (mx > 255 ? 2 : 1);
    return n - (i + 1) >= need;
}

/* stb's last failure reason, printable (it can quote a chunk's raw bytes). */
static const char *stb_reason(char out[96])
{
    const char *r = stbi_failure_reason();
    size_t i = 0;
    for (; r && r[i] && i < 95; i++)
        out[i] = r[i] >= 0x20 && r[i] < 0x7f ? r[i] : '?';
    out[i] = 0;
    return out;
}

int jlm_image_load_mem(const uint8_t *buf, size_t len, const char *what, jlm_image *out, jlm_err *err)
{
    char why[96];
    if (len == 0)
        return jlm_errf(err, JLM_EFORMAT, "%s: empty image file", what);
    if (len > JLM_IMAGE_MAX_BYTES)
        return jlm_errf(err, JLM_EFORMAT, "%s: image file of %zu bytes, the limit is %u", what, len, JLM_IMAGE_MAX_BYTES);
    if (!known_magic(buf, len))
        return jlm_errf(err, JLM_EFORMAT, "%s: not a PNG, JPEG or binary PPM image", what);
    int w, h, comp;
    if (!stbi_info_from_memory(buf, (int)len, &w, &h, &comp))
        return jlm_errf(err, JLM_EFORMAT, "%s: unreadable image header (%s)", what, stb_reason(why));
    if (w <= 0 || h <= 0)
        return jlm_errf(err, JLM_EFORMAT, "%s: image of size %dx%d", what, w, h);
    if ((uint64_t)w * (uint64_t)h > JLM_IMAGE_MAX_PIXELS)
        return jlm_errf(err, JLM_EFORMAT, "%s: image of %dx%d pixels, the limit is %u pixels", what, w, h,
                        JLM_IMAGE_MAX_PIXELS);
    if (!complete(buf, len))
        return jlm_errf(err, JLM_EFORMAT, "%s: truncated or inconsistent image data (%dx%d: it ends early or inflates past its size)", what, w, h);
    int w2, h2;
    uint8_t *px = stbi_load_from_memory(buf, (int)len, &w2, &h2, &comp, 3);
    if (!px)
        return jlm_errf(err, JLM_EFORMAT, "%s: corrupt or truncated image (%s)", what, stb_reason(why));
    if (w2 != w || h2 != h) {
        stbi_image_free(px);
        return jlm_errf(err, JLM_EFORMAT, "%s: image size changed while decoding", what);
    }
    uint8_t *rgb = malloc((size_t)w * h * 3);   /* ours, so jlm_image_free needs no stb */
    if (!rgb) {
        stbi_image_free(px);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory for %dx%d pixels", what, w, h);
    }
    memcpy(rgb, px, (size_t)w * h * 3);
    stbi_image_free(px);
    *out = (jlm_image){.w = (uint32_t)w, .h = (uint32_t)h, .rgb = rgb};
    return JLM_OK;
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
