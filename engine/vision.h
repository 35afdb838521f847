/* vision.h - images in: decoding, a projector's preprocessing, the vision
 * tower (SigLIP-style ViT blocks read through the pager's vision array) and
 * the projector (prompt/image_prompt.h feeds an image prompt to the engine).
 *
 * Owns: the image loader (libstb: PNG, JPEG, binary PPM/PGM; the pixel count
 * is bounded from the header before decoding), llama.cpp's preprocessing per
 * projector, the tower's forward pass. The text graph is untouched: the
 * projector output enters it through jlm_engine_eval_embd.
 *
 * Projectors are a table (vision.c, `projectors`): a new type (llava MLP,
 * Qwen2-VL merger) adds an entry with its preprocessing, token count and
 * projection, and its roles in docs/vision.md. First entry: gemma3.
 *
 * Invariants:
 *  (1) Every tower block is reached through the pager (JLM_PAGER_VISION),
 *      pinned while it runs and unpinned right after; the output does not
 *      depend on the budget.
 *  (2) Nothing is read outside the tensors jlm_vtower_open checked: shapes
 *      are validated against the vision record at open.
 * Thread safety: a jlm_vtower belongs to one engine and its thread.
 * Memory: jlm_image owns its pixels; the tower owns its buffers and borrows
 * the engine (which must outlive it).
 */
#ifndef JLM_VISION_H
#define JLM_VISION_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"
#include "format/jlm_format.h"

/* Largest decoded image accepted, in pixels (bounded from the header). */
#define JLM_IMAGE_MAX_PIXELS (4096u * 4096u)
/* Largest image file read, in bytes. */
#define JLM_IMAGE_MAX_BYTES (64u << 20)

typedef struct jlm_image {
    uint32_t w, h;
    uint8_t *rgb;   /* (h, w, 3) row-major RGB */
} jlm_image;

/* Decodes a PNG, JPEG or binary PPM/PGM image to RGB (alpha dropped, grey
 * expanded). Refused in one line naming `what` and the reason: another
 * format, zero size, more than JLM_IMAGE_MAX_PIXELS, a truncated or corrupt
 * file (JLM_EFORMAT; JLM_EIO for a read error). *out untouched on error. */
int  jlm_image_load_mem(const uint8_t *buf, size_t len, const char *what, jlm_image *out, jlm_err *err);
int  jlm_image_load(const char *path, jlm_image *out, jlm_err *err);
void jlm_image_free(jlm_image *img);   /* accepts NULL */

/* llama.cpp's preprocessing for v's projector: u8 (image_size^2 * 3, HWC)
 * the resized and padded picture, f32 (same layout) the normalised input.
 * Either may be NULL. JLM_EUNSUPPORTED for a projector without a graph. */
int jlm_vision_preprocess(const jlm_vision *v, const jlm_image *img, uint8_t *u8, float *f32, jlm_err *err);

/* Preprocessing steps (image.c), for the projector table in vision.c:
 * fit_pad: llama.cpp's fixed-size preprocessor (PAD_CEIL): scale to fit
 * image_size x image_size keeping the aspect ratio (its own align-corners
 * bilinear, truncated to u8), centred on black; an image already that size
 * is copied. normalise: (u/255 - mean) / std per channel, f32, HWC. */
int  jlm_image_fit_pad(const jlm_vision *v, const jlm_image *img, uint8_t *u8, jlm_err *err);
void jlm_image_normalise(const jlm_vision *v, const uint8_t *u8, float *f32);

typedef struct jlm_vtower jlm_vtower;

/* The tower of e's container. JLM_EUNSUPPORTED without a vision record or for
 * an unknown projector, JLM_EFORMAT for a missing or misshapen tensor
 * (named). *out untouched on error. */
int  jlm_vtower_open(jlm_engine *e, jlm_vtower **out, jlm_err *err);
void jlm_vtower_close(jlm_vtower *vt);   /* accepts NULL */
uint32_t jlm_vtower_n_tokens(const jlm_vtower *vt);   /* embeddings per image */
uint32_t jlm_vtower_n_embd(const jlm_vtower *vt);     /* width of each (the text n_embd) */

/* The projector output for one preprocessed image (f32 from
 * jlm_vision_preprocess): n_tokens rows of n_embd into out. Page-in errors
 * name the vision block. */
int  jlm_vtower_encode(jlm_vtower *vt, const float *f32, float *out, jlm_err *err);

/* The projector's begin/end-of-image token texts (in the text vocabulary)
 * and its name; static strings. */
void jlm_vtower_markers(const jlm_vtower *vt, const char **boi, const char **eoi, const char **name);
/* Preprocesses img for the projector and encodes it: n_tokens x n_embd
 * floats into out. */
int  jlm_vtower_encode_image(jlm_vtower *vt, const jlm_image *img, float *out, jlm_err *err);

#endif
