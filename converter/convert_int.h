/* convert_int.h - private declarations shared by the converter's files. */
#ifndef JLM_CONVERT_INT_H
#define JLM_CONVERT_INT_H

#include "convert.h"

int jlm_conv_config(const jlm_gguf *g, jlm_config *c, jlm_err *err);
int jlm_conv_role(const char *name, int32_t *block, int *fused);
/* JLM_ERANGE when the planned container is out of proportion to the source
 * (limits.c, docs/security.md). */
int jlm_conv_check_proportion(const jlm_conv *c, jlm_err *err);

#define JLM_WRITER_NAME "jlm convert 0.1 (format 27)"

#endif
