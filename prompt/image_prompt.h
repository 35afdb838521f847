/* image_prompt.h - one prompt with an image in it, through the engine.
 * Sits above engine/ (the tower and the text graph) and text/ (the
 * tokenizer): the one place that needs both. */
#ifndef JLM_IMAGE_PROMPT_H
#define JLM_IMAGE_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"
#include "engine/vision.h"
#include "text/tokenizer/tokenizer.h"

/* Runs `prompt` with the image at its marker ("<image>" or llama.cpp's
 * "<__media__>"; none: the image goes first) from the engine's current
 * position: text before + begin-of-image token, the image's embeddings
 * (bidirectional among themselves), end-of-image token + text after. Logits
 * after the last token. *ids (malloc'd, *n_ids) gets the text tokens, for a
 * sampler's history. Errors name the image or the token that is missing. */
int  jlm_image_prompt_eval(jlm_engine *e, jlm_vtower *vt, const jlm_tok *tok, const char *prompt,
                           const jlm_image *img, float *logits, int32_t **ids, size_t *n_ids, jlm_err *err);
/* The same on the cache of s (serve's slots), the engine's own when s is NULL. */
int  jlm_image_prompt_eval_seq(jlm_engine *e, jlm_engine_seq *s, jlm_vtower *vt, const jlm_tok *tok, const char *prompt,
                               const jlm_image *img, float *logits, int32_t **ids, size_t *n_ids, jlm_err *err);

#endif
