/* test_fs_priv.c - privilege through a root daemon mounted allow_other
 * (issue 10, docs/security.md): an unprivileged user made by the test (useradd,
 * removed in .fini) does each operation through the mount and directly in SRC;
 * nothing through the mount may succeed that fails in SRC, new names are the
 * user's, and no setuid/setgid bit is set through the mount. Needs root (skips
 * otherwise). */
#include <criterion/criterion.h>

#include "tests/testutil.h"
#include "tests/mntutil.h"

#include <grp.h>
#include <pwd.h>

static char g_user[32];
static uid_t U;
static gid_t G;

enum op { OP_READ, OP_WRITE, OP_CHMOD, OP_CHOWN, OP_CREATE, OP_MKDIR, OP_UNLINK, OP_RENAME, OP_TRUNCATE,
          OP_UTIMES, OP_SETUID, OP_SETGID, OP_SYMLINK, OP_CHMOD_OWN };
static const char *OP_NAME[] = {"read", "write", "chmod", "chown", "create", "mkdir", "unlink", "rename",
                                "truncate", "utimes", "chmod u+s", "chmod g+s", "symlink", "chmod 600"};

static int do_op(enum op op, const char *base, const char *name)
{
    char p[1100], q[1100];
    snprintf(p, sizeof p, "%s/%s", base, name);
    snprintf(q, sizeof q, "%s/open/renamed", base);
    struct timespec ts[2] = {{1000000, 0}, {1000000, 0}};
    int fd;
    switch (op) {
    case OP_READ: { char c; fd = open(p, O_RDONLY); return fd < 0 || read(fd, &c, 1) < 0 ? -1 : 0; }
    case OP_WRITE: fd = open(p, O_WRONLY); return fd < 0 || write(fd, "x", 1) != 1 ? -1 : 0;
    case OP_CHMOD: return chmod(p, 0666);
    case OP_CHOWN: return chown(p, U, G);
    case OP_CREATE: fd = open(p, O_WRONLY | O_CREAT, 0644); return fd < 0 ? -1 : 0;
    case OP_MKDIR: return mkdir(p, 0755);
    case OP_UNLINK: return unlink(p);
    case OP_RENAME: return rename(p, q);
    case OP_TRUNCATE: return truncate(p, 0);
    case OP_UTIMES: return utimensat(AT_FDCWD, p, ts, 0);
    case OP_SETUID: return chmod(p, 04755);
    case OP_SETGID: return chmod(p, 02755);
    case OP_SYMLINK: return symlink("/etc/shadow", p);
    case OP_CHMOD_OWN: return chmod(p, 0600);
    }
    return -1;
}

/* Runs one operation as the test user in a child; 0 if it succeeded, else
 * the errno it failed with. */
static int as_user(enum op op, const char *base, const char *name)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        if (setgroups(0, NULL) || setresgid(G, G, G) || setresuid(U, U, U))
            _exit(126);
        _exit(do_op(op, base, name) ? (errno ? errno : 125) & 0x7f : 0);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 127;
}

static const char *pathf_src(const char *rel)
{
    static char buf[4][1100];
    static int i;
    char *b = buf[i++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", M.src, rel);
    return b;
}

static void put(const char *rel, const char *text, mode_t mode)
{
    char p[1100];
    snprintf(p, sizeof p, "%s/%s", M.src, rel);
    cr_assert_eq(tu_write_file(p, text, strlen(text)), 0);
    chmod(p, mode);
}

static void init(void)
{
    if (geteuid() != 0)
        return;
    snprintf(g_user, sizeof g_user, "jlmt%d", (int)getpid());
    char cmd[200];
    snprintf(cmd, sizeof cmd, "useradd -M -N -s /usr/sbin/nologin %s >/dev/null 2>&1", g_user);
    struct passwd *pw = system(cmd) == 0 ? getpwnam(g_user) : NULL;
    if (!pw) {
        g_user[0] = 0;
        return;
    }
    U = pw->pw_uid;
    G = pw->pw_gid;
    mnt_dirs();
    chmod(M.tmp, 0755);   /* the user must reach SRC and the mount point */
    put("secret", "root only", 0600);
    put("pub", "everyone reads", 0644);
    char p[1100];
    snprintf(p, sizeof p, "%s/rootdir", M.src);
    mkdir(p, 0755);
    put("rootdir/victim", "root's", 0644);
    snprintf(p, sizeof p, "%s/open", M.src);
    mkdir(p, 0777);
    chmod(p, 01777);
    snprintf(M.extra, sizeof M.extra, "allow_other");
    mnt_start(0, 1);
}

static void fini(void)
{
    mnt_stop();
    if (g_user[0]) {
        char cmd[200];
        snprintf(cmd, sizeof cmd, "userdel %s >/dev/null 2>&1", g_user);
        if (system(cmd)) {}
    }
    mnt_fini();
}

#define NEED_USER() \
    if (!g_user[0]) cr_skip_test("needs root and useradd")

Test(fs_priv, nothing_through_the_mount_exceeds_the_user_in_src, .init = init, .fini = fini, .timeout = 60)
{
    NEED_USER();
    static const struct { enum op op; const char *name; } denied[] = {
        {OP_READ, "secret"}, {OP_WRITE, "pub"}, {OP_CHMOD, "pub"}, {OP_CHOWN, "pub"},
        {OP_CREATE, "rootdir/new"}, {OP_MKDIR, "rootdir/newd"}, {OP_UNLINK, "rootdir/victim"},
        {OP_RENAME, "rootdir/victim"}, {OP_TRUNCATE, "pub"}, {OP_UTIMES, "pub"}, {OP_SETUID, "pub"},
        {OP_SYMLINK, "rootdir/lnk"}, {OP_CHMOD, "secret"}, {OP_WRITE, "rootdir/victim"},
    };
    for (size_t i = 0; i < sizeof denied / sizeof denied[0]; i++) {
        int direct = as_user(denied[i].op, M.src, denied[i].name);
        int mnt = as_user(denied[i].op, M.mnt, denied[i].name);
        cr_expect_neq(direct, 0, "%s %s is denied in SRC (the case tests a privilege)", OP_NAME[denied[i].op],
                      denied[i].name);
        cr_expect_neq(mnt, 0, "%s %s through the mount must fail as it does in SRC", OP_NAME[denied[i].op],
                      denied[i].name);
    }
    size_t n;
    unsigned char *b = tu_read_file(pathf_src("pub"), &n);
    cr_expect(b && n == 14 && !memcmp(b, "everyone reads", 14), "root's file unchanged");
    free(b);
    struct stat st;
    cr_expect(stat(pathf_src("pub"), &st) == 0 && st.st_uid == 0 && (st.st_mode & 07777) == 0644,
              "root's file keeps owner and mode");
    cr_expect(stat(pathf_src("rootdir/victim"), &st) == 0, "root's file in root's folder is still there");
    cr_expect_eq(as_user(OP_READ, M.mnt, "pub"), 0, "what the user may do still works: read pub");
}

Test(fs_priv, new_names_belong_to_the_caller_and_never_carry_setuid, .init = init, .fini = fini, .timeout = 60)
{
    NEED_USER();
    cr_assert_eq(as_user(OP_CREATE, M.mnt, "open/f"), 0, "create in a 1777 folder through the mount");
    cr_assert_eq(as_user(OP_MKDIR, M.mnt, "open/d"), 0, "mkdir in a 1777 folder through the mount");
    cr_assert_eq(as_user(OP_SYMLINK, M.mnt, "open/l"), 0, "symlink in a 1777 folder through the mount");
    const char *made[] = {"open/f", "open/d", "open/l"};
    for (int i = 0; i < 3; i++) {
        struct stat st;
        cr_assert_eq(lstat(pathf_src(made[i]), &st), 0, "%s exists in SRC", made[i]);
        cr_expect(st.st_uid == U && st.st_gid == G, "%s is owned by %u:%u, want the caller %u:%u", made[i],
                  (unsigned)st.st_uid, (unsigned)st.st_gid, (unsigned)U, (unsigned)G);
    }
    cr_expect_eq(as_user(OP_CHMOD_OWN, M.mnt, "open/f"), 0, "the owner may chmod their file");
    cr_expect_neq(as_user(OP_SETUID, M.mnt, "open/f"), 0, "setuid through the mount is refused");
    cr_expect_neq(as_user(OP_SETGID, M.mnt, "open/f"), 0, "setgid through the mount is refused");
    struct stat st;
    cr_assert_eq(stat(pathf_src("open/f"), &st), 0);
    cr_expect_eq(st.st_mode & 07777, 0600, "mode 0%o: no setuid/setgid bit", st.st_mode & 07777);
}

/* ---------------------------------------------------------------- symlinks and status */
static void copy_model(const char *model, const char *to)
{
    size_t n;
    unsigned char *b = tu_read_file(tu_model(model), &n);
    cr_assert(b);
    cr_assert_eq(tu_write_file(to, b, n), 0, "write %s", to);
    free(b);
}

/* Polls VIEW/status until it starts with "error" (10 s at most). */
static char *wait_error(const char *view)
{
    double t0 = now_s();
    for (;;) {
        char *s = read_text(pathf("%s/%s/status", M.mnt, view));
        if (s && !strncmp(s, "error", 5))
            return s;
        free(s);
        cr_assert(now_s() - t0 < 10, "%s: no error status within 10 s", view);
        sleep_ms(20);
    }
}

static void init_plain(void) { mnt_dirs(); }

Test(fs_links, a_symlink_in_src_is_never_a_source, .init = init_plain, .fini = mnt_fini, .timeout = 60)
{
    copy_model("stories260K.gguf", pathf("%s/outside.gguf", M.tmp));    /* outside SRC */
    copy_model("stories260K.gguf", pathf("%s/real.gguf", M.src));
    cr_assert_eq(symlink(pathf("%s/outside.gguf", M.tmp), pathf("%s/evil.gguf", M.src)), 0);
    cr_assert_eq(symlink("real.gguf", pathf("%s/inner.gguf", M.src)), 0);
    mnt_start(0, 1);
    struct stat st;
    cr_assert_eq(stat(pathf("%s/real.jlm/status", M.mnt), &st), 0, "a regular GGUF gets its view");
    cr_expect_neq(stat(pathf("%s/evil.jlm", M.mnt), &st), 0, "a link out of SRC gets no view");
    cr_expect_neq(stat(pathf("%s/inner.jlm", M.mnt), &st), 0, "a link inside SRC gets no view either");
    cr_expect(lstat(pathf("%s/evil.gguf", M.mnt), &st) == 0 && S_ISLNK(st.st_mode), "the link itself passes through");
    /* a link made while mounted, through SRC and through the mount */
    cr_assert_eq(symlink(pathf("%s/outside.gguf", M.tmp), pathf("%s/late.gguf", M.src)), 0);
    cr_assert_eq(symlink(pathf("%s/outside.gguf", M.tmp), pathf("%s/late2.gguf", M.mnt)), 0);
    cr_expect_neq(stat(pathf("%s/late.jlm", M.mnt), &st), 0, "no view for a link made in SRC");
    cr_expect_neq(stat(pathf("%s/late2.jlm", M.mnt), &st), 0, "no view for a link made through the mount");
}

Test(fs_links, status_never_echoes_source_bytes_or_absolute_paths, .init = init_plain, .fini = mnt_fini,
     .timeout = 60)
{
    const char secret[] = "root:$6$hash:19000:0:99999:7:::\n";
    cr_assert_eq(tu_write_file(pathf("%s/bad.gguf", M.src), secret, sizeof secret - 1), 0);
    size_t n;
    unsigned char *b = tu_read_file(tu_model("stories260K.gguf"), &n);
    cr_assert(b);
    cr_assert_eq(tu_write_file(pathf("%s/cut.gguf", M.src), b, 4096), 0);   /* truncated: names a field */
    free(b);
    mnt_start(0, 1);
    const char *views[] = {"bad.jlm", "cut.jlm"};
    for (int i = 0; i < 2; i++) {
        char *s = wait_error(views[i]);
        cr_expect(!strstr(s, "root") && !strstr(s, "72 6f") && !strstr(s, "hash"), "%s echoes source bytes: %s",
                  views[i], s);
        cr_expect(!strstr(s, M.tmp), "%s shows an absolute path: %s", views[i], s);
        cr_expect(strstr(s, views[i][0] == 'b' ? "bad.gguf" : "cut.gguf"), "%s names the source: %s", views[i], s);
        free(s);
    }
}

Test(fs_priv, a_view_is_readable_only_by_who_may_read_its_gguf, .init = init, .fini = fini, .timeout = 60)
{
    NEED_USER();
    copy_model("stories260K.gguf", pathf_src("private.gguf"));
    chmod(pathf_src("private.gguf"), 0600);
    copy_model("stories260K.gguf", pathf_src("public.gguf"));
    chmod(pathf_src("public.gguf"), 0644);
    struct stat st;
    cr_assert_eq(stat(pathf("%s/private.jlm/status", M.mnt), &st), 0, "root sees the view");
    cr_expect_neq(as_user(OP_READ, M.src, "private.gguf"), 0, "the GGUF is private (the case tests a privilege)");
    cr_expect_neq(as_user(OP_READ, M.mnt, "private.jlm/model.jlm"), 0, "its container is private too");
    cr_expect_neq(as_user(OP_READ, M.mnt, "private.jlm/status"), 0, "and its status");
    cr_expect_neq(as_user(OP_READ, M.mnt, "private.jlm/blocks/0"), 0, "and its pages");
    cr_expect_eq(as_user(OP_READ, M.mnt, "public.jlm/status"), 0, "a readable GGUF's view stays readable");
    cr_expect_eq(as_user(OP_READ, M.mnt, "public.jlm/model.jlm"), 0, "a readable GGUF's view stays readable");
}
