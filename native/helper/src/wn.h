/*
 * Warren native helper: shared C declarations.
 *
 * Error convention (see ../ERRORS.md): every fallible function returns a
 * negative value on failure and fills a `wn_error` (stable code + errno +
 * message naming the step and path). Resources are released by scope-based
 * cleanup attributes (cleanup_fd, cleanup_free), so early returns never leak.
 *
 * This header is included by the N-API addon (C++) and by the static helper
 * binaries (warren-nsexec); nothing here may depend on Node.
 */
#ifndef WARREN_WN_H
#define WARREN_WN_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Stable codes; the names are the WarrenError codes of src/errors.ts. */
typedef enum {
  WN_OK = 0,
  WN_INVALID_ARGUMENT,
  WN_PATH_ESCAPE,
  WN_FILE_NOT_FOUND,
  WN_ALREADY_EXISTS,
  WN_SANDBOX_NOT_RUNNING,
  WN_NOT_SUPPORTED,
  WN_NATIVE_ERROR,
  WN_CGROUP_ERROR,
  WN_MOUNT_ERROR,
  WN_SPAWN_ERROR,
  WN_TIMEOUT,
  WN_FORBIDDEN,
} wn_code;

typedef struct wn_error {
  wn_code code;
  int errnum; /* errno of the failed syscall, 0 when the failure is not a syscall's */
  char msg[1024];
} wn_error;

const char *wn_code_name(wn_code code);
/* Symbolic errno name ("EINVAL"); never NULL. */
const char *wn_errno_name(int errnum);
/* Fill `e` and return -1. When errnum != 0 the message gets ": ENAME" appended. */
int wn_fail(wn_error *e, wn_code code, int errnum, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Same, errnum taken from errno. */
#define wn_fail_errno(e, code, ...) wn_fail((e), (code), errno, __VA_ARGS__)

/* ---- scope-based cleanup ---------------------------------------------- */
static inline void wn_closep(int *fd) {
  if (*fd >= 0) {
    int saved = errno;
    close(*fd);
    errno = saved;
  }
}
static inline void wn_freep(void *p) {
  void **pp = (void **)p;
  int saved = errno;
  free(*pp);
  errno = saved;
}
#define cleanup_fd __attribute__((cleanup(wn_closep)))
#define cleanup_free __attribute__((cleanup(wn_freep)))
/* Hand ownership of an fd out of a cleanup_fd scope. */
static inline int wn_steal_fd(int *fd) {
  int r = *fd;
  *fd = -1;
  return r;
}

/* ---- validation (shared by the addon and the CLI helpers) ------------- */
#define WN_MAX_PATH 4095
#define WN_MAX_ARGS 4096
#define WN_MAX_ARG_LEN (128 * 1024)
#define WN_MAX_ARGV_TOTAL (2 * 1024 * 1024)
#define WN_MAX_LOWER_DIRS 128
#define WN_PID_MAX 4194304

/* ^[a-z0-9][a-z0-9-]{0,62}$ */
int wn_valid_id(const char *s);
/* RFC 1123-ish host name: ^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$ */
int wn_valid_hostname(const char *s);
/* Absolute, normalized (no "//", no "." or ".." components, no trailing '/'), < 4096 bytes. */
int wn_valid_abs_path(const char *s);
int wn_check_id(wn_error *e, const char *what, const char *s);
int wn_check_abs_path(wn_error *e, const char *what, const char *s);

/* ---- small syscall helpers ------------------------------------------- */
/* Write a whole string to dirfd/name (O_WRONLY|O_CLOEXEC, no O_CREAT). Returns -1/errno. */
int wn_write_file_at(int dirfd, const char *path, const char *data);
/* Read up to cap-1 bytes, NUL-terminate. Returns length or -1/errno. */
ssize_t wn_read_file_at(int dirfd, const char *path, char *buf, size_t cap);
/* Read a whole file into a malloc'd, NUL-terminated buffer. Returns length or -1/errno. */
ssize_t wn_read_file_alloc(const char *path, char **out);
/* Parse a decimal unsigned integer (trailing whitespace allowed). */
int wn_parse_u64(const char *s, uint64_t *out);

/* In a child about to become a sandbox process: close every fd >= `from` except the `n` in `keep`
   (left close-on-exec). A child of the gateway inherits a copy of its descriptor table, one pidfd
   per sandbox; closed now, none is left to push a fd the child opens later (a Landlock ruleset,
   an O_PATH walk) past the sandbox's own RLIMIT_NOFILE. Returns 0 or -errno. */
int wn_close_fds_except(int from, const int *keep, int n);

int wn_pidfd_open(pid_t pid, unsigned flags);
int wn_pidfd_send_signal(int pidfd, int sig);
/* Start time (field 22 of /proc/pid/stat) in clock ticks; 0 when the process does not exist. */
int wn_process_start_time(pid_t pid, uint64_t *out, wn_error *e);

/* ---- cgroups ----------------------------------------------------------- */
enum {
  WN_CG_CPU = 0,
  WN_CG_CPUACCT,
  WN_CG_MEMORY,
  WN_CG_PIDS,
  WN_CG_FREEZER,
  WN_CG_UNIFIED, /* v2: the only hierarchy; v1: the controller-less cgroup2 tree (may be absent) */
  WN_CG_NROLES
};

typedef struct wn_cg_layout {
  int version; /* 1 or 2 */
  /* Mount point per role ("" when absent). On v2 every role maps to the unified mount. */
  char mount[WN_CG_NROLES][256];
  /* Index of the first role with the same mount (co-mounted / v2), else its own index. */
  int same_as[WN_CG_NROLES];
} wn_cg_layout;

extern const char *const wn_cg_role_names[WN_CG_NROLES];

typedef struct wn_cg_limits {
  /* -2 = not given (unchanged); -1 = unlimited; else the value. */
  int64_t cpu_quota_us;
  int64_t cpu_period_us;
  int64_t memory_bytes;
  int64_t memory_swap_bytes; /* memory+swap; -2 with memory given = same as memory (no swap) */
  int64_t pids_max;
} wn_cg_limits;
#define WN_LIMIT_UNSET (-2)
#define WN_LIMIT_MAX (-1)
void wn_cg_limits_init(wn_cg_limits *l);
int wn_cg_limits_check(const wn_cg_limits *l, wn_error *e);

typedef struct wn_cg_stats {
  uint64_t memory_current;
  uint64_t memory_peak;
  uint64_t oom_kills;
  uint64_t cpu_usage_us;
  uint64_t pids_current;
  int frozen;
} wn_cg_stats;

/* Detected once per process and cached (thread-safe). */
int wn_cg_layout_get(const wn_cg_layout **out, wn_error *e);
/* Directory of group `name` for `role` (parent group when name == NULL). Returns -1 if role absent. */
int wn_cg_path(const wn_cg_layout *l, int role, const char *name, char *buf, size_t cap);

int wn_cg_create(const char *name, const wn_cg_limits *lim, wn_error *e);
int wn_cg_update(const char *name, const wn_cg_limits *lim, wn_error *e);
int wn_cg_stats_read(const char *name, wn_cg_stats *st, wn_error *e);
int wn_cg_oom_kills(const char *name, uint64_t *out, wn_error *e);
/* malloc'd array of pids in *out (caller frees), count in *n. */
int wn_cg_procs(const char *name, pid_t **out, size_t *n, wn_error *e);
int wn_cg_freeze(const char *name, int frozen, wn_error *e);
/* Returns number of processes signalled (>= 0) or -1. */
int wn_cg_kill(const char *name, wn_error *e);
int wn_cg_destroy(const char *name, wn_error *e);
/* 1 exists, 0 not; -1 error. */
int wn_cg_exists(const char *name, wn_error *e);
int wn_cg_attach(const char *name, pid_t pid, wn_error *e);
/* 1 when the group is frozen or freezing (a process joining it would stop). */
int wn_cg_is_frozen(const char *name, wn_error *e);
/* Open <group>/cgroup.procs O_WRONLY|O_CLOEXEC in every distinct hierarchy (for "0" writes by a child). */
#define WN_CG_MAX_FDS WN_CG_NROLES
/* roles[i] (nullable) receives the WN_CG_* role of fds[i]. When unified_dir is not NULL, the cgroup2
   group (v2, or the v1 hybrid's unified tree) is not among fds: *unified_dir gets an O_DIRECTORY fd of it
   (for CLONE_INTO_CGROUP) and *unified_procs its cgroup.procs (fallback); both -1 when it is absent. */
int wn_cg_open_procs(const char *name, int fds[WN_CG_MAX_FDS], int roles[WN_CG_MAX_FDS], int *n, int *unified_dir,
                     int *unified_procs, wn_error *e);
/* Is `pid` a member of group `name` (reads /proc/pid/cgroup)? 1 yes, 0 no, -1 error. */
int wn_cg_pid_in_group(pid_t pid, const char *name, wn_error *e);

/* clone3 with a private stack: the child runs fn(arg) on [stack, stack+stack_size) and exits with
   its result. flags are clone3 flags (CLONE_INTO_CGROUP uses cgroup_fd, CLONE_PIDFD fills *pidfd,
   CLONE_PARENT_SETTID stores the child's pid in *parent_tid before the child runs).
   -1/ENOSYS where clone3 is unavailable (old kernel or architecture without the trampoline). */
pid_t wn_clone3(int (*fn)(void *), void *arg, char *stack, size_t stack_size, uint64_t flags, int exit_signal,
                int cgroup_fd, int *pidfd, pid_t *parent_tid);

/* ---- capabilities / child-side helpers (async-signal-safe) ------------ */
/* Docker's default set minus NET_RAW. */
extern const uint64_t wn_default_caps;
/* Drop the bounding set to `keep`, set E/P/I to `keep`, clear ambient. Returns -errno. */
int wn_caps_drop(uint64_t keep);
/* PR_SET_DUMPABLE 0 for the calling process. The spawn/exec children share the caller's memory until
   they exec; once one has joined a sandbox, a process in it with the same uid and capabilities could
   otherwise ptrace it or read /proc/<pid>/mem and /proc/<pid>/fd, i.e. the caller's memory and fds.
   Side effect for the caller (a root daemon): no core dumps. */
void wn_protect_memory(void);
/* Reset every signal disposition to SIG_DFL and unblock everything. */
void wn_child_reset_signals(void);

/* ---- spawn ------------------------------------------------------------- */
typedef struct wn_spawn_spec {
  const char *id;
  const char *hostname;
  const char *const *lower_dirs;
  size_t n_lower;
  const char *upper_dir;
  const char *work_dir;
  const char *rootfs_dir;
  const char *init_path;
  int sched_idle;
  int core_sched;
  uint64_t shm_bytes; /* 0 = default 64 MiB */
  /* Non-NULL: bind this host directory at /dev/shm instead of a tmpfs of its own, so shared memory
     counts against the same quota as the writable layer (a directory on the sandbox's disk tmpfs). */
  const char *shm_dir;
  /* Non-NULL: bind this host directory (on the same disk tmpfs) at /dev instead of a 64 KiB tmpfs. */
  const char *dev_dir;
  const struct wn_confine *confine; /* seccomp/Landlock/AppArmor/rlimits (confine.h); NULL = none */
  const char *netns_path; /* join this network namespace (a pooled /run/netns entry); NULL = new, loopback only */
  /* has_mnt_template: start from the mount namespace mnt_template_fd (wn_mnt_template_create)
     instead of a copy of the caller's, with clones of the mounts the sandbox uses (its layers,
     its disk) moved in. A flag, so that a zeroed spec never means fd 0. */
  int has_mnt_template;
  int mnt_template_fd;
  /* With the template: the template's mask tmpfs, bound over every masked directory. */
  const char *mask_dir;
  /* With the template: the template's sysfs (wn_mnt_template_create's `sysfs`), bound at /sys
     instead of a sysfs of the sandbox's own network namespace. */
  const char *sysfs_dir;
} wn_spawn_spec;

/* A mount namespace for new sandboxes (mnt_template.c): the caller's, less every mount that is
   not "/", /dev, /proc, /sys (and below) or a mount holding one of `keep`; with `mask` (an
   empty directory on a kept mount), an empty read-only tmpfs there for spawns to bind over
   the directories they mask (wn_spawn_spec.mask_dir); with `sysfs` (another such directory), a
   read-only sysfs of a network namespace of its own there, for spawns to bind at /sys
   (wn_spawn_spec.sysfs_dir). Returns its nsfs fd. */
int wn_mnt_template_create(const char *const *keep, size_t n_keep, const char *mask, const char *sysfs, wn_error *e);

typedef struct wn_spawn_result {
  pid_t pid;
  int pidfd;
  uint64_t start_time;
} wn_spawn_result;

int wn_spawn_sandbox(const wn_spawn_spec *s, wn_spawn_result *r, wn_error *e);
int wn_spawn_spec_check(const wn_spawn_spec *s, wn_error *e);

/* ---- exec (shared by the addon and warren-nsexec) --------------------- */
enum { WN_STDIO_PIPES = 0, WN_STDIO_PTY = 1, WN_STDIO_INHERIT = 2 };

typedef struct wn_exec_spec {
  pid_t init_pid;
  const char *cgroup;
  const char *const *argv; /* NULL-terminated */
  size_t argc;
  const char *const *envp; /* NULL-terminated */
  size_t envc;
  const char *cwd;
  uid_t uid;
  gid_t gid;
  int sched_idle;
  int stdio;      /* WN_STDIO_* */
  int pty_cols;   /* WN_STDIO_PTY */
  int pty_rows;
  int status_pipe; /* WN_STDIO_PIPES / WN_STDIO_PTY: extra pipe on the child's fd 3 */
  int status_socket; /* instead: a SOCK_SEQPACKET socket pair, one end on the child's fd 3 */
  const struct wn_confine *confine; /* seccomp/Landlock/AppArmor/rlimits (confine.h); NULL = none */
  const struct wn_isolate *isolate; /* FnCall per-invocation isolation (isolate.h); NULL = none */
} wn_exec_spec;

typedef struct wn_exec_result {
  pid_t pid;
  int pidfd;
  int stdin_fd, stdout_fd, stderr_fd, status_fd, pty_fd; /* -1 when absent */
} wn_exec_result;

/* Bring a process's swapped-out pages back (prefetch.c); *bytes: what was asked for. */
enum { WN_PREFETCH_TOUCH = 0, WN_PREFETCH_WILLNEED = 1 };
int wn_prefetch(pid_t pid, int mode, uint64_t *bytes, wn_error *e);
/* Push a process's private writable pages to swap (MADV_PAGEOUT); *bytes: the mappings' size. */
int wn_pageout(pid_t pid, uint64_t *bytes, wn_error *e);

int wn_exec_spec_check(const wn_exec_spec *s, wn_error *e);
int wn_exec(const wn_exec_spec *s, wn_exec_result *r, wn_error *e);
/* Reserve the descriptor slots wn_exec places its child's descriptors in (nsexec.c), while the
   process holds few: done by the first wn_exec otherwise, which may be too late to find room. */
void wn_exec_slots_reserve(void);
/* The slots themselves, for spawn.c too: a free group (or -1), fd placed in slot i of group g
   (close-on-exec; -1 on failure), the group put back to its placeholder and freed, and one past
   the highest slot (what a child that leaves the table keeps below). */
int wn_slots_take(void);
int wn_slot_place(int g, int i, int fd);
void wn_slots_give(int g);
int wn_slots_top(void);

/* ---- filesystem confined to a root ------------------------------------ */
enum { WN_OPEN_READ = 0, WN_OPEN_WRITE, WN_OPEN_APPEND, WN_OPEN_DIR };
/* Returns a new O_CLOEXEC fd or -1. */
/* The file-system identity an open runs with (the sandbox program's). */
#define WN_MAX_GROUPS 64
typedef struct wn_creds {
  uid_t uid;
  gid_t gid;
  int n_groups;
  gid_t groups[WN_MAX_GROUPS];
} wn_creds;
/* cr NULL: the caller's own credentials. */
int wn_open_in_root(const char *root_dir, const char *path, int how, mode_t mode, const wn_creds *cr, wn_error *e);
int wn_mkdir_in_root(const char *root_dir, const char *path, mode_t mode, int recursive, const wn_creds *cr, wn_error *e);

/* ---- mounts and misc --------------------------------------------------- */
enum {
  WN_MNT_RO = 1 << 0,
  WN_MNT_NOSUID = 1 << 1,
  WN_MNT_NODEV = 1 << 2,
  WN_MNT_NOEXEC = 1 << 3,
  WN_MNT_BIND = 1 << 4,
  WN_MNT_REC = 1 << 5,
  WN_MNT_PRIVATE = 1 << 6,
};
int wn_mount(const char *source, const char *target, const char *fstype, unsigned flags, const char *data, wn_error *e);
int wn_umount(const char *target, int detach, wn_error *e);
int wn_core_sched_supported(void);
int wn_set_sched_idle(pid_t pid, wn_error *e);
int wn_pty_resize(int fd, int cols, int rows, wn_error *e);

#ifdef __cplusplus
}
#endif
#endif
