/* Errors, validation and small syscall helpers shared by the addon and the helpers. */
#include "wn.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

const char *wn_code_name(wn_code code) {
  switch (code) {
    case WN_OK: return "OK";
    case WN_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case WN_PATH_ESCAPE: return "PATH_ESCAPE";
    case WN_FILE_NOT_FOUND: return "FILE_NOT_FOUND";
    case WN_ALREADY_EXISTS: return "ALREADY_EXISTS";
    case WN_SANDBOX_NOT_RUNNING: return "SANDBOX_NOT_RUNNING";
    case WN_NOT_SUPPORTED: return "NOT_SUPPORTED";
    case WN_NATIVE_ERROR: return "NATIVE_ERROR";
    case WN_CGROUP_ERROR: return "CGROUP_ERROR";
    case WN_MOUNT_ERROR: return "MOUNT_ERROR";
    case WN_SPAWN_ERROR: return "SPAWN_ERROR";
    case WN_TIMEOUT: return "TIMEOUT";
    case WN_FORBIDDEN: return "FORBIDDEN";
  }
  return "INTERNAL";
}

const char *wn_errno_name(int errnum) {
  const char *n = strerrorname_np(errnum);
  return n ? n : "EUNKNOWN";
}

int wn_fail(wn_error *e, wn_code code, int errnum, const char *fmt, ...) {
  if (e == NULL) return -1;
  e->code = code;
  e->errnum = errnum;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if ((size_t)n >= sizeof e->msg) n = sizeof e->msg - 1;
  if (errnum != 0) snprintf(e->msg + n, sizeof e->msg - (size_t)n, ": %s", wn_errno_name(errnum));
  return -1;
}

/* ---- validation ---------------------------------------------------------- */

int wn_valid_id(const char *s) {
  if (s == NULL) return 0;
  size_t n = strlen(s);
  if (n < 1 || n > 63) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (c == '-' && i > 0);
    if (!ok) return 0;
  }
  return 1;
}

int wn_valid_hostname(const char *s) {
  if (s == NULL) return 0;
  size_t n = strlen(s);
  if (n < 1 || n > 63) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!(alnum || (i > 0 && (c == '-' || c == '.')))) return 0;
  }
  return 1;
}

int wn_valid_abs_path(const char *s) {
  if (s == NULL || s[0] != '/') return 0;
  size_t n = strlen(s);
  if (n > WN_MAX_PATH) return 0;
  if (n == 1) return 1;
  if (s[n - 1] == '/') return 0;
  const char *p = s;
  while (*p) {
    /* p points at a '/' */
    const char *c = p + 1;
    const char *end = strchr(c, '/');
    size_t len = end ? (size_t)(end - c) : strlen(c);
    if (len == 0) return 0;
    if (len == 1 && c[0] == '.') return 0;
    if (len == 2 && c[0] == '.' && c[1] == '.') return 0;
    if (!end) break;
    p = end;
  }
  return 1;
}

int wn_check_id(wn_error *e, const char *what, const char *s) {
  if (!wn_valid_id(s)) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "%s must match ^[a-z0-9][a-z0-9-]{0,62}$", what);
  return 0;
}

int wn_check_abs_path(wn_error *e, const char *what, const char *s) {
  if (!wn_valid_abs_path(s))
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "%s must be an absolute normalized path without '.' or '..' components", what);
  return 0;
}

/* ---- files ---------------------------------------------------------------- */

int wn_write_file_at(int dirfd, const char *path, const char *data) {
  cleanup_fd int fd = openat(dirfd, path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -1;
  size_t len = strlen(data);
  ssize_t w;
  do w = write(fd, data, len);
  while (w < 0 && errno == EINTR);
  if (w < 0) return -1;
  if ((size_t)w != len) {
    errno = EIO;
    return -1;
  }
  return 0;
}

ssize_t wn_read_file_at(int dirfd, const char *path, char *buf, size_t cap) {
  cleanup_fd int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -1;
  size_t off = 0;
  while (off + 1 < cap) {
    ssize_t r = read(fd, buf + off, cap - 1 - off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    off += (size_t)r;
  }
  buf[off] = '\0';
  return (ssize_t)off;
}

ssize_t wn_read_file_alloc(const char *path, char **out) {
  cleanup_fd int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t cap = 4096, off = 0;
  char *buf = malloc(cap);
  if (!buf) return -1;
  for (;;) {
    if (off + 1 >= cap) {
      if (cap >= (64u << 20)) {
        free(buf);
        errno = EFBIG;
        return -1;
      }
      char *nb = realloc(buf, cap * 2);
      if (!nb) {
        free(buf);
        errno = ENOMEM;
        return -1;
      }
      buf = nb;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + off, cap - 1 - off);
    if (r < 0) {
      if (errno == EINTR) continue;
      int saved = errno;
      free(buf);
      errno = saved;
      return -1;
    }
    if (r == 0) break;
    off += (size_t)r;
  }
  buf[off] = '\0';
  *out = buf;
  return (ssize_t)off;
}

int wn_parse_u64(const char *s, uint64_t *out) {
  if (s == NULL || *s < '0' || *s > '9') return -1;
  uint64_t v = 0;
  while (*s >= '0' && *s <= '9') {
    uint64_t d = (uint64_t)(*s - '0');
    if (v > (UINT64_MAX - d) / 10) return -1;
    v = v * 10 + d;
    s++;
  }
  while (*s == '\n' || *s == ' ' || *s == '\t') s++;
  if (*s != '\0') return -1;
  *out = v;
  return 0;
}

/* ---- processes ------------------------------------------------------------ */

int wn_pidfd_open(pid_t pid, unsigned flags) { return (int)syscall(SYS_pidfd_open, pid, flags); }

int wn_pidfd_send_signal(int pidfd, int sig) { return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0); }

int wn_process_start_time(pid_t pid, uint64_t *out, wn_error *e) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  *out = 0;
  if (wn_read_file_at(AT_FDCWD, path, buf, sizeof buf) < 0) {
    if (errno == ENOENT || errno == ESRCH) return 0;
    return wn_fail_errno(e, WN_NATIVE_ERROR, "read %s", path);
  }
  /* comm may contain spaces and ')': fields resume after the last ')'. */
  char *p = strrchr(buf, ')');
  if (!p) return wn_fail(e, WN_NATIVE_ERROR, 0, "parse %s: no comm field", path);
  p++;
  /* After ')' comes field 3 (state); start time is field 22. */
  int field = 2;
  while (*p) {
    while (*p == ' ') p++;
    if (!*p) break;
    field++;
    char *start = p;
    while (*p && *p != ' ') p++;
    if (field == 22) {
      char tmp[32];
      size_t len = (size_t)(p - start);
      if (len >= sizeof tmp) break;
      memcpy(tmp, start, len);
      tmp[len] = '\0';
      if (wn_parse_u64(tmp, out) < 0) break;
      return 0;
    }
  }
  return wn_fail(e, WN_NATIVE_ERROR, 0, "parse %s: no start time field", path);
}

/* ---- child-side helpers: raw syscalls only, no allocation, no locks ------ */

#define CAPBIT(c) (UINT64_C(1) << (c))
const uint64_t wn_default_caps = CAPBIT(CAP_CHOWN) | CAPBIT(CAP_DAC_OVERRIDE) | CAPBIT(CAP_FSETID) |
                                 CAPBIT(CAP_FOWNER) | CAPBIT(CAP_MKNOD) | CAPBIT(CAP_SETGID) | CAPBIT(CAP_SETUID) |
                                 CAPBIT(CAP_SETFCAP) | CAPBIT(CAP_SETPCAP) | CAPBIT(CAP_NET_BIND_SERVICE) |
                                 CAPBIT(CAP_SYS_CHROOT) | CAPBIT(CAP_KILL) | CAPBIT(CAP_AUDIT_WRITE);

int wn_caps_drop(uint64_t keep) {
  for (int cap = 0; cap < 64; cap++) {
    if (keep & CAPBIT(cap)) continue;
    if (syscall(SYS_prctl, PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) return -errno;
  }
  if (syscall(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL) return -errno;
  struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct data[2];
  for (int i = 0; i < 2; i++) {
    uint32_t v = (uint32_t)(keep >> (32 * i));
    data[i].effective = v;
    data[i].permitted = v;
    data[i].inheritable = v;
  }
  if (syscall(SYS_capset, &hdr, data) < 0) return -errno;
  return 0;
}

void wn_protect_memory(void) {
  if (prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0) prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

struct wn_kernel_sigaction {
  void *handler;
  unsigned long flags;
  void *restorer;
  uint64_t mask;
};

void wn_child_reset_signals(void) {
  struct wn_kernel_sigaction sa = {.handler = SIG_DFL, .flags = 0, .restorer = NULL, .mask = 0};
  for (int sig = 1; sig < 65; sig++) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    syscall(SYS_rt_sigaction, sig, &sa, NULL, 8);
  }
  uint64_t empty = 0;
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, &empty, NULL, 8);
}

int wn_close_fds_except(int from, const int *keep, int n) {
  /* the keep set is a handful of fds: sort a copy (insertion sort, no allocation in a child) */
  int k[8];
  int m = 0;
  for (int i = 0; i < n; i++) {
    int fd = keep[i];
    if (fd < from) continue;
    if (m == (int)(sizeof k / sizeof k[0])) return -EINVAL;
    int j = m++;
    while (j > 0 && k[j - 1] > fd) {
      k[j] = k[j - 1];
      j--;
    }
    k[j] = fd;
  }
  unsigned lo = (unsigned)from;
  for (int i = 0; i < m; i++) {
    if ((unsigned)k[i] > lo && syscall(SYS_close_range, lo, (unsigned)k[i] - 1, 0U) < 0) return -errno;
    if ((unsigned)k[i] >= lo) lo = (unsigned)k[i] + 1;
  }
  if (syscall(SYS_close_range, lo, ~0U, 0U) < 0) return -errno;
  /* what is kept must not outlive the exec */
  for (int i = 0; i < m; i++)
    if (fcntl(k[i], F_SETFD, FD_CLOEXEC) < 0) return -errno;
  return 0;
}
