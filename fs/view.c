/* view.c - one model view: its plan (from shapes alone), its container's
 * units (the metadata+dense prefix, then every page), background conversion
 * into the cache's .part file, on-demand packing, and its texts. */
#include "fs/view_int.h"
#include "base/beneath.h"
#include "format/sums.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <sys/statvfs.h>
#include <sys/file.h>
#include <unistd.h>

const char *jlmfs_arr_name(int arr)
{
    static const char *n[] = {"meta", "blocks", "vision", "experts"};
    return arr >= 0 && arr < 4 ? n[arr] : "?";
}

/* ---------------------------------------------------------------- small helpers */
/* One line to the daemon's log (env->log; none: dropped). */
static void vlog(const jlmfs_view *v, int prio, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void vlog(const jlmfs_view *v, int prio, const char *fmt, ...)
{
    if (!v->env->log)
        return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    v->env->log(v->env->ctx, prio, line);
}

/* Removes a file of the cache folder (below the folder the daemon holds). */
static void cache_unlink(const jlmfs_view *v, const char *path)
{
    const char *name = strrchr(path, '/');
    if (v->env->cache_fd >= 0 && name)
        unlinkat(v->env->cache_fd, name + 1, 0);
    else
        unlink(path);
}

/* The folder and name a cache file is opened at: below the held folder. */
static int cache_at(const jlmfs_view *v, const char *path, const char **name)
{
    const char *slash = strrchr(path, '/');
    *name = v->env->cache_fd >= 0 && slash ? slash + 1 : path;
    return v->env->cache_fd >= 0 && slash ? v->env->cache_fd : AT_FDCWD;
}

/* The entry's sidecar, paired with the plan's header and size: 0 and
 * *out, or a JLM_E* code with err naming why. */
static int load_sums(jlmfs_view *v, jlm_sums **out, jlm_err *err)
{
    const char *name;
    int dfd = cache_at(v, v->sums_path, &name);
    return jlm_sums_load(dfd, name, v->meta, v->file_size, out, err);
}

int jlmfs_ident_eq(const jlmfs_ident *a, const jlmfs_ident *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtime_s == b->mtime_s &&
           a->mtime_ns == b->mtime_ns && a->mm_ino == b->mm_ino && a->mm_size == b->mm_size &&
           a->mm_mtime_s == b->mm_mtime_s && a->mm_mtime_ns == b->mm_mtime_ns && a->hf_hash == b->hf_hash;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int jlmfs_view_space_back(jlmfs_view *v, double min_age)
{
    pthread_mutex_lock(&v->lock);
    int cand = v->state == JLMFS_ERROR && v->t_nospace > 0 && mono_s() - v->t_nospace >= min_age;
    pthread_mutex_unlock(&v->lock);
    struct statvfs sv;
    return cand && !statvfs(v->env->cache, &sv) && (unsigned long long)sv.f_bavail * sv.f_frsize >= v->file_size;
}

void jlmfs_view_log_planned(jlmfs_view *v)
{
    char msg[sizeof v->errmsg];
    int st = jlmfs_view_state(v, NULL, msg, sizeof msg);
    double mib = (double)v->file_size / (1 << 20);
    if (st == JLMFS_READY)
        vlog(v, JLMFS_LOG_INFO, "%s: ready (%.1f MiB, from the cache)", v->key, mib);
    else if (st == JLMFS_CONVERTING && v->env->shared)   /* which host converts: shared_claim says */
        vlog(v, JLMFS_LOG_INFO, "%s: planned %s (%.1f MiB%s%s), entry %s", v->key, v->rel, mib,
             v->env->type ? ", type " : "", v->env->type ? v->env->type : "", strrchr(v->cache_path, '/') + 1);
    else if (st == JLMFS_CONVERTING)
        vlog(v, JLMFS_LOG_INFO, "%s: converting %s (%.1f MiB%s%s)", v->key, v->rel, mib,
                  v->env->type ? ", type " : "", v->env->type ? v->env->type : "");
    else
        vlog(v, JLMFS_LOG_ERR, "%s: error: %s", v->key, msg);
}

/* ERROR, and the .part goes: unlinked, and its descriptor swapped for
 * /dev/null (dup2 is atomic, so a reader racing on v->fd reads 0 bytes, never
 * another file) so the space comes back now, not when the view is dropped. */
static void fail_view(jlmfs_view *v, const char *msg)
{
    /* the error, the .part's removal and the release of its space in one
     * lock section: whoever reads the status `error: ...` finds nothing
     * half-written left and the space back (reads fail on the state, so they
     * never see the /dev/null put in place of the file) */
    char line[sizeof v->errmsg];
    pthread_mutex_lock(&v->lock);
    int now = v->state != JLMFS_ERROR;   /* the first error is the one kept and logged */
    if (now) {
        v->state = JLMFS_ERROR;
        jlmfs_status_clean(v->errmsg, sizeof v->errmsg, msg, v->env);
        memcpy(line, v->errmsg, sizeof line);
    }
    cache_unlink(v, v->part_path);
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0 && v->fd >= 0)
        dup3(null, v->fd, O_CLOEXEC);
    if (null >= 0)
        close(null);
    pthread_mutex_unlock(&v->lock);
    if (now)
        vlog(v, JLMFS_LOG_ERR, "%s: error: %s", v->key, line);
    /* pages the kernel already holds would still be served to open
     * descriptors without asking: dropped, so every later read gets EIO */
    jlmfs_view_invalidate(v);
}

void jlmfs_view_invalidate(jlmfs_view *v)
{
    const jlmfs_view_env *env = v->env;
    if (!env->invalidate)
        return;
    char p[4200];
    static const char *files[] = {"model.jlm", "dense", "status", "config.json", "tensors", "stats", "layout.html"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "/%s/%s", v->key, files[i]);
        env->invalidate(env->invalidate_ctx, p);
    }
    for (uint32_t u = 0; u < v->n_units && v->units; u++) {
        const jlmfs_unit *un = &v->units[u];
        if (un->arr == JLMFS_A_BLOCKS)
            snprintf(p, sizeof p, "/%s/blocks/%d", v->key, un->a);
        else if (un->arr == JLMFS_A_VISION)
            snprintf(p, sizeof p, "/%s/vision/%d", v->key, un->a);
        else if (un->arr == JLMFS_A_EXPERTS)
            snprintf(p, sizeof p, "/%s/experts/%d.%d", v->key, un->a, un->b);
        else
            continue;
        env->invalidate(env->invalidate_ctx, p);
    }
}

/* A full cache stopped v: the daemon plans it again once the cache's
 * filesystem has room for it (jlmfs_view_space_back). */
static void mark_no_space(jlmfs_view *v)
{
    pthread_mutex_lock(&v->lock);
    v->t_nospace = mono_s();
    pthread_mutex_unlock(&v->lock);
}

/* The status line for a full cache: how much the rest of the conversion
 * needs and how much the cache's filesystem has. */
static int no_space(jlmfs_view *v, jlm_err *err)
{
    struct statvfs sv;
    unsigned long long have = statvfs(v->env->cache, &sv) ? 0ull : (unsigned long long)sv.f_bavail * sv.f_frsize;
    pthread_mutex_lock(&v->lock);
    unsigned long long need = v->file_size - v->done_bytes;
    v->t_nospace = mono_s();   /* the daemon retries when the space is back (jlmfs_view_space_back) */
    pthread_mutex_unlock(&v->lock);
    return jlm_errf(err, JLM_ENOSPC, "%s: no space left in cache (need %llu, have %llu)", v->part_path, need, have);
}

/* ---------------------------------------------------------------- layout */
static int add_unit(jlmfs_view *v, size_t *cap, uint64_t off, uint64_t len, int arr, int32_t a, int32_t b)
{
    if (v->n_units == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        jlmfs_unit *nu = realloc(v->units, nc * sizeof *nu);
        if (!nu)
            return -1;
        v->units = nu;
        *cap = nc;
    }
    v->units[v->n_units++] = (jlmfs_unit){off, len, (uint8_t)arr, a, b};
    return 0;
}

/* MoE blocks (those holding an expert bank) in ascending order get ranks. */
static int plan_experts(jlmfs_view *v, int32_t **rank_block)
{
    const jlm_model *m = v->plan;
    uint32_t nl = m->config.n_layer;
    v->moe_rank = malloc((nl ? nl : 1) * sizeof *v->moe_rank);
    *rank_block = malloc((nl ? nl : 1) * sizeof **rank_block);
    if (!v->moe_rank || !*rank_block)
        return -1;
    for (uint32_t i = 0; i < nl; i++)
        v->moe_rank[i] = -1;
    for (uint32_t i = 0; i < m->hdr.n_tensors; i++) {
        const jlm_tensor *t = &m->tensors[i];
        if (jlm_fmt_role_is_bank(t->role) && t->block >= 0 && (uint32_t)t->block < nl)
            v->moe_rank[t->block] = 0;
    }
    for (uint32_t i = 0; i < nl; i++)
        if (v->moe_rank[i] == 0) {
            (*rank_block)[v->n_moe] = (int32_t)i;
            v->moe_rank[i] = (int32_t)v->n_moe++;
        }
    v->n_expert = m->config.n_expert;
    return 0;
}

/* Units: [0, first page) then every text, vision and expert page; a gap
 * (none in a v27 file) is absorbed by the unit before it. */
static int plan_units(jlmfs_view *v, jlm_err *err)
{
    const jlm_header *h = &v->plan->hdr;
    int32_t *rank_block = NULL;
    size_t cap = 0;
    int rc = plan_experts(v, &rank_block);
    if (!rc && (uint64_t)v->n_moe * v->n_expert != h->n_exp_pages)
        rc = jlm_errf(err, JLM_EFORMAT, "%s: %u expert pages planned, %u MoE blocks x %u experts",
                      v->rel, h->n_exp_pages, v->n_moe, v->n_expert);
    if (!rc)
        rc = add_unit(v, &cap, 0, 0, JLMFS_A_META, -1, -1);
    for (uint32_t i = 0; !rc && i < h->n_blocks; i++)
        rc = add_unit(v, &cap, h->data_off + (uint64_t)i * h->page_size, h->page_size, JLMFS_A_BLOCKS, (int32_t)i, -1);
    for (uint32_t i = 0; !rc && i < h->n_vis_blocks; i++)
        rc = add_unit(v, &cap, h->vis_data_off + (uint64_t)i * h->vis_page_size, h->vis_page_size,
                      JLMFS_A_VISION, (int32_t)i, -1);
    for (uint32_t p = 0; !rc && p < h->n_exp_pages; p++)
        rc = add_unit(v, &cap, h->exp_data_off + (uint64_t)p * h->exp_page_size, h->exp_page_size, JLMFS_A_EXPERTS,
                      rank_block[p / v->n_expert], (int32_t)(p % v->n_expert));
    free(rank_block);
    if (rc == -1)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory planning units", v->rel);
    if (rc)
        return rc;
    for (uint32_t u = 0; u < v->n_units; u++) {
        uint64_t next = u + 1 < v->n_units ? v->units[u + 1].off : v->file_size;
        if (next < v->units[u].off + v->units[u].len || next > v->file_size)
            return jlm_errf(err, JLM_EFORMAT, "%s: unit %u [%llu, +%llu) overlaps the next or passes EOF %llu",
                            v->rel, u, (unsigned long long)v->units[u].off, (unsigned long long)v->units[u].len,
                            (unsigned long long)v->file_size);
        v->units[u].len = next - v->units[u].off;
    }
    v->done = calloc(v->n_units ? v->n_units : 1, 1);
    v->busy = calloc(v->n_units ? v->n_units : 1, 1);
    return v->done && v->busy ? 0 : jlm_errf(err, JLM_ENOMEM, "%s: out of memory", v->rel);
}

/* ---------------------------------------------------------------- texts */
static char *config_json(const jlm_model *m)
{
    const jlm_config *c = &m->config;
    const char *an = jlm_fmt_arch_name(c->arch);
    json_t *o = json_object();
    json_object_set_new(o, "arch", json_string(an ? an : "unknown"));
    json_object_set_new(o, "arch_code", json_integer(c->arch));
#define U(f) json_object_set_new(o, #f, json_integer((json_int_t)c->f))
#define F(f) json_object_set_new(o, #f, json_real((double)c->f))
    U(n_layer); U(n_embd); U(n_head); U(n_kv_head); U(head_dim); U(n_rot); U(n_ffn); U(n_vocab);
    U(n_ctx); U(n_expert); U(n_expert_used); U(n_ffn_exp); U(swa_window); U(swa_period);
    F(rms_eps); F(rope_base); F(attn_factor); F(embd_scale); F(rope_base_swa); U(flags); U(n_ffn_shexp);
    F(attn_softcap); F(final_softcap); F(yarn_factor); U(yarn_orig_ctx); F(yarn_beta_fast);
    F(yarn_beta_slow); F(rope_linear); U(head_dim_v); U(n_dense_lead); U(q_lora_rank); U(kv_lora_rank);
    F(yarn_log_mul); F(expert_scale); U(n_expert_group); U(n_expert_group_used); U(moe_step);
    F(attn_scale); F(residual_scale); F(logit_scale); F(clamp_kqv); U(head_dim_swa); U(n_kv_head_swa);
    U(n_rot_swa); U(flags2); U(n_kv_shared); U(ple_dim);
#undef U
#undef F
    json_t *rs = json_array();
    for (int i = 0; i < 4; i++)
        json_array_append_new(rs, json_integer(c->rope_sections[i]));
    json_object_set_new(o, "rope_sections", rs);
    json_t *lk = json_array();
    for (uint32_t i = 0; i < c->n_layer_kinds; i++)
        json_array_append_new(lk, json_integer(c->layer_kinds[i]));
    json_object_set_new(o, "layer_kinds", lk);
    json_object_set_new(o, "has_vision", json_boolean(m->has_vision));
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!s)
        return NULL;
    char *r = NULL;
    if (asprintf(&r, "%s\n", s) < 0)
        r = NULL;
    free(s);
    return r;
}

/* One line a tensor: name role block index type dims region page qs_off d_off sc_off. */
static char *tensors_text(const jlm_model *m)
{
    static const char *rn[] = {"dense", "text", "vision", "expert"};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    for (uint32_t i = 0; i < m->hdr.n_tensors; i++) {
        const jlm_tensor *t = &m->tensors[i];
        const jlm_type_traits *tt = jlm_fmt_type_traits(t->type);
        const char *role = jlm_fmt_role_name(t->role);
        jlm_tensor_loc l;
        jlm_fmt_tensor_loc(m, t, &l);
        fprintf(f, "%s %s %d %d %s ", t->name.s, role ? role : "?", t->block, t->index, tt ? tt->name : "?");
        for (int d = 0; d < t->ndim; d++)
            fprintf(f, "%s%llu", d ? "x" : "", (unsigned long long)t->dims[d]);
        fprintf(f, " %s %lld %llu %llu %llu\n", rn[l.region & 3], (long long)l.page,
                (unsigned long long)t->qs_off, (unsigned long long)t->d_off, (unsigned long long)t->sc_off);
    }
    if (fclose(f))
        return NULL;
    return buf;
}

/* ---------------------------------------------------------------- create */
/* Plans the view; a source that cannot be planned leaves it in ERROR. */
static int plan_view(jlmfs_view *v, const char *src_path, const char *mm_path, jlm_err *err)
{
    int rc = jlm_conv_open_full(v->env->src_fd, src_path, mm_path, v->env->type, NULL, &v->conv, err);
    if (rc)
        return rc;
    v->file_size = v->conv->plan.file_size;
    uint64_t meta_len = v->conv->plan.hdr.dense_off;
    uint8_t *meta = malloc(meta_len ? meta_len : 1);
    if (!meta)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", src_path);
    rc = jlm_conv_read_span(v->conv, 0, meta_len, meta, err);
    if (!rc)
        rc = jlm_fmt_parse(meta, meta_len, v->file_size, v->key, &v->plan, err);
    v->meta = meta;
    if (!rc)
        rc = plan_units(v, err);
    if (!rc) {
        v->config_json = config_json(v->plan);
        v->tensors_txt = tensors_text(v->plan);
        if (!v->config_json || !v->tensors_txt)
            rc = jlm_errf(err, JLM_ENOMEM, "%s: out of memory", src_path);
    }
    return rc;
}

/* The path that reopens what fd is (the file, not its name). */
static void fd_path(char *buf, size_t n, int fd)
{
    snprintf(buf, n, "/proc/self/fd/%d", fd);
}

/* fd (a finished entry, opened below the cache folder) is a container
 * whose [0, DenseOff) is the plan's (a foreign version or another source
 * never matches). */
static int cache_valid(jlmfs_view *v, int fd)
{
    jlm_model *m;
    jlm_err e;
    char p[64];
    fd_path(p, sizeof p, fd);
    if (jlm_fmt_open(p, &m, &e))
        return 0;
    int ok = m->file_size == v->file_size && m->hdr.dense_off == v->plan->hdr.dense_off &&
             !memcmp(m->meta, v->meta, m->hdr.dense_off);
    jlm_fmt_close(m);
    return ok;
}

/* A finished entry takes its source's owner (when the daemon may give it:
 * root) and read bits, never wider (docs/security.md section 12): a 0600
 * GGUF's container is 0400, as private as the GGUF. A daemon that is not root
 * keeps the file its own and readable by itself. -1 with errno set. */
static int entry_perms(const jlmfs_view *v, int fd)
{
    struct stat st;
    int root = geteuid() == 0;
    mode_t want = (v->dir_st.st_mode & 0444) | (root ? 0 : 0400);
    if (fstat(fd, &st))
        return -1;
    if (root && (st.st_uid != v->dir_st.st_uid || st.st_gid != v->dir_st.st_gid) &&
        fchown(fd, v->dir_st.st_uid, v->dir_st.st_gid))
        return -1;
    return (st.st_mode & 07777) == want ? 0 : fchmod(fd, want);
}

/* An entry whose inode changed (ctime) more than a moment after its sidecar
 * was written was altered or swapped since (a forged size and mtime leave
 * ctime behind; the writer renames the entry just after the sidecar): 1,
 * with err saying so. */
#define SUMS_CTIME_SLACK_S 2
static int changed_after_sums(const jlmfs_view *v, int fd, jlm_err *err)
{
    const char *name;
    int dfd = cache_at(v, v->sums_path, &name);
    struct stat est, sst;
    if (fstat(fd, &est) || fstatat(dfd, name, &sst, AT_SYMLINK_NOFOLLOW))
        return 0;   /* no sidecar: load_sums says so */
    if (est.st_ctim.tv_sec <= sst.st_mtim.tv_sec + SUMS_CTIME_SLACK_S)
        return 0;
    jlm_errf(err, JLM_EFORMAT, "%s: changed %lld s after its checksums were written (a swapped or edited entry)",
             v->cache_path, (long long)(est.st_ctim.tv_sec - sst.st_mtim.tv_sec));
    return 1;
}

static int open_container(jlmfs_view *v, jlm_err *err)
{
    int fd = jlmfs_cache_open(v->env->cache_fd, v->cache_path, O_RDONLY, 0);
    jlm_sums *sums = NULL;
    jlm_err serr = {0};
    if (fd >= 0 && cache_valid(v, fd) && !changed_after_sums(v, fd, &serr) && load_sums(v, &sums, &serr) == 0 &&
        !entry_perms(v, fd)) {
        if (v->env->shared)
            flock(fd, LOCK_SH);   /* in use: `jlm cache prune` on any host keeps it */
        v->fd = fd;
        v->sums = sums;
        memset(v->done, 1, v->n_units);
        v->done_bytes = v->file_size;
        v->state = JLMFS_READY;
        return 0;
    }
    jlm_sums_free(sums);   /* loaded, but the entry's mode could not be set */
    if (fd >= 0 && serr.msg[0])
        vlog(v, JLMFS_LOG_WARNING, "%s: cached entry refused, converting again: %s", v->key, serr.msg);
    if (fd >= 0)
        close(fd);
    if (!v->env->shared) {   /* shared: the converter's rename replaces it, under the entry's lock */
        cache_unlink(v, v->cache_path);   /* stale, foreign, a link, unreadable or unsummed: rebuilt, never misread */
        cache_unlink(v, v->sums_path);
    }
    v->fd = jlmfs_cache_open(v->env->cache_fd, v->part_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (v->fd < 0)
        return jlm_errf(err, JLM_EIO, "%s: %s", v->part_path, strerror(errno));
    if (ftruncate(v->fd, (off_t)v->file_size))
        return jlm_errf(err, JLM_EIO, "%s: cannot size to %llu bytes: %s", v->part_path,
                        (unsigned long long)v->file_size, strerror(errno));
    v->state = JLMFS_CONVERTING;
    return 0;
}

/* Longest flattened path kept in a cache name: 255 - '@' - the identity
 * (4 hex fields and a time, at most ~90) - ".vNN.jlm.sums.part" (the longest
 * suffix an entry gets; ".fail.tmp" is one shorter); a paired
 * projector's identity (at most 65 more) takes its share. */
#define FLAT_MAX    128
#define FLAT_MAX_MM 80

/* The shared-cache name: the content key(s) of the bytes, the type and the
 * format version, nothing of the host (shared.c). */
static char *shared_name(const jlmfs_view_env *env, const char *content, const char *mm_content)
{
    char *out = NULL;
    if (asprintf(&out, "%s/c%s%s%s%s%.16s.v%u.jlm", env->cache, content, mm_content ? "+" : "",
                 mm_content ? mm_content : "", env->type ? "~" : "", env->type ? env->type : "", JLM_VERSION) < 0)
        out = NULL;
    return out;
}

static char *cache_name(const jlmfs_view_env *env, const char *rel, const jlmfs_ident *id)
{
    size_t n = strlen(rel);
    if (id->hf_hash == 0 && n > 5)
        n -= 5;   /* ".gguf" */
    char *flat = strndup(rel, n), *out = NULL;
    if (!flat)
        return NULL;
    for (char *p = flat; *p; p++)
        if (*p == '/')
            *p = '%';
    /* A long stem or a deep path would make a name over NAME_MAX (with the
     * ".part" / ".fail.tmp" / ".sums.part" the entry also gets): keep its head, add a hash
     * of the whole path. */
    size_t flat_max = id->mm_ino || id->hf_hash || env->type ? FLAT_MAX_MM : FLAT_MAX;
    if (id->mm_ino && env->type)
        flat_max = FLAT_MAX_MM - 16;
    if (strlen(flat) > flat_max) {
        uint64_t h = 1469598103934665603ull;   /* FNV-1a 64 */
        for (const char *p = flat; *p; p++)
            h = (h ^ (unsigned char)*p) * 1099511628211ull;
        snprintf(flat + flat_max - 17, 18, "~%016llx", (unsigned long long)h);
    }
    char mm[96] = "";   /* with a projector: its identity too */
    if (id->mm_ino)
        snprintf(mm, sizeof mm, "+%llx-%llx-%lld.%09ld", (unsigned long long)id->mm_ino,
                 (unsigned long long)id->mm_size, (long long)id->mm_mtime_s, id->mm_mtime_ns);
    else if (id->hf_hash)   /* a folder: the hash of its files' identities */
        snprintf(mm, sizeof mm, "+h%016llx", (unsigned long long)id->hf_hash);
    char ty[24] = "";   /* -o type=: another container of the same source */
    if (env->type)
        snprintf(ty, sizeof ty, "~%.16s", env->type);
    if (asprintf(&out, "%s/%s@%llx-%llx-%llx-%lld.%09ld%s%s.v%u.jlm", env->cache, flat, (unsigned long long)id->dev,
                 (unsigned long long)id->ino, (unsigned long long)id->size, (long long)id->mtime_s, id->mtime_ns, mm, ty,
                 JLM_VERSION) < 0)
        out = NULL;
    free(flat);
    return out;
}

/* v's cache_path, part_path and sums_path. Shared mode: named by the
 * content keys of the source and its projector (a folder source keeps the
 * identity name: its files are not hashed), the .part by this host's id.
 * JLM_ENOTFOUND when a source changed while it was hashed (not stable). */
static int entry_names(jlmfs_view *v, jlm_err *err)
{
    const jlmfs_view_env *env = v->env;
    const char *rel = v->rel;
    if (!rel)
        return jlm_errf(err, JLM_ENOMEM, "out of memory");
    if (!env->shared || v->id.hf_hash) {
        v->cache_path = cache_name(env, rel, &v->id);
    } else {
        char key[33], mmkey[33];
        char *mm = v->id.mm_ino ? jlmfs_mmproj_rel(env->src_fd, rel, NULL) : NULL;
        int rc = jlmfs_keys_get(env->keys, env->src_fd, rel, key, err);
        if (!rc && mm)
            rc = jlmfs_keys_get(env->keys, env->src_fd, mm, mmkey, err);
        free(mm);
        if (rc)
            return rc;
        v->cache_path = shared_name(env, key, v->id.mm_ino ? mmkey : NULL);
    }
    if (v->cache_path && asprintf(&v->part_path, env->shared ? "%s.%s.part" : "%s.part", v->cache_path,
                                  env->host) < 0)
        v->part_path = NULL;
    if (v->cache_path && asprintf(&v->sums_path, "%s.sums", v->cache_path) < 0)
        v->sums_path = NULL;
    return 0;
}

int jlmfs_view_create(const jlmfs_view_env *env, const char *rel, const jlmfs_ident *id, const struct stat *dir_st,
                      jlmfs_view **out, jlm_err *err)
{
    jlmfs_view *v = calloc(1, sizeof *v);
    if (!v)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", rel);
    static uint64_t serials;   /* never reused: a replaced view's nodes are new inodes in the mount */
    v->env = env;
    v->refs = 1;
    v->serial = __atomic_add_fetch(&serials, 1, __ATOMIC_RELAXED);
    v->fd = -1;
    v->t0 = mono_s();
    v->id = *id;
    v->dir_st = *dir_st;
    pthread_mutex_init(&v->lock, NULL);
    pthread_cond_init(&v->packed, NULL);
    size_t n = strlen(rel);
    v->is_hf = id->hf_hash != 0;
    size_t stem = v->is_hf ? n : n - 5;   /* "sub/foo" of "sub/foo.gguf" or of the folder "sub/foo" */
    v->lock_fd = -1;
    v->rel = strdup(rel);
    v->key = malloc(stem + 5);
    int rc = entry_names(v, err);
    if (rc) {
        jlmfs_view_unref(v);
        return rc;
    }
    if (!v->rel || !v->key || !v->cache_path || !v->part_path || !v->sums_path) {
        jlmfs_view_unref(v);
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", rel);
    }
    memcpy(v->key, rel, stem);
    strcpy(v->key + stem, ".jlm");
    /* a projector beside a GGUF, relative to SRC too */
    char *mm = v->is_hf ? NULL : jlmfs_mmproj_rel(env->src_fd, rel, NULL);
    jlm_err e = {0};
    int refused = jlmfs_guard_enter(v, e.msg, sizeof e.msg);   /* a recorded failure is not retried */
    /* relative to SRC: below it, no symlink followed */
    rc = refused ? JLM_EFORMAT : plan_view(v, v->rel, mm, &e);
    free(mm);
    if (!rc)
        rc = open_container(v, &e);
    if (rc) {   /* the view exists, in ERROR: status names the reason */
        v->state = JLMFS_ERROR;
        jlmfs_status_clean(v->errmsg, sizeof v->errmsg, e.msg, env);
        if (v->fd >= 0)
            close(v->fd);
        v->fd = -1;
        cache_unlink(v, v->part_path);
    }
    if (!refused && v->state != JLMFS_CONVERTING)
        jlmfs_guard_leave(v, rc, v->errmsg);
    *out = v;
    return JLM_OK;
}

void jlmfs_view_ref(jlmfs_view *v)
{
    __atomic_add_fetch(&v->refs, 1, __ATOMIC_RELAXED);
}

void jlmfs_view_unref(jlmfs_view *v)
{
    if (!v || __atomic_sub_fetch(&v->refs, 1, __ATOMIC_ACQ_REL))
        return;
    if (v->fd >= 0)
        close(v->fd);
    jlmfs_entry_unlock(v);
    jlm_conv_close(v->conv);
    jlm_fmt_close(v->plan);
    pthread_mutex_destroy(&v->lock);
    pthread_cond_destroy(&v->packed);
    free(v->rel); free(v->key); free(v->cache_path); free(v->part_path); free(v->sums_path);
    jlm_sums_free(v->sums);
    free(v->meta); free(v->units); free(v->done); free(v->busy);
    free(v->moe_rank); free(v->config_json); free(v->tensors_txt);
    for (int i = 0; i < JLMFS_SPARES; i++)
        free(v->spare[i]);
    free(v);
}

/* Dropped from the table (source gone or replaced): its entry is stale. The
 * unlinks happen under the lock the worker renames under, so no finished
 * entry can appear after this. Open handles keep reading their fd. */
void jlmfs_view_kill(jlmfs_view *v)
{
    pthread_mutex_lock(&v->lock);
    v->dead = 1;
    if (!v->env->shared) {   /* shared: the entry is its bytes', which other hosts may serve */
        cache_unlink(v, v->cache_path);
        cache_unlink(v, v->sums_path);
    }
    cache_unlink(v, v->part_path);
    jlmfs_guard_forget(v);
    pthread_mutex_unlock(&v->lock);
}

/* ---------------------------------------------------------------- torn sources */
/* 1 if the file the conversion reads is no longer what the view was planned
 * from (rewritten in place: size or mtime). Checked on the open descriptor,
 * after every packed unit and before ready, so no unit mixes two versions
 * unnoticed; a source unlinked or renamed meanwhile is unchanged for it, and
 * open descriptors of the view keep being served the one version (POSIX). */
static int source_changed(const jlmfs_view *v)
{
    if (v->is_hf) {   /* a folder: its files' identities, read again (hfdir.c) */
        jlmfs_ident now;
        return !jlmfs_hf_ident(v->env->src_fd, v->rel, 0, &now, NULL) || !jlmfs_ident_eq(&now, &v->id);
    }
    struct stat st;
    int same = !jlm_gguf_fstat(v->conv->g, 0, &st) && st.st_dev == v->id.dev && st.st_ino == v->id.ino &&
               st.st_size == v->id.size && st.st_mtim.tv_sec == v->id.mtime_s && st.st_mtim.tv_nsec == v->id.mtime_ns;
    return !same;
}

/* The view fails as a whole (every descriptor gets EIO from now on, never a
 * page of the new version next to one of the old); the next lookup of the
 * path plans the new version as a new view. */
static int source_changed_error(jlmfs_view *v, jlm_err *err)
{
    int rc = jlm_errf(err, JLM_EIO, "%s: the source changed while it was converted", v->rel);
    fail_view(v, err->msg);
    return rc;
}

/* Dropped from the table (jlmfs_sync_view): killed, and if the bytes its
 * conversion reads were rewritten in place (not unlinked or renamed: the
 * descriptor is checked) before it finished, failed as a whole, so its open
 * descriptors get EIO for every page, not old pages for some and EIO for the
 * rest; then the kernel is told to forget what it cached of it. */
void jlmfs_view_retire(jlmfs_view *v, const char *why)
{
    if (why)
        vlog(v, JLMFS_LOG_INFO, "%s: dropped (%s)", v->key, why);
    else
        vlog(v, JLMFS_LOG_INFO, "%s: dropped (%s was removed, renamed, changed or opened for writing)",
                  v->key, v->rel);
    jlmfs_view_kill(v);
    if (jlmfs_view_state(v, NULL, NULL, 0) == JLMFS_CONVERTING && v->conv && source_changed(v)) {
        jlm_err e;
        source_changed_error(v, &e);   /* fails (and invalidates) */
        return;
    }
    jlmfs_view_invalidate(v);
}

/* ---------------------------------------------------------------- units */
/* One packer per unit. A page-in through the kernel arrives as many FUSE
 * reads in flight at once (an O_DIRECT read of a 34 MB page is split into
 * max_read pieces and sent together), and each piece used to pack the whole
 * unit itself: up to a dozen threads packing the same 34 MB on two cores,
 * which made drop-to-first-token 2.4x convert + run. Now the first thread to
 * want a unit claims it and packs it; the others (readers, or the worker)
 * wait for it on v->packed and then read the cache file. */
enum { CLAIM_DONE = 0, CLAIM_MINE = 1, CLAIM_BUSY = 2, CLAIM_FAILED = 3 };

/* wait: block while another thread packs u; else CLAIM_BUSY at once. */
static int claim_unit(jlmfs_view *v, uint32_t u, int wait)
{
    pthread_mutex_lock(&v->lock);
    while (!v->done[u] && v->busy[u] && wait && v->state != JLMFS_ERROR)
        pthread_cond_wait(&v->packed, &v->lock);
    int r = v->done[u] ? CLAIM_DONE : v->state == JLMFS_ERROR ? CLAIM_FAILED : v->busy[u] ? CLAIM_BUSY : CLAIM_MINE;
    if (r == CLAIM_MINE)
        v->busy[u] = 1;
    pthread_mutex_unlock(&v->lock);
    return r;
}

static void release_unit(jlmfs_view *v, uint32_t u)
{
    pthread_mutex_lock(&v->lock);
    v->busy[u] = 0;
    pthread_cond_broadcast(&v->packed);
    pthread_mutex_unlock(&v->lock);
}

/* A buffer of at least len bytes for packing a unit: a kept one when one is
 * big enough (its pages are already mapped: a fresh 34 MB malloc is an mmap
 * whose every page faults on first touch), else a new one. */
static uint8_t *buf_get(jlmfs_view *v, size_t len, size_t *cap)
{
    uint8_t *b = NULL;
    pthread_mutex_lock(&v->lock);
    for (int i = 0; i < JLMFS_SPARES && !b; i++)
        if (v->spare[i] && v->spare_cap[i] >= len) {
            b = v->spare[i], *cap = v->spare_cap[i];
            v->spare[i] = NULL;
        }
    pthread_mutex_unlock(&v->lock);
    if (!b && (b = malloc(len ? len : 1)))
        *cap = len ? len : 1;
    return b;
}

/* Keeps b for the next unit while the view converts (else frees it). */
static void buf_put(jlmfs_view *v, uint8_t *b, size_t cap)
{
    pthread_mutex_lock(&v->lock);
    for (int i = 0; b && i < JLMFS_SPARES && v->state == JLMFS_CONVERTING; i++)
        if (!v->spare[i]) {
            v->spare[i] = b, v->spare_cap[i] = cap;
            b = NULL;
        }
    pthread_mutex_unlock(&v->lock);
    free(b);
}

/* The kept buffers, once no more units will be packed. */
static void buf_drop_all(jlmfs_view *v)
{
    pthread_mutex_lock(&v->lock);
    for (int i = 0; i < JLMFS_SPARES; i++) {
        free(v->spare[i]);
        v->spare[i] = NULL;
    }
    pthread_mutex_unlock(&v->lock);
}

/* Packs unit u (jlm_conv_read_span), writes it into the cache file and marks
 * it done. The caller has claimed u (claim_unit) and releases it after. The
 * caller gets the bytes in *bytes if non-NULL (else freed). Slow: no lock
 * held while packing or writing. */
static int fill_unit(jlmfs_view *v, uint32_t u, uint8_t **bytes, size_t *cap, jlm_err *err)
{
    const jlmfs_unit *un = &v->units[u];
    size_t bcap = 0;
    uint8_t *buf = buf_get(v, un->len, &bcap);
    if (!buf)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory (%llu bytes for a page)", v->key,
                        (unsigned long long)un->len);
    int rc = jlm_conv_read_span(v->conv, un->off, un->len, buf, err);
    if (source_changed(v))   /* also when the read failed: a truncated rewrite is a change, not a bad file */
        rc = source_changed_error(v, err);
    if (!rc) {
        int e = jlm_io_pwrite_full(v->env->io, v->fd, buf, un->len, un->off, NULL);
        if (!e)   /* start the write-back now, so finish's fsync has little left (as format/writer.c) */
            (void)sync_file_range(v->fd, (off_t)un->off, (off_t)un->len, SYNC_FILE_RANGE_WRITE);
        if (e == ENOSPC || e == EDQUOT)
            rc = no_space(v, err);
        else if (e)
            rc = jlm_errf(err, JLM_EIO, "%s: writing [%llu, +%llu): %s", v->part_path, (unsigned long long)un->off,
                          (unsigned long long)un->len, strerror(e == JLM_IO_EOF ? EIO : e));
    }
    if (!rc) {
        pthread_mutex_lock(&v->lock);
        if (!v->done[u]) {
            v->done[u] = 1;
            v->done_bytes += un->len;
        }
        v->packs++;
        pthread_mutex_unlock(&v->lock);
    }
    if (!rc && bytes)
        *bytes = buf, *cap = bcap;
    else
        buf_put(v, buf, bcap);
    return rc;
}

/* 1 once v was dropped (jlmfs_view_kill: its source unlinked, renamed or
 * replaced). Its entry's files are unlinked then, at any point of finish
 * (the .part before its read-back, the sidecar between its write and its
 * load): a finish step that fails on a name kill removed is no failure of
 * the view. Every unit is in v->fd, which the open descriptors of the view
 * keep reading to the end (the old version whole, POSIX); only a failure of
 * the bytes themselves (the source changed, fsync) fails it. */
static int dropped(jlmfs_view *v)
{
    pthread_mutex_lock(&v->lock);
    int dead = v->dead;
    pthread_mutex_unlock(&v->lock);
    return dead;
}

/* Every unit written: sync, re-open and compare with the plan, rename. */
static int finish(jlmfs_view *v, jlm_err *err)
{
    if (source_changed(v))
        return source_changed_error(v, err);
    if (v->env->io->fsync(v->fd)) {   /* through the seam: tests inject faults here too */
        int e = errno;
        if (e == ENOSPC || e == EDQUOT)
            mark_no_space(v);
        return jlm_errf(err, e == ENOSPC || e == EDQUOT ? JLM_ENOSPC : JLM_EIO, "%s: fsync: %s", v->part_path,
                        strerror(e));
    }
    jlm_model *m;
    char fdp[64];
    fd_path(fdp, sizeof fdp, v->fd);   /* the file written, not whatever the name is now */
    int rc = jlm_fmt_open(fdp, &m, err);
    if (rc)
        return dropped(v) ? JLM_OK : jlm_err_prefix(err, rc, "%s: read-back", v->part_path);
    int same = m->file_size == v->file_size && m->hdr.dense_off == v->plan->hdr.dense_off &&
               !memcmp(m->meta, v->meta, v->plan->hdr.dense_off);
    jlm_fmt_close(m);
    if (!same)
        return jlm_errf(err, JLM_EIO, "%s: read-back differs from the plan", v->part_path);
    if (entry_perms(v, v->fd))
        return jlm_errf(err, JLM_EIO, "%s: giving it its source's owner and mode: %s", v->part_path, strerror(errno));
    /* the checksums, from the bytes written, in place before the entry is */
    const char *sname;
    int sdfd = cache_at(v, v->sums_path, &sname);
    jlm_sums *sums = NULL;
    if ((rc = jlm_sums_write_fd(v->fd, v->file_size, sdfd, sname, 0600, err)) || (rc = load_sums(v, &sums, err))) {
        if (!dropped(v))
            return rc;
        pthread_mutex_lock(&v->lock);   /* a sidecar written after kill's unlinks: no entry beside it */
        if (!v->env->shared)
            cache_unlink(v, v->sums_path);
        pthread_mutex_unlock(&v->lock);
        return JLM_OK;
    }
    if (v->env->shared)
        flock(v->fd, LOCK_SH);   /* the entry it becomes is in use: `jlm cache prune` keeps it */
    pthread_mutex_lock(&v->lock);
    int rename_e = !v->dead && v->env->io->rename(v->part_path, v->cache_path) ? errno : 0;
    if (rename_e)
        rc = jlm_errf(err, rename_e == ENOSPC || rename_e == EDQUOT ? JLM_ENOSPC : JLM_EIO, "%s: rename: %s",
                      v->part_path, strerror(rename_e));
    if (rename_e == ENOSPC || rename_e == EDQUOT)
        v->t_nospace = mono_s();
    int ready = !rc && !v->dead;
    if (ready) {
        v->state = JLMFS_READY;
        v->sums = sums;
        sums = NULL;
    } else {
        cache_unlink(v, v->sums_path);   /* no entry beside it */
    }
    pthread_mutex_unlock(&v->lock);
    jlm_sums_free(sums);
    if (ready)
        vlog(v, JLMFS_LOG_INFO, "%s: ready (%.1f MiB converted in %.1f s; units %u, packed %u)", v->key,
                  (double)v->file_size / (1 << 20), mono_s() - v->t0, v->n_units, v->packs);
    return rc;
}

/* Every unit in order, skipping those another thread is packing; then a
 * second pass waits for those (and packs any a reader gave back undone,
 * after ENOMEM). 0, or the first failure (already in the view's state). */
static int convert_units(jlmfs_view *v)
{
    jlm_err err = {0};
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t u = 0; u < v->n_units; u++) {
            pthread_mutex_lock(&v->lock);
            int stop = v->dead || v->state != JLMFS_CONVERTING || __atomic_load_n(v->env->stop, __ATOMIC_RELAXED);
            int done = v->done[u];
            pthread_mutex_unlock(&v->lock);
            if (stop)
                return -1;   /* dropped (kill removed the files), failed, or shutting down (close removes the .part) */
            if (v->env->slow_ms && !done) {   /* test hook: lets tests read ahead of the worker (not claimed yet) */
                struct timespec ts = {v->env->slow_ms / 1000, (long)(v->env->slow_ms % 1000) * 1000000L};
                nanosleep(&ts, NULL);
            }
            if (claim_unit(v, u, pass == 1) != CLAIM_MINE)
                continue;    /* done, being packed (pass 0), or failed (the stop check says so next) */
            int rc = fill_unit(v, u, NULL, NULL, &err);
            if (rc)
                fail_view(v, err.msg);   /* before the release: a waiting reader sees the failure */
            release_unit(v, u);
            if (rc)
                return rc;
        }
    return 0;
}

typedef struct helper { jlmfs_view *v; int rc; } helper;

static void *convert_helper(void *arg)
{
    helper *h = arg;
    h->rc = convert_units(h->v);
    return NULL;
}

/* The worker. A view converts on every CPU (up to PACKERS): helpers claim
 * units beside the worker, as readers do, so one view's conversion is not
 * one thread's (the jlm convert pipeline packs on all CPUs too). The worker
 * finishes once the helpers are joined; the guard hears the first packer's
 * failure code (a reader's failure: no code, it only clears the busy mark). */
#define PACKERS 8
/* ---------------------------------------------------------------- shared cache */
/* Another host finished the entry while this one waited: its container
 * and sidecar take the place of this host's .part (dup3 is atomic: a
 * reader of a done unit reads the same bytes from either). 0, or -1 if the
 * entry is not a finished, summed one of this plan. */
static int adopt_entry(jlmfs_view *v)
{
    int fd = jlmfs_cache_open(v->env->cache_fd, v->cache_path, O_RDONLY, 0);
    jlm_sums *sums = NULL;
    jlm_err e = {0};
    if (fd < 0 || !cache_valid(v, fd) || changed_after_sums(v, fd, &e) || load_sums(v, &sums, &e)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    flock(fd, LOCK_SH);   /* in use: `jlm cache prune` on any host keeps it */
    pthread_mutex_lock(&v->lock);
    int ok = !v->dead && v->state == JLMFS_CONVERTING && dup3(fd, v->fd, O_CLOEXEC) >= 0;
    if (ok) {
        v->sums = sums;
        sums = NULL;
        memset(v->done, 1, v->n_units);
        v->done_bytes = v->file_size;
        v->state = JLMFS_READY;
        cache_unlink(v, v->part_path);
    }
    pthread_mutex_unlock(&v->lock);
    jlm_sums_free(sums);
    close(fd);
    return ok ? 0 : -1;
}

static int stopping(jlmfs_view *v)
{
    pthread_mutex_lock(&v->lock);
    int stop = v->dead || v->state != JLMFS_CONVERTING || __atomic_load_n(v->env->stop, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&v->lock);
    return stop;
}

/* Shared mode, before converting: takes the entry's lock, waiting while
 * another host holds it (reads are served meanwhile, packed on demand into
 * this host's .part). 0: this host holds the lock and converts; 1: nothing
 * to convert (another host finished it, or v failed, was dropped or the
 * daemon stops). The log says which host converted and which waited. */
static int shared_claim(jlmfs_view *v)
{
    char holder[256], waited_for[256] = "";
    double t = mono_s();
    int waited = 0;
    for (;;) {
        if (stopping(v))
            return 1;
        int got = jlmfs_entry_lock(v, holder, sizeof holder);
        if (got < 0) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s.lock: %s", v->cache_path, strerror(errno));
            fail_view(v, msg);
            return 1;
        }
        if (got == 0) {   /* said once the holder has written its line (or after 1 s) */
            if (!waited_for[0] && (holder[0] || mono_s() - t > 1.0)) {
                vlog(v, JLMFS_LOG_INFO, "%s: waiting: %s", v->key, holder[0] ? holder : "another host converts it");
                snprintf(waited_for, sizeof waited_for, "%s", holder[0] ? holder : "another host");
            }
            waited = 1;
            struct timespec ts = {0, 100000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        if (adopt_entry(v) == 0) {
            jlmfs_entry_unlock(v);
            vlog(v, JLMFS_LOG_INFO, "%s: ready (%.1f MiB, converted by another host; waited %.1f s)", v->key,
                 (double)v->file_size / (1 << 20), mono_s() - t);
            return 1;
        }
        char msg[sizeof v->errmsg];
        if (jlmfs_guard_claim(v, msg, sizeof msg)) {
            fail_view(v, msg);
            jlmfs_entry_unlock(v);
            return 1;
        }
        if (waited)
            vlog(v, JLMFS_LOG_INFO, "%s: taking over the conversion (%s stopped) as host %s", v->key,
                 waited_for[0] ? waited_for : "another host", v->env->host);
        else
            vlog(v, JLMFS_LOG_INFO, "%s: converting as host %s (entry lock held)", v->key, v->env->host);
        return 0;
    }
}

void jlmfs_view_convert(jlmfs_view *v)
{
    if (v->env->shared && shared_claim(v))
        return;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nh = ncpu > 1 ? (int)(ncpu < PACKERS ? ncpu : PACKERS) - 1 : 0, started = 0;
    pthread_t th[PACKERS];
    helper hs[PACKERS];
    for (; started < nh && v->env->slow_ms == 0; started++) {   /* the slow test hook wants one packer */
        hs[started] = (helper){v, 0};
        if (pthread_create(&th[started], NULL, convert_helper, &hs[started]))
            break;
    }
    int rc = convert_units(v);
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        if (rc <= 0 && hs[i].rc > 0)
            rc = hs[i].rc;
    }
    buf_drop_all(v);
    pthread_mutex_lock(&v->lock);
    int failed = v->state != JLMFS_CONVERTING, dead = v->dead;
    pthread_mutex_unlock(&v->lock);
    if (dead || __atomic_load_n(v->env->stop, __ATOMIC_RELAXED)) {
        jlmfs_entry_unlock(v);
        return;
    }   /* dropped (kill removed the files) or shutting down (close removes the .part) */
    jlm_err err = {0};
    if (!failed && rc == 0 && (rc = finish(v, &err)))
        fail_view(v, err.msg);
    jlmfs_guard_leave(v, rc > 0 ? rc : failed ? JLM_EIO : 0, v->errmsg);
    jlmfs_entry_unlock(v);   /* shared mode: after the entry (or the failure) is recorded */
}

/* ---------------------------------------------------------------- reads */
static uint32_t unit_at(const jlmfs_view *v, uint64_t off)
{
    uint32_t lo = 0, hi = v->n_units;   /* last unit with units[u].off <= off */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (v->units[mid].off <= off)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* A read of a view in ERROR: EIO naming the reason (errmsg is set once,
 * before the state changes, and never again). */
static int failed_read(const jlmfs_view *v, jlm_err *err)
{
    return jlm_errf(err, JLM_EIO, "%s: conversion failed: %s", v->key, v->errmsg);
}

int jlmfs_view_bad(jlmfs_view *v) { return __atomic_load_n(&v->bad, __ATOMIC_ACQUIRE); }

/* A span of the entry did not match: named in the log, the entry and its
 * sidecar removed (under the lock kill removes them under) and v marked bad,
 * so the table converts the source again. */
static int span_mismatch(jlmfs_view *v, jlm_err *err)
{
    vlog(v, JLMFS_LOG_ERR, "%s: %s; the entry is removed and converted again", v->key, err->msg);
    pthread_mutex_lock(&v->lock);
    if (!v->dead) {
        cache_unlink(v, v->cache_path);
        cache_unlink(v, v->sums_path);
    }
    pthread_mutex_unlock(&v->lock);
    __atomic_store_n(&v->bad, 1, __ATOMIC_RELEASE);   /* the next lookup replaces v */
    jlmfs_view_invalidate(v);   /* queued to fuse_ops' own thread: safe inside a read */
    return jlm_errf(err, JLM_EIO, "%s: %s", v->key, err->msg);
}

/* Checks every span of the entry that [off, off+n) touches and no read has
 * checked yet: the spans from the first unchecked to the last read from the
 * entry in one read, hashed, compared (format/sums.h). A span checked once
 * is not checked again. */
static int check_spans(jlmfs_view *v, jlm_sums *s, uint64_t off, uint64_t n, jlm_err *err)
{
    int64_t i = jlm_sums_find(s, off);
    if (i < 0)   /* in padding: the first span after it */
        for (i = 0; (uint32_t)i < s->n && s->spans[i].off < off; i++)
            ;
    uint32_t lo = UINT32_MAX, hi = 0;
    for (; (uint32_t)i < s->n && s->spans[i].off < off + n; i++)
        if (!jlm_sums_done(s, (uint32_t)i)) {
            lo = lo == UINT32_MAX ? (uint32_t)i : lo;
            hi = (uint32_t)i;
        }
    if (lo == UINT32_MAX)
        return JLM_OK;   /* the hot path: every span checked before */
    uint64_t a = s->spans[lo].off, len = s->spans[hi].off + s->spans[hi].len - a;
    uint8_t *b = malloc(len);
    if (!b)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", v->key);
    int e = jlm_io_pread_full(v->env->io, v->fd, b, len, a, NULL);
    int rc = e ? jlm_errf(err, JLM_EIO, "%s: reading [%llu, +%llu): %s", v->cache_path, (unsigned long long)a,
                          (unsigned long long)len, strerror(e == JLM_IO_EOF ? EIO : e))
               : JLM_OK;
    for (uint32_t k = lo; !rc && k <= hi; k++)
        if (!jlm_sums_done(s, k))
            rc = jlm_sums_check(s, k, b + (s->spans[k].off - a), s->spans[k].len, v->cache_path, NULL, err);
    free(b);
    return rc == JLM_EFORMAT ? span_mismatch(v, err) : rc;
}

int jlmfs_view_read(jlmfs_view *v, uint64_t off, size_t len, uint8_t *out, jlm_err *err)
{
    pthread_mutex_lock(&v->lock);
    int state = v->state;
    jlm_sums *sums = v->sums;   /* set once, freed with v */
    pthread_mutex_unlock(&v->lock);
    if (state == JLMFS_ERROR)
        return failed_read(v, err);
    if (jlmfs_view_bad(v))
        return jlm_errf(err, JLM_EIO, "%s: its entry failed a checksum: converting it again", v->key);
    if (off > v->file_size || len > v->file_size - off)
        return jlm_errf(err, JLM_EINVAL, "%s: read [%llu, +%zu) past %llu bytes", v->key,
                        (unsigned long long)off, len, (unsigned long long)v->file_size);
    uint64_t end = off + len;
    for (uint32_t u = unit_at(v, off); u < v->n_units && off < end; u++) {
        const jlmfs_unit *un = &v->units[u];
        uint64_t hi = un->off + un->len < end ? un->off + un->len : end, n = hi - off;
        int c = claim_unit(v, u, 1);   /* another thread packing u: wait for it, then read the file */
        if (c == CLAIM_FAILED)
            return failed_read(v, err);
        int done = c == CLAIM_DONE;
        int tier = done ? JLM_TIER_DISK : JLM_TIER_CONVERT;
        if (done) {   /* hot path: the cache file (its own page cache sits below) */
            int rc = sums ? check_spans(v, sums, off, n, err) : JLM_OK;
            if (rc)
                return rc;
            int e = jlm_io_pread_full(v->env->io, v->fd, out, n, off, NULL);
            if (e)
                return jlm_errf(err, JLM_EIO, "%s: reading [%llu, +%llu): %s", v->cache_path,
                                (unsigned long long)off, (unsigned long long)n,
                                strerror(e == JLM_IO_EOF ? EIO : e));
        } else {      /* ahead of the worker: pack the whole unit now, keep it */
            uint8_t *b;
            size_t bcap = 0;
            int rc = fill_unit(v, u, &b, &bcap, err);
            if (rc && rc != JLM_ENOMEM)
                fail_view(v, err->msg);   /* as the worker would: status says why, no later read mixes */
            release_unit(v, u);           /* after the state says so: waiters see the failure, not a retry */
            if (rc)
                return rc;
            memcpy(out, b + (off - un->off), n);
            buf_put(v, b, bcap);
        }
        if (un->arr != JLMFS_A_META)
            if (v->env->record)
                v->env->record(v->env->ctx, v->key, un, tier, n);
        out += n;
        off = hi;
    }
    return JLM_OK;
}

int jlmfs_view_state(jlmfs_view *v, int *pct, char *msg, size_t msg_len)
{
    pthread_mutex_lock(&v->lock);
    int s = v->state;
    if (pct)
        *pct = v->file_size ? (int)(v->done_bytes * 100 / v->file_size) : 100;
    if (msg && msg_len)
        snprintf(msg, msg_len, "%s", v->errmsg);
    pthread_mutex_unlock(&v->lock);
    return s;
}

void jlmfs_view_progress(jlmfs_view *v, uint64_t *done, uint64_t *total)
{
    pthread_mutex_lock(&v->lock);
    *done = v->done_bytes;
    *total = v->file_size;
    pthread_mutex_unlock(&v->lock);
}

int jlmfs_view_expert_page(const jlmfs_view *v, int32_t b, int32_t e, uint64_t *off)
{
    const jlm_header *h = &v->plan->hdr;
    if (b < 0 || (uint32_t)b >= v->plan->config.n_layer || v->moe_rank[b] < 0 || e < 0 || (uint32_t)e >= v->n_expert)
        return JLM_ENOTFOUND;
    *off = h->exp_data_off + ((uint64_t)v->moe_rank[b] * v->n_expert + (uint64_t)e) * h->exp_page_size;
    return JLM_OK;
}

/* ---------------------------------------------------------------- check */
int jlmfs_view_check(jlmfs_view *v, jlm_err *err)
{
    int rc = 0;
    pthread_mutex_lock(&v->lock);
    if (v->state != JLMFS_CONVERTING && v->state != JLMFS_READY && v->state != JLMFS_ERROR)
        rc = jlm_errf(err, JLM_EINVAL, "%s: state %d", v->key, v->state);
    if (!rc && v->state != JLMFS_ERROR) {
        uint64_t at = 0, done = 0;
        for (uint32_t u = 0; u < v->n_units && !rc; u++) {
            if (v->units[u].off != at)
                rc = jlm_errf(err, JLM_EINVAL, "%s: unit %u starts at %llu, expected %llu", v->key, u,
                              (unsigned long long)v->units[u].off, (unsigned long long)at);
            at += v->units[u].len;
            done += v->done[u] ? v->units[u].len : 0;
            if (!rc && v->state == JLMFS_READY && !v->done[u])
                rc = jlm_errf(err, JLM_EINVAL, "%s: ready but unit %u not written", v->key, u);
        }
        if (!rc && at != v->file_size)
            rc = jlm_errf(err, JLM_EINVAL, "%s: units cover %llu of %llu bytes", v->key,
                          (unsigned long long)at, (unsigned long long)v->file_size);
        if (!rc && done != v->done_bytes)
            rc = jlm_errf(err, JLM_EINVAL, "%s: %llu bytes marked done, counter says %llu", v->key,
                          (unsigned long long)done, (unsigned long long)v->done_bytes);
        if (!rc && v->fd < 0)
            rc = jlm_errf(err, JLM_EINVAL, "%s: no container descriptor", v->key);
    }
    pthread_mutex_unlock(&v->lock);
    return rc;
}
