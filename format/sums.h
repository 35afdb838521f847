/* sums.h - page checksums of a .jlm container, kept in a sidecar OUT.sums
 * beside it (docs/checksums.md; the v27 byte map has no room for them).
 *
 * Owns: the span list of a container (derived from its header alone: the
 * header and records [0, DenseOff) as one span, the dense region and every
 * page of the text, vision and expert arrays cut into Chunk-sized pieces),
 * the XXH3-64 of each span, and the sidecar's bytes (writing it atomically,
 * reading and pairing it with one container, checking spans).
 *
 * Invariants:
 *  (1) The spans are a pure function of the header: the reader derives them
 *      and refuses a sidecar whose count, container size or header hash
 *      differs (it belongs to another container).
 *  (2) A sidecar is written to PATH.sums.part, fsynced, renamed: a reader
 *      never sees half of one.
 *  (3) Checking a span that the read covers only in part hashes the bytes
 *      read followed by zeros up to the span's end (page tail padding is
 *      zero by contract); when that does not match, the caller must read the
 *      whole span and check again before declaring a mismatch.
 *
 * Thread safety: a jlm_sums is immutable after load, except the verified
 * bits, which are set atomically (any thread may check spans).
 * Memory: jlm_sums_load's result is freed by jlm_sums_free (accepts NULL).
 */
#ifndef JLM_SUMS_H
#define JLM_SUMS_H

#include <stddef.h>
#include <stdint.h>

#include "base/jlm_err.h"
#include "format/jlm_format.h"

#define JLM_SUMS_MAGIC   "JLMSUMS\0"
#define JLM_SUMS_VERSION 1u
#define JLM_SUMS_HDR_LEN 48u

/* What a span holds (names in messages). */
enum jlm_span_kind { JLM_SPAN_RECORDS = 0, JLM_SPAN_DENSE = 1, JLM_SPAN_BLOCK = 2,
                     JLM_SPAN_VISION = 3, JLM_SPAN_EXPERT = 4 };

typedef struct jlm_span { uint64_t off, len; } jlm_span;

typedef struct jlm_sums {
    uint64_t  file_size, hdr_hash, chunk;
    jlm_header hdr;
    uint32_t  n;            /* spans */
    jlm_span *spans;        /* sorted by offset, disjoint */
    uint64_t *hash;         /* expected XXH3-64 per span */
    uint8_t  *ok;           /* 1 once a span was checked (atomic) */
} jlm_sums;

/* XXH3-64 of bytes (the one hash of this module): XXH3's AVX2 loop where
 * the CPU has AVX2 (the engine hashes every page it reads first: 1.8x the
 * SSE2 loop's speed on this project's VM, docs/checksums.md), else its SSE2
 * (or scalar) loop. The value is the same from either (XXH3's contract;
 * tests/test_sums.c compares them). */
uint64_t jlm_sums_hash(const void *p, size_t n);
/* The two loops (x86-64; _avx2 only where the CPU has AVX2). */
uint64_t jlm_sums_hash_base(const void *p, size_t n);
uint64_t jlm_sums_hash_avx2(const void *p, size_t n);

/* Computes the sidecar of the container open at fd (size bytes, header
 * decoded and validated) and writes it to sums_path atomically (2); paths
 * are relative to dirfd (AT_FDCWD, or a folder held open: jlmfs's cache),
 * no link is followed, and a new file gets mode (less the umask).
 * JLM_EFORMAT / JLM_EIO / JLM_ENOSPC naming the path. */
int jlm_sums_write_fd(int fd, uint64_t size, int dirfd, const char *sums_path, unsigned mode, jlm_err *err);

/* Loads sums_path (relative to dirfd, no link followed) and pairs it with the container whose first bytes are
 * hdr_bytes (at least JLM_HEADER_LEN) and whose size is file_size.
 * JLM_ENOTFOUND: no sidecar; JLM_EFORMAT: malformed or another container's
 * (message names the sidecar and the reason). */
int jlm_sums_load(int dirfd, const char *sums_path, const uint8_t *hdr_bytes, uint64_t file_size,
                  jlm_sums **out, jlm_err *err);
void jlm_sums_free(jlm_sums *s);

/* Index of the span holding byte off, or -1 (padding between regions). */
int64_t jlm_sums_find(const jlm_sums *s, uint64_t off);

/* Names span i ("block 3 chunk 1 (bytes 8192+4096)") into buf. */
void jlm_sums_name(const jlm_sums *s, uint32_t i, char *buf, size_t n);

/* Checks span i against bytes p[0, have) (have <= span length; the rest are
 * taken as zeros, invariant 3). 0 on a match (and marks the span checked);
 * else JLM_EFORMAT with "WHAT: checksum mismatch in NAME: expected X, got Y"
 * and *got set. */
int jlm_sums_check(jlm_sums *s, uint32_t i, const void *p, uint64_t have, const char *what,
                   uint64_t *got, jlm_err *err);

/* 1 when span i was checked. */
int jlm_sums_done(const jlm_sums *s, uint32_t i);

/* PATH + ".sums", malloc'ed; NULL on OOM. */
char *jlm_sums_path(const char *container);

#endif
