/*
 * wn_confine_apply: the last steps of every sandbox process before execve
 * (see confine.h). Order: AppArmor change-onexec, Landlock, rlimits (after
 * every step that opens a descriptor), seccomp (last: the filter denies
 * nothing the earlier steps need, but keeping it last means no step runs
 * under it).
 *
 * Landlock: one ruleset per process, built here from the path lists (the rules
 * name inodes of the sandbox's own root, so they cannot be prepared in the
 * caller's mount namespace). Paths are opened with RESOLVE_NO_SYMLINKS: a
 * writable path the sandbox turned into a symlink (say /work -> /) grants
 * nothing. Missing paths are skipped.
 */
#include "wn.h"
#include "confine.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <linux/seccomp.h>
#include <linux/filter.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif

/* Landlock UAPI, spelled out: Debian 12's headers stop at ABI 2. */
#define LL_CREATE_RULESET_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1
#define LL_FS_EXECUTE (1ULL << 0)
#define LL_FS_WRITE_FILE (1ULL << 1)
#define LL_FS_READ_FILE (1ULL << 2)
#define LL_FS_READ_DIR (1ULL << 3)
#define LL_FS_REMOVE_DIR (1ULL << 4)
#define LL_FS_REMOVE_FILE (1ULL << 5)
#define LL_FS_MAKE_CHAR (1ULL << 6)
#define LL_FS_MAKE_DIR (1ULL << 7)
#define LL_FS_MAKE_REG (1ULL << 8)
#define LL_FS_MAKE_SOCK (1ULL << 9)
#define LL_FS_MAKE_FIFO (1ULL << 10)
#define LL_FS_MAKE_BLOCK (1ULL << 11)
#define LL_FS_MAKE_SYM (1ULL << 12)
#define LL_FS_REFER (1ULL << 13)      /* ABI 2 */
#define LL_FS_TRUNCATE (1ULL << 14)   /* ABI 3 */
#define LL_FS_IOCTL_DEV (1ULL << 15)  /* ABI 5 */

struct ll_ruleset_attr {
  uint64_t handled_access_fs;
  uint64_t handled_access_net; /* ABI 4 */
  uint64_t scoped;             /* ABI 6 */
};
struct ll_path_beneath_attr {
  uint64_t allowed_access;
  int32_t parent_fd;
} __attribute__((packed));

#define LL_FILE_RIGHTS (LL_FS_EXECUTE | LL_FS_WRITE_FILE | LL_FS_READ_FILE | LL_FS_TRUNCATE | LL_FS_IOCTL_DEV)
#define LL_READ_RIGHTS (LL_FS_EXECUTE | LL_FS_READ_FILE | LL_FS_READ_DIR)

static uint64_t ll_handled(int abi) {
  uint64_t h = (LL_FS_MAKE_BLOCK << 1) - 1; /* ABI 1: bits 0..12 */
  if (abi >= 2) h |= LL_FS_REFER;
  if (abi >= 3) h |= LL_FS_TRUNCATE;
  /* IOCTL_DEV (ABI 5) is deliberately not handled: terminals opened later (/dev/tty) need their
     ioctls; the dangerous ones (TIOCSTI, TIOCLINUX) are denied by seccomp. */
  return h;
}

int wn_landlock_abi(void) {
  long r = syscall(SYS_landlock_create_ruleset, NULL, 0, LL_CREATE_RULESET_VERSION);
  return r < 0 ? -errno : (int)r;
}

const char *wn_confine_step_name(int step) {
  switch (step) {
    case WN_CF_RLIMIT: return "setrlimit";
    case WN_CF_APPARMOR: return "AppArmor change-onexec";
    case WN_CF_LANDLOCK_CREATE: return "landlock_create_ruleset";
    case WN_CF_LANDLOCK_RULE: return "landlock_add_rule";
    case WN_CF_LANDLOCK_RESTRICT: return "landlock_restrict_self";
    case WN_CF_SECCOMP: return "seccomp(SECCOMP_SET_MODE_FILTER)";
  }
  return "confinement";
}

/* soft = hard = v, never above the current hard limit (after the uid switch it cannot be raised). */
static int set_limit(int res, int64_t v) {
  struct rlimit old;
  if (syscall(SYS_prlimit64, 0, res, NULL, &old) < 0) return -errno;
  rlim_t want = (rlim_t)v;
  if (old.rlim_max != RLIM_INFINITY && want > old.rlim_max) want = old.rlim_max;
  struct rlimit rl = {want, want};
  if (syscall(SYS_prlimit64, 0, res, &rl, NULL) < 0) return -errno;
  return 0;
}

static int apparmor_onexec(const char *profile) {
  char buf[256];
  size_t n = strlen(profile);
  if (n + 6 > sizeof buf) return -EINVAL;
  memcpy(buf, "exec ", 5);
  memcpy(buf + 5, profile, n);
  buf[5 + n] = '\0';
  int fd = open("/proc/self/attr/apparmor/exec", O_WRONLY | O_CLOEXEC);
  if (fd < 0) fd = open("/proc/self/attr/exec", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ssize_t w = write(fd, buf, 5 + n);
  int err = errno;
  close(fd);
  return w < 0 ? -err : 0;
}

static int add_path(int ruleset, int root_fd, const char *path, uint64_t rights) {
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | (root_fd >= 0 ? RESOLVE_IN_ROOT : 0);
  int fd = (int)syscall(SYS_openat2, root_fd >= 0 ? root_fd : AT_FDCWD, path, &how, sizeof how);
  if (fd < 0) return (errno == ENOENT || errno == ELOOP || errno == ENOTDIR) ? 0 : -errno;
  struct stat st;
  if (fstat(fd, &st) < 0) {
    int err = errno;
    close(fd);
    return -err;
  }
  struct ll_path_beneath_attr pb = {.allowed_access = S_ISDIR(st.st_mode) ? rights : (rights & LL_FILE_RIGHTS),
                                    .parent_fd = fd};
  long r = pb.allowed_access ? syscall(SYS_landlock_add_rule, ruleset, LL_RULE_PATH_BENEATH, &pb, 0) : 0;
  int err = errno;
  close(fd);
  return r < 0 ? -err : 0;
}

/* Full access beneath every top-level directory of the root except the protected ones
   (getdents64 on a stack buffer: async-signal-safe). Symlinks are skipped (add_path refuses them). */
static int add_top_level(int ruleset, int root_fd, const wn_confine *c, uint64_t rights) {
  int dfd = root_fd >= 0 ? openat(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return -errno;
  char buf[4096];
  char path[300];
  int rc = 0;
  for (;;) {
    long n = syscall(SYS_getdents64, dfd, buf, sizeof buf);
    if (n < 0) {
      rc = -errno;
      break;
    }
    if (n == 0) break;
    for (long off = 0; off < n && rc == 0;) {
      struct {
        uint64_t ino;
        int64_t off;
        unsigned short reclen;
        unsigned char type;
        char name[];
      } *d = (void *)(buf + off);
      off += d->reclen;
      if (d->type != DT_DIR && d->type != DT_UNKNOWN) continue;
      if (!strcmp(d->name, ".") || !strcmp(d->name, "..")) continue;
      size_t len = strlen(d->name);
      if (len + 2 > sizeof path) continue;
      path[0] = '/';
      memcpy(path + 1, d->name, len + 1);
      int skip = 0;
      for (int i = 0; i < c->n_protect && !skip; i++) skip = !strcmp(c->ll_protect[i], path);
      if (!skip) rc = add_path(ruleset, root_fd, path, rights);
    }
    if (rc < 0) break;
  }
  close(dfd);
  return rc;
}

/* Create the ruleset and add the path rules; returns the ruleset fd or -errno (*step set). */
static int make_ruleset(const wn_confine *c, int root_fd, int *step) {
  uint64_t handled = ll_handled(c->landlock_abi);
  struct ll_ruleset_attr attr = {.handled_access_fs = handled, .handled_access_net = 0, .scoped = 0};
  size_t size = offsetof(struct ll_ruleset_attr, handled_access_net);
  if (c->landlock_abi >= 6 && c->ll_scope) {
    if (c->ll_scope & WN_LL_SCOPE_ABSTRACT_UNIX) attr.scoped |= 1ULL << 0;
    if (c->ll_scope & WN_LL_SCOPE_SIGNAL) attr.scoped |= 1ULL << 1;
    size = sizeof attr;
  }
  *step = WN_CF_LANDLOCK_CREATE;
  int rs = (int)syscall(SYS_landlock_create_ruleset, &attr, size, 0);
  if (rs < 0) return -errno;
  int rc = 0;
  *step = WN_CF_LANDLOCK_RULE;
  for (int i = 0; i < c->n_ro && rc == 0; i++) rc = add_path(rs, root_fd, c->ll_ro[i], LL_READ_RIGHTS & handled);
  for (int i = 0; i < c->n_rw && rc == 0; i++) rc = add_path(rs, root_fd, c->ll_rw[i], handled);
  if (rc == 0 && c->ll_rw_top) rc = add_top_level(rs, root_fd, c, handled);
  if (rc < 0) {
    close(rs);
    return rc;
  }
  return rs;
}

static int apply_landlock(const wn_confine *c, int exec_fd, int *step) {
  int rs, rc = 0, own = 0;
  if (c->ll_have_ruleset) {
    rs = c->ll_ruleset_fd;
  } else if (exec_fd >= 0) {
    /* The sandbox's pid 1 (warren-init) only reaps: no filesystem access at all, except executing
       itself (the rule added below). Stricter than the profile, and no path walk at spawn. */
    wn_confine bare = *c;
    bare.n_ro = bare.n_rw = bare.n_protect = 0;
    bare.ll_rw_top = 0;
    rs = make_ruleset(&bare, -1, step);
    if (rs < 0) return rs;
    own = 1;
  } else {
    rs = make_ruleset(c, -1, step);
    if (rs < 0) return rs;
    own = 1;
  }
  *step = WN_CF_LANDLOCK_RULE;
  if (rc == 0 && exec_fd >= 0) {
    struct ll_path_beneath_attr pb = {.allowed_access = LL_FS_EXECUTE | LL_FS_READ_FILE, .parent_fd = exec_fd};
    if (syscall(SYS_landlock_add_rule, rs, LL_RULE_PATH_BENEATH, &pb, 0) < 0) rc = -errno;
  }
  if (rc == 0) {
    *step = WN_CF_LANDLOCK_RESTRICT;
    if (syscall(SYS_landlock_restrict_self, rs, 0) < 0) rc = -errno;
  }
  if (own) close(rs);
  return rc;
}

int wn_landlock_ruleset_build(const wn_confine *c, int root_fd, wn_error *e) {
  int step = 0;
  int rs = make_ruleset(c, root_fd, &step);
  if (rs < 0) return wn_fail(e, WN_SPAWN_ERROR, -rs, "build Landlock ruleset: %s", wn_confine_step_name(step));
  return rs;
}

int wn_confine_apply(const wn_confine *c, int exec_fd, int *step) {
  int rc;
  *step = 0;
  if (!c || !c->active) return 0;
  if (c->apparmor_profile) {
    *step = WN_CF_APPARMOR;
    if ((rc = apparmor_onexec(c->apparmor_profile)) < 0) return rc;
  }
  if (c->landlock_abi > 0 && (rc = apply_landlock(c, exec_fd, step)) < 0) return rc;
  /* After every step that opens a descriptor (the AppArmor attr file, the ruleset, its O_PATH
     walk): none of them runs under the sandbox's own RLIMIT_NOFILE. */
  *step = WN_CF_RLIMIT;
  if (c->rlimit_fsize >= 0 && (rc = set_limit(RLIMIT_FSIZE, c->rlimit_fsize)) < 0) return rc;
  if (c->rlimit_nofile >= 0 && (rc = set_limit(RLIMIT_NOFILE, c->rlimit_nofile)) < 0) return rc;
  if (c->seccomp) {
    *step = WN_CF_SECCOMP;
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, c->seccomp) < 0) return -errno;
  }
  *step = 0;
  return 0;
}

int wn_confine_check(const wn_confine *c, wn_error *e) {
  if (!c || !c->active) return 0;
  if (c->n_rw < 0 || c->n_rw > WN_CONFINE_MAX_PATHS || c->n_ro < 0 || c->n_ro > WN_CONFINE_MAX_PATHS)
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "confine: at most %d writable and %d read-only paths",
                   WN_CONFINE_MAX_PATHS, WN_CONFINE_MAX_PATHS);
  for (int i = 0; i < c->n_rw; i++)
    if (strcmp(c->ll_rw[i], "/") != 0 && wn_check_abs_path(e, "confine.writable[]", c->ll_rw[i]) < 0) return -1;
  for (int i = 0; i < c->n_ro; i++)
    if (strcmp(c->ll_ro[i], "/") != 0 && wn_check_abs_path(e, "confine.readOnly[]", c->ll_ro[i]) < 0) return -1;
  if (c->n_protect < 0 || c->n_protect > WN_CONFINE_MAX_PATHS)
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "confine: at most %d protected paths", WN_CONFINE_MAX_PATHS);
  for (int i = 0; i < c->n_protect; i++) {
    if (wn_check_abs_path(e, "confine.protected[]", c->ll_protect[i]) < 0) return -1;
    if (strchr(c->ll_protect[i] + 1, '/')) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "confine.protected[] must be top-level directories");
  }
  if (c->landlock_abi < 0 || c->landlock_abi > 64) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "confine.landlockAbi out of range");
  if (c->ll_scope & ~(WN_LL_SCOPE_ABSTRACT_UNIX | WN_LL_SCOPE_SIGNAL))
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "confine.scope has unknown bits");
  if (c->rlimit_fsize > (int64_t)1 << 50 || c->rlimit_nofile > (1 << 20))
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "confine rlimits out of range");
  if (c->rlimit_nofile >= 0 && c->rlimit_nofile < 16)
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "confine.nofile must be at least 16");
  if (c->apparmor_profile) {
    size_t n = strlen(c->apparmor_profile);
    if (n == 0 || n > 200) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "confine.apparmorProfile must be 1..200 bytes");
    for (size_t i = 0; i < n; i++) {
      char ch = c->apparmor_profile[i];
      if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.'))
        return wn_fail(e, WN_INVALID_ARGUMENT, 0, "confine.apparmorProfile has a bad character");
    }
  }
  return 0;
}

int wn_bpf_lsm_probe(void) {
  /* BPF_PROG_LOAD, prog_type BPF_PROG_TYPE_LSM (29), expected_attach_type BPF_LSM_MAC (27), no BTF id:
     a kernel that accepts LSM programs rejects this for the missing attach_btf_id (EINVAL); one that
     refuses them answers EPERM (lockdown) or EINVAL for the type itself. */
  struct {
    uint32_t prog_type, insn_cnt;
    uint64_t insns, license;
    uint32_t log_level, log_size;
    uint64_t log_buf;
    uint32_t kern_version, prog_flags;
    char prog_name[16];
    uint32_t prog_ifindex, expected_attach_type;
    uint32_t prog_btf_fd, func_info_rec_size;
    uint64_t func_info;
    uint32_t func_info_cnt, line_info_rec_size;
    uint64_t line_info;
    uint32_t line_info_cnt, attach_btf_id;
  } attr;
  struct sock_filter dummy[2]; /* unused as BPF; the load fails before looking at it */
  uint64_t insns[2] = {0xb7 /* r0 = 0 */, 0x95 /* exit */};
  (void)dummy;
  memset(&attr, 0, sizeof attr);
  attr.prog_type = 29;
  attr.insn_cnt = 2;
  attr.insns = (uint64_t)(uintptr_t)insns;
  attr.license = (uint64_t)(uintptr_t)"GPL";
  attr.expected_attach_type = 27;
  long fd = syscall(SYS_bpf, 5 /* BPF_PROG_LOAD */, &attr, sizeof attr);
  if (fd >= 0) {
    close((int)fd);
    return 0;
  }
  int err = errno;
  if (err == EINVAL || err == ESRCH || err == ENOENT) return 0; /* type known; only the probe's BTF id is missing */
  return -err;
}
