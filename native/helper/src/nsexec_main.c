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
 * Confinement (confine.h), applied last before execve:
 *   --seccomp ALLOWMASK  the default filter with the WN_SC_ALLOW_* groups in the mask let through
 *   --landlock ABI       Landlock rules for that ABI: --rw PATH / --ro PATH (repeatable), --scope N
 *                        --rw-top 1 (every top-level directory except --protect PATH ones)
 *   --apparmor PROFILE   change profile on exec;  --fsize BYTES / --nofile N  rlimits
 */
#include "wn.h"
#include "confine.h"

#include <signal.h>
#include <stdio.h>
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
