/* daemon.c - `jlmfs SRC MOUNTPOINT [-f] [-o cache=DIR,workers=N,...]`
 * (fs/daemon.h): the options, the refusals at start (a jlmfs over a jlmfs, a
 * mount point inside its own source), the mount and the session loop. */
#include "fs/daemon.h"
#include "fs/fuse_int.h"

#include <jansson.h>
#include <sqlite3.h>

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

const char jlmfs_daemon_usage[] =
    "usage: jlmfs SRC MOUNTPOINT [-f] [-d] [-o OPTIONS]\n"
    "Mounts the folder SRC at MOUNTPOINT; every complete x.gguf (or Hugging Face\n"
    "folder x/) in it gets a read-only model view x.jlm/ (model.jlm, status, config.json, tensors, dense,\n"
    "blocks/N, vision/N, experts/B.E, resident/, stats). See docs/jlmfs.md.\n"
    "options:\n"
    "  -o cache=DIR     container cache (default SRC/.jlmfs-cache, hidden from the mount)\n"
    "  -o shared        the cache folder is shared by the daemons of many hosts (a\n"
    "                   distributed filesystem): entries keyed by content, one\n"
    "                   converter per entry, removed only by jlm cache prune\n"
    "                   (docs/scale-out.md); needs cache=DIR\n"
    "  -o db=PATH       residency database (default CACHE/jlmfs.db; with shared:\n"
    "                   /var/lib/jlmfs/ as root, else $XDG_STATE_HOME/jlmfs/)\n"
    "  -o workers=N     background conversion threads (default 1)\n"
    "  -o type=T        quantize at conversion: keep (default), Q8_0, Q6_K, Q5_K_M,\n"
    "                   Q4_K_M, Q5_1, Q5_0, Q4_1, Q4_0 (as jlm convert --type)\n"
    "  -o allow_other   let other users use the mount (FUSE option; the kernel checks\n"
    "                   every access against SRC's owners and modes: default_permissions)\n"
    "  -f               stay in the foreground, the log on stderr (else syslog,\n"
    "                   facility daemon: mounts, conversions, errors, drops);\n"
    "                   -d: debug (implies -f)\n"
    "test hook: JLMFS_TEST_SLOW_MS=N sleeps N ms before each page the\n"
    "background conversion packs (so tests can read ahead of it).\n";

/* ---------------------------------------------------------------- one daemon per tree */
/* Undoes mountinfo's octal escapes (\040 for a space) in place. */
static void unescape(char *s)
{
    char *o = s;
    for (; *s; s++) {
        if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
            *o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
            s += 3;
        } else {
            *o++ = *s;
        }
    }
    *o = 0;
}

/* The mount holding path (the longest mount point that is path or above it;
 * the last listed of equal ones, which covers the others): 1 with its mount
 * point and source copied out if it is a jlmfs mount (fstype fuse.jlmfs), else 0. */
static int jlmfs_mount_of(const char *path, char *mp_out, size_t mp_n, char *src_out, size_t src_n)
{
    char *real = realpath(path, NULL);
    FILE *f = real ? fopen("/proc/self/mountinfo", "re") : NULL;
    char line[8192], best_mp[4096] = "", best_src[4096] = "";
    size_t best = 0;
    int is_jlmfs = 0;
    while (f && fgets(line, sizeof line, f)) {
        char mp[4096], fstype[256], src[4096];
        const char *dash = strstr(line, " - ");
        if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1 ||
            sscanf(dash + 3, "%255s %4095s", fstype, src) != 2)
            continue;
        unescape(mp);
        unescape(src);
        size_t n = strlen(mp);
        int above = !strcmp(mp, "/") || (!strncmp(real, mp, n) && (real[n] == 0 || real[n] == '/'));
        if (above && n >= best) {   /* later lines of the same point were mounted over earlier ones */
            best = n;
            is_jlmfs = !strcmp(fstype, "fuse.jlmfs");
            snprintf(best_mp, sizeof best_mp, "%s", mp);
            snprintf(best_src, sizeof best_src, "%s", src);
        }
    }
    if (f)
        fclose(f);
    free(real);
    if (is_jlmfs) {
        snprintf(mp_out, mp_n, "%s", best_mp);
        snprintf(src_out, src_n, "%s", best_src);
    }
    return is_jlmfs;
}

/* 1 (its mount point copied out) if a jlmfs mount has src as its source. */
static int jlmfs_mounted_from(const char *src, char *mp_out, size_t mp_n)
{
    char *real = realpath(src, NULL);
    FILE *f = real ? fopen("/proc/self/mountinfo", "re") : NULL;
    char line[8192];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) {
        char mp[4096], fstype[256], from[4096];
        const char *dash = strstr(line, " - ");
        if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1 ||
            sscanf(dash + 3, "%255s %4095s", fstype, from) != 2 || strcmp(fstype, "fuse.jlmfs"))
            continue;
        unescape(mp);
        unescape(from);
        char *rf = realpath(from, NULL);
        found = rf && !strcmp(rf, real);
        if (found)
            snprintf(mp_out, mp_n, "%s", mp);
        free(rf);
    }
    if (f)
        fclose(f);
    free(real);
    return found;
}

/* A jlmfs over a jlmfs would convert every model a second time into a
 * second cache: SRC inside a jlmfs mount or already the source of one, or MNT
 * on or inside one, is refused naming that mount. 0, or 1 with the line printed. */
static int refuse_stacking(const char *src, const char *mnt)
{
    char mp[4096], from[4096];
    if (jlmfs_mount_of(src, mp, sizeof mp, from, sizeof from)) {
        fprintf(stderr, "jlmfs: source %s is inside the jlmfs mount %s (of %s): mount %s instead\n", src, mp, from,
                from);
        return 1;
    }
    if (jlmfs_mounted_from(src, mp, sizeof mp)) {
        fprintf(stderr, "jlmfs: source %s is already mounted by jlmfs at %s: use that mount\n", src, mp);
        return 1;
    }
    if (mnt && jlmfs_mount_of(mnt, mp, sizeof mp, from, sizeof from)) {
        fprintf(stderr, "jlmfs: mount point %s is %s the jlmfs mount %s (of %s): unmount it first (fusermount3 -u %s)\n",
                mnt, strcmp(mp, mnt) ? "inside" : "already", mp, from, mp);
        return 1;
    }
    return 0;
}

/* 1 if path is below dir (both absolute, resolved). */
static int is_below(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return !strcmp(dir, "/") ? path[1] != 0 : !strncmp(path, dir, n) && path[n] == '/';
}

/* A mount point inside SRC (or SRC itself) puts the mount inside the tree
 * the daemon serves it from: `ls MNT/inner` makes the daemon look up its own
 * mount and wait on itself, and the caller can no longer be killed. SRC
 * inside the mount point is hidden by the mount from the daemon's own paths.
 * Both refused before mounting: 0, or 1 with the line printed. */
static int refuse_nesting(const char *src, const char *mnt)
{
    char *rs = realpath(src, NULL), *rm = mnt ? realpath(mnt, NULL) : NULL;
    int bad = 1;
    if (rs && rm && !strcmp(rs, rm))
        fprintf(stderr, "jlmfs: mount point %s is the source itself: choose a mount point outside %s\n", mnt, src);
    else if (rs && rm && is_below(rm, rs))
        fprintf(stderr, "jlmfs: mount point %s is inside the source %s (the daemon would wait on its own mount): "
                "choose a mount point outside it\n", mnt, src);
    else if (rs && rm && is_below(rs, rm))
        fprintf(stderr, "jlmfs: source %s is inside the mount point %s (the mount would hide it): "
                "choose a mount point outside it\n", src, mnt);
    else
        bad = 0;   /* unresolvable: jlmfs_open and the mount say why */
    free(rs);
    free(rm);
    return bad;
}

/* ---------------------------------------------------------------- options */
typedef struct opts { char *src, *mnt, *cache, *type, *db; unsigned workers; int help, n_nonopt, shared; } opts;

enum { KEY_HELP = 1, KEY_FG };
static const struct fuse_opt opt_spec[] = {
    {"cache=%s", offsetof(opts, cache), 0},
    {"workers=%u", offsetof(opts, workers), 0},
    {"type=%s", offsetof(opts, type), 0},
    {"db=%s", offsetof(opts, db), 0},
    {"shared", offsetof(opts, shared), 1},
    FUSE_OPT_KEY("-f", KEY_FG),
    FUSE_OPT_KEY("-d", KEY_FG),
    FUSE_OPT_KEY("debug", KEY_FG),
    FUSE_OPT_KEY("-h", KEY_HELP),
    FUSE_OPT_KEY("--help", KEY_HELP),
    FUSE_OPT_END,
};

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *out)
{
    opts *o = data;
    if (key == KEY_HELP) {
        o->help = 1;
        return 0;
    }
    if (key == KEY_FG) {
        jlmfs_dlog_foreground(1);   /* the log goes to stderr; FUSE sees the option too */
        return 1;
    }
    if (key == FUSE_OPT_KEY_NONOPT && o->n_nonopt++ == 0) {
        o->src = strdup(arg);   /* SRC; the mount point goes on to FUSE */
        return 0;
    }
    if (key == FUSE_OPT_KEY_NONOPT && o->n_nonopt == 2 && !o->mnt)
        o->mnt = strdup(arg);   /* kept to check it, and passed on */
    return 1;
}


void jlmfs_daemon_print_build(FILE *out)
{
    fprintf(out, "build: %s %s, libfuse %d.%d (runtime %d), sqlite %s, jansson %s\n",
#if defined(__clang__)
            "clang",
#else
            "gcc",
#endif
            __VERSION__, FUSE_MAJOR_VERSION, FUSE_MINOR_VERSION, fuse_version(), sqlite3_libversion(),
            jansson_version_str());
}

int jlmfs_daemon_main(int argc, char **argv)
{
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    struct fuse_cmdline_opts co = {0};
    struct fuse_session *se = NULL;
    struct fuse_loop_config *cfg = NULL;
    jlmfs *fs = NULL;
    opts o = {0};
    char *name = NULL;   /* "SRC on MNT type fuse.jlmfs" in the mount table */
    int rc, mounted = 0, handlers = 0;
    if (fuse_opt_parse(&args, &o, opt_spec, opt_proc)) {
        rc = 2;
        goto out;
    }
    if (o.help) {
        fputs(jlmfs_daemon_usage, stdout);
        rc = 0;
        goto out;
    }
    if (!o.src || o.n_nonopt != 2) {
        fputs(jlmfs_daemon_usage, stderr);
        rc = 2;
        goto out;
    }
    if (o.shared && !o.cache) {
        fputs("jlmfs: option shared: needs cache=DIR (the folder the hosts share)\n", stderr);
        rc = 2;
        goto out;
    }
    if (refuse_stacking(o.src, o.mnt) || refuse_nesting(o.src, o.mnt)) {
        rc = 1;
        goto out;
    }
    /* The kernel checks every access against the owner and mode each node
     * shows (SRC's own for passthrough files): without it a root daemon
     * mounted allow_other would read, write and chmod anything for anyone. */
    fuse_opt_add_arg(&args, "-odefault_permissions");
    char *abs_src = realpath(o.src, NULL);   /* absolute: refuse_stacking compares it */
    const char *shown = abs_src ? abs_src : o.src;
    if (!strchr(shown, ',') && asprintf(&name, "-ofsname=%s", shown) >= 0)
        fuse_opt_add_arg(&args, name);
    fuse_opt_add_arg(&args, "-osubtype=jlmfs");
    free(abs_src);
    if (fuse_parse_cmdline(&args, &co) || !co.mountpoint) {
        fputs(jlmfs_daemon_usage, stderr);
        rc = 2;
        goto out;
    }
    openlog("jlmfs", LOG_PID, LOG_DAEMON);   /* connects at the first line: after daemonizing */
    const char *slow = getenv("JLMFS_TEST_SLOW_MS");
    jlmfs_opts fo = {.src = o.src, .cache = o.cache, .n_workers = o.workers, .type = o.type,
                     .shared = o.shared, .db = o.db,
                     .invalidate = jlmfs_fuse_inval_queue, .log = jlmfs_dlog_line,
                     .slow_ms = slow ? (unsigned)strtoul(slow, NULL, 10) : 0};
    jlm_err e;
    if (jlmfs_open(&fo, &fs, &e)) {
        fprintf(stderr, "jlmfs: %s\n", e.msg);
        fs = NULL;
        rc = 1;
        goto out;
    }
    rc = 1;
    if (!(se = fuse_session_new(&args, &jlmfs_fuse_ops, sizeof jlmfs_fuse_ops, fs)))
        goto out;   /* libfuse said why (an unknown option) */
    if (jlmfs_fuse_bind(fs, se)) {
        fprintf(stderr, "jlmfs: out of memory\n");
        goto out;
    }
    if (fuse_set_signal_handlers(se))
        goto out;
    handlers = 1;
    if (fuse_session_mount(se, co.mountpoint))
        goto out;
    mounted = 1;
    fuse_daemonize(co.foreground);
    if (co.singlethread) {
        rc = fuse_session_loop(se) ? 1 : 0;
    } else {
        /* libfuse's own default for idle threads is "unlimited"; 10 is the
         * documented one (-o max_idle_threads=N sets it) */
        cfg = fuse_loop_cfg_create();
        if (cfg) {
            fuse_loop_cfg_set_clone_fd(cfg, (unsigned)co.clone_fd);
            fuse_loop_cfg_set_idle_threads(cfg, co.max_idle_threads == UINT_MAX ? 10 : co.max_idle_threads);
            fuse_loop_cfg_set_max_threads(cfg, co.max_threads);
            rc = fuse_session_loop_mt(se, cfg) ? 1 : 0;
        }
    }
out:   /* every exit frees what the options and args hold (LSan in make debug) */
    if (mounted)
        fuse_session_unmount(se);
    if (handlers)
        fuse_remove_signal_handlers(se);
    if (se)
        fuse_session_destroy(se);   /* runs op_destroy if init ran */
    if (fs && !jlmfs_fuse_started())
        jlmfs_close(fs);   /* never initialised: destroy did not close it */
    jlmfs_fuse_unbind();
    if (cfg)
        fuse_loop_cfg_destroy(cfg);
    free(co.mountpoint);
    fuse_opt_free_args(&args);
    free(name); free(o.src); free(o.mnt); free(o.cache); free(o.type); free(o.db);
    return rc;
}
