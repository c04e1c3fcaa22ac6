/*
 * warren-agent: the guest side of a Warren microVM. It runs as pid 1 in the
 * guest (exec'd by the initramfs /init once the sandbox root is mounted at
 * /newroot) and serves the host over one virtio-serial port (QEMU), or over a
 * vsock port where the VMM has no virtio-serial (Firecracker).
 *
 * The guest is untrusted and so is everything in it; this program only has to
 * be correct, not to defend itself: the host validates every frame it sends.
 *
 * Frames, both ways: u8 type, u32 channel, u32 length (little endian), payload.
 * Host -> guest: EXEC, STDIN, STDIN_EOF, KILL, READ, WRITE, LIST, MKDIRS, KIND, SHUTDOWN, PING, EXPORT,
 * AS (a file request run with a user's filesystem identity), CLOCK (set the time after a restore).
 * Guest -> host: HELLO, OUT, EXIT, OK, ERR, STARTED (see src/shim/backends/microvm/agent-protocol.ts).
 *
 * A guest read on the port returns 0 while no host client is connected (and
 * after one went away, e.g. a gateway restart): the agent then polls again a
 * little later, and forgets any half-received frame. Over vsock each host
 * connection is a stream of its own: the agent listens, and the newest
 * connection replaces the one before (a host that went away without a close
 * is replaced by the one that came back), with the same clean frame boundary.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/openat2.h>
#include <linux/random.h>
#include <poll.h>
#include <linux/vm_sockets.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/reboot.h>
#include <termios.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum {
  T_EXEC = 1, T_STDIN = 2, T_STDIN_EOF = 3, T_KILL = 4, T_READ = 5, T_WRITE = 6, T_LIST = 7, T_MKDIRS = 8, T_KIND = 9, T_SHUTDOWN = 10, T_PING = 11, T_EXPORT = 12, T_AS = 13, T_CLOCK = 14,
  T_HELLO = 0x81, T_OUT = 0x82, T_EXIT = 0x83, T_OK = 0x84, T_ERR = 0x85, T_STARTED = 0x87,
};

#define HDR 9
#define MAX_PAYLOAD (256 * 1024)
#define MAX_PROCS 256

static int port = -1;
static int rootfd = -1;
static const char *root_path = "/newroot";

struct proc {
  uint32_t chan;
  pid_t pid;
  int in, out, err; /* -1 when closed */
  int exited;
};
static struct proc procs[MAX_PROCS];

static void put32(unsigned char *p, uint32_t v) { p[0] = v; p[1] = v >> 8; p[2] = v >> 16; p[3] = v >> 24; }
static uint32_t get32(const unsigned char *p) { return p[0] | (p[1] << 8) | (p[2] << 16) | ((uint32_t)p[3] << 24); }

/*
 * Where the host reaches a server of this agent: "vsock:PORT" (a listening
 * vsock socket; connections are accepted as they come), "unix:PATH" (the
 * same over a unix socket: how the host-side tests run this agent without a
 * VM), or a virtio port's device (opened once and kept).
 */
struct endpoint { char dev[300]; int lfd; };

/* A listening socket of `family` at `a` (non-blocking), or -1 with errno. */
static int listen_at(int family, const void *a, socklen_t len) {
  int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (bind(fd, (const struct sockaddr *)a, len) || listen(fd, 4)) {
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

/* Set up `spec`; returns the virtio port's fd, or -1 for a listening endpoint (no host yet) or on error (errno). */
static int endpoint_open(struct endpoint *e, const char *spec) {
  e->lfd = -1;
  snprintf(e->dev, sizeof e->dev, "%s", spec);
  if (strncmp(spec, "unix:", 5) == 0) {
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (strlen(spec + 5) >= sizeof a.sun_path) { errno = ENAMETOOLONG; return -1; }
    strcpy(a.sun_path, spec + 5);
    unlink(a.sun_path);
    e->lfd = listen_at(AF_UNIX, &a, sizeof a);
    return -1;
  }
  if (strncmp(spec, "vsock:", 6) != 0) return open(spec, O_RDWR | O_NONBLOCK | O_CLOEXEC);
  char *end;
  unsigned long vport = strtoul(spec + 6, &end, 10);
  if (*end != 0 || vport == 0 || vport > 0xffffffffUL) { errno = EINVAL; return -1; }
  struct sockaddr_vm a;
  memset(&a, 0, sizeof a);
  a.svm_family = AF_VSOCK;
  a.svm_cid = VMADDR_CID_ANY;
  a.svm_port = (unsigned)vport;
  e->lfd = listen_at(AF_VSOCK, &a, sizeof a);
  return -1;
}

/* A listening endpoint's pending host connection, or -1. */
static int endpoint_accept(struct endpoint *e) {
  return e->lfd < 0 ? -1 : accept4(e->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
}

/* A pending host connection becomes the port, the one before closed (the newest wins): 1 when one was taken. */
static int endpoint_take(struct endpoint *e) {
  int c = endpoint_accept(e);
  if (c < 0) return 0;
  if (port >= 0) close(port);
  port = c;
  return 1;
}

static void write_all(const unsigned char *b, size_t n) {
  while (n > 0) {
    ssize_t w = write(port, b, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd p = {port, POLLOUT, 0};
        if (poll(&p, 1, 1000) == 0) return; /* nobody reads: drop */
        continue;
      }
      return;
    }
    b += w;
    n -= (size_t)w;
  }
}

static void send_frame(int type, uint32_t chan, const void *a, size_t an, const void *b, size_t bn) {
  unsigned char h[HDR];
  h[0] = (unsigned char)type;
  put32(h + 1, chan);
  put32(h + 5, (uint32_t)(an + bn));
  unsigned char *buf = malloc(HDR + an + bn);
  if (!buf) return;
  memcpy(buf, h, HDR);
  if (an) memcpy(buf + HDR, a, an);
  if (bn) memcpy(buf + HDR + an, b, bn);
  write_all(buf, HDR + an + bn);
  free(buf);
}

static void send_err(uint32_t chan, int e, const char *msg) {
  unsigned char p[4];
  put32(p, (uint32_t)e);
  send_frame(T_ERR, chan, p, 4, msg, strlen(msg));
}

static void send_ok(uint32_t chan, const void *d, size_t n) { send_frame(T_OK, chan, d, n, NULL, 0); }

static void send_out(uint32_t chan, int stream, const void *d, size_t n) {
  unsigned char s = (unsigned char)stream;
  send_frame(T_OUT, chan, &s, 1, d, n);
}

/* Resolve `path` inside the sandbox root: ".." and symlinks never leave it. */
static int open_in_root(const char *path, int flags, mode_t mode) {
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = (uint64_t)(flags | O_CLOEXEC);
  how.mode = (flags & O_CREAT) ? mode : 0;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  while (*path == '/') path++;
  if (*path == 0) path = ".";
  return (int)syscall(SYS_openat2, rootfd, path, &how, sizeof how);
}

static int mkdirs(const char *path, mode_t mode) {
  char buf[4096];
  if (strlen(path) >= sizeof buf) return -ENAMETOOLONG;
  strcpy(buf, path);
  for (char *p = buf + 1;; p++) {
    if (*p == '/' || *p == 0) {
      char c = *p;
      *p = 0;
      int fd = open_in_root(buf, O_PATH | O_DIRECTORY, 0);
      if (fd < 0) {
        /* create the last component inside its (resolved) parent */
        char *slash = strrchr(buf, '/');
        const char *name = slash ? slash + 1 : buf;
        if (slash) *slash = 0;
        int pfd = open_in_root(slash && slash != buf ? buf : "/", O_PATH | O_DIRECTORY, 0);
        if (slash) *slash = '/';
        if (pfd < 0) return -errno;
        int r = mkdirat(pfd, name, mode);
        int e = errno;
        close(pfd);
        if (r < 0 && e != EEXIST) return -e;
      } else {
        close(fd);
      }
      *p = c;
      if (c == 0) break;
    }
  }
  return 0;
}

/* Payload strings are NUL-terminated; `next` walks them. */
static const char *next_str(const char **cur, const char *end) {
  const char *s = *cur;
  const char *z = memchr(s, 0, (size_t)(end - s));
  if (!z) return NULL;
  *cur = z + 1;
  return s;
}

static struct proc *proc_by_chan(uint32_t chan) {
  for (int i = 0; i < MAX_PROCS; i++) if (procs[i].pid > 0 && procs[i].chan == chan) return &procs[i];
  return NULL;
}

/* T_EXPORT runs one fixed command outside the sandbox root (the upper dir is not reachable from inside it). */
static int exec_outside_root = 0;

/* cgroup.procs of the group every sandbox process runs in (the sandbox's pids limit; see the
 * initramfs' /init), or -1 where the guest kernel has no cgroup2. The agent and its session
 * servers stay outside it, so a fork bomb that fills the group cannot stop them from forking. */
static int sandbox_procs = -1;

/* In a child, before anything else: join the sandbox's group. */
static int join_sandbox_group(void) {
  return sandbox_procs < 0 || write(sandbox_procs, "0", 1) == 1 ? 0 : -1;
}

static void do_exec(uint32_t chan, const char *p, const char *end) {
  const char *cwd = next_str(&p, end), *uid_s = next_str(&p, end), *gid_s = next_str(&p, end), *nargs_s = next_str(&p, end);
  if (!cwd || !uid_s || !gid_s || !nargs_s) return send_err(chan, EINVAL, "malformed exec");
  int nargs = atoi(nargs_s);
  if (nargs < 1 || nargs > 4096) return send_err(chan, EINVAL, "bad argc");
  char **argv = calloc((size_t)nargs + 1, sizeof *argv);
  for (int i = 0; i < nargs; i++) if (!(argv[i] = (char *)next_str(&p, end))) { free(argv); return send_err(chan, EINVAL, "short argv"); }
  const char *nenv_s = next_str(&p, end);
  int nenv = nenv_s ? atoi(nenv_s) : 0;
  if (nenv < 0 || nenv > 4096) { free(argv); return send_err(chan, EINVAL, "bad envc"); }
  char **envp = calloc((size_t)nenv + 1, sizeof *envp);
  for (int i = 0; i < nenv; i++) if (!(envp[i] = (char *)next_str(&p, end))) { free(argv); free(envp); return send_err(chan, EINVAL, "short env"); }
  struct proc *slot = NULL;
  for (int i = 0; i < MAX_PROCS; i++) if (procs[i].pid == 0) { slot = &procs[i]; break; }
  if (!slot || proc_by_chan(chan)) { free(argv); free(envp); return send_err(chan, EAGAIN, "too many processes"); }
  int in[2], out[2], er[2], status[2];
  if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(er, O_CLOEXEC) || pipe2(status, O_CLOEXEC)) { free(argv); free(envp); return send_err(chan, errno, "pipe"); }
  pid_t pid = fork();
  if (pid == 0) {
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    int e = join_sandbox_group() ? errno : 0;
    setsid();
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(er[1], 2);
    if (!e && !exec_outside_root && (fchdir(rootfd) || chroot("."))) e = errno;
    if (!e && chdir(cwd)) e = errno | 0x10000;
    gid_t gid = (gid_t)atol(gid_s);
    if (!e && (setgroups(0, NULL) || setgid(gid) || setuid((uid_t)atol(uid_s)))) e = errno;
    if (!e) {
      environ = envp;
      execvpe(argv[0], argv, envp);
      e = errno;
    }
    unsigned char b[4];
    put32(b, (uint32_t)e);
    if (write(status[1], b, 4) < 0) _exit(127);
    _exit(127);
  }
  close(in[0]); close(out[1]); close(er[1]); close(status[1]);
  free(argv);
  free(envp);
  if (pid < 0) { close(in[1]); close(out[0]); close(er[0]); close(status[0]); return send_err(chan, errno, "fork"); }
  unsigned char b[4];
  ssize_t n = read(status[0], b, 4);
  close(status[0]);
  if (n == 4) {
    uint32_t e = get32(b);
    waitpid(pid, NULL, 0);
    close(in[1]); close(out[0]); close(er[0]);
    return send_err(chan, (int)(e & 0xffff), (e & 0x10000) ? "chdir" : "exec");
  }
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(er[0], F_SETFL, O_NONBLOCK);
  *slot = (struct proc){chan, pid, in[1], out[0], er[0], 0};
  unsigned char pb[4];
  put32(pb, (uint32_t)pid);
  send_frame(T_STARTED, chan, pb, 4, NULL, 0);
}

static void do_read(uint32_t chan, const char *p, size_t n) {
  if (n < 9 || p[n - 1] != 0) return send_err(chan, EINVAL, "malformed read");
  uint64_t max = get32((const unsigned char *)p) | ((uint64_t)get32((const unsigned char *)p + 4) << 32);
  int fd = open_in_root(p + 8, O_RDONLY | O_NOFOLLOW * 0, 0);
  if (fd < 0) return send_err(chan, errno, "open");
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) { close(fd); return send_err(chan, S_ISDIR(st.st_mode) ? EISDIR : EINVAL, "not a regular file"); }
  if ((uint64_t)st.st_size > max) { close(fd); return send_err(chan, EFBIG, "too large"); }
  static char buf[65536];
  uint64_t total = 0;
  for (;;) {
    ssize_t r = read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    total += (uint64_t)r;
    if (total > max) { close(fd); return send_err(chan, EFBIG, "grew too large"); }
    send_out(chan, 1, buf, (size_t)r);
  }
  close(fd);
  send_ok(chan, NULL, 0);
}

static void do_write(uint32_t chan, const char *p, size_t n) {
  if (n < 9) return send_err(chan, EINVAL, "malformed write");
  uint32_t mode = get32((const unsigned char *)p), flags = get32((const unsigned char *)p + 4);
  const char *path = p + 8;
  const char *z = memchr(path, 0, n - 8);
  if (!z) return send_err(chan, EINVAL, "malformed write");
  const char *data = z + 1;
  size_t dn = n - (size_t)(data - p);
  if (flags & 1) {
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", path);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) { *slash = 0; int r = mkdirs(parent, 0755); if (r < 0) return send_err(chan, -r, "mkdir"); }
  }
  int fd = open_in_root(path, O_WRONLY | O_CREAT | ((flags & 1) ? O_TRUNC : O_APPEND), mode & 07777);
  if (fd < 0) return send_err(chan, errno, "open");
  if (flags & 1) fchmod(fd, mode & 07777);
  while (dn > 0) {
    ssize_t w = write(fd, data, dn);
    if (w < 0) { int e = errno; close(fd); return send_err(chan, e, "write"); }
    data += w;
    dn -= (size_t)w;
  }
  close(fd);
  send_ok(chan, NULL, 0);
}

static void do_list(uint32_t chan, const char *path) {
  int fd = open_in_root(path, O_RDONLY | O_DIRECTORY, 0);
  if (fd < 0) return send_err(chan, errno, "open");
  DIR *d = fdopendir(fd);
  if (!d) { close(fd); return send_err(chan, errno, "opendir"); }
  size_t cap = 65536, len = 0;
  char *out = malloc(cap);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW)) continue;
    char t = S_ISREG(st.st_mode) ? 'f' : S_ISDIR(st.st_mode) ? 'd' : S_ISLNK(st.st_mode) ? 'l' : 'o';
    char line[512];
    int k = snprintf(line, sizeof line, "%c\t%o\t%lld\t%lld\t%s\n", t, st.st_mode & 07777, (long long)st.st_size, (long long)st.st_mtime, e->d_name);
    if (k < 0 || (size_t)k >= sizeof line) continue;
    if (len + (size_t)k > MAX_PAYLOAD - 16) break;
    if (len + (size_t)k > cap) { cap *= 2; out = realloc(out, cap); }
    memcpy(out + len, line, (size_t)k);
    len += (size_t)k;
  }
  closedir(d);
  send_ok(chan, out, len);
  free(out);
}

static void do_kind(uint32_t chan, const char *path) {
  int fd = open_in_root(path, O_PATH, 0);
  if (fd < 0) return send_err(chan, errno, "open");
  struct stat st;
  int r = fstat(fd, &st);
  close(fd);
  if (r) return send_err(chan, errno, "stat");
  send_ok(chan, S_ISDIR(st.st_mode) ? "d" : S_ISREG(st.st_mode) ? "f" : "o", 1);
}

static void close_fd(int *fd) { if (*fd >= 0) { close(*fd); *fd = -1; } }

static void handle(int type, uint32_t chan, const char *p, size_t n);

/* T_AS: u32 uid, u32 gid, u8 type, then that file request's payload. The request runs with the
 * user's filesystem identity (fsuid/fsgid, no supplementary groups), so the files API can do what
 * an exec as that user could and no more. The agent is single-threaded: the identity is back to
 * root before the next frame. */
static void do_as(uint32_t chan, const char *p, size_t n) {
  if (n < 9) return send_err(chan, EINVAL, "malformed identity");
  uint32_t uid = get32((const unsigned char *)p), gid = get32((const unsigned char *)p + 4);
  int inner = (unsigned char)p[8];
  if (inner != T_READ && inner != T_WRITE && inner != T_LIST && inner != T_KIND && inner != T_MKDIRS) return send_err(chan, EINVAL, "identity only for file requests");
  gid_t groups[64];
  int ng = getgroups(64, groups);
  if (ng < 0 || setgroups(0, NULL)) return send_err(chan, errno, "setgroups");
  setfsgid((gid_t)gid);
  setfsuid((uid_t)uid);
  int ok = (uid_t)setfsuid((uid_t)-1) == (uid_t)uid && (gid_t)setfsgid((gid_t)-1) == (gid_t)gid;
  if (ok) handle(inner, chan, p + 9, n - 9);
  setfsuid(0);
  setfsgid(0);
  if (setgroups((size_t)ng, groups)) { /* pid 1 keeps going: root's own groups only matter for root requests */ }
  if (!ok) send_err(chan, EPERM, "setfsuid");
}

static void handle(int type, uint32_t chan, const char *p, size_t n) {
  const char *end = p + n;
  struct proc *pr;
  switch (type) {
  case T_PING: {
    struct utsname u;
    uname(&u);
    send_frame(T_HELLO, chan, u.release, strlen(u.release), NULL, 0);
    return;
  }
  case T_EXEC: return do_exec(chan, p, end);
  case T_EXPORT: {
    /* the writable layer as a tar stream (whiteouts are 0/0 character devices); fixed argv, nothing from the host */
    static const char req[] = "/\0" "0\0" "0\0" "8\0" "/bin/busybox\0" "tar\0" "-c\0" "-f\0" "-\0" "-C\0" "/rw/upper\0" ".\0" "1\0" "PATH=/bin\0";
    sync();
    exec_outside_root = 1;
    do_exec(chan, req, req + sizeof req - 1);
    exec_outside_root = 0;
    return;
  }
  case T_STDIN:
    if ((pr = proc_by_chan(chan)) && pr->in >= 0) {
      while (n > 0) { ssize_t w = write(pr->in, p, n); if (w <= 0) { if (errno == EINTR) continue; break; } p += w; n -= (size_t)w; }
    }
    return;
  case T_STDIN_EOF:
    if ((pr = proc_by_chan(chan))) close_fd(&pr->in);
    return;
  case T_KILL:
    if ((pr = proc_by_chan(chan)) && n >= 1) { kill(-pr->pid, (unsigned char)p[0]); kill(pr->pid, (unsigned char)p[0]); }
    return;
  case T_AS: return do_as(chan, p, n);
  case T_READ: return do_read(chan, p, n);
  case T_WRITE: return do_write(chan, p, n);
  case T_LIST: if (n && p[n - 1] == 0) do_list(chan, p); else send_err(chan, EINVAL, "malformed"); return;
  case T_KIND: if (n && p[n - 1] == 0) do_kind(chan, p); else send_err(chan, EINVAL, "malformed"); return;
  case T_MKDIRS:
    if (n >= 5 && p[n - 1] == 0) { int r = mkdirs(p + 4, get32((const unsigned char *)p) & 07777); if (r < 0) send_err(chan, -r, "mkdir"); else send_ok(chan, NULL, 0); }
    else send_err(chan, EINVAL, "malformed");
    return;
  case T_CLOCK: {
    /* u64 ns since the epoch: a restored guest's clock stopped when its snapshot was taken */
    if (n != 8) { send_err(chan, EINVAL, "malformed"); return; }
    uint64_t ns = (uint64_t)get32((const unsigned char *)p) | (uint64_t)get32((const unsigned char *)p + 4) << 32;
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull)};
    if (clock_settime(CLOCK_REALTIME, &ts)) send_err(chan, errno, "clock_settime");
    else send_ok(chan, NULL, 0);
    return;
  }
  case T_SHUTDOWN:
    sync();
    kill(-1, SIGKILL);
    sync();
    reboot(RB_POWER_OFF);
    _exit(0);
  }
}

static void pump(struct proc *pr, int stream) {
  int *fd = stream == 1 ? &pr->out : &pr->err;
  static char buf[65536];
  for (int i = 0; i < 16; i++) {
    ssize_t r = read(*fd, buf, sizeof buf);
    if (r > 0) { send_out(pr->chan, stream, buf, (size_t)r); continue; }
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    close_fd(fd);
    send_out(pr->chan, stream, NULL, 0); /* end of this stream */
    return;
  }
}

static void maybe_free(struct proc *pr) {
  if (pr->exited && pr->out < 0 && pr->err < 0) { close_fd(&pr->in); pr->pid = 0; }
}

/* ---------------------------------------------------------------- shell sessions
 *
 * Each virtio port named "warren.session.N" is served by its own child of the
 * agent: it waits for START, runs the shell (pipes + status fd 3, or a pty),
 * and relays until the shell exits. The host end is warren-vmshell, the child
 * of a warren-session holder on the host, so the holder (output buffer,
 * re-attach) works exactly as for containers. If the host end goes away (the
 * VM was paused and restored, the bridge reconnects), the session waits up to
 * SESSION_GRACE_MS for it before it is killed.
 */
enum { S_START = 0x20, S_INPUT = 0x21, S_RESIZE = 0x22, S_SIGNAL = 0x23, S_RESUME = 0x24, S_MARK = 0x25, S_OUT = 0xA1, S_EXIT = 0xA2, S_STARTED = 0xA3 };
#define SESSION_GRACE_MS 30000

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* Session and start time of a process (0: read; -1: gone or unreadable). */
static int proc_session(pid_t pid, int *session, unsigned long long *start) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  /* after the name: state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
   * utime stime cutime cstime priority nice num_threads itrealvalue starttime */
  if (!p || sscanf(p + 2, "%*c %*d %*d %d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", session, start) != 2) return -1;
  return 0;
}

/* The shell's session as the last MARK saw it: what a command-mode signal to "the command"
 * spares (the shell, and background jobs of earlier commands). A session with more processes
 * than fit is recorded in part; the rest count as the command's. nmarked < 0: no MARK yet. */
struct sproc { pid_t pid; unsigned long long start; };
#define MAX_MARKED 4096
static struct sproc marked[MAX_MARKED];
static int nmarked = -1;

static int was_marked(pid_t pid, unsigned long long start) {
  for (int i = 0; i < nmarked; i++) if (marked[i].pid == pid && marked[i].start == start) return 1;
  return 0;
}

/* Call fn(pid, start, arg) for every process of session sid but `except`. */
static void each_in_session(pid_t sid, pid_t except, void (*fn)(pid_t, unsigned long long, int), int arg) {
  DIR *d = opendir("/proc");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    pid_t pid = (pid_t)atoi(e->d_name);
    if (pid <= 1 || pid == except) continue;
    int session;
    unsigned long long start;
    if (proc_session(pid, &session, &start) == 0 && session == sid) fn(pid, start, arg);
  }
  closedir(d);
}

static void note_marked(pid_t pid, unsigned long long start, int unused) {
  (void)unused;
  if (nmarked < MAX_MARKED) marked[nmarked++] = (struct sproc){pid, start};
}
static void kill_one(pid_t pid, unsigned long long start, int sig) { (void)start; kill(pid, sig); }
static void kill_if_new(pid_t pid, unsigned long long start, int sig) { if (!was_marked(pid, start)) kill(pid, sig); }

static void kill_session_but(pid_t sid, pid_t except, int sig) { each_in_session(sid, except, kill_one, sig); }

static void session_server(const char *portpath) {
  struct endpoint ep;
  port = endpoint_open(&ep, portpath);
  if (port < 0 && ep.lfd < 0) { fprintf(stderr, "warren-agent: session port %s: %m\n", portpath); return; }
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGPIPE);
  int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  unsigned char *in = malloc(HDR + MAX_PAYLOAD);
  for (;;) {
    while (port < 0) {
      if (ep.lfd >= 0) {
        struct pollfd pl = {ep.lfd, POLLIN, 0};
        poll(&pl, 1, -1);
        port = endpoint_accept(&ep);
      } else {
        port = open(portpath, O_RDWR | O_NONBLOCK | O_CLOEXEC);
        if (port < 0) sleep(1);
      }
    }
    size_t have = 0;
    pid_t shell = 0;
    int mode = 0, fin = -1, fout = -1, ferr = -1, fstat_ = -1, master = -1;
    int connected = 1, exited = 0, code = 0, sig = 0;
    long long lost_at = 0;
    unsigned char token[16] = {0};
    /* Whether the connection belongs to the running shell: 1 yes, 0 no (a RESUME with another
     * token), -1 not known yet (the port closed since). Every bridge opens a connection with START or
     * RESUME, so any other frame while not known comes from the bridge that was there before the
     * close: a close reaches the guest on virtio-serial's control queue, apart from the port's data,
     * so the guest can learn of one after the frames that followed it, and those frames are that
     * bridge's commands, not a stranger's. */
    int resumed = 1;
    for (;;) {
      struct pollfd fds[8];
      int nf = 0, ip = -1, io = -1, ie = -1, is = -1, im = -1, il = -1;
      fds[nf++] = (struct pollfd){sfd, POLLIN, 0};
      if (connected && port >= 0) { ip = nf; fds[nf++] = (struct pollfd){port, POLLIN, 0}; }
      if (ep.lfd >= 0) { il = nf; fds[nf++] = (struct pollfd){ep.lfd, POLLIN, 0}; }
      /* Until the connection is known to be this shell's bridge (START or RESUME with its token, or a
       * frame only that bridge sends), its output stays in the pipes: nothing is lost while the host
       * is away or has not said who it is. */
      if (resumed == 1 && fout >= 0) { io = nf; fds[nf++] = (struct pollfd){fout, POLLIN, 0}; }
      if (resumed == 1 && ferr >= 0) { ie = nf; fds[nf++] = (struct pollfd){ferr, POLLIN, 0}; }
      if (resumed == 1 && fstat_ >= 0) { is = nf; fds[nf++] = (struct pollfd){fstat_, POLLIN, 0}; }
      if (resumed == 1 && master >= 0) { im = nf; fds[nf++] = (struct pollfd){master, POLLIN, 0}; }
      poll(fds, (nfds_t)nf, connected ? 1000 : 100);
      /* a host connection: the newest one is the bridge (the one before is gone or going) */
      if (il >= 0 && fds[il].revents && endpoint_take(&ep)) {
        have = 0;
        if (connected) { connected = 0; lost_at = now_ms(); }
      }
      /* no host over vsock: the shell lives as long as over a virtio port with no host */
      if (!connected && port < 0 && shell > 0 && now_ms() - lost_at > SESSION_GRACE_MS) kill(-shell, SIGKILL), kill_session_but(shell, 0, SIGKILL);
      if (!connected && port >= 0) {
        connected = 1;
        resumed = -1;
        if (shell == 0) { have = 0; }
        else if (now_ms() - lost_at > SESSION_GRACE_MS) kill(-shell, SIGKILL), kill_session_but(shell, 0, SIGKILL);
      }
      if (fds[0].revents) {
        struct signalfd_siginfo si;
        while (read(sfd, &si, sizeof si) == sizeof si) {}
        int st;
        pid_t pid;
        while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
          if (pid == shell) { exited = 1; code = WIFEXITED(st) ? WEXITSTATUS(st) : 0; sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0; }
        }
      }
      static char buf[65536];
      int streams[4] = {1, 2, 3, 4};
      int *fdp[4] = {&fout, &ferr, &fstat_, &master};
      int idx[4] = {io, ie, is, im};
      for (int k = 0; k < 4; k++) {
        if (idx[k] < 0 || !fds[idx[k]].revents) continue;
        ssize_t r = read(*fdp[k], buf, sizeof buf);
        if (r > 0) { if (connected && resumed == 1) send_frame(S_OUT, 0, &(unsigned char){(unsigned char)streams[k]}, 1, buf, (size_t)r); }
        else if (r == 0 || (errno != EAGAIN && errno != EINTR)) close_fd(fdp[k]);
      }
      if (exited && fout < 0 && ferr < 0 && fstat_ < 0 && master < 0) {
        unsigned char b[8];
        put32(b, (uint32_t)code);
        put32(b + 4, (uint32_t)sig);
        if (resumed == 1) send_frame(S_EXIT, 0, b, 8, NULL, 0);
        close_fd(&fin);
        kill_session_but(shell, 0, SIGKILL);
        break;
      }
      if (exited && master >= 0) { /* pty: the slave side may linger in background jobs */ kill_session_but(shell, 0, SIGHUP); close_fd(&master); }
      if (ip < 0 || !(fds[ip].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t got = read(port, in + have, HDR + MAX_PAYLOAD - have);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
        connected = 0;
        have = 0;
        lost_at = now_ms();
        /* a vsock stream that ended does not come back: the next host connection is accepted */
        if (ep.lfd >= 0) { close(port); port = -1; }
        if (shell == 0) continue;
        continue;
      }
      if (got < 0) continue;
      have += (size_t)got;
      size_t off = 0;
      while (have - off >= HDR) {
        uint32_t len = get32(in + off + 5);
        if (len > MAX_PAYLOAD) { off = have; break; }
        if (have - off < HDR + len) break;
        int type = in[off];
        const char *p = (const char *)in + off + HDR, *end = p + len;
        if (type == S_RESUME && len == 16) {
          /* the same bridge, back after the VMM was restarted */
          resumed = shell > 0 && memcmp(p, token, 16) == 0;
          off += HDR + len;
          continue;
        }
        if (type == S_START && shell > 0 && !exited && len >= 16 && memcmp(p, token, 16) == 0) {
          /* the bridge sends START again until it hears STARTED: a repeat for the running shell */
          unsigned char b[4];
          put32(b, (uint32_t)shell);
          resumed = 1;
          send_frame(S_STARTED, 0, b, 4, NULL, 0);
          off += HDR + len;
          continue;
        }
        if (type == S_START && shell > 0) {
          /* a new session on this port: whatever ran here before is over */
          kill(-shell, SIGKILL);
          kill_session_but(shell, 0, SIGKILL);
        }
        if (resumed == -1 && type != S_START && shell > 0) resumed = 1;
        if (resumed != 1 && type != S_START) { off += HDR + len; continue; }
        if (type == S_START && len >= 21) {
          memcpy(token, p, 16);
          p += 16;
          len -= 16;
          resumed = 1;
          nmarked = -1; /* a new shell: no command has started in it */
          if (shell > 0) {
            /* reap the old shell, drop its pipes */
            waitpid(shell, NULL, 0);
            close_fd(&fin); close_fd(&fout); close_fd(&ferr); close_fd(&fstat_); close_fd(&master);
            shell = 0;
            exited = 0;
          }
          mode = (unsigned char)p[0];
          const unsigned char *u = (const unsigned char *)p;
          struct winsize ws = {.ws_col = (unsigned short)(u[1] | (u[2] << 8)), .ws_row = (unsigned short)(u[3] | (u[4] << 8))};
          const char *q = p + 5;
          const char *cwd = next_str(&q, end), *uid_s = next_str(&q, end), *gid_s = next_str(&q, end), *na = next_str(&q, end);
          int nargs = na ? atoi(na) : 0;
          char *argv[64] = {0}, *envp[512] = {0};
          int ok = cwd && uid_s && gid_s && nargs > 0 && nargs < 63;
          for (int i = 0; ok && i < nargs; i++) ok = (argv[i] = (char *)next_str(&q, end)) != NULL;
          const char *ne = ok ? next_str(&q, end) : NULL;
          int nenv = ne ? atoi(ne) : -1;
          ok = ok && nenv >= 0 && nenv < 511;
          for (int i = 0; ok && i < nenv; i++) ok = (envp[i] = (char *)next_str(&q, end)) != NULL;
          if (!ok) fprintf(stderr, "warren-agent: malformed session start\n");
          if (ok) {
            int pi[2] = {-1, -1}, po[2] = {-1, -1}, pe[2] = {-1, -1}, ps[2] = {-1, -1};
            int slave = -1;
            if (mode == 1) {
              master = open("/newroot/dev/pts/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
              int unlock = 0, n = -1;
              if (master >= 0 && ioctl(master, TIOCSPTLCK, &unlock) == 0 && ioctl(master, TIOCGPTN, &n) == 0) {
                char sp[64];
                snprintf(sp, sizeof sp, "/newroot/dev/pts/%d", n);
                slave = open(sp, O_RDWR | O_NOCTTY | O_CLOEXEC);
                if (ws.ws_col && ws.ws_row) ioctl(master, TIOCSWINSZ, &ws);
              }
            } else if (pipe2(pi, O_CLOEXEC) || pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC) || pipe2(ps, O_CLOEXEC)) ok = 0;
            pid_t pid = ok && (mode != 1 || slave >= 0) ? fork() : -1;
            if (pid == 0) {
              sigset_t none;
              sigemptyset(&none);
              sigprocmask(SIG_SETMASK, &none, NULL);
              if (join_sandbox_group()) { fprintf(stderr, "warren-agent: session cgroup: %m\n"); _exit(127); }
              setsid();
              /* into the root first: rootfd may be one of the fds (3) the dup2s below replace */
              int rooted = fchdir(rootfd) == 0 && chroot(".") == 0;
              if (mode == 1) { ioctl(slave, TIOCSCTTY, 0); dup2(slave, 0); dup2(slave, 1); dup2(slave, 2); }
              else { dup2(pi[0], 0); dup2(po[1], 1); dup2(pe[1], 2); dup2(ps[1], 3); }
              if (!rooted || (chdir(cwd) && chdir("/"))) { fprintf(stderr, "warren-agent: session root: %m\n"); _exit(127); }
              if (setgroups(0, NULL) || setgid((gid_t)atol(gid_s)) || setuid((uid_t)atol(uid_s))) { fprintf(stderr, "warren-agent: session ids: %m\n"); _exit(127); }
              environ = envp;
              execvpe(argv[0], argv, envp);
              fprintf(stderr, "warren-agent: session exec %s: %m\n", argv[0]);
              _exit(127);
            }
            if (slave >= 0) close(slave);
            if (mode != 1) {
              close(pi[0]); close(po[1]); close(pe[1]); close(ps[1]);
              fin = pi[1]; fout = po[0]; ferr = pe[0]; fstat_ = ps[0];
              fcntl(fout, F_SETFL, O_NONBLOCK); fcntl(ferr, F_SETFL, O_NONBLOCK); fcntl(fstat_, F_SETFL, O_NONBLOCK);
            } else if (master >= 0) {
              fcntl(master, F_SETFL, O_NONBLOCK);
            }
            if (pid > 0) {
              shell = pid;
              unsigned char b[4];
              put32(b, (uint32_t)pid);
              send_frame(S_STARTED, 0, b, 4, NULL, 0);
            } else {
              fprintf(stderr, "warren-agent: session start failed (ok=%d mode=%d)\n", ok, mode);
              unsigned char b[8] = {127, 0, 0, 0, 0, 0, 0, 0};
              send_frame(S_EXIT, 0, b, 8, NULL, 0);
            }
          }
        } else if (type == S_INPUT && shell > 0) {
          int fd = mode == 1 ? master : fin;
          if (len == 0 && mode != 1) close_fd(&fin);
          size_t n = len;
          while (fd >= 0 && n > 0) {
            ssize_t w = write(fd, p, n);
            if (w < 0) { if (errno == EINTR) continue; if (errno == EAGAIN) { struct pollfd pw = {fd, POLLOUT, 0}; poll(&pw, 1, 100); continue; } break; }
            p += w; n -= (size_t)w;
          }
        } else if (type == S_RESIZE && len == 4 && master >= 0) {
          const unsigned char *u = (const unsigned char *)p;
          struct winsize ws = {.ws_col = (unsigned short)(u[0] | (u[1] << 8)), .ws_row = (unsigned short)(u[2] | (u[3] << 8))};
          ioctl(master, TIOCSWINSZ, &ws);
        } else if (type == S_SIGNAL && len == 2 && shell > 0) {
          int signo = (unsigned char)p[0], target = (unsigned char)p[1];
          if (target == 0 || target == 3) kill(shell, signo);
          else if (target == 1) {
            if (mode == 1) { pid_t fg = master >= 0 ? tcgetpgrp(master) : -1; if (fg > 0) kill(-fg, signo); }
            /* what the shell started since the MARK; a bridge that sends no MARKs means everything but the shell */
            else each_in_session(shell, shell, nmarked >= 0 ? kill_if_new : kill_one, signo);
          } else kill_session_but(shell, 0, signo);
        } else if (type == S_MARK && shell > 0) {
          nmarked = 0;
          each_in_session(shell, 0, note_marked, 0);
        }
        off += HDR + len;
      }
      if (off > 0) { memmove(in, in + off, have - off); have -= off; }
    }
  }
}

/* Session servers by port; one killed (kill -9 -1 in the guest reaches them) is started again. */
#define MAX_SESSION_PORTS 16
static struct { pid_t pid; char dev[300]; } servers[MAX_SESSION_PORTS];
static int nservers;

static void spawn_server(int i) {
  pid_t pid = fork();
  if (pid == 0) { session_server(servers[i].dev); _exit(0); }
  servers[i].pid = pid;
}

static void respawn_server(pid_t dead) {
  for (int i = 0; i < nservers; i++) if (servers[i].pid == dead) spawn_server(i);
}

static void start_session_servers(void) {
  /* endpoints for the sessions, comma-separated (no virtio-serial: "vsock:1025,vsock:1026,...") */
  const char *list = getenv("WARREN_SESSION_PORTS");
  if (list && *list) {
    const char *p = list;
    while (*p && nservers < MAX_SESSION_PORTS) {
      size_t n = strcspn(p, ",");
      if (n > 0 && n < sizeof servers[nservers].dev) {
        memcpy(servers[nservers].dev, p, n);
        servers[nservers].dev[n] = 0;
        spawn_server(nservers++);
      }
      p += n + (p[n] == ',');
    }
    return;
  }
  DIR *d = opendir("/sys/class/virtio-ports");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[300], name[64] = {0};
    snprintf(path, sizeof path, "/sys/class/virtio-ports/%s/name", e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t n = read(fd, name, sizeof name - 1);
    close(fd);
    if (n <= 0 || strncmp(name, "warren.session.", 15) != 0) continue;
    if (nservers >= MAX_SESSION_PORTS) break;
    snprintf(servers[nservers].dev, sizeof servers[nservers].dev, "/dev/%s", e->d_name);
    spawn_server(nservers++);
  }
  closedir(d);
}

/*
 * --scrub: zero the guest's free memory before a template snapshot. Anonymous
 * pages come zeroed from the kernel, so taking (nearly) all free memory and
 * giving it back leaves only zero pages free, which the snapshot does not
 * store and a restored guest does not have resident on the host.
 */
static int scrub(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return 1;
  char line[128];
  long free_kb = -1;
  while (fgets(line, sizeof line, f)) if (sscanf(line, "MemFree: %ld kB", &free_kb) == 1) break;
  fclose(f);
  /* leave the kernel its reserves (and this program's own pages) */
  long take_kb = free_kb - 4 * 1024;
  if (take_kb <= 0) return 0;
  const size_t chunk = 4u << 20;
  for (long done = 0; done + (long)(chunk >> 10) <= take_kb; done += (long)(chunk >> 10)) {
    if (mmap(NULL, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0) == MAP_FAILED) break;
  }
  return 0; /* exiting frees it all */
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/*
 * WARREN_SEED and WARREN_CLOCK (set by /init in a guest restored from a
 * template): what it must not share with its siblings. SEED (128 hex digits
 * from the host's CSPRNG) is credited to the kernel's pool and the CRNG
 * reseeded from it; CLOCK (ns since the epoch) replaces the template's time.
 * Done here, before anything else runs, rather than by another program: each
 * program a restored TCG guest starts for the first time costs it its
 * translation again.
 */
static int fresh(const char *hex, const char *clock) {
  struct { int entropy_count; int buf_size; unsigned char buf[64]; } e;
  if (strlen(hex) != 2 * sizeof e.buf) return 2;
  for (size_t i = 0; i < sizeof e.buf; i++) {
    int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return 2;
    e.buf[i] = (unsigned char)(hi << 4 | lo);
  }
  e.entropy_count = 8 * (int)sizeof e.buf;
  e.buf_size = (int)sizeof e.buf;
  char *endp;
  errno = 0;
  unsigned long long ns = strtoull(clock, &endp, 10);
  if (errno || *clock == '\0' || *endp != '\0') return 2;
  int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
  if (fd < 0 || ioctl(fd, RNDADDENTROPY, &e) || ioctl(fd, RNDRESEEDCRNG)) { perror("warren-agent: reseed"); return 1; }
  close(fd);
  struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull)};
  if (clock_settime(CLOCK_REALTIME, &ts)) { perror("warren-agent: clock"); return 1; }
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--scrub") == 0) return scrub();
  const char *seed = getenv("WARREN_SEED"), *clock = getenv("WARREN_CLOCK");
  if (seed || clock) {
    int r = fresh(seed ? seed : "", clock ? clock : "");
    if (r) { fprintf(stderr, "warren-agent: bad WARREN_SEED or WARREN_CLOCK (%d)\n", r); return 1; }
    unsetenv("WARREN_SEED");
    unsetenv("WARREN_CLOCK");
  }
  const char *portname = getenv("WARREN_AGENT_PORT");
  if (!portname) portname = "/dev/vport0p1";
  const char *rp = getenv("WARREN_ROOT");
  if (rp) root_path = rp;
  rootfd = open(root_path, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (rootfd < 0) { perror("warren-agent: root"); return 1; }
  struct endpoint ep;
  port = endpoint_open(&ep, portname);
  if (port < 0 && ep.lfd < 0) { perror("warren-agent: port"); return 1; }
  const char *cg = getenv("WARREN_CGROUP");
  if (cg && *cg) {
    char procs_path[256];
    snprintf(procs_path, sizeof procs_path, "%s/cgroup.procs", cg);
    sandbox_procs = open(procs_path, O_WRONLY | O_CLOEXEC);
    if (sandbox_procs < 0) perror("warren-agent: sandbox cgroup");
  }
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGPIPE);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  size_t cap = HDR + MAX_PAYLOAD;
  unsigned char *in = malloc(cap);
  size_t have = 0;
  int connected = port >= 0;
  start_session_servers();
  fprintf(stderr, "warren-agent: ready\n");
  for (;;) {
    struct pollfd fds[3 + 2 * MAX_PROCS];
    struct { struct proc *p; int stream; } who[3 + 2 * MAX_PROCS];
    int nf = 0, ip = -1, il = -1;
    fds[nf++] = (struct pollfd){sfd, POLLIN, 0};
    if (connected && port >= 0) { ip = nf; fds[nf++] = (struct pollfd){port, POLLIN, 0}; }
    if (ep.lfd >= 0) { il = nf; fds[nf++] = (struct pollfd){ep.lfd, POLLIN, 0}; }
    int base = nf;
    for (int i = 0; i < MAX_PROCS; i++) {
      if (procs[i].pid == 0) continue;
      if (procs[i].out >= 0) { who[nf].p = &procs[i]; who[nf].stream = 1; fds[nf++] = (struct pollfd){procs[i].out, POLLIN, 0}; }
      if (procs[i].err >= 0) { who[nf].p = &procs[i]; who[nf].stream = 2; fds[nf++] = (struct pollfd){procs[i].err, POLLIN, 0}; }
    }
    /* over vsock a new host connection wakes the poll; a virtio port is polled again shortly */
    int r = poll(fds, (nfds_t)nf, connected || ep.lfd >= 0 ? -1 : 100);
    if (r < 0 && errno != EINTR) return 1;
    if (!connected && ep.lfd < 0) connected = 1; /* try the port again */
    /* the newest host connection wins, from a clean frame boundary */
    if (il >= 0 && fds[il].revents && endpoint_take(&ep)) {
      connected = 1;
      have = 0;
      ip = -1; /* what was polled was the old connection */
    }
    if (fds[0].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) == sizeof si) {}
      int st;
      pid_t pid;
      while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        respawn_server(pid);
        for (int i = 0; i < MAX_PROCS; i++) {
          if (procs[i].pid != pid) continue;
          unsigned char b[8];
          put32(b, WIFEXITED(st) ? (uint32_t)WEXITSTATUS(st) : 0);
          put32(b + 4, WIFSIGNALED(st) ? (uint32_t)WTERMSIG(st) : 0);
          /* drain what the pipes already hold so output precedes EXIT */
          if (procs[i].out >= 0) pump(&procs[i], 1);
          if (procs[i].err >= 0) pump(&procs[i], 2);
          send_frame(T_EXIT, procs[i].chan, b, 8, NULL, 0);
          procs[i].exited = 1;
          maybe_free(&procs[i]);
        }
      }
    }
    if (ip >= 0) {
      if (fds[ip].revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t got = read(port, in + have, cap - have);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
          connected = 0; /* no host client: poll again shortly, and start from a clean frame boundary */
          have = 0;
          if (ep.lfd >= 0) { close(port); port = -1; } /* a vsock stream does not come back */
        } else if (got > 0) {
          have += (size_t)got;
          size_t off = 0;
          while (have - off >= HDR) {
            uint32_t len = get32(in + off + 5);
            if (len > MAX_PAYLOAD) { have = off = 0; break; }
            if (have - off < HDR + len) break;
            /* NUL after the payload lets string handlers rely on termination checks */
            handle(in[off], get32(in + off + 1), (const char *)in + off + HDR, len);
            off += HDR + len;
          }
          if (off > 0) { memmove(in, in + off, have - off); have -= off; }
        }
      }
    }
    for (int i = base; i < nf; i++) {
      if (!fds[i].revents) continue;
      struct proc *pr = who[i].p;
      if (pr->pid == 0) continue;
      int fd = who[i].stream == 1 ? pr->out : pr->err;
      if (fd != fds[i].fd) continue;
      pump(pr, who[i].stream);
      maybe_free(pr);
    }
  }
}
