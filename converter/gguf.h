/* gguf.h - a bounded GGUF v2/v3 reader (the converter's only window on GGUF).
 *
 * Owns: parsing the GGUF header, every metadata value type (incl. nested
 * arrays), the tensor infos, general.alignment, split files
 * (NAME-00001-of-0000N.gguf: all parts opened, tensors merged, metadata from
 * part 1), and the reference dequantization of ggml block types to f32
 * (bit-identical to ggml's dequantize_row_*).
 * Must not know: the .jlm format, architectures, roles.
 *
 * Invariants:
 *  (1) Every count, length and offset read from the file is checked against
 *      the bytes left (overflow-safe) before anything is allocated or indexed;
 *      a truncated or corrupt file is refused with JLM_EFORMAT, never crashes.
 *  (2) Every tensor's data span [data_off, data_off + n_bytes) lies inside its
 *      part file.
 * Thread safety: a jlm_gguf is immutable after open; jlm_gguf_read may be
 * called from several threads (pread).
 * Memory: the jlm_gguf owns all strings/arrays it returns; they live until
 * jlm_gguf_close.
 */
#ifndef JLM_GGUF_H
#define JLM_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "base/jlm_err.h"

/* ggml type ids as stored in GGUF */
enum jlm_ggml_type {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6,
    GGML_Q5_1 = 7, GGML_Q8_0 = 8, GGML_Q8_1 = 9, GGML_Q2_K = 10, GGML_Q3_K = 11,
    GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_Q8_K = 15,
    GGML_I8 = 24, GGML_I16 = 25, GGML_I32 = 26, GGML_I64 = 27, GGML_F64 = 28,
    GGML_BF16 = 30, GGML_MXFP4 = 39,
};

/* GGUF metadata value types */
enum jlm_gguf_vtype {
    GGUF_T_U8 = 0, GGUF_T_I8 = 1, GGUF_T_U16 = 2, GGUF_T_I16 = 3, GGUF_T_U32 = 4,
    GGUF_T_I32 = 5, GGUF_T_F32 = 6, GGUF_T_BOOL = 7, GGUF_T_STRING = 8,
    GGUF_T_ARRAY = 9, GGUF_T_U64 = 10, GGUF_T_I64 = 11, GGUF_T_F64 = 12,
};

typedef struct jlm_gguf_str { const char *s; uint64_t len; } jlm_gguf_str;  /* s NUL-terminated */

typedef struct jlm_gguf_kv {
    jlm_gguf_str key;
    uint32_t     type;          /* enum jlm_gguf_vtype */
    uint32_t     arr_type;      /* element type when type == ARRAY */
    uint64_t     n;             /* element count (1 for scalars) */
    union {
        uint64_t u; int64_t i; double f; int b;   /* scalar value, widened */
        jlm_gguf_str str;
    } v;
    const void  *arr;           /* ARRAY: elements as stored (numbers little-endian, packed)
                                   or, for strings, a jlm_gguf_str[n]; nested arrays: jlm_gguf_kv[n] */
} jlm_gguf_kv;

typedef struct jlm_gguf_tensor {
    jlm_gguf_str name;
    uint32_t     n_dims;
    uint64_t     ne[4];         /* ggml order: ne[0] = row length; unused = 1 */
    uint32_t     type;          /* enum jlm_ggml_type */
    uint32_t     part;          /* which split file */
    uint64_t     data_off;      /* absolute offset in that part file */
    uint64_t     n_bytes;       /* size of the data */
} jlm_gguf_tensor;

typedef struct jlm_gguf {
    char            *path;      /* first part */
    uint32_t         version;
    uint32_t         n_parts;
    uint64_t         n_kv;
    jlm_gguf_kv     *kv;
    uint64_t         n_tensors;
    jlm_gguf_tensor *tensors;
    uint64_t         alignment;
    uint64_t         total_bytes; /* sum of part file sizes */
    void            *priv;
} jlm_gguf;

/* Opens path (if it is part 1 of a split, all parts). *out untouched on error;
 * messages name the file and the offset/field. */
int  jlm_gguf_open(const char *path, jlm_gguf **out, jlm_err *err);
/* Same with path relative to the directory root_fd, opened (with every split
 * part) by jlm_open_beneath: no symlink followed, nothing outside root_fd.
 * Messages name the relative path only. root_fd -1: jlm_gguf_open. */
int  jlm_gguf_open_at(int root_fd, const char *path, jlm_gguf **out, jlm_err *err);
/* Same on an in-memory image (no splits); the buffer must outlive the handle. For fuzzing. */
int  jlm_gguf_open_mem(const void *buf, size_t len, const char *what, jlm_gguf **out, jlm_err *err);
void jlm_gguf_close(jlm_gguf *g);   /* accepts NULL */

/* A handle over tables the caller built (the Hugging Face folder reader,
 * converter/safetensors.c): kv and tensors (with names) must stay valid until
 * close, when owner_free(ctx) runs (also on error). Reads go to read(ctx, i,
 * off, buf, n) with i the tensor's index; data_off/part are the caller's.
 * Keys and tensor names must be unique (JLM_EFORMAT naming the duplicate). */
typedef int (*jlm_gguf_reader)(void *ctx, uint64_t i, uint64_t off, void *buf, size_t n, jlm_err *err);
int  jlm_gguf_virtual(const char *path, jlm_gguf_kv *kv, uint64_t n_kv, jlm_gguf_tensor *t, uint64_t n_t,
                      uint64_t total_bytes, jlm_gguf_reader read, void *ctx, void (*owner_free)(void *),
                      jlm_gguf **out, jlm_err *err);

/* Lookups: NULL if absent. */
const jlm_gguf_kv     *jlm_gguf_find(const jlm_gguf *g, const char *key);
const jlm_gguf_tensor *jlm_gguf_find_tensor(const jlm_gguf *g, const char *name);

/* Typed getters: 0 and *out set if present and convertible (any integer type
 * for u32/i64 within range; f32/f64 for float; bool), JLM_ENOTFOUND if absent,
 * JLM_EFORMAT if of an incompatible type. */
int jlm_gguf_get_u32(const jlm_gguf *g, const char *key, uint32_t *out, jlm_err *err);
int jlm_gguf_get_i64(const jlm_gguf *g, const char *key, int64_t *out, jlm_err *err);
int jlm_gguf_get_f32(const jlm_gguf *g, const char *key, float *out, jlm_err *err);
int jlm_gguf_get_bool(const jlm_gguf *g, const char *key, int *out, jlm_err *err);
int jlm_gguf_get_str(const jlm_gguf *g, const char *key, jlm_gguf_str *out, jlm_err *err);

/* Reads [off, off+n) of a tensor's data into buf (pread). JLM_EIO on error. */
int jlm_gguf_read(const jlm_gguf *g, const jlm_gguf_tensor *t, uint64_t off, void *buf, size_t n, jlm_err *err);
/* fstat of the open file of part k (0-based): what the reads see now (a file
 * rewritten in place shows its new size and mtime; an unlinked or renamed one
 * is unchanged). -1 with errno set for an in-memory image or a bad k. */
int jlm_gguf_fstat(const jlm_gguf *g, uint32_t k, struct stat *st);

/* ggml block traits: elements per block and bytes per block; 0 if unknown. */
uint32_t jlm_ggml_block_elems(uint32_t type);
uint32_t jlm_ggml_block_bytes(uint32_t type);
const char *jlm_ggml_type_name(uint32_t type);   /* "Q4_K", or NULL */

/* Reference dequantization of one row of k elements of ggml type `type`
 * (k a multiple of the block size) to f32: exactly ggml's dequantize_row_*
 * (f16/bf16 conversion included), so results compare bit for bit.
 * JLM_EUNSUPPORTED for a type it does not know. */
int jlm_ggml_dequant_row(uint32_t type, const void *src, float *dst, uint64_t k, jlm_err *err);

/* f16 / bf16 <-> f32 exactly as ggml does it. */
float    jlm_f16_to_f32(uint16_t h);
uint16_t jlm_f32_to_f16(float f);     /* round to nearest even */
float    jlm_bf16_to_f32(uint16_t h);

#endif
