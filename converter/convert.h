/* convert.h - GGUF -> .jlm conversion: architecture mapping, tensor roles,
 * fused-tensor splitting, the layout plan (pass 1) and packing (pass 2).
 *
 * Owns: the mapping of llama.cpp's metadata keys and tensor names to the
 * typed config and role codes (docs/converter.md lists it per architecture).
 * Uses format/ (planner, writer, reader, and the dequantization oracle
 * format/dequant.h for read-back checks), converter/gguf, converter/pack and
 * converter/vocab.
 *
 * Invariants:
 *  (1) jlm_conv_open computes the complete plan from shapes alone: no weight
 *      byte is read before jlm_conv_write (so --plan and jlmfs views are cheap).
 *  (2) jlm_conv_write leaves OUT only after the written file re-opens cleanly
 *      and spot checks match the source; on any failure neither OUT nor
 *      OUT.part exists afterwards.
 * Thread safety: open, write and close one jlm_conv from one thread at a
 * time. jlm_conv_write packs on worker threads it starts and joins itself;
 * every write through the jlm_io seam, the progress callback and the error
 * message stay on the calling thread. jlm_conv_pack_tensor and
 * jlm_conv_read_span may run on any number of threads at once, also during
 * a write (the plan is read-only after open; the source is read with pread).
 */
#ifndef JLM_CONVERT_H
#define JLM_CONVERT_H

#include "format/jlm_format.h"
#include "converter/gguf.h"

#include <stdio.h>

typedef struct jlm_conv jlm_conv;

/* Where a container tensor's bytes come from in the source. */
typedef struct jlm_conv_src {
    uint32_t gguf_idx;      /* index in g->tensors */
    uint64_t row0;          /* first source row (fused tensors are split by rows) */
    uint32_t src_type;      /* ggml type */
    int      exact;         /* 0: re-quantized (e.g. Q2_K) */
    int      from_mm;       /* 1: the tensor is the mmproj's (c->mm), not the text GGUF's */
    uint32_t qtype;         /* --type: quantized to this ggml type at packing (0: as stored) */
} jlm_conv_src;

struct jlm_conv {
    jlm_gguf       *g;
    jlm_arena      *arena;
    jlm_config      config;
    jlm_vocab       vocab;
    jlm_fingerprint fp;
    uint32_t        n_tensors;
    jlm_tensor     *tensors;   /* table order, offsets from the plan */
    jlm_conv_src   *src;       /* (n_tensors,) */
    jlm_plan        plan;
    const char     *src_path;
    jlm_gguf       *mm;        /* the vision projector GGUF (--mmproj), or NULL */
    jlm_vision      vision;    /* its vision record when mm != NULL */
    uint32_t        quant;     /* --type target (ggml type), 0: keep */
};

/* Progress callback: bytes packed so far of total. */
typedef void (*jlm_conv_progress)(void *ctx, uint64_t done, uint64_t total);

/* Opens a GGUF, maps it and plans the container. Notes (e.g. a re-quantized
 * type) go to `notes` if non-NULL (one line each). Errors name the file:
 * JLM_EUNSUPPORTED for an unknown architecture / tensor / type (named),
 * JLM_EFORMAT for a malformed source. *out untouched on error. */
int  jlm_conv_open(const char *src_path, FILE *notes, jlm_conv **out, jlm_err *err);
/* Same with src_path relative to the directory root_fd, opened without
 * following any symlink and without leaving root_fd (jlm_gguf_open_at): what
 * the daemon uses for sources in SRC. */
int  jlm_conv_open_at(int root_fd, const char *src_path, FILE *notes, jlm_conv **out, jlm_err *err);
void jlm_conv_close(jlm_conv *c);   /* accepts NULL */
/* Same, with a vision tower from an mmproj GGUF (llama.cpp's clip format):
 * the tower's config becomes the vision record, its blocks the vision pages
 * (docs/vision.md). A projector whose output width is not the text model's
 * n_embd, an unknown projector type or tensor is refused, naming the file. */
int  jlm_conv_open_mm(const char *src_path, const char *mmproj_path, FILE *notes, jlm_conv **out, jlm_err *err);

/* The same, quantizing weights to `type` at packing ("keep" or NULL: as they
 * are; "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q5_1", "Q5_0", "Q4_1", "Q4_0"), with llama-quantize's per-tensor choices (converter/quantize.h). */
int  jlm_conv_open_as(const char *src_path, const char *type, FILE *notes, jlm_conv **out, jlm_err *err);
/* Both: a vision tower (mmproj_path, or NULL) and a target type (or NULL). */
int  jlm_conv_open_full(int root_fd, const char *src_path, const char *mmproj_path, const char *type, FILE *notes,
                        jlm_conv **out, jlm_err *err);

/* Records the device the container is meant for in its fingerprint (4.7:
 * "cpu" by default; "vulkan" or "cuda"), planning again. Compared on load,
 * never enforced. JLM_EINVAL for another name. */
int  jlm_conv_set_device(jlm_conv *c, const char *device, jlm_err *err);

/* Pass 2: packs every tensor into OUT.part, verifies, renames to OUT. */
int  jlm_conv_write(jlm_conv *c, const char *out_path, const jlm_io *io,
                    jlm_conv_progress cb, void *cb_ctx, jlm_err *err);

/* Packs the planes of tensor i into buf, laid out exactly as they are in the
 * file from the tensor's page/dense start `base` (buf covers [base, base+len)).
 * Used by the writer and by jlmfs's on-demand packing of a single page.
 * For a bank, `expert` selects the sheet and base is that expert's page. */
int  jlm_conv_pack_tensor(jlm_conv *c, uint32_t i, int64_t expert, uint8_t *buf,
                          uint64_t base, uint64_t len, jlm_err *err);

/* Fills out[0, len) with the bytes the finished container has at [off,
 * off+len), computed from the plan and the source alone (header, sections,
 * packed planes, zero padding): what jlmfs serves for a page that background
 * conversion has not written yet. Packs every tensor the span touches (the
 * whole tensor, or the whole expert sheet, even for a partial overlap), so
 * callers should ask for whole pages. JLM_EINVAL if the span passes EOF;
 * source errors as jlm_conv_write. Thread safety: concurrent calls on one
 * jlm_conv are safe (reads use pread, state is read-only after open). */
int  jlm_conv_read_span(jlm_conv *c, uint64_t off, size_t len, uint8_t *out, jlm_err *err);

/* Default output path: SRC with .gguf replaced by .jlm (caller frees). */
char *jlm_conv_default_out(const char *src_path);

#endif
