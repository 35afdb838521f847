/* backend.h - choosing the compute backend (`--backend cpu|vulkan|cuda|auto`,
 * `--device N`) and the build description of `jlm --version`.
 *
 * Owns: refusing a backend this binary or machine cannot run, with one line
 * naming why. cpu, vulkan and auto pass here (the engine opens the Vulkan
 * device, engine/backend_vk.h); cuda passes when built and the device probe
 * finds device N, or under JLM_CUDA_EMULATE (engine/backend_cu.h), and is
 * refused otherwise with the probe's reason (not built / no device:
 * docs/cuda.md). */
#ifndef JLM_CLI_BACKEND_H
#define JLM_CLI_BACKEND_H

#include <stdio.h>

/* 0 when `name` (NULL = cpu) on device `device` can run; otherwise prints
 * "jlm CMD: --backend NAME: REASON" to stderr and returns the exit status
 * (2 for a usage error, 1 for a backend that cannot run here). */
int jlm_cli_backend_check(const char *cmd, const char *name, int device);

/* Prints the lines of `jlm --version` (format, CPU kernel variant, CUDA,
 * Vulkan: built or not and the devices found). */
void jlm_cli_print_version(FILE *f);
/* [{"name": "cpu"|"vulkan"|"cuda", "built": bool, "devices": [names]}] for
 * `jlm info --json` (a new reference). */
struct json_t;
struct json_t *jlm_cli_backends_json(void);

/* --stats' paging lines: first `pager: page-ins N, evictions N, bytes-read N,
 * hits N` (totals over the backends: the host pager's figures given, plus
 * the device frames'), then one line per backend: `cpu: ...` (the host
 * pager) and, with --backend vulkan or cuda, `vulkan: ...` / `cuda: ...`
 * (device page-ins, bytes uploaded / imported, frames, path, kernel vs
 * transfer time): one line per device, in block order, with two. */
struct jlm_engine;
void jlm_cli_print_backend_stats(FILE *f, struct jlm_engine *e, unsigned long long page_ins,
                                 unsigned long long evictions, unsigned long long bytes_read,
                                 unsigned long long hits);

#endif
