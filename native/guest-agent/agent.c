/*
 * warren-agent: the guest side of a Warren microVM. It runs as pid 1 in the
 * guest (exec'd by the initramfs /init once the sandbox root is mounted at
 * /newroot) and serves the host over one virtio-serial port.
 *
 * The guest is untrusted and so is everything in it; this program only has to
 * be correct, not to defend itself: the host validates every frame it sends.
 *
 * Frames, both ways: u8 type, u32 channel, u32 length (little endian), payload.
 * Host -> guest: EXEC, STDIN, STDIN_EOF, KILL, READ, WRITE, LIST, MKDIRS, KIND, SHUTDOWN, PING.
 * Guest -> host: HELLO, OUT, EXIT, OK, ERR, STARTED (see src/shim/backends/microvm/agent-protocol.ts).
 *
 * A guest read on the port returns 0 while no host client is connected (and
 * after one went away, e.g. a gateway restart): the agent then polls again a
 * little later, and forgets any half-received frame.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/openat2.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/reboot.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum {
  T_EXEC = 1, T_STDIN = 2, T_STDIN_EOF = 3, T_KILL = 4, T_READ = 5, T_WRITE = 6, T_LIST = 7, T_MKDIRS = 8, T_KIND = 9, T_SHUTDOWN = 10, T_PING = 11,
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
    setsid();
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(er[1], 2);
    int e = 0;
    if (fchdir(rootfd) || chroot(".")) e = errno;
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
  case T_READ: return do_read(chan, p, n);
  case T_WRITE: return do_write(chan, p, n);
  case T_LIST: if (n && p[n - 1] == 0) do_list(chan, p); else send_err(chan, EINVAL, "malformed"); return;
  case T_KIND: if (n && p[n - 1] == 0) do_kind(chan, p); else send_err(chan, EINVAL, "malformed"); return;
  case T_MKDIRS:
    if (n >= 5 && p[n - 1] == 0) { int r = mkdirs(p + 4, get32((const unsigned char *)p) & 07777); if (r < 0) send_err(chan, -r, "mkdir"); else send_ok(chan, NULL, 0); }
    else send_err(chan, EINVAL, "malformed");
    return;
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

int main(void) {
  const char *portname = getenv("WARREN_AGENT_PORT");
  if (!portname) portname = "/dev/vport0p1";
  const char *rp = getenv("WARREN_ROOT");
  if (rp) root_path = rp;
  rootfd = open(root_path, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (rootfd < 0) { perror("warren-agent: root"); return 1; }
  port = open(portname, O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (port < 0) { perror("warren-agent: port"); return 1; }
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGPIPE);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  size_t cap = HDR + MAX_PAYLOAD;
  unsigned char *in = malloc(cap);
  size_t have = 0;
  int connected = 1;
  fprintf(stderr, "warren-agent: ready\n");
  for (;;) {
    struct pollfd fds[2 + 2 * MAX_PROCS];
    struct { struct proc *p; int stream; } who[2 + 2 * MAX_PROCS];
    int nf = 0;
    fds[nf++] = (struct pollfd){sfd, POLLIN, 0};
    if (connected) fds[nf++] = (struct pollfd){port, POLLIN, 0};
    for (int i = 0; i < MAX_PROCS; i++) {
      if (procs[i].pid == 0) continue;
      if (procs[i].out >= 0) { who[nf].p = &procs[i]; who[nf].stream = 1; fds[nf++] = (struct pollfd){procs[i].out, POLLIN, 0}; }
      if (procs[i].err >= 0) { who[nf].p = &procs[i]; who[nf].stream = 2; fds[nf++] = (struct pollfd){procs[i].err, POLLIN, 0}; }
    }
    int r = poll(fds, (nfds_t)nf, connected ? -1 : 100);
    if (r < 0 && errno != EINTR) return 1;
    if (!connected) connected = 1; /* try the port again */
    int base = 1;
    if (fds[0].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) == sizeof si) {}
      int st;
      pid_t pid;
      while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
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
    if (nf > 1 && fds[1].fd == port) {
      base = 2;
      if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t got = read(port, in + have, cap - have);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
          connected = 0; /* no host client: poll again shortly, and start from a clean frame boundary */
          have = 0;
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
