/* bench_mount.c - page-in throughput through a jlmfs mount as a ratio against
 * reading the same spans of the plain container file, in the same run.
 *
 * A llama-1b-shaped Q4_K GGUF (4 blocks) is generated into SRC, converted to
 * a plain container (the baseline), and SRC is mounted with the built jlmfs
 * (sibling of $JLM_BIN). Once the view is ready, every text page is read with
 * one pread of PageSize bytes (as the engine's pager does):
 *   cold: caches dropped (echo 3 > /proc/sys/vm/drop_caches when permitted,
 *         else posix_fadvise DONTNEED on both files) and a fresh mount;
 *   hot:  the same reads again (the mount's pages come from the page cache,
 *         kept by keep_cache).
 * Median of R rounds. The machines are shared and noisy: read the ratios.
 *
 *   build/bench/bench_mount [-r R] [-l LAYERS]
 */
#include "bench/bench_common.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

static char g_src[1024], g_mnt[1024], g_cache[1024];
static pid_t g_pid;

static int mounted(void)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    char line[4096], a[64], b[64], c[64], root[1024], mp[1024];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f))
        found = sscanf(line, "%63s %63s %63s %1023s %1023s", a, b, c, root, mp) == 5 && !strcmp(mp, g_mnt);
    if (f)
        fclose(f);
    return found;
}

static int mount_start(const char *bin)
{
    g_pid = fork();
    if (g_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char opt[1100];
        snprintf(opt, sizeof opt, "cache=%s", g_cache);
        execl(bin, "jlmfs", g_src, g_mnt, "-f", "-o", opt, (char *)NULL);
        _exit(127);
    }
    double t0 = bench_now();
    while (!mounted()) {
        if (bench_now() - t0 > 10 || waitpid(g_pid, NULL, WNOHANG) == g_pid)
            return -1;
        usleep(10000);
    }
    return 0;
}

static void mount_stop(void)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "fusermount3 -u -z '%s' 2>/dev/null", g_mnt);
    if (system(cmd)) {}
    if (g_pid > 0) {
        kill(g_pid, SIGTERM);
        waitpid(g_pid, NULL, 0);
        g_pid = 0;
    }
}

static int wait_ready(void)
{
    char path[1100], buf[64];
    snprintf(path, sizeof path, "%s/m.jlm/status", g_mnt);
    for (double t0 = bench_now(); bench_now() - t0 < 120; usleep(20000)) {
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = 0;
        if (!strncmp(buf, "ready", 5))
            return 0;
        if (!strncmp(buf, "error", 5))
            break;
    }
    fprintf(stderr, "bench_mount: view not ready: %s\n", buf);
    return -1;
}

static void fadvise_dontneed(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

/* Drops the page cache (1 if drop_caches was permitted); the plain file and
 * every entry of the cache folder are also fadvise'd out, which works
 * unprivileged. */
static int drop_caches(const char *plain, const char *cache_dir)
{
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    int ok = f && fputs("3\n", f) >= 0;
    if (f && fclose(f))
        ok = 0;
    fadvise_dontneed(plain);
    DIR *d = opendir(cache_dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char p[2200];
        snprintf(p, sizeof p, "%s/%s", cache_dir, de->d_name);
        if (strstr(de->d_name, ".jlm"))
            fadvise_dontneed(p);
    }
    if (d)
        closedir(d);
    return ok;
}

/* Reads every text page of the container at path with one pread each; seconds. */
static double read_pages(const char *path, const jlm_header *h, uint8_t *buf)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    double t0 = bench_now();
    for (uint32_t i = 0; i < h->n_blocks; i++) {
        size_t got = 0;
        while (got < h->page_size) {
            ssize_t r = pread(fd, buf + got, h->page_size - got, (off_t)(h->data_off + (uint64_t)i * h->page_size + got));
            if (r <= 0) {
                close(fd);
                return -1;
            }
            got += (size_t)r;
        }
    }
    double t = bench_now() - t0;
    close(fd);
    return t;
}

int main(int argc, char **argv)
{
    int rounds = 3, layers = 4;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-r")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-l")) layers = atoi(argv[i + 1]);
    }
    const char *jb = getenv("JLM_BIN");
    char bin[1100];
    snprintf(bin, sizeof bin, "%s", jb && *jb ? jb : "build/jlm");
    char *slash = strrchr(bin, '/');
    snprintf(slash ? slash + 1 : bin, 16, "jlmfs");
    char *tmp = bench_tmpdir(), gguf[1200], ref[1200], model[1200], msg[512];
    snprintf(g_src, sizeof g_src, "%s/src", tmp);
    snprintf(g_mnt, sizeof g_mnt, "%s/mnt", tmp);
    snprintf(g_cache, sizeof g_cache, "%s/cache", tmp);
    snprintf(gguf, sizeof gguf, "%s/m.gguf", g_src);
    snprintf(ref, sizeof ref, "%s/ref.jlm", tmp);
    snprintf(model, sizeof model, "%s/m.jlm/model.jlm", g_mnt);
    mkdir(g_src, 0755);
    mkdir(g_mnt, 0755);
    mkg_shape s = {0};
    mkg_preset("llama-1b", &s);
    jlm_err err = {0};
    jlm_conv *c = NULL;
    jlm_model *m = NULL;
    int rc = mkg_write(gguf, &s, GGML_Q4_K, (uint32_t)layers, 42, msg, sizeof msg);
    if (rc)
        fprintf(stderr, "bench_mount: %s\n", msg);
    if (!rc && ((rc = jlm_conv_open(gguf, NULL, &c, &err)) || (rc = jlm_conv_write(c, ref, NULL, NULL, NULL, &err)) ||
                (rc = jlm_fmt_open(ref, &m, &err))))
        fprintf(stderr, "bench_mount: %s\n", err.msg);
    jlm_conv_close(c);
    uint8_t *buf = m ? malloc(m->hdr.page_size) : NULL;
    if (!rc && (!buf || mount_start(bin) || wait_ready()))
        rc = -1;
    double cold_m[16], cold_p[16], hot_m[16], hot_p[16];
    int dropped = 0;
    rounds = rounds < 1 ? 1 : rounds > 16 ? 16 : rounds;
    for (int r = 0; !rc && r < rounds; r++) {
        mount_stop();   /* a fresh mount: nothing of the view in the page cache */
        dropped = drop_caches(ref, g_cache);
        if (mount_start(bin) || wait_ready()) { rc = -1; break; }
        cold_p[r] = read_pages(ref, &m->hdr, buf);
        cold_m[r] = read_pages(model, &m->hdr, buf);
        hot_p[r] = read_pages(ref, &m->hdr, buf);
        hot_m[r] = read_pages(model, &m->hdr, buf);
        if (cold_p[r] < 0 || cold_m[r] < 0 || hot_p[r] < 0 || hot_m[r] < 0)
            rc = -1;
    }
    if (!rc) {
        double mb = (double)m->hdr.n_blocks * (double)m->hdr.page_size / 1048576.0;
        double cp = bench_median(cold_p, rounds), cm = bench_median(cold_m, rounds), hp = bench_median(hot_p, rounds), hm = bench_median(hot_m, rounds);
        printf("bench_mount: %u pages x %.1f MiB (llama-1b shape, Q4_K), median of %d, caches %s\n", m->hdr.n_blocks,
               (double)m->hdr.page_size / 1048576.0, rounds, dropped ? "dropped (drop_caches)" : "fadvise DONTNEED only");
        printf("  cold: plain %8.0f MiB/s  mount %8.0f MiB/s  mount/plain %.2f\n", mb / cp, mb / cm, cp / cm);
        printf("  hot:  plain %8.0f MiB/s  mount %8.0f MiB/s  mount/plain %.2f\n", mb / hp, mb / hm, hp / hm);
    }
    mount_stop();
    free(buf);
    jlm_fmt_close(m);
    bench_rmrf(tmp);
    free(tmp);
    return rc ? 1 : 0;
}
