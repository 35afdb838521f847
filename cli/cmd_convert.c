/* cmd_convert.c - `jlm convert SRC [OUT [TYPE]] [-o OUT] [--type TYPE] [--plan]`.
 * OUT and TYPE may follow SRC as llama-quantize takes them (IN OUT TYPE). */
#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/outfile.h"
#include "converter/convert.h"
#include "residency/residency.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The .part being written, so a SIGINT/SIGTERM removes it (format invariant
 * 4). Written before the handlers can run; read only by them. */
static char *g_part;

static void on_signal(int sig)
{
    if (g_part)
        unlink(g_part);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void progress(void *ctx, uint64_t done, uint64_t total)
{
    /* Test hook: terminate ourselves at N% to check that nothing is left. */
    const char *at = getenv("JLM_TEST_SIGNAL_AT");
    if (at && total && done * 100 >= (uint64_t)atoi(at) * total)
        raise(SIGTERM);
    jlm_cli_progress(ctx, done, total);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void print_plan(const jlm_conv *c, const char *out)
{
    const jlm_header *h = &c->plan.hdr;
    printf("plan for %s -> %s\n", c->src_path, out);
    printf("  arch            %s, %u layers, %u tensors\n", jlm_fmt_arch_name(c->config.arch), c->config.n_layer, c->n_tensors);
    printf("  metadata        %llu bytes (config %llu, vocab %llu, table %llu)\n", (unsigned long long)h->dense_off,
           (unsigned long long)h->cfg_len, (unsigned long long)h->voc_len, (unsigned long long)h->tab_len);
    printf("  dense region    %llu bytes at %llu\n", (unsigned long long)h->dense_len, (unsigned long long)h->dense_off);
    printf("  text pages      %u x %llu bytes at %llu\n", h->n_blocks, (unsigned long long)h->page_size, (unsigned long long)h->data_off);
    if (h->n_vis_blocks)
        printf("  vision pages    %u x %llu bytes at %llu\n", h->n_vis_blocks, (unsigned long long)h->vis_page_size,
               (unsigned long long)h->vis_data_off);
    if (h->n_exp_pages)
        printf("  expert pages    %u x %llu bytes at %llu\n", h->n_exp_pages, (unsigned long long)h->exp_page_size,
               (unsigned long long)h->exp_data_off);
    printf("  chunk           %llu\n  stream groups   %u\n", (unsigned long long)h->chunk, h->stream_groups);
    printf("  file size       %llu bytes (source %llu)\n", (unsigned long long)c->plan.file_size,
           (unsigned long long)c->g->total_bytes);
}

/* The folder OUT.part is created in must exist and be writable: found out
 * before a conversion of many GB, not at its end. errno's text or NULL. */
static const char *bad_out_dir(const char *out)
{
    char *d = strdup(out);
    if (!d)
        return "out of memory";
    char *sl = strrchr(d, '/');
    const char *dir = sl ? (sl == d ? "/" : (*sl = 0, d)) : ".";
    struct stat st;
    const char *why = NULL;
    if (stat(dir, &st) != 0)
        why = strerror(errno);
    else if (!S_ISDIR(st.st_mode))
        why = strerror(ENOTDIR);
    else if (access(dir, W_OK | X_OK) != 0)
        why = strerror(errno);
    free(d);
    return why;
}

/* The command line of `jlm convert`. */
typedef struct conv_args {
    const char *src, *out, *mmproj, *type, *device;
    const char *oflag;   /* "-o " when the output was named with -o: for messages */
    int plan_only, show_progress;
} conv_args;

/* 0, the exit status after one line, or -1 after --help. */
static int convert_parse(int argc, char **argv, conv_args *a)
{
    const jlm_opt t[] = {
        {"-o", "--output", JLM_OPT_STR, &a->out, 0, 0, JLM_OPT_OUT, "OUT.jlm", "the container to write (default: SRC with .jlm)"},
        {NULL, "--mmproj", JLM_OPT_STR, &a->mmproj, 0, 0, 0, "FILE", "a vision projector GGUF to pack in"},
        {NULL, "--type", JLM_OPT_STR, &a->type, 0, 0, 0, "TYPE", "keep|Q8_0|Q6_K|Q5_K_M|Q4_K_M|Q5_1|Q5_0|Q4_1|Q4_0 (default: keep)"},
        {NULL, "--plan", JLM_OPT_FLAG, &a->plan_only, 0, 0, 0, NULL, "print the plan, write nothing"},
        {NULL, "--progress", JLM_OPT_FLAG, &a->show_progress, 0, 0, 0, NULL,
         "progress lines on stderr when it is not a terminal (a log; on a terminal the bar is always drawn)"},
        {NULL, "--device", JLM_OPT_STR, &a->device, 0, 0, 0, "cpu|vulkan|cuda", "the device recorded in the fingerprint (compared on load, never enforced; default: cpu)"},
    };
    const char *pos[3] = {0};
    jlm_opts_spec os = {"jlm convert", "SRC.gguf|HF_FOLDER [OUT.jlm [TYPE]] [options]", t, (int)(sizeof t / sizeof t[0]),
                        pos, 3, 0};
    int prc = jlm_opts_parse(&os, argc, argv);
    if (prc)
        return prc == 1 ? -1 : prc;
    a->src = os.n_pos ? pos[0] : NULL;
    if (!a->src) {
        jlm_opts_help(stderr, &os);
        return 2;
    }
    /* OUT and TYPE after SRC, as llama-quantize IN OUT TYPE; each once */
    if (os.n_pos > 1 && a->out && strcmp(a->out, pos[1])) {
        fprintf(stderr, "jlm convert: the output is given twice: '%s' and -o '%s'\n", pos[1], a->out);
        return 2;
    }
    if (os.n_pos > 2 && a->type && strcasecmp(a->type, pos[2])) {
        fprintf(stderr, "jlm convert: the type is given twice: '%s' and --type '%s'\n", pos[2], a->type);
        return 2;
    }
    a->oflag = a->out ? "-o " : "";
    if (os.n_pos > 1)
        a->out = pos[1];
    if (os.n_pos > 2)
        a->type = pos[2];
    if (a->device && strcmp(a->device, "cpu") && strcmp(a->device, "vulkan") && strcmp(a->device, "cuda")) {
        fprintf(stderr, "jlm convert: --device '%.40s': expected cpu, vulkan or cuda\n", a->device);
        return 2;
    }
    return 0;
}

/* Where the container goes, checked before any work: a->out (the checked
 * writer's refusals, cli/outfile.h: the converter renames OUT.part over
 * OUT), or SRC with .jlm (*def, malloc'd). 0 or the exit status after a line. */
static int convert_out(conv_args *a, char **def)
{
    int given = a->out != NULL, rc;
    if (given && !a->plan_only && (rc = jlm_cli_out_check("jlm convert", *a->oflag ? "-o" : "", a->out, &a->src, 1,
                                                          "source")))
        return rc;
    if (!given && !(a->out = *def = jlm_conv_default_out(a->src)))
        return jlm_cli_error("jlm convert", "out of memory"), 1;
    if (a->plan_only)
        return 0;
    char *vdb = NULL, *vkey = NULL;
    if (!given && jlm_rdb_discover(a->out, &vdb, &vkey, NULL) == 0) {
        /* SRC lies in a jlmfs mount: the daemon has made its view, which is
         * the container already (docs/cli.md); nothing to write */
        jlm_cli_errorf("jlm convert", "%s is in a jlmfs mount: its view %s is the converted container (jlm run %s); "
                       "-o PATH writes a copy elsewhere", a->src, a->out, a->out);
        free(vdb); free(vkey);
        return 1;
    }
    const char *why = given ? NULL : jlm_cli_out_refusal(a->out, &a->src, 1, "source");
    if (!why)
        why = bad_out_dir(a->out);
    if (why) {   /* before any work: the output is checked, then the source is converted */
        jlm_cli_errorf("jlm convert", "%s%s: cannot write there: %s", a->oflag, a->out, why);
        return given ? 2 : 1;
    }
    return 0;
}

/* The conversion itself, with its progress, and the .part removed on a
 * signal. Exit status. */
static int convert_write(const conv_args *a)
{
    jlm_err err = {0};
    jlm_conv *c;
    double t0 = now_s();
    if (jlm_conv_open_full(-1, a->src, a->mmproj, a->type, stderr, &c, &err))
        return jlm_cli_error("jlm convert", err.msg), 1;
    if (a->device && jlm_conv_set_device(c, a->device, &err)) {
        jlm_cli_error("jlm convert", err.msg);
        jlm_conv_close(c);
        return 1;
    }
    if (a->plan_only) {
        print_plan(c, a->out);
        jlm_conv_close(c);
        return 0;
    }
    if (asprintf(&g_part, "%s.part", a->out) < 0)
        g_part = NULL;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    jlm_cli_bar b;
    jlm_cli_bar_init(&b, "jlm convert", jlm_cli_bar_mode(a->show_progress));
    int rc = jlm_conv_write(c, a->out, NULL, progress, &b, &err);
    jlm_cli_bar_end(&b);
    if (rc)
        jlm_cli_error("jlm convert", err.msg);
    else
        fprintf(stderr, "jlm convert: wrote %s (%llu bytes, %u tensors) in %.2f s\n", a->out,
                (unsigned long long)c->plan.file_size, c->n_tensors, now_s() - t0);
    jlm_conv_close(c);
    return rc ? 1 : 0;
}

int jlm_cmd_convert(int argc, char **argv)
{
    conv_args a = {0};
    char *def = NULL;
    int rc = convert_parse(argc, argv, &a);
    if (rc)
        return rc < 0 ? 0 : rc;   /* -1: --help printed */
    rc = convert_out(&a, &def);
    if (!rc)
        rc = convert_write(&a);
    free(def);
    return rc;
}
