/* memlimit.h - how much memory this process may use: its memory cgroup's
 * limit and the system's MemAvailable, for the engine's automatic budget
 * (jlm_engine_opts.budget = JLM_BUDGET_AUTO, docs/engine.md).
 *
 * Owns: reading and parsing /proc/self/cgroup, cgroup v1
 * memory.limit_in_bytes, cgroup v2 memory.max and /proc/meminfo, all under a
 * root folder ("/" in use; tests give a fake tree). Knows nothing of models.
 *
 * Rules:
 *  (1) The limit of a cgroup is the smallest limit on its path up to the
 *      hierarchy's mount root (a parent's limit binds its children); a
 *      folder missing on the way is skipped (in a container the mount root
 *      is the container's own cgroup while /proc/self/cgroup names the
 *      host's path). v2 is looked for under sys/fs/cgroup and
 *      sys/fs/cgroup/unified (hybrid mounts), v1 under sys/fs/cgroup/memory.
 *  (2) "max", or a v1 value >= 2^60 (the kernel's "no limit" is
 *      PAGE_COUNTER_MAX pages), is no limit.
 *  (3) Files that do not exist mean "nothing known"; a file that exists but
 *      does not parse is an error naming it (JLM_EFORMAT).
 * Thread safety: none needed (no state). Cannot allocate.
 */
#ifndef JLM_MEMLIMIT_H
#define JLM_MEMLIMIT_H

#include <stddef.h>
#include <stdint.h>

#include "base/jlm_err.h"

typedef struct jlm_memlimit {
    uint64_t cg_limit;        /* bytes; 0: no cgroup limit found */
    int      cg_version;      /* 1 or 2 when cg_limit is set, else 0 */
    char     cg_file[256];    /* the file the limit came from (root prefix included) */
    uint64_t mem_available;   /* MemAvailable bytes; 0: unknown */
} jlm_memlimit;

/* ---------------------------------------------------------------- parsing (pure, for tests and fuzzing) */
/* A limit file's text ("max\n", "123\n"): *bytes = the value, UINT64_MAX for
 * no limit (rule 2). -1 for anything else (empty, signs, junk, overflow). */
int jlm_memlimit_parse_value(const char *text, size_t len, uint64_t *bytes);
/* /proc/self/cgroup's text ("ID:CONTROLLERS:PATH" lines): the v2 path (line
 * "0::PATH") into v2 and the v1 memory controller's path into v1 ("" when
 * absent). Paths longer than the buffers are dropped (""). Never fails. */
void jlm_memlimit_parse_cgroup(const char *text, size_t len, char *v2, size_t v2_len, char *v1, size_t v1_len);
/* /proc/meminfo's text: MemAvailable in bytes, 0 when absent or malformed. */
uint64_t jlm_memlimit_parse_meminfo(const char *text, size_t len);

/* ---------------------------------------------------------------- reading */
/* Fills *out from the files under root (rules 1-3). JLM_EFORMAT naming the
 * file that does not parse (*out untouched then). */
int jlm_memlimit_read(const char *root, jlm_memlimit *out, jlm_err *err);

/* The automatic budget: the smaller of the cgroup limit and MemAvailable,
 * less a headroom of 48 MiB + 1/16 of it (the rest of the process:
 * binary, vocabulary, logits, allocator slack, thread stacks). *headroom
 * gets that headroom. 0 when nothing is known (no budget then); 1 when the
 * headroom takes it all (the engine raises it to its minimum working set). */
uint64_t jlm_memlimit_budget(const jlm_memlimit *m, uint64_t *headroom);

#endif
