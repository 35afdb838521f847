/* convert_int.h - private declarations shared by the converter's files. */
#ifndef JLM_CONVERT_INT_H
#define JLM_CONVERT_INT_H

#include "converter/convert.h"

int jlm_conv_config(const jlm_gguf *g, jlm_config *c, jlm_err *err);
int jlm_conv_role(const char *name, int32_t *block, int *fused);

#define JLM_WRITER_NAME "jlm convert 0.1 (format 27)"

#endif
