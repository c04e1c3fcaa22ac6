/*
 * Confinement of every sandbox process: seccomp, Landlock, AppArmor
 * change-onexec and rlimits. Applied by the spawn child (sandbox pid 1) and the
 * exec child (every process entered with nsexec) as the last steps before
 * execve, after the capability drop, the uid switch and no_new_privs.
 *
 * The child-side function is async-signal-safe: raw syscalls only, no malloc.
 * Everything it reads (the BPF program, the path lists) is prepared by the
 * caller first; the seccomp program is built once per choice set and cached.
 */
#ifndef WARREN_CONFINE_H
#define WARREN_CONFINE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct sock_fprog;
struct wn_error;

/* Optional seccomp groups. Each bit ALLOWS the group; everything else in the default
   denylist is always denied with EPERM. */
enum {
  WN_SC_ALLOW_PTRACE = 1 << 0,      /* ptrace, process_vm_readv/writev */
  WN_SC_ALLOW_IO_URING = 1 << 1,    /* io_uring_setup/enter/register */
  WN_SC_ALLOW_USERFAULTFD = 1 << 2, /* userfaultfd */
  WN_SC_ALLOW_PERF = 1 << 3,        /* perf_event_open */
  WN_SC_ALLOW_ALL = 0xf,
  /* Internal, never from a policy: unshare(2) for the FnCall python3 zygote, whose children make
     their user, IPC and network namespaces themselves (every child then stacks the full filter). */
  WN_SC_ZYGOTE = 1 << 4,
};

#define WN_CONFINE_MAX_PATHS 32

/* Landlock scope bits (ABI 6). */
#define WN_LL_SCOPE_ABSTRACT_UNIX 1u
#define WN_LL_SCOPE_SIGNAL 2u

typedef struct wn_confine {
  int active;                        /* 0: nothing is applied */
  const struct sock_fprog *seccomp;  /* NULL: no filter */
  int landlock_abi;                  /* 0: no Landlock; else the ABI the rules are written for */
  const char *ll_rw[WN_CONFINE_MAX_PATHS]; /* full access beneath (paths inside the sandbox root) */
  int n_rw;
  const char *ll_ro[WN_CONFINE_MAX_PATHS]; /* read + execute beneath */
  int n_ro;
  unsigned ll_scope;                 /* WN_LL_SCOPE_* (ignored below ABI 6) */
  /* writableTopLevel: every top-level directory of the root that exists when the ruleset
     is built, except these (e.g. /usr, /etc), gets full access too. */
  int ll_rw_top;
  const char *ll_protect[WN_CONFINE_MAX_PATHS];
  int n_protect;
  const char *apparmor_profile;      /* NULL: none; else written as "exec <profile>" before execve */
  int64_t rlimit_fsize;              /* bytes; < 0: unchanged */
  int64_t rlimit_nofile;             /* < 0: unchanged */
  /* A ready Landlock ruleset (wn_landlock_ruleset_build) used instead of building one in the child:
     the addon caches one per sandbox, so an exec costs one landlock_restrict_self. */
  int ll_have_ruleset;
  int ll_ruleset_fd;
} wn_confine;

/* Steps reported as the child_report index (step S_CONFINE / X_CONFINE). */
enum { WN_CF_RLIMIT = 1, WN_CF_APPARMOR, WN_CF_LANDLOCK_CREATE, WN_CF_LANDLOCK_RULE, WN_CF_LANDLOCK_RESTRICT, WN_CF_SECCOMP };
const char *wn_confine_step_name(int step);

/* Child side. Returns 0 or -errno; *step gets the WN_CF_* that failed. exec_fd >= 0: an O_PATH fd of
   the binary about to be exec'd from outside the sandbox root (warren-init), granted read+execute. */
int wn_confine_apply(const wn_confine *c, int exec_fd, int *step);

/* Validate paths / ranges (caller side). */
int wn_confine_check(const wn_confine *c, struct wn_error *e);

/* The default seccomp filter with the optional groups in `allow` let through. Built once per
   `allow` value and cached for the life of the process (thread-safe); never freed. */
const struct sock_fprog *wn_seccomp_filter(unsigned allow);

/* Build the Landlock ruleset of `c` with its paths resolved inside root_fd (an O_PATH fd of a
   sandbox's root, e.g. /proc/<init>/root; RESOLVE_IN_ROOT, no symlinks). Returns an O_CLOEXEC fd. */
int wn_landlock_ruleset_build(const wn_confine *c, int root_fd, struct wn_error *e);

/* landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION): the ABI (>= 1), or -errno. */
int wn_landlock_abi(void);
/* prctl(PR_GET_SECCOMP) works and the kernel has SECCOMP_MODE_FILTER: 1, else 0. */
int wn_seccomp_supported(void);
/* Probe BPF-LSM: try BPF_PROG_LOAD of type LSM. Returns 0 when the kernel would accept LSM programs
   (it rejects the probe for its missing BTF id with EINVAL), else -errno (EPERM: refused here). */
int wn_bpf_lsm_probe(void);

#ifdef __cplusplus
}
#endif
#endif
