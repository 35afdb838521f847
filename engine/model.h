/* model.h - the inference engine: a container, its pager, the KV cache and
 * the forward pass of every supported architecture on the CPU.
 *
 * Owns: the forward pass of llama incl. Mixtral-style MoE, qwen2, qwen3,
 * qwen3moe, olmoe, gemma3, phi3, gpt-oss: one block program per family
 * (engine/prog.h, engine/arch/) run by the executor (exec*.c) under the
 * layer loop (model.c), pages through the streamer (stream.c); the KV cache (F32, F16 or Q8_0 keys and values, grown as the context
 * fills: engine/kvcache.c); scratch buffers; the
 * budget's split between them and the page frames. Reads only the .jlm container
 * (format/), through a page source and the pager (engine/pager.h); computes
 * with kernels/cpu. Knows nothing of GGUF.
 *
 * Invariants:
 *  (1) The dense region is read whole at open and stays resident; every
 *      block and expert page is reached through the pager, pinned while its
 *      layer runs and unpinned right after.
 *  (2) The logits depend only on the tokens evaluated, never on the budget
 *      (tests: same ids at every budget down to one block frame).
 *  (3) n_past <= n_ctx; a token beyond n_ctx is refused (JLM_ERANGE).
 * Thread safety: one engine per thread; it runs its own worker pool.
 * Memory: the engine owns the model, source, pager, pool and buffers.
 */
#ifndef JLM_MODEL_H
#define JLM_MODEL_H

#include <stdint.h>
#include <stdio.h>

#include "engine/pager.h"
#include "engine/routing.h"
#include "engine/source.h"
#include "format/jlm_format.h"

/* ---------------------------------------------------------------- pages of a container */
/* Array indices jlm_pager_open_model gives a container's page arrays (an
 * array without pages is present with n_pages 0). */
enum { JLM_PAGER_TEXT = 0, JLM_PAGER_VISION = 1, JLM_PAGER_EXPERTS = 2 };
/* Opens a pager over m's text (BLOCK class), vision (BLOCK) and expert
 * (EXPERT) page arrays with extents from jlm_fmt_page_extent and the
 * container's Chunk; src reads the container's bytes. Errors as
 * jlm_pager_open, naming m->path; *out untouched then. */
int  jlm_pager_open_model(const jlm_model *m, jlm_source *src, uint64_t budget,
                          jlm_pager **out, jlm_err *err);

/* jlm_engine_opts.budget: take it from the memory cgroup's limit or
 * MemAvailable (engine/memlimit.h), less a headroom; the files are read
 * under $JLM_MEM_ROOT when set (a test seam), else under /. */
#define JLM_BUDGET_AUTO UINT64_MAX

#define JLM_ENGINE_MAX_CTX (1u << 24)   /* positions: jlm_engine_open refuses more (JLM_EINVAL) */

typedef struct jlm_engine_opts {
    int      n_threads;    /* <= 0: online CPUs */
    uint64_t budget;       /* bytes of the engine's memory: page frames + KV cache
                            * + scratch + the dense region (frames get what the
                            * rest leaves); 0 = unlimited; JLM_BUDGET_AUTO */
    uint32_t n_ctx;        /* 0: min(model context, 4096); at most JLM_ENGINE_MAX_CTX */
    int      direct;       /* plain-file source: 1 try O_DIRECT, 0 buffered */
    int      no_prefetch;  /* 1: no block read ahead on the pager's reader thread */
    int      no_predict;   /* 1: no read ahead of the next MoE block's predicted experts */
    int      no_warm;      /* 1: no background read of the pages (the cold start, docs/pager.md) */
    int      whole_blocks; /* 1: a block's page acquired whole under a budget, not op by op */
    uint32_t read_depth;   /* pages read at once (the routed experts of a block);
                            * 0: JLM_ENGINE_READ_DEPTH; 1: one at a time */
    int      verify;       /* 1: check every span of the container against
                            * PATH.sums (format/sums.h) on its first read, and
                            * refuse to open without a sidecar that pairs with it */
    int      no_verify;    /* 1: no checks; neither: checks when PATH.sums exists
                            * (a sidecar that does not pair is refused) */
    int      quiet;        /* 1: no notes on stderr */
    const char *backend;   /* NULL/"cpu"; "vulkan" / "cuda": matmuls on a Vulkan /
                            * CUDA device (engine/backend_vk.h, backend_cu.h;
                            * JLM_CUDA_EMULATE=1: the host emulation of a CUDA
                            * device); "auto": Vulkan on a GPU if
                            * one is found, else the CPU with a note;
                            * "cuda,vulkan" / "vulkan,cuda": two devices in
                            * block order (jlm_engine_split_parse) */
    const char *device;    /* CUDA: device index; Vulkan: index or name substring (naming a
                            * CPU device such as lavapipe allows it); two
                            * devices: "A,B", either may be empty (the default) */
    uint32_t gpu_layers;   /* Vulkan/CUDA: blocks 0..N-1 on the device, the rest and
                            * the output on the CPU; 0 = all (output included).
                            * Two devices: the first device's count, >= 1 */
    uint64_t gpu_budget;   /* Vulkan/CUDA: bytes of device page frames (pager policy);
                            * 0: jlm_dev_default_budget; below one block frame
                            * plus the routed experts: raised, with a note.
                            * Two devices: the first device's */
    uint32_t gpu_layers2;  /* two devices: the second device's blocks, the next
                            * ones after the first's; 0 = all remaining (the
                            * output included); the rest on the CPU */
    uint64_t gpu_budget2;  /* two devices: the second device's frames, as gpu_budget */
    const char *kv;        /* NULL/"f32"; "f16" or "q8_0": keys and values stored as
                            * F16 (half the memory) or ggml's Q8_0 (34 bytes a 32
                            * values; head dimensions in whole blocks of 32; not
                            * latent attention); logits within docs/engine.md's
                            * tolerances of the F32 cache's. "auto" (the CLI's
                            * default): F16, F32 for latent attention */
    const char *kv_k, *kv_v;   /* the keys' / values' type alone, over kv (--cache-type-k/-v) */
    const char *expert_policy;   /* NULL: JLM_XP_DEFAULT; "auto" / "lru" / "lfu" / "next": which
                            * unpinned expert page the host pager evicts first
                            * (engine/xpolicy.h) */
} jlm_engine_opts;

typedef struct jlm_engine jlm_engine;

/* Device backends one engine splits its blocks over (`--backend cuda,vulkan`). */
#define JLM_ENGINE_DEVS 2
/* jlm_engine_opts.backend and .device as lists (engine/model_split.c):
 * backend NULL or "cpu" (n 0), "auto" (n 1, is_auto), one device backend,
 * or two different ones joined by a comma; device: with one backend the
 * whole string (commas included, as before the lists), with two the entries
 * split at the commas (fewer than two: the rest default, ""). */
typedef struct jlm_engine_split {
    int         n;                          /* device backends, 0..JLM_ENGINE_DEVS */
    int         is_auto;
    const char *kind[JLM_ENGINE_DEVS];      /* "vulkan" or "cuda" */
    char        device[JLM_ENGINE_DEVS][256];   /* "": the backend's default */
} jlm_engine_split;
/* JLM_EINVAL with one line naming the option ("--backend 'cuda,cuda': the
 * same backend twice ...": an unknown name, the same kind twice, more than
 * two, an empty entry, auto or cpu in a list; "--device '0,0,0': ..."); *out
 * untouched then. Shared by the engine and the CLI's check before any work. */
int  jlm_engine_split_parse(const char *backend, const char *device, jlm_engine_split *out, jlm_err *err);

/* opts.kv, kv_k and kv_v are each NULL or a type's name: JLM_EINVAL with one
 * line naming the option otherwise ("--cache-type-k 'q4': expected f32, f16
 * or q8_0"; --kv may also be "auto"). The CLI's check before any work;
 * jlm_engine_open checks again. */
int  jlm_engine_kv_check(const jlm_engine_opts *opts, jlm_err *err);

/* Opens a container (a .jlm file, or a jlmfs view directory's model.jlm),
 * reads its dense region, sizes the pager (a budget below the minimum working
 * set is raised to it, with a note on stderr unless quiet) and allocates the
 * KV cache. JLM_EUNSUPPORTED for an architecture without a graph, or the
 * reader's errors; *out untouched on error. */
int  jlm_engine_open(const char *path, const jlm_engine_opts *opts, jlm_engine **out, jlm_err *err);
void jlm_engine_close(jlm_engine *e);   /* accepts NULL */

/* Runs tokens[0, n) at positions n_past.. and writes the logits after the last
 * one to logits (n_vocab floats) if non-NULL. JLM_ERANGE (context full, token
 * id out of range), or a page-in error (JLM_EIO...) naming the page: the
 * engine's state is then unchanged for the failed token. */
int  jlm_engine_eval(jlm_engine *e, const int32_t *tokens, uint32_t n, float *logits, jlm_err *err);

/* Runs n embedding rows (n_embd floats each, entered unscaled) at positions
 * n_past.., e.g. an image's projector output; bidir: the rows attend to each
 * other both ways (gemma3's image block; the sliding window still applies to
 * earlier keys). Logits after the last row as jlm_engine_eval. JLM_ERANGE
 * when the context is full; state unchanged on error. */
int  jlm_engine_eval_embd(jlm_engine *e, const float *embd, uint32_t n, int bidir, float *logits, jlm_err *err);
/* --backend vulkan|cuda: matmuls run on the device and bytes of planes uploaded
 * (both 0 on the CPU backend; summed over two devices). Cannot fail. */
void jlm_engine_dev_counters(const jlm_engine *e, uint64_t *matmuls, uint64_t *bytes_up);
/* The device backend's counters (engine/backend.h); 0 and *out zeroed
 * when the engine runs on the CPU only, else 1. With two devices: the
 * first's (jlm_engine_dev_counters sums both). */
struct jlm_dev_stats;
int  jlm_engine_dev_stats(const jlm_engine *e, struct jlm_dev_stats *out);
/* Device i's counters (0: the first, in block order); 0 and *out zeroed
 * when there is no device i, else 1. Cannot fail. */
int  jlm_engine_dev_stats_at(const jlm_engine *e, int i, struct jlm_dev_stats *out);

/* Forgets the KV cache from position pos on (0: everything). Cannot fail. */
void jlm_engine_rewind(jlm_engine *e, uint32_t pos);

/* ---------------------------------------------------------------- sequences
 * A jlm_engine_seq is a KV cache of its own (n_ctx positions) on an engine,
 * so one engine (one pager, one copy of the weights) serves several
 * sequences. jlm_engine_eval_batch runs one token of each of n sequences in
 * one forward pass: each block page is pinned once for all of them, each
 * token is computed exactly as it is alone (every kernel's row of a
 * matmul equals its matvec bit for bit; norms, RoPE, attention and the
 * experts run per token on that token's own cache), so a sequence's logits
 * do not depend on what else is in the batch. A sequence belongs to the
 * engine that created it and must be destroyed before it. */
typedef struct jlm_engine_seq jlm_engine_seq;
int  jlm_engine_seq_create(jlm_engine *e, jlm_engine_seq **out, jlm_err *err);   /* JLM_ENOMEM */
void jlm_engine_seq_destroy(jlm_engine_seq *s);                                  /* accepts NULL */
void jlm_engine_seq_rewind(jlm_engine_seq *s, uint32_t pos);                     /* cannot fail */
uint32_t jlm_engine_seq_n_past(const jlm_engine_seq *s);
/* jlm_engine_eval on s's cache instead of the engine's own. */
int  jlm_engine_eval_seq(jlm_engine *e, jlm_engine_seq *s, const int32_t *tokens, uint32_t n, float *logits,
                         jlm_err *err);
/* jlm_engine_eval_embd on s's cache instead of the engine's own. */
int  jlm_engine_eval_embd_seq(jlm_engine *e, jlm_engine_seq *s, const float *embd, uint32_t n, int bidir,
                              float *logits, jlm_err *err);
/* tokens[t] at the next position of seqs[t], t < n <= jlm_engine_max_batch(),
 * all distinct; logits (n, n_vocab) after each. JLM_EINVAL (n, a repeated
 * sequence), JLM_ERANGE (a bad id, a full context: nothing evaluated), a
 * page-in error (no sequence advances). */
int  jlm_engine_eval_batch(jlm_engine *e, jlm_engine_seq *const *seqs, const int32_t *tokens, uint32_t n,
                           float *logits, jlm_err *err);
uint32_t jlm_engine_max_batch(void);
/* A KV prefix kept apart from any sequence (serve's prefix cache): the
 * first n positions of a sequence's cache, compact (jlm_engine_kv_bytes(n)
 * bytes). Loading the first k <= n positions of a saved prefix into s makes
 * s hold exactly what evaluating those k tokens on it would (n_past = k), so
 * what follows evaluates bit for bit as after the tokens themselves.
 * jlm_engine_kv_bytes is 0 for a model whose cache is not kept per KV head
 * (latent attention, deepseek2): its prefixes cannot be saved, and save and
 * load do nothing. */
uint64_t jlm_engine_kv_bytes(const jlm_engine *e, uint32_t n);
/* n <= jlm_engine_seq_n_past(s); buf holds jlm_engine_kv_bytes(e, n) bytes.
 * A sequence whose blocks run on a device keeps their cache there: its
 * positions come back for the save (counted in the device's activations
 * down). Error: the device's copy failed (buf undefined). */
int  jlm_engine_kv_save(const jlm_engine *e, const jlm_engine_seq *s, uint32_t n, void *buf, jlm_err *err);
/* buf saved with n positions; k <= n and k <= n_ctx; the device's share of
 * them goes up (activations up). Error: the device's copy failed (s is then
 * empty: n_past 0). */
int  jlm_engine_kv_load(const jlm_engine *e, jlm_engine_seq *s, const void *buf, uint32_t n, uint32_t k, jlm_err *err);

/* Embeddings (`jlm run --embeddings`, serve's /v1/embeddings): evaluates
 * tokens[0, n) at the end of s's cache (NULL: the engine's own) and writes
 * to out (jlm_engine_n_embd floats) their final hidden states, after the
 * output norm, pooled (the mean over the n tokens, or with pool_last the
 * last token's) and L2-normalised (an all-zero vector stays zero). The
 * cache advances by n as with jlm_engine_eval. JLM_EINVAL (n 0), else the
 * errors of jlm_engine_eval. */
int  jlm_engine_embed(jlm_engine *e, jlm_engine_seq *s, const int32_t *tokens, uint32_t n, int pool_last, float *out,
                      jlm_err *err);
uint32_t jlm_engine_n_embd(const jlm_engine *e);

const jlm_model *jlm_engine_model(const jlm_engine *e);
uint32_t jlm_engine_n_past(const jlm_engine *e);
uint32_t jlm_engine_n_ctx(const jlm_engine *e);
uint32_t jlm_engine_n_vocab(const jlm_engine *e);
jlm_pager *jlm_engine_pager(jlm_engine *e);
/* The resident dense region (DenseLen bytes from DenseOff), for engine/vision.c. */
const uint8_t *jlm_engine_dense(const jlm_engine *e);
/* The engine's worker pool, for engine/vision.c between evaluations (never
 * while one runs: the pool is not reentrant). */
struct jlm_pool *jlm_engine_pool(jlm_engine *e);
/* Profiling (jlm bench --profile): where evaluation time goes. While on,
 * each evaluation adds its wall time to total_ns and the time of each class
 * of operation (measured on the calling thread, which also runs a slice of
 * every parallel part) to ns[class]; JLM_PROF_OTHER is the remainder
 * (norms, RoPE, activations, residual adds, embedding: the serial glue).
 * The pool's figures say how long threads waited at dispatch barriers and
 * how much of the time ran in parallel: serial = total - pool wall time.
 * JLM_PROF_SAMPLE is added by the caller (jlm_engine_prof_add): sampling is
 * outside the engine. Off (the default): no clock is read. */
enum {
    JLM_PROF_MATMUL,    /* weight matmuls, activation quantization included */
    JLM_PROF_ATTN,      /* attention over the cache (scores, softmax, values) */
    JLM_PROF_ROUTE,     /* MoE routing: router matvec and top-k */
    JLM_PROF_PAGEIN,    /* waiting for block and expert pages (jlm_pager_get) */
    JLM_PROF_SAMPLE,    /* sampling, added by the caller */
    JLM_PROF_OTHER,     /* the rest: total - the above */
    JLM_PROF_N
};
typedef struct jlm_engine_prof {
    unsigned long long ns[JLM_PROF_N];
    unsigned long long total_ns;       /* evaluations' wall time (+ JLM_PROF_SAMPLE) */
    unsigned long long evals, tokens;
    unsigned long long dispatches;     /* parallel parts that reached the workers */
    unsigned long long par_wall_ns;    /* their wall time */
    unsigned long long wait_ns;        /* thread time waiting at their barriers, summed over threads */
    unsigned long long busy_ns;        /* thread time working in them, summed over threads */
    int n_threads;
} jlm_engine_prof;
void jlm_engine_profile(jlm_engine *e, int on);
void jlm_engine_prof_get(const jlm_engine *e, jlm_engine_prof *out);   /* OTHER computed here */
void jlm_engine_prof_reset(jlm_engine *e);
void jlm_engine_prof_add(jlm_engine *e, int cls, unsigned long long ns);
const char *jlm_engine_prof_name(int cls);
/* Device i's share (engine/backend.h, jlm_dev_prof: its time per op class,
 * and transfer/wait) since jlm_engine_profile or jlm_engine_prof_reset; on
 * the CPU lines above, a device's time is in the class the host was in when
 * it called the device (a matmul offload: matmul; a block on the device:
 * norms/rope/act). 0 and *out zeroed when there is no device i. Cannot fail. */
struct jlm_dev_prof;
int jlm_engine_dev_prof_at(const jlm_engine *e, int i, struct jlm_dev_prof *out);

/* The page frames' budget actually in force (after subtracting the KV cache
 * as far as it has grown, scratch and dense region, and raising to the
 * minimum working set); 0: unlimited. It shrinks as the cache grows (32
 * positions at a time, as evaluation reaches them) and as a batch reaches
 * more scratch rows, and grows back when jlm_engine_rewind gives positions
 * back or, under a budget, a smaller batch gives rows back. */
uint64_t jlm_engine_budget(const jlm_engine *e);
/* Where the engine's memory goes, for --stats. */
typedef struct jlm_engine_mem {
    uint64_t budget;       /* the whole budget asked for (or found); 0: unlimited */
    uint64_t frames;       /* = jlm_engine_budget */
    uint64_t kv;           /* the engine's own KV cache as far as it has grown (the pages
                            * kv_have positions touch; sequences add theirs, not counted) */
    uint64_t scratch;      /* activation buffers (their per-row ones: the rows the batches reached) */
    uint64_t dense;        /* the resident dense region */
    const char *kv_k, *kv_v;   /* the keys' and values' types: "f32", "f16", "q8_0" */
    uint32_t kv_have;      /* positions the cache holds memory for (chunks of 32) */
    uint64_t kv_full;      /* bytes the cache takes at the whole context */
    uint64_t kv_token;     /* KV bytes one position of context takes, every layer (latent attention:
                            * the latent and the RoPE key, not the expanded heads) */
    uint32_t kv_row;       /* values a position takes in one layer (keys + values, or the latent row) */
    char     source[320];  /* how budget was chosen: "--budget", "cgroup v1
                            * FILE ...", "MemAvailable ...", "none" */
} jlm_engine_mem;
void jlm_engine_mem_info(const jlm_engine *e, jlm_engine_mem *out);   /* cannot fail */
/* The read ahead of routed experts (--stats): the next MoE block's experts
 * predicted from this block's input (the next router applied early) and read
 * while this block computes. predicted: experts predicted; hits: of those,
 * the ones the block then routed to; reads: predicted experts read ahead
 * (not resident); used: of those, routed to; wasted_bytes: bytes read ahead
 * for experts the block did not route to; held: predicted experts not
 * resident and not read, because too few of the recent ones were routed to
 * (docs/pager.md, Reading ahead). Zero when off or not a MoE. */
typedef struct jlm_engine_predict {
    uint64_t predicted, hits, reads, used, wasted_bytes, held;
    uint64_t warm, warm_bytes;   /* pages (bytes) the background read of the cold start started */
} jlm_engine_predict;
void jlm_engine_predict_stats(const jlm_engine *e, jlm_engine_predict *out);   /* cannot fail */
/* Pages read at once when nothing else is said (jlm_engine_opts.read_depth):
 * the queue depth measured on this disk (docs/bench.md, Expert reads). */
#define JLM_ENGINE_READ_DEPTH 8
/* Bytes of weights one token reads: the dense tensors a token uses plus
 * every block page (and the routed experts' pages, counted as n_expert_used
 * pages per MoE block). For the roofline bench. */
uint64_t jlm_engine_bytes_per_token(const jlm_engine *e);

/* Expert routing observed on the last evaluated token (for tests): for block
 * b, the n_expert_used expert indices chosen; NULL for a dense block. */
const int32_t *jlm_engine_last_route(const jlm_engine *e, uint32_t block);

/* --trace-routing: from now on every routing decision is a line of f
 * (NULL: none), in the order the engine routes (a prefill batch block by
 * block, then each generated token). f first gets the header line
 *   # jlm routing trace 1 n_layer L n_expert E n_used K expert_bytes B
 * (B: the mean bytes of an expert page), then one line per token and
 * routed block: "POS BLOCK ID..." (the position, the block index, the
 * n_used chosen expert ids in slot order), decimal, space-separated
 * (docs/pager.md, Expert cache policy; bench/routing_replay.c reads it).
 * Writes are not checked here: the caller checks f (ferror) when done.
 * JLM_EINVAL for a model without routed experts (f untouched). */
int jlm_engine_trace_routing(jlm_engine *e, FILE *f, jlm_err *err);

/* --warm-from: the background read of the cold start (docs/pager.md) takes
 * the expert pages in the order of their routings in t (an earlier run's
 * --trace-routing, routing.h), most routed first, the rest in file order;
 * the text pages still come first. Call before the first evaluation.
 * JLM_EINVAL for a model without routed experts or a trace of another
 * shape (n_layer, n_expert, n_used), JLM_EUNSUPPORTED when the expert pages
 * are not n_expert a block with a router, JLM_ENOMEM; the order is then
 * unchanged. Changes which pages are read when, never a result. */
int jlm_engine_warm_order(jlm_engine *e, const jlm_routing_trace *t, jlm_err *err);

#endif
