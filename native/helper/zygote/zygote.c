/*
 * _warren_zygote: the fork server of a FnCall python3 zygote (docs/fncall.md, "python3 zygote").
 *
 * A pool container keeps one python3 interpreter that has started up the way `python3 -B main.py`
 * does and then calls serve(3): from then on it only forks. Each request (from the gateway, over
 * the SOCK_SEQPACKET socket on fd 3) carries the invocation's stdio pipes, environment, limits and
 * confinement; the child gets exactly the per-process setup a fresh exec gets from nsexec.c's
 * exec_child, applied here with the same code (isolate.h, confine.c), and returns to Python to run
 * the script. The parent reports the child (a pidfd), waits for it and reports its wait status.
 *
 * The zygote itself holds no capability beyond a sandbox root's default set: the child makes its
 * per-invocation IPC and network namespaces inside a user namespace of its own, which the zygote
 * maps identically to the host's (0 0 4294967295, the same map as the initial user namespace),
 * and then drops to the run user. The mount namespace (read-only root, scratch binds, /dev/shm)
 * is the zygote's, prepared once by the exec that started it; no invocation can change it.
 *
 * The child runs no Python code until the setup is complete: every step here is C.
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x03080000
#include <Python.h>

#include "wn.h"
#include "confine.h"
#include "isolate.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define REQ_MAX (512 * 1024)
#define MAX_ENV 4096

/* replies: {kind, a, b, c} */
enum { R_STARTED = 1, R_FAILED = 2, R_EXITED = 3 };
/* failure steps (R_FAILED.a) */
enum { Z_REQUEST = 1, Z_FORK, Z_SETSID, Z_STDIO, Z_CLOSE_FDS, Z_USERNS, Z_IDMAP, Z_ISOLATE, Z_CAPS, Z_SETGROUPS, Z_SETGID, Z_SETUID, Z_CHDIR, Z_NNP, Z_CONFINE };

struct request {
  char *env[MAX_ENV + 1];
  int n_env;
  wn_isolate iso;
  wn_confine cf;
  uid_t uid;
  gid_t gid;
  const char *cwd;
  int fds[3];
};

static char g_buf[REQ_MAX + 1];

static int send_reply(int ctl, int kind, int a, int b, int c, int fd) {
  int32_t msg[4] = {kind, a, b, c};
  struct iovec iov = {msg, sizeof msg};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  struct msghdr mh;
  memset(&mh, 0, sizeof mh);
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (fd >= 0) {
    mh.msg_control = u.buf;
    mh.msg_controllen = sizeof u.buf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  }
  ssize_t n;
  do n = sendmsg(ctl, &mh, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n < 0 ? -1 : 0;
}

static int64_t num(const char *s) { return strtoll(s, NULL, 10); }

/*
 * The request: NUL-terminated records "<tag><value>"; tags: E env entry, U uid, G gid, C cwd,
 * I ipc namespace, N network namespace, R rlimits "cpu fsize core nofile", S seccomp allow mask,
 * L Landlock ABI, W/O Landlock writable/read-only path, T writable top level, P protected name,
 * X Landlock scope, A AppArmor profile, F/Q confinement RLIMIT_FSIZE/RLIMIT_NOFILE.
 */
static int parse(char *buf, size_t len, struct request *r) {
  memset(&r->iso, 0, sizeof r->iso);
  memset(&r->cf, 0, sizeof r->cf);
  r->n_env = 0;
  r->uid = 65534;
  r->gid = 65534;
  r->cwd = "/";
  r->iso.rl_cpu_s = r->iso.rl_fsize = r->iso.rl_core = r->iso.rl_nofile = -1;
  r->cf.rlimit_fsize = r->cf.rlimit_nofile = -1;
  buf[len] = '\0';
  for (size_t off = 0; off < len;) {
    char *rec = buf + off;
    size_t n = strlen(rec);
    off += n + 1;
    if (n == 0) continue;
    char tag = rec[0];
    char *v = rec + 1;
    switch (tag) {
      case 'E':
        if (r->n_env >= MAX_ENV || strchr(v, '=') == NULL) return -1;
        r->env[r->n_env++] = v;
        break;
      case 'U': r->uid = (uid_t)num(v); break;
      case 'G': r->gid = (gid_t)num(v); break;
      case 'C': r->cwd = v; break;
      case 'I': r->iso.ipc = 1; break;
      case 'N': r->iso.net = 1; break;
      case 'R': {
        long long a, b, c, d;
        if (sscanf(v, "%lld %lld %lld %lld", &a, &b, &c, &d) != 4) return -1;
        r->iso.rl_cpu_s = a;
        r->iso.rl_fsize = b;
        r->iso.rl_core = c;
        r->iso.rl_nofile = d;
        break;
      }
      case 'S':
        r->cf.active = 1;
        r->cf.seccomp = wn_seccomp_filter((unsigned)num(v));
        if (r->cf.seccomp == NULL) return -1;
        break;
      case 'L': r->cf.active = 1; r->cf.landlock_abi = (int)num(v); break;
      case 'W':
        if (r->cf.n_rw >= WN_CONFINE_MAX_PATHS) return -1;
        r->cf.active = 1;
        r->cf.ll_rw[r->cf.n_rw++] = v;
        break;
      case 'O':
        if (r->cf.n_ro >= WN_CONFINE_MAX_PATHS) return -1;
        r->cf.active = 1;
        r->cf.ll_ro[r->cf.n_ro++] = v;
        break;
      case 'T': r->cf.active = 1; r->cf.ll_rw_top = 1; break;
      case 'P':
        if (r->cf.n_protect >= WN_CONFINE_MAX_PATHS) return -1;
        r->cf.ll_protect[r->cf.n_protect++] = v;
        break;
      case 'X': r->cf.ll_scope = (unsigned)num(v); break;
      case 'A': r->cf.active = 1; r->cf.apparmor_profile = v; break;
      case 'F': r->cf.active = 1; r->cf.rlimit_fsize = num(v); break;
      case 'Q': r->cf.active = 1; r->cf.rlimit_nofile = num(v); break;
      default: return -1;
    }
  }
  r->env[r->n_env] = NULL;
  return wn_isolate_invalid(&r->iso) == NULL ? 0 : -1;
}

/* One request; returns its length, 0 at EOF, -1 on a bad message (its fds closed). */
static ssize_t recv_request(int ctl, struct request *r) {
  struct iovec iov = {g_buf, REQ_MAX};
  union {
    char buf[CMSG_SPACE(3 * sizeof(int))];
    struct cmsghdr align;
  } u;
  struct msghdr mh;
  memset(&mh, 0, sizeof mh);
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = u.buf;
  mh.msg_controllen = sizeof u.buf;
  ssize_t n;
  do n = recvmsg(ctl, &mh, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n <= 0) return n == 0 ? 0 : -2;
  int got = 0;
  r->fds[0] = r->fds[1] = r->fds[2] = -1;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    int tmp[8];
    if (k > 8) k = 8;
    memcpy(tmp, CMSG_DATA(cm), (size_t)k * sizeof(int));
    for (int i = 0; i < k; i++) {
      if (got < 3) r->fds[got++] = tmp[i];
      else close(tmp[i]);
    }
  }
  if (got != 3 || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || parse(g_buf, (size_t)n, r) < 0) {
    for (int i = 0; i < got; i++) close(r->fds[i]);
    return -1;
  }
  return n;
}

struct sync_msg {
  int32_t step, index, err;
};

static void __attribute__((noreturn)) child_fail(int sync, int step, int index, int err) {
  struct sync_msg m = {step, index, err};
  ssize_t w;
  do w = write(sync, &m, sizeof m);
  while (w < 0 && errno == EINTR);
  _exit(127);
}

static int read_full(int fd, void *p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

/*
 * The first half of a child's setup, in the order of nsexec.c's exec_child: a session, stdio (when
 * the request's descriptors are there: a spare gets them later), no other descriptor but the sync
 * socket (moved to 3), its user namespace (mapped by the zygote), then its IPC and network
 * namespaces and rlimits. The child is still root with the zygote's capabilities here. Returns the
 * sync socket's descriptor.
 */
static int child_isolate(const wn_isolate *iso, const int *fds, int ctl, int sync) {
  close(ctl);
  if (setsid() < 0) child_fail(sync, Z_SETSID, 0, errno);
  if (fds != NULL) {
    int tmp[3];
    for (int i = 0; i < 3; i++) {
      tmp[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 10);
      if (tmp[i] < 0) child_fail(sync, Z_STDIO, i, errno);
    }
    for (int i = 0; i < 3; i++)
      if (dup2(tmp[i], i) < 0) child_fail(sync, Z_STDIO, i, errno);
  }
  /* Everything else goes (no exec will close the close-on-exec ones); the sync socket moves to 3. */
  if (sync != 3) {
    if (dup2(sync, 3) < 0) child_fail(sync, Z_CLOSE_FDS, 0, errno);
    sync = 3;
  }
  if (syscall(SYS_close_range, 4, ~0U, 0) < 0) child_fail(sync, Z_CLOSE_FDS, 1, errno);
  /* The user namespace first: the IPC and network namespaces below belong to it. */
  if (unshare(CLONE_NEWUSER) < 0) child_fail(sync, Z_USERNS, 0, errno);
  struct sync_msg ask = {0, 0, 0};
  if (write(sync, &ask, sizeof ask) != (ssize_t)sizeof ask) _exit(127);
  char ack;
  if (read(sync, &ack, 1) != 1 || ack != 'K') _exit(127);
  int iso_step = 0;
  int irc = wn_isolate_apply(iso, &iso_step);
  if (irc < 0) child_fail(sync, Z_ISOLATE, iso_step, -irc);
  return sync;
}

/* The second half: the request's identity, directory and confinement. Returns when it is complete. */
static void child_drop(const struct request *r, int sync) {
  int rc = wn_caps_drop(wn_default_caps);
  if (rc < 0) child_fail(sync, Z_CAPS, 0, -rc);
  gid_t gid = r->gid;
  if (syscall(SYS_setgroups, 1, &gid) < 0) child_fail(sync, Z_SETGROUPS, 0, errno);
  if (syscall(SYS_setresgid, r->gid, r->gid, r->gid) < 0) child_fail(sync, Z_SETGID, 0, errno);
  if (syscall(SYS_setresuid, r->uid, r->uid, r->uid) < 0) child_fail(sync, Z_SETUID, 0, errno);
  if (chdir(r->cwd) < 0) child_fail(sync, Z_CHDIR, 0, errno);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) child_fail(sync, Z_NNP, 0, errno);
  if (r->cf.active) {
    int cf_step = 0;
    int crc = wn_confine_apply(&r->cf, -1, &cf_step);
    if (crc < 0) child_fail(sync, Z_CONFINE, cf_step, -crc);
  }
  struct sync_msg ok = {0, 0, 0};
  if (write(sync, &ok, sizeof ok) != (ssize_t)sizeof ok) _exit(127);
  close(sync);
}

/*
 * What the namespaces and rlimits of a request depend on (its I, N and R records, in order): a
 * spare made for one request serves the next only when these are the same.
 */
#define KEY_MAX 256
static size_t isolation_key(const char *buf, size_t len, char *out) {
  size_t k = 0;
  for (size_t off = 0; off < len;) {
    const char *rec = buf + off;
    size_t n = strnlen(rec, len - off);
    off += n + 1;
    if (n == 0 || (rec[0] != 'I' && rec[0] != 'N' && rec[0] != 'R')) continue;
    if (k + n + 1 > KEY_MAX) return (size_t)-1;
    memcpy(out + k, rec, n);
    out[k + n] = '\0';
    k += n + 1;
  }
  return k;
}

/* The environment of the child, as a Python list of "K=V"; it also becomes the process's environ. */
static PyObject *child_env(struct request *r) {
  extern char **environ;
  environ = r->env;
  PyObject *list = PyList_New(0);
  if (list == NULL) _exit(127);
  for (int i = 0; i < r->n_env; i++) {
    PyObject *s = PyUnicode_DecodeFSDefault(r->env[i]);
    if (s == NULL || PyList_Append(list, s) < 0) _exit(127);
    Py_DECREF(s);
  }
  return list;
}

/*
 * A spare: the next invocation's child, forked when the last one exited and isolated like it
 * while the gateway is busy with that one's results, so that only the cheap second half of the
 * setup is left for the next request. It waits as root (no leftover of the last program, which
 * runs as the run user, can signal or inspect it; the gateway kills those before the next request
 * anyway). Its request comes over the sync socket: a length and the three stdio descriptors, then
 * the request itself, which must ask for the same isolation it was made with.
 */
static struct {
  pid_t pid;
  int sync;
  int mapped; /* its user namespace is mapped */
  int ready;  /* it has said that its isolation is complete */
  char key[KEY_MAX];
  size_t keylen;
} g_spare = {-1, -1, 0, 0, {0}, 0};

static PyObject *spare_child(int ctl, int sync, const struct request *made) {
  sync = child_isolate(&made->iso, NULL, ctl, sync);
  struct sync_msg ready = {0, 0, 0};
  if (write(sync, &ready, sizeof ready) != (ssize_t)sizeof ready) _exit(127);
  uint32_t len = 0;
  struct iovec iov = {&len, sizeof len};
  union {
    char buf[CMSG_SPACE(3 * sizeof(int))];
    struct cmsghdr align;
  } u;
  struct msghdr mh;
  memset(&mh, 0, sizeof mh);
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = u.buf;
  mh.msg_controllen = sizeof u.buf;
  ssize_t n;
  do n = recvmsg(sync, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  while (n < 0 && errno == EINTR);
  if (n != (ssize_t)sizeof len) _exit(0); /* the zygote dropped this spare, or is gone */
  static struct request r;
  int got = 0;
  struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
  if (cm != NULL && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS && cm->cmsg_len == CMSG_LEN(3 * sizeof(int))) {
    memcpy(r.fds, CMSG_DATA(cm), 3 * sizeof(int));
    got = 3;
  }
  if (got != 3 || (mh.msg_flags & MSG_CTRUNC) || len == 0 || len > REQ_MAX || read_full(sync, g_buf, len) < 0) child_fail(sync, Z_REQUEST, 1, EINVAL);
  char key[KEY_MAX];
  size_t keylen = isolation_key(g_buf, len, key);
  if (parse(g_buf, len, &r) < 0 || keylen != g_spare.keylen || memcmp(key, g_spare.key, keylen) != 0) child_fail(sync, Z_REQUEST, 2, EINVAL);
  for (int i = 0; i < 3; i++)
    if (dup2(r.fds[i], i) < 0) child_fail(sync, Z_STDIO, i, errno);
  for (int i = 0; i < 3; i++)
    if (r.fds[i] > 3) close(r.fds[i]);
  child_drop(&r, sync);
  return child_env(&r);
}

static pid_t wait_child(pid_t pid, int *status);

static void spare_drop(void) {
  if (g_spare.pid > 0) {
    int st;
    kill(g_spare.pid, SIGKILL);
    wait_child(g_spare.pid, &st);
  }
  if (g_spare.sync >= 0) close(g_spare.sync);
  g_spare.pid = -1;
  g_spare.sync = -1;
  g_spare.mapped = 0;
  g_spare.ready = 0;
}

/* Fork a spare for requests like `r` (whose raw form is buf[0..len)). In the spare, *child is set. */
static pid_t spare_fork(int ctl, const struct request *r, const char *buf, size_t len, PyObject **child) {
  size_t keylen = isolation_key(buf, len, g_spare.key);
  if (keylen == (size_t)-1) return -1;
  g_spare.keylen = keylen;
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) return -1;
  PyOS_BeforeFork();
  pid_t pid = fork();
  if (pid == 0) {
    PyOS_AfterFork_Child();
    close(sp[0]);
    *child = spare_child(ctl, sp[1], r);
    return 0;
  }
  PyOS_AfterFork_Parent();
  close(sp[1]);
  if (pid < 0) {
    close(sp[0]);
    return -1;
  }
  g_spare.pid = pid;
  g_spare.sync = sp[0];
  g_spare.mapped = 0;
  g_spare.ready = 0;
  return pid;
}

static int write_idmaps(pid_t pid);

/* The spare's user namespace is there: map it (off the next request's path). */
static void spare_map(void) {
  if (g_spare.pid < 0 || g_spare.mapped) return;
  struct sync_msg m;
  if (read_full(g_spare.sync, &m, sizeof m) < 0 || m.step != 0 || write_idmaps(g_spare.pid) < 0 || write(g_spare.sync, "K", 1) != 1) {
    spare_drop();
    return;
  }
  g_spare.mapped = 1;
}

/*
 * Hand the request (raw buf[0..len), descriptors fds) to the spare if it was made for the same
 * isolation and is ready. Returns its pid and sync socket, or -1 (the spare, if any, is gone: the
 * request is forked afresh, and a failure is reported from there).
 */
static pid_t spare_take(const char *buf, size_t len, const int *fds, int *sync) {
  if (g_spare.pid < 0) return -1;
  char key[KEY_MAX];
  size_t keylen = isolation_key(buf, len, key);
  struct sync_msg m;
  if (!g_spare.mapped || keylen != g_spare.keylen || memcmp(key, g_spare.key, keylen) != 0) {
    spare_drop();
    return -1;
  }
  if (!g_spare.ready && (read_full(g_spare.sync, &m, sizeof m) < 0 || m.step != 0)) {
    spare_drop();
    return -1;
  }
  uint32_t n32 = (uint32_t)len;
  struct iovec iov = {&n32, sizeof n32};
  union {
    char buf[CMSG_SPACE(3 * sizeof(int))];
    struct cmsghdr align;
  } u;
  struct msghdr mh;
  memset(&mh, 0, sizeof mh);
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = u.buf;
  mh.msg_controllen = sizeof u.buf;
  struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(3 * sizeof(int));
  memcpy(CMSG_DATA(cm), fds, 3 * sizeof(int));
  ssize_t w;
  do w = sendmsg(g_spare.sync, &mh, MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  for (size_t off = 0; w == (ssize_t)sizeof n32 && off < len;) {
    ssize_t k = write(g_spare.sync, buf + off, len - off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      w = -1;
      break;
    }
    off += (size_t)k;
  }
  if (w != (ssize_t)sizeof n32) {
    spare_drop();
    return -1;
  }
  pid_t pid = g_spare.pid;
  *sync = g_spare.sync;
  g_spare.pid = -1;
  g_spare.sync = -1;
  g_spare.mapped = 0;
  g_spare.ready = 0;
  return pid;
}

/*
 * Wait for the next request. Meanwhile the spare says that it is ready, or it ends (killed by the
 * gateway before an invocation that does not fork, or by anything else): it is reaped at once, so
 * that no exited spare is left in the container's process table.
 */
static int wait_request(int ctl) {
  for (;;) {
    struct pollfd p[2] = {{ctl, POLLIN, 0}, {g_spare.sync, POLLIN, 0}};
    int np = g_spare.sync >= 0 && g_spare.mapped ? 2 : 1;
    int rc = poll(p, (nfds_t)np, -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (np == 2 && p[1].revents != 0) {
      struct sync_msg m;
      if (g_spare.ready || (p[1].revents & POLLIN) == 0 || read_full(g_spare.sync, &m, sizeof m) < 0 || m.step != 0) spare_drop();
      else g_spare.ready = 1;
    }
    if (p[0].revents != 0) return 0;
  }
}

/* The identity map of the initial user namespace, written by the zygote (the namespace's owner). */
static int write_idmaps(pid_t pid) {
  static const char map[] = "0 0 4294967295\n";
  const char *files[2] = {"uid_map", "gid_map"};
  for (int i = 0; i < 2; i++) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, files[i]);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    ssize_t w = write(fd, map, sizeof map - 1);
    int err = errno;
    close(fd);
    if (w != (ssize_t)(sizeof map - 1)) return -(w < 0 ? err : EIO);
  }
  return 0;
}

static pid_t wait_child(pid_t pid, int *status) {
  pid_t w;
  do w = waitpid(pid, status, 0);
  while (w < 0 && errno == EINTR);
  return w;
}

/* Returns the child's environment (a list of "K=V") in the child; None in the zygote at EOF. */
static PyObject *serve(PyObject *self, PyObject *args) {
  int ctl;
  if (!PyArg_ParseTuple(args, "i", &ctl)) return NULL;
  static struct request r;
  for (;;) {
    if (wait_request(ctl) < 0) break;
    ssize_t n = recv_request(ctl, &r);
    if (n == 0 || n == -2) break;
    if (n < 0) {
      if (send_reply(ctl, R_FAILED, Z_REQUEST, 0, EINVAL, -1) < 0) break;
      continue;
    }
    struct sync_msg m = {0, 0, 0};
    int failed = 0;
    int sync = -1;
    pid_t pid = spare_take(g_buf, (size_t)n, r.fds, &sync);
    if (pid < 0) {
      int sp[2];
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) {
        int err = errno;
        for (int i = 0; i < 3; i++) close(r.fds[i]);
        send_reply(ctl, R_FAILED, Z_FORK, 0, err, -1);
        continue;
      }
      PyOS_BeforeFork();
      pid = fork();
      if (pid == 0) {
        PyOS_AfterFork_Child();
        close(sp[0]);
        child_drop(&r, child_isolate(&r.iso, r.fds, ctl, sp[1]));
        return child_env(&r);
      }
      int fork_err = errno;
      PyOS_AfterFork_Parent();
      close(sp[1]);
      if (pid < 0) {
        close(sp[0]);
        for (int i = 0; i < 3; i++) close(r.fds[i]);
        send_reply(ctl, R_FAILED, Z_FORK, 0, fork_err, -1);
        continue;
      }
      sync = sp[0];
      if (read_full(sync, &m, sizeof m) < 0) {
        m = (struct sync_msg){Z_USERNS, 1, EIO};
        failed = 1;
      } else if (m.step != 0) {
        failed = 1;
      } else {
        int mrc = write_idmaps(pid);
        if (mrc < 0) {
          m = (struct sync_msg){Z_IDMAP, 0, -mrc};
          failed = 1;
        } else if (write(sync, "K", 1) != 1) {
          m = (struct sync_msg){Z_ISOLATE, 0, EIO};
          failed = 1;
        }
      }
    }
    for (int i = 0; i < 3; i++) close(r.fds[i]);
    /* The end of the setup, by a spare or by a child forked just now. */
    if (!failed) {
      if (read_full(sync, &m, sizeof m) < 0) {
        m = (struct sync_msg){Z_ISOLATE, 0, EIO};
        failed = 1;
      } else if (m.step != 0) {
        failed = 1;
      }
    }
    close(sync);
    int status = 0;
    if (failed) {
      kill(pid, SIGKILL);
      wait_child(pid, &status);
      if (send_reply(ctl, R_FAILED, m.step, m.index, m.err, -1) < 0) break;
      continue;
    }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    int sent = send_reply(ctl, R_STARTED, (int)pid, 0, 0, pidfd);
    if (pidfd >= 0) close(pidfd);
    if (sent < 0) kill(pid, SIGKILL);
    wait_child(pid, &status);
    if (sent < 0) break;
    /* The next request's child, isolated while the gateway takes this one's results. The gateway
     * is told which process it is (a pidfd with the exit), so that it spares it when it kills what
     * the program left behind. */
    PyObject *child = NULL;
    if (spare_fork(ctl, &r, g_buf, (size_t)n, &child) == 0 && child != NULL) return child;
    int spare_fd = g_spare.pid > 0 ? (int)syscall(SYS_pidfd_open, g_spare.pid, 0) : -1;
    int rc = send_reply(ctl, R_EXITED, status, 0, 0, spare_fd);
    if (spare_fd >= 0) close(spare_fd);
    if (rc < 0) break;
    spare_map();
  }
  spare_drop();
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"serve", serve, METH_VARARGS, "Serve fork requests on a socket; returns the environment in each child."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot slots[] = {{0, NULL}};

static struct PyModuleDef def = {
    PyModuleDef_HEAD_INIT, "_warren_zygote", NULL, 0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__warren_zygote(void) { return PyModuleDef_Init(&def); }
