/* safetensors.h - a bounded reader of safetensors files and of sharded sets
 * (model.safetensors.index.json), the converter's window on Hugging Face weights.
 *
 * Owns: the 8-byte header length, the JSON header (jansson), the shard index.
 * Must not know: config.json, architectures, the .jlm format (converter/hf.c maps).
 *
 * Invariants (docs/safetensors.md):
 *  (1) the header length is at most JLM_ST_HEADER_CAP and inside the file;
 *  (2) every tensor's [begin, end) lies in the data section, end - begin equals
 *      the product of its shape times its dtype's size, and the tensors sorted by
 *      begin are contiguous and cover the data section exactly (no overlap, no
 *      hole, no trailing bytes: a truncated or padded shard is refused);
 *  (3) names are unique across every shard of a set; a shard the index names
 *      is a plain file name in the same folder.
 * Refusals name the file and, where one is involved, the tensor.
 * Thread safety: a set is immutable after open; jlm_st_read may be called from
 * several threads (pread).
 */
#ifndef JLM_SAFETENSORS_H
#define JLM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/jlm_err.h"

#define JLM_ST_HEADER_CAP ((uint64_t)100 << 20)   /* as the reference implementation */
#define JLM_ST_MAX_DIMS   4
/* dtype U8: not a ggml type. Read only as gpt-oss's MXFP4 _blocks / _scales
 * (converter/hf.c refuses it anywhere else, by tensor name). */
#define JLM_ST_U8         0x10000u

typedef struct jlm_st_tensor {
    const char *name;
    uint32_t    dtype;                 /* GGML_F32, GGML_F16, GGML_BF16 or JLM_ST_U8 */
    uint32_t    n_dims;                /* 0 (scalar) .. JLM_ST_MAX_DIMS */
    uint64_t    shape[JLM_ST_MAX_DIMS];/* HF order: outermost first */
    uint32_t    file;                  /* shard index */
    uint64_t    off;                   /* absolute offset of the data in the shard */
    uint64_t    n_bytes;
} jlm_st_tensor;

typedef struct jlm_st_set jlm_st_set;

/* Parses one shard's header from buf (the first len bytes of a file of
 * file_size bytes; len >= 8 + header length, else JLM_EFORMAT). Tensors are
 * appended to the set's table with file index `file`. */
int  jlm_st_parse(jlm_st_set *s, const uint8_t *buf, size_t len, uint64_t file_size, uint32_t file,
                  jlm_err *err);

/* Opens DIR/model.safetensors, or every shard DIR/model.safetensors.index.json
 * names. JLM_ENOTFOUND when the folder has neither. */
int  jlm_st_open_dir(const char *dir, jlm_st_set **out, jlm_err *err);
/* The same with the folder open as dir_fd (dir names it in messages); with
 * beneath, every file is opened below dir_fd following no symlink
 * (base/beneath.h): the daemon's sources. */
int  jlm_st_open_dirfd(int dir_fd, int beneath, const char *dir, jlm_st_set **out, jlm_err *err);
/* 1 if the folder dir_fd looks completely copied (jlmfs, docs/jlmfs.md): a
 * regular config.json, and model.safetensors or every shard its index names,
 * each holding at least 8 + its header + the end its header gives its last
 * tensor. 0 with why filled otherwise. Nothing followed through a symlink.
 * A header that is there but does not parse counts as complete: planning
 * refuses it with the reason. */
int  jlm_st_dir_complete(int dir_fd, char *why, size_t n);
/* The per-shard part of it: img holds the first `have` bytes of a shard of
 * file_size bytes (8 + its header length when the file has them). 1 if the
 * file holds 8 + header + the largest data end its header gives (or its
 * header is all there but no JSON object, or its length is over the cap:
 * refused later, when planned), 0 while it is shorter. */
int  jlm_st_image_complete(const uint8_t *img, size_t have, uint64_t file_size);
/* One in-memory shard (the buffer outlives the set). For fuzzing and tests. */
int  jlm_st_open_mem(const void *buf, size_t len, const char *what, jlm_st_set **out, jlm_err *err);
void jlm_st_close(jlm_st_set *s);   /* accepts NULL */

uint64_t             jlm_st_count(const jlm_st_set *s);
const jlm_st_tensor *jlm_st_at(const jlm_st_set *s, uint64_t i);     /* sorted by name */
const jlm_st_tensor *jlm_st_find(const jlm_st_set *s, const char *name);
const char          *jlm_st_file(const jlm_st_set *s, uint32_t file);  /* path, for messages */
uint64_t             jlm_st_total_bytes(const jlm_st_set *s);

/* Reads [off, off+n) of a tensor's data (pread). JLM_EIO names file and tensor. */
int  jlm_st_read(const jlm_st_set *s, const jlm_st_tensor *t, uint64_t off, void *buf, size_t n, jlm_err *err);

#endif
