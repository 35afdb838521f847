/* convert_int.h - private declarations shared by the converter's files. */
#ifndef JLM_CONVERT_INT_H
#define JLM_CONVERT_INT_H

#include "converter/convert.h"

int jlm_conv_config(const jlm_gguf *g, jlm_config *c, jlm_err *err);
int jlm_conv_role(const char *name, int32_t *block, int *fused);
/* JLM_ERANGE when the planned container is out of proportion to the source
 * (limits.c, docs/security.md). */
int jlm_conv_check_proportion(const jlm_conv *c, jlm_err *err);

/* Opens mm_path into c->mm, fills c->vision and appends the tower's tensors
 * (from_mm) to c->tensors / c->src (vision_map.c). */
int jlm_conv_map_vision(jlm_conv *c, int root_fd, const char *mm_path, FILE *notes, jlm_err *err);
/* The GGUF a container tensor's bytes come from. */
static inline const jlm_gguf *jlm_conv_src_gguf(const jlm_conv *c, const jlm_conv_src *s)
{
    return s->from_mm ? c->mm : c->g;
}

/* JLM_WRITER_NAME: format/jlm_format.h (the engine compares it on load) */

#endif
