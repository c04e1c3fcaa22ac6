/*
 * exec: start a process inside a running sandbox. Shared by the N-API addon
 * (exec) and the static warren-nsexec helper; there is one copy of this code.
 *
 *   caller thread (made non-dumpable: the children share its memory until they exec)
 *     └─ clone(CLONE_VM|CLONE_VFORK)            stage 1, on a private stack
 *          join the v1 cgroups (write "0" to cgroup.procs), setns(pidfd of the sandbox
 *          init, MNT|UTS|IPC|NET|PID)
 *          └─ clone3(CLONE_VM|CLONE_VFORK|CLONE_PARENT|CLONE_INTO_CGROUP)   the real child
 *               born in the sandbox's cgroup2 group (no migration), a child of the
 *               *caller* (reapable by waitid/pidfd), inside the sandbox pid namespace:
 *               setns(CGROUP), setsid, stdio, capabilities, uid/gid, chdir, SCHED_IDLE,
 *               no_new_privs, execve with a PATH search
 *
 * Both clones are vfork-style: nothing returns to the caller until the child
 * has exec'd or failed, so exec failures (ENOENT, EACCES, a missing cwd) come
 * back synchronously as {step, index, errno} through a CLOEXEC pipe. The
 * children share the caller's memory and only make raw syscalls.
 *
 * The descriptor table. A child made without CLONE_FILES gets a copy of the caller's table and
 * must close it before the exec, and stage 1 closes its own copy when it exits: in a gateway
 * that holds a pidfd per sandbox that is four passes over thousands of descriptors per exec
 * (+2 ms at 10,000). So both clones share the caller's table (CLONE_FILES), and the child leaves
 * it with close_range(top, ~0, CLOSE_RANGE_UNSHARE), which copies only the descriptors below
 * `top`: the few it needs are first placed in reserved slots there (dup3 over a placeholder,
 * put back after the exec). Without slots (none reserved in time, or the descriptors were
 * already too many) it copies as before. A sandbox's spawn (spawn.c) uses the same slots.
 *
 * The caller must reap every child it gets (watchExit / waitid): an unreaped
 * zombie lives in the sandbox's pid namespace, and that namespace's init cannot
 * finish exiting (zap_pid_ns_processes) until it is reaped.
 */
#include "wn.h"
#include "confine.h"
#include "isolate.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>

#ifndef PR_SCHED_CORE
#define PR_SCHED_CORE 62
#endif
#ifndef PR_SCHED_CORE_SHARE_FROM
#define PR_SCHED_CORE_SHARE_FROM 3
#endif
#ifndef TIOCGPTPEER
#define TIOCGPTPEER _IO('T', 0x41)
#endif

#ifdef WN_TRACE
#include <time.h>
extern uint64_t wn_trace_ns[64];
extern int wn_trace_n;
#define TRACE()                                                                             \
  do {                                                                                      \
    struct timespec ts_;                                                                    \
    clock_gettime(CLOCK_MONOTONIC, &ts_);                                                   \
    if (wn_trace_n < 64) wn_trace_ns[wn_trace_n++] = (uint64_t)ts_.tv_sec * 1000000000ull + (uint64_t)ts_.tv_nsec; \
  } while (0)
#else
#define TRACE() \
  do {          \
  } while (0)
#endif

#define STAGE_STACK_SIZE (128 * 1024)
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

enum exec_step {
  X_NONE = 0,
  X_CGROUP_JOIN,
  X_SETNS,
  X_CLONE,
  X_SETSID,
  X_STDIO,
  X_CTTY,
  X_CLOSE_FDS,
  X_CORE_SCHED,
  X_CAPS,
  X_SETGROUPS,
  X_SETGID,
  X_SETUID,
  X_CHDIR,
  X_SCHED_IDLE,
  X_NNP,
  X_EXEC,
  X_CONFINE, /* index = WN_CF_* step */
  X_ISOLATE, /* index = WN_ISO_* step */
};

struct child_report {
  int32_t step;
  int32_t index;
  int32_t err;
};

struct exec_ctx {
  const wn_exec_spec *s;
  int errfd;
  int ns_pidfd;
  int cg_fds[WN_CG_MAX_FDS];
  int cg_roles[WN_CG_MAX_FDS];
  int n_cg;
  int unified_dir;   /* cgroup2 group: CLONE_INTO_CGROUP target of the real child */
  int unified_procs; /* fallback when clone3 is unavailable */
  int child_fds[4]; /* fds that become the child's 0..3; -1: none (inherit mode) */
  int child_src[4]; /* what the child dups them from: child_fds, or their slots */
  int n_child_fds;
  int want_ctty;  /* fd 0 becomes the controlling terminal: 1 required (pty), 2 best effort (inherit) */
  int shared_files; /* both clones share the caller's table; the child leaves it keeping fds below files_top */
  int files_top;
  wn_confine confine; /* the spec's, with the ruleset in its slot */
  int keep_from;  /* first fd to mark close-on-exec in the child */
  int core_share; /* share the init's core-scheduling cookie */
  const char *path_env;
  char *child_stack;
  size_t child_stack_size;
  volatile pid_t child_pid;
  /* The kernel writes the child's pid here (CLONE_PARENT_SETTID) before the child runs, so it is
     known even when stage 1 is killed while it waits for the child (a sandbox reset killing every
     process in the cgroup does that); child_pid is only set once clone returns in stage 1. */
  volatile pid_t child_tid;
};

/* ---- descriptor slots --------------------------------------------------------- */

#define SLOT_GROUPS 8
#define SLOTS_PER_GROUP 6 /* stdin, stdout, stderr, status, the error pipe, the Landlock ruleset */
#define SLOT_BASE 64      /* above what a process has open at start-up */
#define SLOT_TOP_MAX 1024 /* past this, copying the table below the slots costs what it saves */

static pthread_mutex_t slot_mu = PTHREAD_MUTEX_INITIALIZER;
static int slot_state; /* 0: not tried, 1: reserved, -1: none */
static int slot_placeholder = -1;
static int slot_fd[SLOT_GROUPS][SLOTS_PER_GROUP];
static int slot_busy[SLOT_GROUPS];
static int slot_top; /* one past the highest slot */

static void slots_reserve_locked(void) {
  slot_state = -1;
  int ph = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (ph < 0) return;
  int top = 0, n = 0;
  for (int g = 0; g < SLOT_GROUPS; g++)
    for (int i = 0; i < SLOTS_PER_GROUP; i++) {
      /* the lowest free number from SLOT_BASE on: allocated, never taken from another thread */
      int fd = fcntl(ph, F_DUPFD_CLOEXEC, SLOT_BASE);
      if (fd < 0 || fd + 1 > SLOT_TOP_MAX) {
        if (fd >= 0) close(fd);
        for (int k = 0; k < n; k++) close(slot_fd[k / SLOTS_PER_GROUP][k % SLOTS_PER_GROUP]);
        close(ph);
        return;
      }
      slot_fd[g][i] = fd;
      n++;
      if (fd + 1 > top) top = fd + 1;
    }
  slot_placeholder = ph;
  slot_top = top;
  slot_state = 1;
}

int wn_slots_top(void) {
  return slot_top;
}

void wn_exec_slots_reserve(void) {
  pthread_mutex_lock(&slot_mu);
  if (slot_state == 0) slots_reserve_locked();
  pthread_mutex_unlock(&slot_mu);
}

/* A free group of slots, or -1. */
int wn_slots_take(void) {
  int got = -1;
  pthread_mutex_lock(&slot_mu);
  if (slot_state == 0) slots_reserve_locked();
  if (slot_state == 1)
    for (int g = 0; g < SLOT_GROUPS; g++)
      if (!slot_busy[g]) {
        slot_busy[g] = 1;
        got = g;
        break;
      }
  pthread_mutex_unlock(&slot_mu);
  return got;
}

/* Put the placeholder back over every slot of group g (closing what was placed there) and free it. */
void wn_slots_give(int g) {
  if (g < 0) return;
  for (int i = 0; i < SLOTS_PER_GROUP; i++) dup3(slot_placeholder, slot_fd[g][i], O_CLOEXEC);
  pthread_mutex_lock(&slot_mu);
  slot_busy[g] = 0;
  pthread_mutex_unlock(&slot_mu);
}

/* fd placed in slot i of group g (close-on-exec), or -1 when it cannot be. */
int wn_slot_place(int g, int i, int fd) {
  if (fd < 0) return -1;
  return dup3(fd, slot_fd[g][i], O_CLOEXEC) < 0 ? -1 : slot_fd[g][i];
}

static void __attribute__((noreturn)) child_fail(struct exec_ctx *c, int step, int index, int err) {
  struct child_report r = {step, index, err};
  ssize_t w;
  do w = write(c->errfd, &r, sizeof r);
  while (w < 0 && errno == EINTR);
  _exit(127);
}

/* execvpe-style search, without allocation. Returns the errno to report. */
static int exec_search(struct exec_ctx *c) {
  const wn_exec_spec *s = c->s;
  const char *file = s->argv[0];
  char *const *argv = (char *const *)s->argv;
  char *const *envp = (char *const *)s->envp;
  if (strchr(file, '/')) {
    execve(file, argv, envp);
    return errno;
  }
  size_t flen = strlen(file);
  char buf[4096];
  int seen_eacces = 0;
  const char *p = c->path_env;
  for (;;) {
    const char *end = strchrnul(p, ':');
    size_t dlen = (size_t)(end - p);
    if (dlen + 1 + flen + 1 <= sizeof buf) {
      size_t off = 0;
      if (dlen == 0) {
        buf[off++] = '.';
      } else {
        memcpy(buf, p, dlen);
        off = dlen;
      }
      buf[off++] = '/';
      memcpy(buf + off, file, flen + 1);
      execve(buf, argv, envp);
      switch (errno) {
        case EACCES: seen_eacces = 1; break;
        case ENOENT:
        case ENOTDIR:
        case ESTALE:
        case ENODEV:
        case ETIMEDOUT:
        case ENAMETOOLONG: break;
        default: return errno;
      }
    }
    if (*end == '\0') break;
    p = end + 1;
  }
  return seen_eacces ? EACCES : ENOENT;
}

static int exec_child(void *arg) {
  struct exec_ctx *c = arg;
  const wn_exec_spec *s = c->s;

  TRACE();
  wn_child_reset_signals();
  if (setns(c->ns_pidfd, CLONE_NEWCGROUP) < 0) child_fail(c, X_SETNS, 1, errno);
  if (c->shared_files && syscall(SYS_close_range, (unsigned)c->files_top, ~0U, CLOSE_RANGE_UNSHARE) < 0) {
    /* a kernel without CLOSE_RANGE_UNSHARE (before 5.9): a copy of the whole table, closed below */
    if (unshare(CLONE_FILES) < 0) child_fail(c, X_CLOSE_FDS, 0, errno);
  }
  if (setsid() < 0) child_fail(c, X_SETSID, 0, errno);
  if (c->n_child_fds > 0) {
    /* Move the sources out of 0..3 first so the dup2s below cannot clobber each other. */
    int tmp[4];
    for (int i = 0; i < c->n_child_fds; i++) {
      tmp[i] = fcntl(c->child_src[i], F_DUPFD_CLOEXEC, 10);
      if (tmp[i] < 0) child_fail(c, X_STDIO, i, errno);
    }
    for (int i = 0; i < c->n_child_fds; i++)
      if (dup2(tmp[i], i) < 0) child_fail(c, X_STDIO, i, errno);
  }
  /* pty mode: our fresh slave. inherit mode (warren-nsexec): the caller's terminal, taken over even
     when it is still the controlling terminal of the caller's session (we hold CAP_SYS_ADMIN here). */
  if (c->want_ctty == 1 && ioctl(0, TIOCSCTTY, 0) < 0) child_fail(c, X_CTTY, 0, errno);
  if (c->want_ctty == 2) ioctl(0, TIOCSCTTY, 1);
  {
    int keep[2] = {c->errfd, c->confine.active && c->confine.ll_have_ruleset ? c->confine.ll_ruleset_fd : -1};
    int crc = wn_close_fds_except(c->keep_from, keep, 2);
    if (crc < 0) child_fail(c, X_CLOSE_FDS, 0, -crc);
  }
  /* pid 1 of this pid namespace is the sandbox init */
  if (c->core_share && prctl(PR_SCHED_CORE, PR_SCHED_CORE_SHARE_FROM, 1, 0 /* PIDTYPE_PID */, 0) < 0)
    child_fail(c, X_CORE_SCHED, 0, errno);
  /* FnCall isolation (new IPC + private mount namespace, read-only root, fresh tmpfs, rlimits);
     needs the capabilities that are dropped next */
  if (s->isolate) {
    int iso_step = 0;
    int irc = wn_isolate_apply(s->isolate, &iso_step);
    if (irc < 0) child_fail(c, X_ISOLATE, iso_step, -irc);
  }
  int rc = wn_caps_drop(wn_default_caps);
  if (rc < 0) child_fail(c, X_CAPS, 0, -rc);
  /* Raw syscalls: glibc's set*id wrappers would broadcast to the caller's threads (SIGSETXID). */
  gid_t gid = s->gid;
  if (syscall(SYS_setgroups, 1, &gid) < 0) child_fail(c, X_SETGROUPS, 0, errno);
  if (syscall(SYS_setresgid, s->gid, s->gid, s->gid) < 0) child_fail(c, X_SETGID, 0, errno);
  if (syscall(SYS_setresuid, s->uid, s->uid, s->uid) < 0) child_fail(c, X_SETUID, 0, errno);
  if (chdir(s->cwd) < 0) child_fail(c, X_CHDIR, 0, errno);
  if (s->sched_idle) {
    struct sched_param sp = {.sched_priority = 0};
    if (sched_setscheduler(0, SCHED_IDLE, &sp) < 0) child_fail(c, X_SCHED_IDLE, 0, errno);
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) child_fail(c, X_NNP, 0, errno);
  /* seccomp / Landlock / AppArmor / rlimits, the last step before execve */
  if (s->confine) {
    int cf_step = 0;
    int crc = wn_confine_apply(&c->confine, -1, &cf_step);
    if (crc < 0) child_fail(c, X_CONFINE, cf_step, -crc);
  }
  TRACE();
  child_fail(c, X_EXEC, 0, exec_search(c));
}

static int exec_stage1(void *arg) {
  struct exec_ctx *c = arg;
  /* Signals stay blocked here (inherited from the caller): no handler of the caller may run on this stack. */
  TRACE();
  for (int i = 0; i < c->n_cg; i++)
    if (write(c->cg_fds[i], "0", 1) < 0) child_fail(c, X_CGROUP_JOIN, i, errno);
  TRACE();
  /* The cgroup namespace is entered by the child: CLONE_INTO_CGROUP is checked against ours. */
  if (setns(c->ns_pidfd, CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWPID) < 0)
    child_fail(c, X_SETNS, 0, errno);
  TRACE();
  const int flags = CLONE_VM | CLONE_VFORK | CLONE_PARENT | CLONE_PARENT_SETTID | (c->shared_files ? CLONE_FILES : 0);
  pid_t pid = -1;
  int into = 0;
  if (c->unified_dir >= 0) {
    /* clone3 wants exit_signal 0 with CLONE_PARENT (the caller's own exit signal, SIGCHLD, is used) */
    pid = wn_clone3(exec_child, c, c->child_stack, c->child_stack_size, (uint64_t)flags | CLONE_INTO_CGROUP, 0,
                    c->unified_dir, NULL, (pid_t *)&c->child_tid);
    into = !(pid < 0 && (errno == ENOSYS || errno == E2BIG));
  }
  if (!into) {
    if (c->unified_procs >= 0 && write(c->unified_procs, "0", 1) < 0) child_fail(c, X_CGROUP_JOIN, c->n_cg, errno);
    pid = clone(exec_child, c->child_stack + c->child_stack_size, flags | SIGCHLD, c, (pid_t *)&c->child_tid);
  }
  if (pid < 0) child_fail(c, X_CLONE, 0, errno);
  c->child_pid = pid;
  return 0;
}

/* ---- parent side -------------------------------------------------------------- */

int wn_exec_spec_check(const wn_exec_spec *s, wn_error *e) {
  if (s->init_pid < 1 || s->init_pid > WN_PID_MAX)
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "initPid must be 1..%d", WN_PID_MAX);
  if (wn_check_id(e, "cgroup", s->cgroup) < 0) return -1;
  if (s->argc < 1 || s->argc > WN_MAX_ARGS || s->argv == NULL || s->argv[s->argc] != NULL)
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "argv must have 1..%d entries", WN_MAX_ARGS);
  if (s->envc > WN_MAX_ARGS || s->envp == NULL || s->envp[s->envc] != NULL)
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "env must have at most %d entries", WN_MAX_ARGS);
  size_t total = 0;
  for (size_t i = 0; i < s->argc; i++) {
    size_t n = strlen(s->argv[i]);
    if (n > WN_MAX_ARG_LEN) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "argv[%zu] is longer than %d bytes", i, WN_MAX_ARG_LEN);
    total += n + 1;
  }
  if (s->argv[0][0] == '\0') return wn_fail(e, WN_INVALID_ARGUMENT, 0, "argv[0] must not be empty");
  for (size_t i = 0; i < s->envc; i++) {
    const char *kv = s->envp[i];
    size_t n = strlen(kv);
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "env[%zu] must be KEY=value", i);
    if (n > WN_MAX_ARG_LEN) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "env[%zu] is longer than %d bytes", i, WN_MAX_ARG_LEN);
    total += n + 1;
  }
  if (total > WN_MAX_ARGV_TOTAL)
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "argv and env exceed %d bytes in total", WN_MAX_ARGV_TOTAL);
  if (wn_check_abs_path(e, "cwd", s->cwd) < 0) return -1;
  if (s->uid == (uid_t)-1 || s->gid == (gid_t)-1) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "uid/gid must be 0..4294967294");
  if (s->stdio != WN_STDIO_PIPES && s->stdio != WN_STDIO_PTY && s->stdio != WN_STDIO_INHERIT)
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "bad stdio mode");
  if (s->stdio == WN_STDIO_PTY && (s->pty_cols < 1 || s->pty_cols > 10000 || s->pty_rows < 1 || s->pty_rows > 10000))
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "pty cols/rows must be 1..10000");
  if (wn_confine_check(s->confine, e) < 0) return -1;
  if (s->isolate) {
    const char *why = wn_isolate_invalid(s->isolate);
    if (why) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "%s", why);
  }
  return 0;
}

static const char *step_name(int step) {
  switch (step) {
    case X_SETNS: return "setns into the sandbox namespaces";
    case X_CLONE: return "clone into the sandbox";
    case X_SETSID: return "setsid";
    case X_STDIO: return "set up stdio";
    case X_CTTY: return "set controlling terminal (TIOCSCTTY)";
    case X_CLOSE_FDS: return "close_range";
    case X_CORE_SCHED: return "share core-scheduling cookie";
    case X_CAPS: return "drop capabilities";
    case X_SETGROUPS: return "setgroups";
    case X_SETGID: return "setgid";
    case X_SETUID: return "setuid";
    case X_SCHED_IDLE: return "sched_setscheduler SCHED_IDLE";
    case X_NNP: return "prctl PR_SET_NO_NEW_PRIVS";
  }
  return "exec setup";
}

static int report_error(const struct exec_ctx *c, const struct child_report *r, wn_error *e) {
  const wn_exec_spec *s = c->s;
  switch (r->step) {
    case X_CGROUP_JOIN: {
      const wn_cg_layout *l;
      char path[512] = "?";
      if (wn_cg_layout_get(&l, NULL) == 0 && r->index >= 0 && r->index <= c->n_cg)
        wn_cg_path(l, r->index == c->n_cg ? WN_CG_UNIFIED : c->cg_roles[r->index], s->cgroup, path, sizeof path);
      return wn_fail(e, WN_CGROUP_ERROR, r->err, "join cgroup %s/cgroup.procs", path);
    }
    case X_CHDIR: return wn_fail(e, WN_SPAWN_ERROR, r->err, "chdir %s", s->cwd);
    case X_EXEC: return wn_fail(e, WN_SPAWN_ERROR, r->err, "exec %s", s->argv[0]);
    case X_SETUID: return wn_fail(e, WN_SPAWN_ERROR, r->err, "setuid %u", (unsigned)s->uid);
    case X_SETGID: return wn_fail(e, WN_SPAWN_ERROR, r->err, "setgid %u", (unsigned)s->gid);
    case X_CONFINE: return wn_fail(e, WN_SPAWN_ERROR, r->err, "confine: %s", wn_confine_step_name(r->index));
    case X_ISOLATE: return wn_fail(e, WN_SPAWN_ERROR, r->err, "isolate: %s", wn_isolate_step_name(r->index));
    case X_CLONE:
      if (r->err == ENOMEM)
        return wn_fail(e, WN_SANDBOX_NOT_RUNNING, r->err, "clone into sandbox %s (its init has exited)", s->cgroup);
      break;
  }
  return wn_fail(e, WN_SPAWN_ERROR, r->err, "%s", step_name(r->step));
}

static int set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -1;
  return fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Open the sandbox's own /dev/pts/ptmx through /proc/<pid>/root without following
   anything the sandbox controls out of its root. */
static int open_sandbox_ptmx(pid_t init_pid, wn_error *e) {
  char root[64];
  snprintf(root, sizeof root, "/proc/%d/root", (int)init_pid);
  cleanup_fd int rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (rootfd < 0) return wn_fail_errno(e, WN_SPAWN_ERROR, "open %s", root);
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = O_RDWR | O_NOCTTY | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS;
  cleanup_fd int fd = (int)syscall(SYS_openat2, rootfd, "dev/pts/ptmx", &how, sizeof how);
  if (fd < 0) return wn_fail_errno(e, WN_SPAWN_ERROR, "open %s/dev/pts/ptmx", root);
  struct statfs sfs;
  if (fstatfs(fd, &sfs) < 0) return wn_fail_errno(e, WN_SPAWN_ERROR, "fstatfs %s/dev/pts/ptmx", root);
  if (sfs.f_type != DEVPTS_SUPER_MAGIC)
    return wn_fail(e, WN_SPAWN_ERROR, EINVAL, "%s/dev/pts/ptmx is not on a devpts filesystem", root);
  return wn_steal_fd(&fd);
}

static void wait_reap(pid_t pid) {
  while (waitpid(pid, NULL, __WALL) < 0 && errno == EINTR) {
  }
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

int wn_exec(const wn_exec_spec *s, wn_exec_result *r, wn_error *e) {
  r->pid = 0;
  r->pidfd = r->stdin_fd = r->stdout_fd = r->stderr_fd = r->status_fd = r->pty_fd = -1;
  if (wn_exec_spec_check(s, e) < 0) return -1;

  struct exec_ctx c;
  memset(&c, 0, sizeof c);
  c.s = s;
  c.errfd = c.ns_pidfd = c.unified_dir = c.unified_procs = -1;
  if (s->confine) c.confine = *s->confine;
  int g = -1; /* the slot group, when the child shares the table */
  for (int i = 0; i < 4; i++) c.child_fds[i] = -1;
  c.path_env = DEFAULT_PATH;
  for (size_t i = 0; i < s->envc; i++)
    if (strncmp(s->envp[i], "PATH=", 5) == 0) c.path_env = s->envp[i] + 5;

  int frozen = wn_cg_is_frozen(s->cgroup, e);
  if (frozen < 0) {
    if (e && e->errnum == ENOENT) e->code = WN_SANDBOX_NOT_RUNNING;
    return -1;
  }
  if (frozen) return wn_fail(e, WN_SANDBOX_NOT_RUNNING, 0, "sandbox %s is frozen", s->cgroup);

  cleanup_fd int ns_pidfd = wn_pidfd_open(s->init_pid, 0);
  if (ns_pidfd < 0) return wn_fail_errno(e, WN_SANDBOX_NOT_RUNNING, "pidfd_open sandbox init %d", (int)s->init_pid);
  /* The pid must be the init of this sandbox (not a recycled pid): check its cgroup, then that the
     pidfd still refers to a live process, so what we read was about the process we hold. */
  int in_group = wn_cg_pid_in_group(s->init_pid, s->cgroup, e);
  if (in_group < 0) return -1;
  if (!in_group)
    return wn_fail(e, WN_SANDBOX_NOT_RUNNING, ESRCH, "process %d is not in cgroup %s", (int)s->init_pid, s->cgroup);
  c.ns_pidfd = ns_pidfd;
  c.core_share = wn_core_sched_supported();

  /* stdio */
  int parent_fds[4] = {-1, -1, -1, -1}; /* stdin(w), stdout(r), stderr(r), status(r) */
  int pty_master = -1;
  int rc = -1;
  if (s->stdio == WN_STDIO_PIPES) {
    for (int i = 0; i < 3; i++) {
      int p[2];
      if (pipe2(p, O_CLOEXEC) < 0) {
        wn_fail_errno(e, WN_SPAWN_ERROR, "pipe2");
        goto out;
      }
      if (i == 0) {
        c.child_fds[0] = p[0];
        parent_fds[0] = p[1];
      } else {
        c.child_fds[i] = p[1];
        parent_fds[i] = p[0];
      }
    }
    c.n_child_fds = 3;
  } else if (s->stdio == WN_STDIO_PTY) {
    pty_master = open_sandbox_ptmx(s->init_pid, e);
    if (pty_master < 0) goto out;
    int unlock = 0;
    if (ioctl(pty_master, TIOCSPTLCK, &unlock) < 0) {
      wn_fail_errno(e, WN_SPAWN_ERROR, "unlockpt");
      goto out;
    }
    struct winsize ws = {.ws_row = (unsigned short)s->pty_rows, .ws_col = (unsigned short)s->pty_cols};
    if (ioctl(pty_master, TIOCSWINSZ, &ws) < 0) {
      wn_fail_errno(e, WN_SPAWN_ERROR, "set pty window size");
      goto out;
    }
    int slave = ioctl(pty_master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (slave < 0) {
      wn_fail_errno(e, WN_SPAWN_ERROR, "open pty slave (TIOCGPTPEER)");
      goto out;
    }
    c.child_fds[0] = slave;
    c.child_fds[1] = slave;
    c.child_fds[2] = slave;
    c.n_child_fds = 3;
    c.want_ctty = 1;
  }
  if (s->stdio != WN_STDIO_INHERIT && (s->status_pipe || s->status_socket)) {
    int p[2];
    if (s->status_socket ? socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, p) < 0 : pipe2(p, O_CLOEXEC) < 0) {
      wn_fail_errno(e, WN_SPAWN_ERROR, s->status_socket ? "socketpair" : "pipe2");
      goto out;
    }
    c.child_fds[3] = p[1];
    parent_fds[3] = p[0];
    c.n_child_fds = 4;
  }
  if (s->stdio == WN_STDIO_INHERIT) {
    c.keep_from = 4; /* 0..2 and fd 3 of the caller pass through */
    c.want_ctty = isatty(0) ? 2 : 0;
  } else {
    c.keep_from = c.n_child_fds;
  }
  /* /proc reads are done: make sure the init we checked is still the process we hold. */
  if (wn_pidfd_send_signal(ns_pidfd, 0) < 0) {
    wn_fail_errno(e, WN_SANDBOX_NOT_RUNNING, "sandbox init %d", (int)s->init_pid);
    goto out;
  }

  if (wn_cg_open_procs(s->cgroup, c.cg_fds, c.cg_roles, &c.n_cg, &c.unified_dir, &c.unified_procs, e) < 0) {
    if (e && e->errnum == ENOENT) e->code = WN_SANDBOX_NOT_RUNNING;
    goto out;
  }

  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) < 0) {
    wn_fail_errno(e, WN_SPAWN_ERROR, "pipe2");
    goto out;
  }
  int err_rd = pipefd[0];
  int err_wr = pipefd[1];
  c.errfd = err_wr;
  for (int i = 0; i < 4; i++) c.child_src[i] = c.child_fds[i];
  /* What the child needs, in slots below files_top (the descriptor table, at the top). Inherit
     mode (warren-nsexec on a terminal) passes the caller's own 0..3 through: it copies. */
  if (s->stdio != WN_STDIO_INHERIT) g = wn_slots_take();
  if (g >= 0) {
    int ok = 1;
    for (int i = 0; i < c.n_child_fds && ok; i++) ok = (c.child_src[i] = wn_slot_place(g, i, c.child_fds[i])) >= 0;
    if (ok) ok = (c.errfd = wn_slot_place(g, 4, err_wr)) >= 0;
    if (ok && c.confine.active && c.confine.ll_have_ruleset) ok = (c.confine.ll_ruleset_fd = wn_slot_place(g, 5, s->confine->ll_ruleset_fd)) >= 0;
    if (ok) {
      c.shared_files = 1;
      c.files_top = slot_top;
    } else {
      wn_slots_give(g);
      g = -1;
      for (int i = 0; i < 4; i++) c.child_src[i] = c.child_fds[i];
      c.errfd = err_wr;
      if (s->confine) c.confine.ll_ruleset_fd = s->confine->ll_ruleset_fd;
    }
  }

  char *stacks = mmap(NULL, 2 * STAGE_STACK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stacks == MAP_FAILED) {
    wn_fail_errno(e, WN_SPAWN_ERROR, "mmap child stacks");
    close(err_rd);
    close(err_wr);
    wn_slots_give(g);
    goto out;
  }
  c.child_stack = stacks + STAGE_STACK_SIZE;
  c.child_stack_size = STAGE_STACK_SIZE;

  TRACE();
  wn_protect_memory();
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t stage1 = clone(exec_stage1, stacks + STAGE_STACK_SIZE, CLONE_VM | CLONE_VFORK | SIGCHLD | (c.shared_files ? CLONE_FILES : 0), &c);
  int clone_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  TRACE();
  if (stage1 > 0) wait_reap(stage1);
  TRACE();
  munmap(stacks, 2 * STAGE_STACK_SIZE);
  close(err_wr);
  /* The child is ours to reap (CLONE_PARENT) whatever happened to stage 1: left unreaped, it would
     keep the sandbox's init from finishing its exit. */
  pid_t child = c.child_pid > 0 ? c.child_pid : c.child_tid;
  int child_reaped = 0;
  if (c.child_pid <= 0 && child > 0) {
    /* Stage 1 died (killed) before clone returned in it, so the child may not have exec'd, nor
       left the shared table yet: it goes before its slots are given to another exec. */
    kill(child, SIGKILL);
    wait_reap(child);
    child_reaped = 1;
  }
  /* Otherwise the child has exec'd or exited (vfork): it holds its own table now. */
  wn_slots_give(g);
  if (stage1 < 0) {
    close(err_rd);
    wn_fail(e, WN_SPAWN_ERROR, clone_errno, "clone exec stage");
    goto out;
  }

  struct child_report rep;
  ssize_t got;
  do got = read(err_rd, &rep, sizeof rep);
  while (got < 0 && errno == EINTR);
  int read_errno = errno;
  close(err_rd);
  /* Failed: the child reported why (it has exited), or the report broke off, or stage 1 died
     (killed) before clone returned in it, so the child may not have exec'd. */
  if (got != 0 || c.child_pid <= 0) {
    if (child > 0 && !child_reaped) {
      if (got != (ssize_t)sizeof rep) kill(child, SIGKILL);
      wait_reap(child);
    }
    if (got == (ssize_t)sizeof rep)
      report_error(&c, &rep, e);
    else if (got != 0)
      wn_fail(e, WN_SPAWN_ERROR, got < 0 ? read_errno : EIO, "read exec status");
    else
      wn_fail(e, WN_SPAWN_ERROR, EIO, "exec stage exited without a child");
    goto out;
  }
  r->pid = c.child_pid;
  r->pidfd = wn_pidfd_open(c.child_pid, 0);
  if (r->pidfd < 0) {
    /* Cannot happen for our own unreaped child. */
    wn_fail_errno(e, WN_SPAWN_ERROR, "pidfd_open %d", (int)c.child_pid);
    kill(c.child_pid, SIGKILL);
    wait_reap(c.child_pid);
    goto out;
  }
  for (int i = 0; i < 4; i++)
    if (parent_fds[i] >= 0 && set_nonblock(parent_fds[i]) < 0) {
      /* fcntl on our own pipe cannot fail; keep going */
    }
  if (pty_master >= 0) set_nonblock(pty_master);
  r->stdin_fd = parent_fds[0];
  r->stdout_fd = parent_fds[1];
  r->stderr_fd = parent_fds[2];
  r->status_fd = parent_fds[3];
  r->pty_fd = pty_master;
  for (int i = 0; i < 4; i++) parent_fds[i] = -1;
  pty_master = -1;
  rc = 0;

out:
  for (int i = 0; i < c.n_cg; i++) close(c.cg_fds[i]);
  close_fd(&c.unified_dir);
  close_fd(&c.unified_procs);
  /* child ends (the pty slave appears up to three times) */
  for (int i = 0; i < 4; i++) {
    int fd = c.child_fds[i];
    if (fd < 0) continue;
    for (int j = i + 1; j < 4; j++)
      if (c.child_fds[j] == fd) c.child_fds[j] = -1;
    close(fd);
  }
  for (int i = 0; i < 4; i++) close_fd(&parent_fds[i]);
  close_fd(&pty_master);
  return rc;
}
