/*
 * warren-nsexec: start a process inside a running sandbox from a plain host
 * process (the shell-session holder). Same code path as the addon's exec
 * (nsexec.c), with stdio inherited from the caller:
 *
 *   warren-nsexec --pid INITPID --cgroup NAME [--uid N] [--gid N] [--cwd DIR]
 *                 [--sched-idle] [--env K=V]... -- argv...
 *
 * stdin/stdout/stderr and fd 3 pass through. SIGTERM/SIGINT/SIGHUP/SIGQUIT are
 * forwarded to the child; the exit status is the child's (128+signal when it
 * was killed). Setup failures print one line to stderr and exit 125 (bad
 * arguments: 2).
 *
 * Supervised mode (--supervise DIR --max-output BYTES [--timeout-ms MS]): a one-shot exec
 * that outlives its caller. The command gets pipes; this process copies its stdout and stderr
 * into DIR/stdout and DIR/stderr (at most BYTES each: past that the pipe is closed, so a writer
 * that goes on gets SIGPIPE, as with the addon's exec), feeds DIR/stdin when it exists, kills
 * the command's process group at the timeout, waits for it, and writes DIR/result (JSON,
 * renamed into place) when it has ended. DIR/pid ("PID STARTTIME") names this process for
 * whoever follows the run later. On fd 1 it answers "ok PID" once the command runs, or
 * "err CODE ERRNO message" and exits 125; then fds 0..2 become /dev/null, so that nothing it
 * holds belongs to the caller.
 *
 * Confinement (confine.h), applied last before execve:
 *   --seccomp ALLOWMASK  the default filter with the WN_SC_ALLOW_* groups in the mask let through
 *   --landlock ABI       Landlock rules for that ABI: --rw PATH / --ro PATH (repeatable), --scope N
 *                        --rw-top 1 (every top-level directory except --protect PATH ones)
 *   --apparmor PROFILE   change profile on exec;  --fsize BYTES / --nofile N  rlimits
 */
#include "wn.h"
#include "confine.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>

static void usage(void) {
  fputs("usage: warren-nsexec --pid INITPID --cgroup NAME [--uid N] [--gid N] [--cwd DIR] [--sched-idle]\n"
        "                     [--env K=V]... [--seccomp MASK] [--landlock ABI] [--rw P]... [--ro P]... [--scope N]\n"
        "                     [--rw-top 1] [--protect P]...\n"
        "                     [--apparmor PROFILE] [--fsize BYTES] [--nofile N] -- argv...\n",
        stderr);
}

static int parse_uint(const char *s, uint64_t max, uint64_t *out) {
  uint64_t v;
  if (wn_parse_u64(s, &v) < 0 || v > max) return -1;
  *out = v;
  return 0;
}

static int supervise(wn_exec_spec *s, const char *dir, uint64_t max_output, uint64_t timeout_ms);

int main(int argc, char **argv) {
  wn_exec_spec s;
  memset(&s, 0, sizeof s);
  s.cwd = "/";
  s.stdio = WN_STDIO_INHERIT;
  const char **env = calloc((size_t)argc + 1, sizeof *env);
  if (!env) return 125;
  size_t envc = 0;
  uint64_t v;
  wn_confine cf;
  memset(&cf, 0, sizeof cf);
  cf.rlimit_fsize = cf.rlimit_nofile = -1;
  const char *sup_dir = NULL;
  uint64_t sup_max = 1 << 20, sup_timeout = 0;
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    } else if (strcmp(a, "--sched-idle") == 0) {
      s.sched_idle = 1;
      continue;
    }
    if (!val) {
      usage();
      return 2;
    }
    if (strcmp(a, "--pid") == 0 && parse_uint(val, WN_PID_MAX, &v) == 0) {
      s.init_pid = (pid_t)v;
    } else if (strcmp(a, "--supervise") == 0) {
      sup_dir = val;
    } else if (strcmp(a, "--max-output") == 0 && parse_uint(val, (uint64_t)1 << 40, &v) == 0) {
      sup_max = v;
    } else if (strcmp(a, "--timeout-ms") == 0 && parse_uint(val, (uint64_t)1 << 40, &v) == 0) {
      sup_timeout = v;
    } else if (strcmp(a, "--cgroup") == 0) {
      s.cgroup = val;
    } else if (strcmp(a, "--uid") == 0 && parse_uint(val, 4294967294u, &v) == 0) {
      s.uid = (uid_t)v;
    } else if (strcmp(a, "--gid") == 0 && parse_uint(val, 4294967294u, &v) == 0) {
      s.gid = (gid_t)v;
    } else if (strcmp(a, "--cwd") == 0) {
      s.cwd = val;
    } else if (strcmp(a, "--env") == 0) {
      env[envc++] = val;
    } else if (strcmp(a, "--seccomp") == 0 && parse_uint(val, WN_SC_ALLOW_ALL, &v) == 0) {
      cf.active = 1;
      cf.seccomp = wn_seccomp_filter((unsigned)v);
    } else if (strcmp(a, "--landlock") == 0 && parse_uint(val, 64, &v) == 0) {
      cf.active = 1;
      cf.landlock_abi = (int)v;
    } else if (strcmp(a, "--rw") == 0 && cf.n_rw < WN_CONFINE_MAX_PATHS) {
      cf.ll_rw[cf.n_rw++] = val;
    } else if (strcmp(a, "--ro") == 0 && cf.n_ro < WN_CONFINE_MAX_PATHS) {
      cf.ll_ro[cf.n_ro++] = val;
    } else if (strcmp(a, "--rw-top") == 0 && strcmp(val, "1") == 0) {
      cf.ll_rw_top = 1;
    } else if (strcmp(a, "--protect") == 0 && cf.n_protect < WN_CONFINE_MAX_PATHS) {
      cf.ll_protect[cf.n_protect++] = val;
    } else if (strcmp(a, "--scope") == 0 && parse_uint(val, 3, &v) == 0) {
      cf.ll_scope = (unsigned)v;
    } else if (strcmp(a, "--apparmor") == 0) {
      cf.active = 1;
      cf.apparmor_profile = val;
    } else if (strcmp(a, "--fsize") == 0 && parse_uint(val, (uint64_t)1 << 50, &v) == 0) {
      cf.active = 1;
      cf.rlimit_fsize = (int64_t)v;
    } else if (strcmp(a, "--nofile") == 0 && parse_uint(val, 1 << 20, &v) == 0) {
      cf.active = 1;
      cf.rlimit_nofile = (int64_t)v;
    } else {
      usage();
      return 2;
    }
    i++;
  }
  if (i >= argc || s.cgroup == NULL || s.init_pid == 0) {
    usage();
    return 2;
  }
  env[envc] = NULL;
  s.argv = (const char *const *)&argv[i];
  s.argc = (size_t)(argc - i);
  s.envp = env;
  s.envc = envc;
  if (cf.active) s.confine = &cf;

  if (sup_dir != NULL) {
    s.stdio = WN_STDIO_PIPES;
    return supervise(&s, sup_dir, sup_max, sup_timeout);
  }

  wn_error err;
  if (wn_exec_spec_check(&s, &err) < 0) {
    fprintf(stderr, "warren-nsexec: %s: %s\n", wn_code_name(err.code), err.msg);
    return 2;
  }

  /* Block the forwarded signals before the child exists: none can be lost. */
  sigset_t fwd;
  sigemptyset(&fwd);
  sigaddset(&fwd, SIGTERM);
  sigaddset(&fwd, SIGINT);
  sigaddset(&fwd, SIGHUP);
  sigaddset(&fwd, SIGQUIT);
  sigaddset(&fwd, SIGCHLD);
  sigprocmask(SIG_BLOCK, &fwd, NULL);

  wn_exec_result r;
  if (wn_exec(&s, &r, &err) < 0) {
    fprintf(stderr, "warren-nsexec: %s: %s\n", wn_code_name(err.code), err.msg);
    return 125;
  }
  for (;;) {
    siginfo_t info;
    memset(&info, 0, sizeof info);
    int w = waitid(P_PIDFD, (id_t)r.pidfd, &info, WEXITED | WNOHANG);
    if (w == 0 && info.si_pid != 0) {
      if (info.si_code == CLD_EXITED) return info.si_status;
      return 128 + info.si_status;
    }
    if (w < 0 && errno != EINTR) {
      fprintf(stderr, "warren-nsexec: waitid: %s\n", wn_errno_name(errno));
      return 125;
    }
    int sig = sigwaitinfo(&fwd, &info);
    if (sig > 0 && sig != SIGCHLD) wn_pidfd_send_signal(r.pidfd, sig);
  }
}

/* ---- supervised mode ---- */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void on_sigpipe(int sig) { (void)sig; }

/* Write `data` to DIR/NAME atomically (a temporary name, then rename). */
static int write_atomic(const char *dir, const char *name, const char *data) {
  char tmp[4096], dst[4096];
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
  snprintf(dst, sizeof dst, "%s/%s", dir, name);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  size_t len = strlen(data), off = 0;
  while (off < len) {
    ssize_t w = write(fd, data + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      close(fd);
      return -1;
    }
    off += (size_t)w;
  }
  /* No fsync: the files must outlive the gateway process, not the machine (whose crash ends the
     sandbox and its command anyway). */
  if (close(fd) < 0) return -1;
  return rename(tmp, dst);
}

/* Field 22 of /proc/self/stat: with the pid, it names this process even after pid reuse. */
static unsigned long long self_starttime(void) {
  char buf[1024];
  int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  if (!p) return 0;
  p += 2; /* state */
  for (int field = 3; field < 22 && p; field++) {
    p = strchr(p, ' ');
    if (p) p++;
  }
  return p ? strtoull(p, NULL, 10) : 0;
}

static void say(const char *line) {
  size_t len = strlen(line), off = 0;
  while (off < len) {
    ssize_t w = write(1, line + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    off += (size_t)w;
  }
}

struct sup_out {
  int rd;        /* pipe from the command; -1 once closed */
  int file;      /* DIR/stdout or DIR/stderr */
  uint64_t kept; /* bytes written to the file */
  int truncated;
};

/* Copy what the pipe has into the file, up to the cap; a byte past the cap closes the pipe. */
static void sup_pump(struct sup_out *o, uint64_t cap) {
  char buf[65536];
  for (;;) {
    ssize_t n = read(o->rd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {
      close(o->rd);
      o->rd = -1;
      return;
    }
    size_t take = (uint64_t)n <= cap - o->kept ? (size_t)n : (size_t)(cap - o->kept);
    size_t off = 0;
    while (off < take) {
      ssize_t w = write(o->file, buf + off, take - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break; /* the data dir is full: what fits is kept */
      off += (size_t)w;
    }
    o->kept += off;
    if (take < (size_t)n) {
      o->truncated = 1;
      close(o->rd);
      o->rd = -1;
      return;
    }
  }
}

static int supervise(wn_exec_spec *s, const char *dir, uint64_t max_output, uint64_t timeout_ms) {
  char path[4096], line[8192];
  wn_error err;
  memset(&err, 0, sizeof err);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigpipe; /* a handler, not SIG_IGN: the command must get the default back */
  sigaction(SIGPIPE, &sa, NULL);
  /* This process outlives its caller: nothing the caller leaked to it (a descriptor it inherited
     without close-on-exec) may stay open here. fds 0..2 are ours; 1 is the answer pipe. */
  syscall(SYS_close_range, 3U, ~0U, 0U);
  if (wn_exec_spec_check(s, &err) < 0) {
    snprintf(line, sizeof line, "err %s 0 %s\n", wn_code_name(err.code), err.msg);
    say(line);
    return 2;
  }
  struct sup_out out[2];
  const char *names[2] = {"stdout", "stderr"};
  for (int k = 0; k < 2; k++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[k]);
    out[k].file = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0600);
    out[k].kept = 0;
    out[k].truncated = 0;
    if (out[k].file < 0) {
      snprintf(line, sizeof line, "err SPAWN_ERROR %d open %s\n", errno, path);
      say(line);
      return 125;
    }
  }
  snprintf(path, sizeof path, "%s/stdin", dir);
  int in_file = open(path, O_RDONLY | O_CLOEXEC);

  double t0 = now_ms();
  wn_exec_result r;
  if (wn_exec(s, &r, &err) < 0) {
    snprintf(line, sizeof line, "err %s %d %s\n", wn_code_name(err.code), err.errnum, err.msg);
    say(line);
    return 125;
  }
  snprintf(line, sizeof line, "%d %llu\n", (int)getpid(), self_starttime());
  if (write_atomic(dir, "pid", line) < 0) {
    wn_pidfd_send_signal(r.pidfd, SIGKILL);
    snprintf(line, sizeof line, "err SPAWN_ERROR %d writing %s/pid\n", errno, dir);
    say(line);
    return 125;
  }
  snprintf(line, sizeof line, "ok %d\n", (int)r.pid);
  say(line);
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    dup2(devnull, 0);
    dup2(devnull, 1);
    dup2(devnull, 2);
    close(devnull);
  }

  out[0].rd = r.stdout_fd;
  out[1].rd = r.stderr_fd;
  for (int k = 0; k < 2; k++) fcntl(out[k].rd, F_SETFL, fcntl(out[k].rd, F_GETFL) | O_NONBLOCK);
  int in_fd = r.stdin_fd;
  char in_buf[65536];
  size_t in_len = 0, in_off = 0;
  if (in_file < 0) {
    close(in_fd);
    in_fd = -1;
  } else {
    fcntl(in_fd, F_SETFL, fcntl(in_fd, F_GETFL) | O_NONBLOCK);
  }

  double deadline = timeout_ms > 0 ? t0 + (double)timeout_ms : 0;
  int timed_out = 0, exited = 0;
  siginfo_t info;
  memset(&info, 0, sizeof info);
  double idle_since = 0; /* after the exit: output pipes held by background children are given up when silent */
  for (;;) {
    struct pollfd pf[4];
    int n = 0, ix_out[2] = {-1, -1}, ix_in = -1, ix_pid = -1;
    for (int k = 0; k < 2; k++)
      if (out[k].rd >= 0) {
        ix_out[k] = n;
        pf[n].fd = out[k].rd;
        pf[n++].events = POLLIN;
      }
    if (in_fd >= 0) {
      ix_in = n;
      pf[n].fd = in_fd;
      pf[n++].events = POLLOUT;
    }
    if (!exited) {
      ix_pid = n;
      pf[n].fd = r.pidfd;
      pf[n++].events = POLLIN;
    }
    if (exited && ix_out[0] < 0 && ix_out[1] < 0) break;
    int wait = -1;
    double now = now_ms();
    if (!exited && deadline > 0 && !timed_out) wait = deadline > now ? (int)(deadline - now) + 1 : 0;
    if (exited) wait = 50;
    int pr = poll(pf, (nfds_t)n, wait);
    if (pr < 0 && errno != EINTR) break;
    now = now_ms();
    if (!exited && deadline > 0 && !timed_out && now >= deadline) {
      timed_out = 1;
      if (kill(-r.pid, SIGKILL) < 0) wn_pidfd_send_signal(r.pidfd, SIGKILL);
    }
    if (pr <= 0) {
      if (exited && pr == 0 && now - idle_since >= 50) {
        for (int k = 0; k < 2; k++)
          if (out[k].rd >= 0) {
            close(out[k].rd);
            out[k].rd = -1;
          }
      }
      continue;
    }
    int got = 0;
    for (int k = 0; k < 2; k++)
      if (ix_out[k] >= 0 && pf[ix_out[k]].revents) {
        uint64_t before = out[k].kept;
        sup_pump(&out[k], max_output);
        if (out[k].kept != before) got = 1;
      }
    if (got) idle_since = now;
    if (ix_in >= 0 && pf[ix_in].revents) {
      if (in_off == in_len) {
        ssize_t m = read(in_file, in_buf, sizeof in_buf);
        in_len = m > 0 ? (size_t)m : 0;
        in_off = 0;
      }
      ssize_t w = in_len > in_off ? write(in_fd, in_buf + in_off, in_len - in_off) : 0;
      if (w > 0) in_off += (size_t)w;
      if (in_len == 0 || (w < 0 && errno != EAGAIN && errno != EINTR)) {
        close(in_fd);
        in_fd = -1;
      }
    }
    if (ix_pid >= 0 && pf[ix_pid].revents) {
      if (waitid(P_PIDFD, (id_t)r.pidfd, &info, WEXITED) == 0) {
        exited = 1;
        idle_since = now;
        if (in_fd >= 0) {
          close(in_fd);
          in_fd = -1;
        }
      }
    }
  }
  double dur = now_ms() - t0;
  char result[512];
  char code[32], sig[32];
  if (info.si_code == CLD_EXITED) {
    snprintf(code, sizeof code, "%d", info.si_status);
    snprintf(sig, sizeof sig, "null");
  } else {
    snprintf(code, sizeof code, "null");
    snprintf(sig, sizeof sig, "%d", info.si_status);
  }
  snprintf(result, sizeof result,
           "{\"exitCode\":%s,\"signal\":%s,\"timedOut\":%s,\"truncated\":%s,\"durationMs\":%.3f,\"stdoutBytes\":%llu,\"stderrBytes\":%llu}\n",
           code, sig, timed_out ? "true" : "false", out[0].truncated || out[1].truncated ? "true" : "false", dur,
           (unsigned long long)out[0].kept, (unsigned long long)out[1].kept);
  for (int k = 0; k < 2; k++) close(out[k].file);
  return write_atomic(dir, "result", result) < 0 ? 1 : 0;
}
