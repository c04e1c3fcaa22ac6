/*
 * warren-vmshell: the host end of a microVM shell session. It runs as the
 * child of a warren-session holder (exactly where warren-nsexec runs for a
 * container), so the holder's output buffer and re-attach work unchanged, and
 * relays its stdin/stdout/stderr/fd 3 (or its pty) to the guest agent's
 * session server over one of the VM's "warren.session.N" virtio ports.
 *
 *   warren-vmshell --dir RUNDIR --slots N --mode command|pty --cwd C --uid U --gid G
 *                  [--vsock FIRST] [--control-fd N] [--env K=V]... -- argv...
 *
 * With --vsock the VM has no virtio-serial (Firecracker): slot N is the guest's
 * vsock port FIRST+N, reached through the VMM's unix socket RUNDIR/v.sock with
 * its "CONNECT <port>" handshake.
 *
 * A slot is claimed with flock on RUNDIR/sN.lock for the bridge's lifetime.
 * With --control-fd (the holder's --control-fd), the holder's MARKs and its
 * signals for the shell, the command and the tree arrive there as 2-byte
 * records (signo, target; signo 0 is a MARK) and are passed to the guest,
 * which applies them with the holder's meaning: "the command" is what the
 * shell started since the MARK, not the shell nor older background jobs.
 * Without it, the holder's own signals are translated: SIGWINCH is a resize
 * (pty) or the command-abort signal (command mode: forwarded to the shell,
 * and everything else in the shell's session is killed).
 * SIGTERM/SIGHUP/SIGINT end the whole session. When the VMM goes away (pause)
 * the bridge reconnects for as long as RUNDIR exists.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

enum { S_START = 0x20, S_INPUT = 0x21, S_RESIZE = 0x22, S_SIGNAL = 0x23, S_RESUME = 0x24, S_MARK = 0x25, S_OUT = 0xA1, S_EXIT = 0xA2, S_STARTED = 0xA3 };
/* the holder's SIGNAL targets, which the guest's session server shares */
enum { T_TREE = 2 };
/* How long a tree kill waits for the guest to report the shell's end before the bridge ends itself. */
#define TREE_KILL_WAIT_MS 1000
/* How long the bridge waits for STARTED before it sends START again. */
#define START_AGAIN_MS 2000
#define HDR 9
#define MAX_PAYLOAD (256 * 1024)

static int sock = -1;

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static void put32(unsigned char *p, uint32_t v) { p[0] = v; p[1] = v >> 8; p[2] = v >> 16; p[3] = v >> 24; }
static uint32_t get32(const unsigned char *p) { return p[0] | (p[1] << 8) | (p[2] << 16) | ((uint32_t)p[3] << 24); }

static int write_all(int fd, const void *b, size_t n) {
  const char *p = b;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) { struct pollfd q = {fd, POLLOUT, 0}; poll(&q, 1, 1000); continue; }
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static void send_frame(int type, const void *a, size_t an) {
  if (sock < 0) return;
  unsigned char h[HDR];
  h[0] = (unsigned char)type;
  put32(h + 1, 0);
  put32(h + 5, (uint32_t)an);
  if (write_all(sock, h, HDR) == 0 && an) write_all(sock, a, an);
}

/* The guest's vsock port this bridge's slot is (0: a virtio port's socket). */
static unsigned vsock_port;

/* Firecracker's host-initiated vsock: "CONNECT <port>\n", answered "OK <host port>\n" once the
 * guest accepted (or the connection is closed). The answer is read a byte at a time, so nothing
 * of the guest's stream that follows it is consumed here. */
static int vsock_handshake(int fd, unsigned gport) {
  char line[32];
  int n = snprintf(line, sizeof line, "CONNECT %u\n", gport);
  if (write_all(fd, line, (size_t)n) < 0) return -1;
  size_t got = 0;
  long long deadline = now_ms() + 5000;
  while (got < sizeof line - 1) {
    struct pollfd p = {fd, POLLIN, 0};
    long long left = deadline - now_ms();
    if (left <= 0 || poll(&p, 1, (int)left) <= 0) return -1;
    if (read(fd, line + got, 1) != 1) return -1;
    if (line[got++] == '\n') break;
  }
  line[got] = 0;
  return strncmp(line, "OK ", 3) == 0 && line[got - 1] == '\n' ? 0 : -1;
}

static int connect_to(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 || (vsock_port && vsock_handshake(fd, vsock_port) < 0)) { close(fd); return -1; }
  return fd;
}

static void die(const char *m) { fprintf(stderr, "warren-vmshell: %s\n", m); exit(127); }

int main(int argc, char **argv) {
  const char *dir = NULL, *mode = "command", *cwd = "/", *uid = "0", *gid = "0";
  int slots = 4, ctl = -1;
  unsigned long vsock_first = 0;
  char *envs[512];
  int nenv = 0, i = 1;
  for (; i < argc; i++) {
    if (!strcmp(argv[i], "--")) { i++; break; }
    if (i + 1 >= argc) die("missing value");
    if (!strcmp(argv[i], "--dir")) dir = argv[++i];
    else if (!strcmp(argv[i], "--slots")) slots = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--mode")) mode = argv[++i];
    else if (!strcmp(argv[i], "--cwd")) cwd = argv[++i];
    else if (!strcmp(argv[i], "--uid")) uid = argv[++i];
    else if (!strcmp(argv[i], "--gid")) gid = argv[++i];
    else if (!strcmp(argv[i], "--vsock")) { vsock_first = strtoul(argv[++i], NULL, 10); if (vsock_first == 0 || vsock_first > 0xfffffff0UL) die("bad --vsock port"); }
    else if (!strcmp(argv[i], "--control-fd")) { ctl = atoi(argv[++i]); if (ctl < 3 || fcntl(ctl, F_GETFD) < 0) die("--control-fd is not open"); }
    else if (!strcmp(argv[i], "--env")) { if (nenv < 511) envs[nenv++] = argv[++i]; else i++; }
    else die("unknown option");
  }
  if (!dir || i >= argc) die("usage: --dir D ... -- argv");
  int pty = !strcmp(mode, "pty");
  /* claim a slot */
  char path[256];
  int slot = -1;
  for (int s = 0; s < slots && slot < 0; s++) {
    snprintf(path, sizeof path, "%s/s%d.lock", dir, s);
    int lf = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lf >= 0 && flock(lf, LOCK_EX | LOCK_NB) == 0) slot = s; /* held until exit */
    else if (lf >= 0) close(lf);
  }
  if (slot < 0) die("every session slot of this microVM is in use");
  if (vsock_first) {
    vsock_port = (unsigned)vsock_first + (unsigned)slot;
    snprintf(path, sizeof path, "%s/v.sock", dir);
  } else snprintf(path, sizeof path, "%s/s%d.sock", dir, slot);
  for (int t = 0; t < 100 && (sock = connect_to(path)) < 0; t++) usleep(50000);
  if (sock < 0) die("cannot reach the microVM");
  /* START: mode, cols, rows, then cwd uid gid argc argv... envc env... (NUL-terminated) */
  struct winsize ws = {0};
  if (pty) ioctl(0, TIOCGWINSZ, &ws);
  unsigned char token[16];
  if (getrandom(token, sizeof token, 0) != sizeof token) die("getrandom");
  size_t cap = 21, len = 21;
  const char *fixed[4] = {cwd, uid, gid, NULL};
  char na[16], ne[16];
  snprintf(na, sizeof na, "%d", argc - i);
  snprintf(ne, sizeof ne, "%d", nenv);
  for (int k = 0; k < 3; k++) cap += strlen(fixed[k]) + 1;
  cap += strlen(na) + 1 + strlen(ne) + 1;
  for (int k = i; k < argc; k++) cap += strlen(argv[k]) + 1;
  for (int k = 0; k < nenv; k++) cap += strlen(envs[k]) + 1;
  if (cap > MAX_PAYLOAD) die("session start is too large");
  unsigned char *start = malloc(cap);
  memcpy(start, token, 16);
  start[16] = pty ? 1 : 0;
  start[17] = ws.ws_col & 0xff; start[18] = ws.ws_col >> 8; start[19] = ws.ws_row & 0xff; start[20] = ws.ws_row >> 8;
#define ADD(s) do { size_t l_ = strlen(s) + 1; memcpy(start + len, s, l_); len += l_; } while (0)
  for (int k = 0; k < 3; k++) ADD(fixed[k]);
  ADD(na);
  for (int k = i; k < argc; k++) ADD(argv[k]);
  ADD(ne);
  for (int k = 0; k < nenv; k++) ADD(envs[k]);
  send_frame(S_START, start, len);
  if (pty && isatty(0)) {
    struct termios t;
    if (tcgetattr(0, &t) == 0) { cfmakeraw(&t); tcsetattr(0, TCSANOW, &t); }
  }
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGWINCH); sigaddset(&mask, SIGTERM); sigaddset(&mask, SIGHUP); sigaddset(&mask, SIGINT); sigaddset(&mask, SIGPIPE);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC);
  unsigned char *in = malloc(HDR + MAX_PAYLOAD);
  static char buf[65536];
  size_t have = 0;
  int stdin_open = 1;
  struct timespec last_resume = {0};
  unsigned char rec[512];
  size_t rec_have = 0;
  int tree_sig = 0;           /* a fatal tree signal was passed on: end when the guest reports, or at tree_deadline */
  long long tree_deadline = 0;
  /* START goes again every START_AGAIN_MS until the guest answers STARTED (a repeat of the same
   * token is only answered there), and nothing of the holder's is passed on before: a START the
   * guest lost would otherwise leave its MARKs and input going to no shell, and this bridge
   * waiting for an end that never comes. */
  int started = 0;
  long long start_sent = now_ms();
  for (;;) {
    /* the control pipe and stdin wait while the guest is unreachable: records and input are not lost */
    struct pollfd fds[4] = {{sfd, POLLIN, 0}, {sock, POLLIN, 0}, {stdin_open && sock >= 0 && started ? 0 : -1, POLLIN, 0}, {ctl >= 0 && sock >= 0 && started ? ctl : -1, POLLIN, 0}};
    if (sock < 0) {
      struct stat st;
      if (stat(dir, &st) != 0) exit(137); /* the sandbox is gone */
      sock = connect_to(path);
      have = 0;
      if (sock < 0) { usleep(100000); continue; }
      if (started) send_frame(S_RESUME, token, sizeof token);
      else { send_frame(S_START, start, len); start_sent = now_ms(); }
      fds[1].fd = sock;
    }
    /* The guest stops sending this shell's output whenever it sees its port close, which a restored
     * VM can report after this bridge is already connected: say who we are again every second. */
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (started && now.tv_sec != last_resume.tv_sec) { send_frame(S_RESUME, token, sizeof token); last_resume = now; }
    if (!started && now_ms() - start_sent >= START_AGAIN_MS) { send_frame(S_START, start, len); start_sent = now_ms(); }
    if (tree_sig && now_ms() >= tree_deadline) {
      signal(tree_sig, SIG_DFL); sigprocmask(SIG_UNBLOCK, &mask, NULL); raise(tree_sig); exit(128 + tree_sig);
    }
    poll(fds, 4, tree_sig ? 50 : started ? 1000 : 100);
    /* before stdin: the holder writes a command's MARK before its input */
    if (fds[3].fd >= 0 && fds[3].revents) {
      ssize_t r = read(ctl, rec + rec_have, sizeof rec - rec_have);
      if (r == 0) ctl = -1; /* the holder is gone; its end of the session follows */
      else if (r > 0) {
        rec_have += (size_t)r;
        size_t k = 0;
        for (; k + 2 <= rec_have; k += 2) {
          unsigned char sg[2] = {rec[k], rec[k + 1]};
          if (sg[0] == 0) { send_frame(S_MARK, NULL, 0); continue; }
          send_frame(S_SIGNAL, sg, 2);
          int fatal = sg[0] == SIGKILL || sg[0] == SIGTERM || sg[0] == SIGHUP || sg[0] == SIGINT || sg[0] == SIGQUIT;
          if (sg[1] == T_TREE && fatal && !tree_sig) {
            tree_sig = sg[0];
            tree_deadline = now_ms() + TREE_KILL_WAIT_MS;
          }
        }
        memmove(rec, rec + k, rec_have - k);
        rec_have -= k;
      }
    }
    if (fds[0].revents) {
      struct signalfd_siginfo si;
      if (read(sfd, &si, sizeof si) == sizeof si) {
        unsigned char sg[2];
        if (si.ssi_signo == SIGWINCH) {
          if (pty) {
            struct winsize w;
            if (ioctl(0, TIOCGWINSZ, &w) == 0) { unsigned char r[4] = {w.ws_col & 0xff, w.ws_col >> 8, w.ws_row & 0xff, w.ws_row >> 8}; send_frame(S_RESIZE, r, 4); }
          } else {
            sg[0] = SIGWINCH; sg[1] = 3; send_frame(S_SIGNAL, sg, 2);
            sg[0] = SIGKILL; sg[1] = 1; send_frame(S_SIGNAL, sg, 2);
          }
        } else if (si.ssi_signo != SIGPIPE) {
          sg[0] = SIGKILL; sg[1] = 2; send_frame(S_SIGNAL, sg, 2);
          exit(128 + (int)si.ssi_signo);
        }
      }
    }
    if (fds[2].fd >= 0 && fds[2].revents) {
      ssize_t r = read(0, buf, sizeof buf);
      if (r > 0) send_frame(S_INPUT, buf, (size_t)r);
      else if (r == 0 || errno != EINTR) { stdin_open = 0; if (!pty) send_frame(S_INPUT, NULL, 0); }
    }
    if (fds[1].revents) {
      ssize_t got = read(sock, in + have, HDR + MAX_PAYLOAD - have);
      if (got <= 0) { close(sock); sock = -1; continue; }
      have += (size_t)got;
      size_t off = 0;
      while (have - off >= HDR) {
        uint32_t l = get32(in + off + 5);
        if (l > MAX_PAYLOAD) die("malformed frame from the microVM");
        if (have - off < HDR + l) break;
        unsigned char *p = in + off + HDR;
        if (in[off] == S_OUT && l >= 1) {
          int fd = p[0] == 2 ? 2 : p[0] == 3 ? 3 : 1;
          if (write_all(fd, p + 1, l - 1) < 0 && fd == 3) { /* the holder closed status: nothing to do */ }
        } else if (in[off] == S_STARTED) {
          started = 1;
        } else if (in[off] == S_EXIT && l == 8) {
          int code = (int)get32(p), sig = (int)get32(p + 4);
          if (sig) { signal(sig, SIG_DFL); sigprocmask(SIG_UNBLOCK, &mask, NULL); raise(sig); exit(128 + sig); }
          exit(code);
        }
        off += HDR + l;
      }
      if (off > 0) { memmove(in, in + off, have - off); have -= off; }
    }
  }
}
