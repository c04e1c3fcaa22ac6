/*
 * spawnSandbox: create a sandbox's pid 1.
 *
 * One clone3(CLONE_VM|CLONE_VFORK|CLONE_NEW{NS,PID,UTS,IPC,NET}|CLONE_INTO_CGROUP)
 * on a private stack, as posix_spawn does: no page-table copy of the (large) Node
 * process, and born in the cgroup2 group (a cgroup2 migration costs an RCU grace
 * period, ~10 ms here). Falls back to clone() + cgroup.procs writes without clone3.
 * The calling thread sleeps until the child has exec'd warren-init or failed.
 * The child shares our memory, so it only makes raw syscalls (no malloc, no
 * stdio, no locks); everything it needs (strings, fds) is prepared here first.
 * It reports a failure as {step, index, errno} through a CLOEXEC pipe.
 *
 * With a mount template (mnt_template.c) the clone has no CLONE_NEWNS: the child joins
 * the template, unshares a copy of its few mounts and moves in the clones of its layers
 * and disk made here, instead of copying every mount of the gateway's namespace.
 *
 * Child sequence: join the v1 cgroups (write "0" to each cgroup.procs), unshare the
 * cgroup namespace (so its root is the sandbox group), [join the template, unshare,
 * move the clones in], make / rprivate, mount
 * the overlay, chdir into it, build /proc /sys /dev, mask and read-only paths,
 * hostname, lo up, pivot_root + detach the old root, SCHED_IDLE / core
 * cookie, stdio -> /dev/null, drop capabilities, no_new_privs, execveat the
 * pre-opened warren-init.
 */
#include "wn.h"
#include "confine.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#ifndef SYS_open_tree
#define SYS_open_tree 428
#define SYS_move_mount 429
#endif
#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#define OPEN_TREE_CLOEXEC O_CLOEXEC
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#ifndef STATX_ATTR_MOUNT_ROOT
#define STATX_ATTR_MOUNT_ROOT 0x00002000
#endif

#ifndef PR_SCHED_CORE
#define PR_SCHED_CORE 62
#define PR_SCHED_CORE_CREATE 1
#define PR_SCHED_CORE_SCOPE_THREAD_GROUP 1
#endif

#ifdef WN_TRACE /* timing of the child's steps, for native/helper/bench only */
#include <time.h>
uint64_t wn_trace_ns[64];
int wn_trace_n;
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

#define CHILD_STACK_SIZE (256 * 1024)
#define DEFAULT_SHM_BYTES (64ull << 20)

enum op_kind { OP_MKDIR, OP_MOUNT, OP_DEVBIND, OP_SYMLINK, OP_MASK, OP_READONLY };

typedef struct setup_op {
  enum op_kind kind;
  const char *path; /* relative to the new root (cwd of the child) */
  const char *src;  /* mount source / symlink target / bind source */
  const char *fstype;
  unsigned long flags;
  const char *data; /* k_shm_data: ctx->shm_data */
  mode_t mode;
} setup_op;

#define MS_HARDEN (MS_NOSUID | MS_NODEV | MS_NOEXEC)
/* data marker: use the per-spawn "mode=1777,size=N" string */
static const char k_shm_data[] = "<shm>";
/* source marker: /sys, a bind of the spec's sysfs_dir when it has one */
static const char k_sysfs_src[] = "sysfs";
/* data marker: /dev, a bind of the spec's dev_dir when it has one */
static const char k_dev_data[] = "mode=755,size=64k,nr_inodes=64";

static const setup_op k_ops[] = {
    {OP_MKDIR, "proc", NULL, NULL, 0, NULL, 0555},
    {OP_MOUNT, "proc", "proc", "proc", MS_HARDEN, NULL, 0},
    {OP_MKDIR, "sys", NULL, NULL, 0, NULL, 0555},
    {OP_MOUNT, "sys", k_sysfs_src, "sysfs", MS_HARDEN | MS_RDONLY, NULL, 0},
    {OP_MKDIR, "dev", NULL, NULL, 0, NULL, 0755},
    /* nodev: device nodes made in /dev by the sandbox (it keeps CAP_MKNOD) stay inert;
       the bind-mounted host devices below are their own mounts and keep working. */
    /* Only the nodes and links below live here: a few inodes and 64 KiB, so /dev is no place to
       store data beside the disk quota (shared memory is /dev/shm, counted in that quota). */
    {OP_MOUNT, "dev", "tmpfs", "tmpfs", MS_NOSUID | MS_NODEV | MS_STRICTATIME, k_dev_data, 0},
    {OP_DEVBIND, "dev/null", "/dev/null", NULL, 0, NULL, 0666},
    {OP_DEVBIND, "dev/zero", "/dev/zero", NULL, 0, NULL, 0666},
    {OP_DEVBIND, "dev/full", "/dev/full", NULL, 0, NULL, 0666},
    {OP_DEVBIND, "dev/random", "/dev/random", NULL, 0, NULL, 0666},
    {OP_DEVBIND, "dev/urandom", "/dev/urandom", NULL, 0, NULL, 0666},
    {OP_DEVBIND, "dev/tty", "/dev/tty", NULL, 0, NULL, 0666},
    {OP_MKDIR, "dev/pts", NULL, NULL, 0, NULL, 0755},
    {OP_MOUNT, "dev/pts", "devpts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5", 0},
    {OP_SYMLINK, "dev/ptmx", "pts/ptmx", NULL, 0, NULL, 0},
    {OP_MKDIR, "dev/shm", NULL, NULL, 0, NULL, 01777},
    {OP_MOUNT, "dev/shm", "shm", "tmpfs", MS_HARDEN, k_shm_data, 0},
    {OP_SYMLINK, "dev/fd", "/proc/self/fd", NULL, 0, NULL, 0},
    {OP_SYMLINK, "dev/stdin", "/proc/self/fd/0", NULL, 0, NULL, 0},
    {OP_SYMLINK, "dev/stdout", "/proc/self/fd/1", NULL, 0, NULL, 0},
    {OP_SYMLINK, "dev/stderr", "/proc/self/fd/2", NULL, 0, NULL, 0},
    {OP_MASK, "proc/kcore", NULL, NULL, 0, NULL, 0},
    {OP_MASK, "proc/sysrq-trigger", NULL, NULL, 0, NULL, 0},
    {OP_MASK, "proc/keys", NULL, NULL, 0, NULL, 0},
    {OP_MASK, "proc/timer_list", NULL, NULL, 0, NULL, 0},
    {OP_MASK, "proc/sched_debug", NULL, NULL, 0, NULL, 0},
    {OP_MASK, "proc/latency_stats", NULL, NULL, 0, NULL, 0},
    {OP_MASK, "proc/acpi", NULL, NULL, 0, NULL, 0},
    {OP_MASK, "proc/scsi", NULL, NULL, 0, NULL, 0},
    {OP_MASK, "sys/firmware", NULL, NULL, 0, NULL, 0},
    {OP_MASK, "sys/devices/virtual/powercap", NULL, NULL, 0, NULL, 0},
    {OP_READONLY, "proc/bus", NULL, NULL, 0, NULL, 0},
    {OP_READONLY, "proc/fs", NULL, NULL, 0, NULL, 0},
    {OP_READONLY, "proc/irq", NULL, NULL, 0, NULL, 0},
    {OP_READONLY, "proc/sys", NULL, NULL, 0, NULL, 0},
};
#define N_OPS (sizeof k_ops / sizeof k_ops[0])

enum spawn_step {
  S_NONE = 0,
  S_CGROUP_JOIN,
  S_UNSHARE_CGROUP,
  S_MAKE_PRIVATE,
  S_OVERLAY,
  S_CHDIR_ROOT,
  S_OP,
  S_HOSTNAME,
  S_NETNS,
  S_LOOPBACK,
  S_PIVOT,
  S_DETACH_OLD,
  S_SCHED_IDLE,
  S_CORE_SCHED,
  S_STDIO,
  S_CLOSE_FDS,
  S_CAPS,
  S_NNP,
  S_EXEC,
  S_CONFINE, /* index = WN_CF_* step */
  S_TEMPLATE, /* index 0 setns, 1 unshare, 2+i move_mount of clone i */
};

struct child_report {
  int32_t step;
  int32_t index;
  int32_t err;
};

#define MAX_CLONES (WN_MAX_LOWER_DIRS + 1)

struct spawn_ctx {
  const wn_spawn_spec *s;
  int n_clones;                  /* detached clones of the mounts the sandbox uses (template mode) */
  int clone_fds[MAX_CLONES];
  const char *clone_at[MAX_CLONES];
  char disk_dir[WN_MAX_PATH];
  int errfd;
  int init_fd;
  int shared_files; /* the child shares the caller's table until it leaves it keeping fds below files_top */
  int files_top;
  wn_confine confine; /* the spec's, with the ruleset in its slot */
  int netns_fd; /* -1: a new network namespace */
  int cg_fds[WN_CG_MAX_FDS];
  int cg_roles[WN_CG_MAX_FDS];
  int n_cg;
  int unified_dir;   /* cgroup2 group: CLONE_INTO_CGROUP target */
  int unified_procs; /* its cgroup.procs, written only when clone3 is unavailable */
  int into_cgroup;   /* the child was born in the cgroup2 group */
  char overlay_opts[4096];
  char shm_data[64];
  const char *mask_dir; /* the tmpfs masked directories bind: the template's, else the first one's own */
};

static void __attribute__((noreturn)) child_fail(struct spawn_ctx *c, int step, int index, int err) {
  struct child_report r = {step, index, err};
  ssize_t w;
  do w = write(c->errfd, &r, sizeof r);
  while (w < 0 && errno == EINTR);
  _exit(127);
}

static int run_op(struct spawn_ctx *c, const setup_op *op) {
  struct stat st;
  switch (op->kind) {
    case OP_MKDIR:
      if (mkdir(op->path, op->mode) < 0 && errno != EEXIST) return -1;
      return 0;
    case OP_MOUNT:
      /* Every superblock a sandbox mounts costs each memory cgroup on the node a slot in its
         shrinker bookkeeping, so the node's memory grows with sandboxes x superblocks: /dev is
         a directory on the disk tmpfs when there is one, not a tmpfs of its own. */
      if (op->data == k_dev_data && c->s->dev_dir != NULL) {
        if (mount(c->s->dev_dir, op->path, NULL, MS_BIND, NULL) < 0) return -1;
        return mount(NULL, op->path, NULL, MS_BIND | MS_REMOUNT | op->flags, NULL);
      }
      if (op->src == k_sysfs_src && c->s->sysfs_dir != NULL) {
        if (mount(c->s->sysfs_dir, op->path, NULL, MS_BIND, NULL) < 0) return -1;
        return mount(NULL, op->path, NULL, MS_BIND | MS_REMOUNT | op->flags, NULL);
      }
      if (op->data == k_shm_data && c->s->shm_dir != NULL) {
        if (mount(c->s->shm_dir, op->path, NULL, MS_BIND, NULL) < 0) return -1;
        return mount(NULL, op->path, NULL, MS_BIND | MS_REMOUNT | op->flags, NULL);
      }
      return mount(op->src, op->path, op->fstype, op->flags, op->data == k_shm_data ? c->shm_data : op->data);
    case OP_DEVBIND: {
      int fd = open(op->path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, op->mode);
      if (fd < 0) return -1;
      close(fd);
      return mount(op->src, op->path, NULL, MS_BIND, NULL);
    }
    case OP_SYMLINK:
      if (symlink(op->src, op->path) < 0 && errno != EEXIST) return -1;
      return 0;
    case OP_MASK:
      if (fstatat(AT_FDCWD, op->path, &st, AT_SYMLINK_NOFOLLOW) < 0) return errno == ENOENT ? 0 : -1;
      if (S_ISDIR(st.st_mode)) {
        /* one empty read-only tmpfs for all masked directories (see OP_MOUNT on superblocks) */
        if (c->mask_dir == NULL) {
          if (mount("tmpfs", op->path, "tmpfs", MS_RDONLY | MS_HARDEN, "mode=555,size=4k") < 0) return -1;
          c->mask_dir = op->path;
          return 0;
        }
        if (mount(c->mask_dir, op->path, NULL, MS_BIND, NULL) < 0) return -1;
        return mount(NULL, op->path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_HARDEN, NULL);
      }
      return mount("/dev/null", op->path, NULL, MS_BIND, NULL);
    case OP_READONLY:
      if (fstatat(AT_FDCWD, op->path, &st, AT_SYMLINK_NOFOLLOW) < 0) return errno == ENOENT ? 0 : -1;
      if (mount(op->path, op->path, NULL, MS_BIND | MS_REC, NULL) < 0) return -1;
      return mount(NULL, op->path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_HARDEN, NULL);
  }
  errno = EINVAL;
  return -1;
}

static int sandbox_child(void *arg) {
  struct spawn_ctx *c = arg;
  const wn_spawn_spec *s = c->s;

  TRACE();
  wn_child_reset_signals();
  /* cgroups first, then a cgroup namespace rooted at the sandbox group */
  for (int i = 0; i < c->n_cg; i++)
    if (write(c->cg_fds[i], "0", 1) < 0) child_fail(c, S_CGROUP_JOIN, i, errno);
  if (!c->into_cgroup && c->unified_procs >= 0 && write(c->unified_procs, "0", 1) < 0)
    child_fail(c, S_CGROUP_JOIN, c->n_cg, errno);
  TRACE();
  if (unshare(CLONE_NEWCGROUP) < 0) child_fail(c, S_UNSHARE_CGROUP, 0, errno);
  TRACE();
  if (c->netns_fd >= 0 && setns(c->netns_fd, CLONE_NEWNET) < 0) child_fail(c, S_NETNS, 0, errno);

  if (s->has_mnt_template) {
    if (setns(s->mnt_template_fd, CLONE_NEWNS) < 0) child_fail(c, S_TEMPLATE, 0, errno);
    if (unshare(CLONE_NEWNS) < 0) child_fail(c, S_TEMPLATE, 1, errno);
    for (int i = 0; i < c->n_clones; i++)
      if (syscall(SYS_move_mount, c->clone_fds[i], "", AT_FDCWD, c->clone_at[i], MOVE_MOUNT_F_EMPTY_PATH) < 0)
        child_fail(c, S_TEMPLATE, 2 + i, errno);
  }
  /* Everything below makes descriptors or stdio of its own: not in the caller's table (the
     descriptor table, at the top of nsexec.c). Up to here only the caller's were read. */
  if (c->shared_files && syscall(SYS_close_range, (unsigned)c->files_top, ~0U, CLOSE_RANGE_UNSHARE) < 0) {
    /* a kernel without CLOSE_RANGE_UNSHARE (before 5.9): a copy of the whole table, closed below */
    if (unshare(CLONE_FILES) < 0) child_fail(c, S_CLOSE_FDS, 1, errno);
  }
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) child_fail(c, S_MAKE_PRIVATE, 0, errno);
  TRACE();
  if (mount("overlay", s->rootfs_dir, "overlay", MS_NODEV, c->overlay_opts) < 0) child_fail(c, S_OVERLAY, 0, errno);
  if (chdir(s->rootfs_dir) < 0) child_fail(c, S_CHDIR_ROOT, 0, errno);
  TRACE();
  for (size_t i = 0; i < N_OPS; i++) {
    if (run_op(c, &k_ops[i]) < 0) child_fail(c, S_OP, (int)i, errno);
    TRACE();
  }

  if (sethostname(s->hostname, strlen(s->hostname)) < 0) child_fail(c, S_HOSTNAME, 0, errno);
  {
    int sk = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sk < 0) child_fail(c, S_LOOPBACK, 0, errno);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, "lo", 3);
    if (ioctl(sk, SIOCGIFFLAGS, &ifr) < 0) child_fail(c, S_LOOPBACK, 0, errno);
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(sk, SIOCSIFFLAGS, &ifr) < 0) child_fail(c, S_LOOPBACK, 1, errno);
    close(sk);
  }

  /* pivot_root(".", "."): the old root ends up stacked on "/", and umount2(".")
     detaches it (see pivot_root(2)). */
  TRACE();
  if (syscall(SYS_pivot_root, ".", ".") < 0) child_fail(c, S_PIVOT, 0, errno);
  TRACE();
  if (umount2(".", MNT_DETACH) < 0) child_fail(c, S_DETACH_OLD, 0, errno);
  TRACE();
  if (chdir("/") < 0) child_fail(c, S_DETACH_OLD, 1, errno);

  if (s->sched_idle) {
    struct sched_param sp = {.sched_priority = 0};
    if (sched_setscheduler(0, SCHED_IDLE, &sp) < 0) child_fail(c, S_SCHED_IDLE, 0, errno);
  }
  if (s->core_sched && prctl(PR_SCHED_CORE, PR_SCHED_CORE_CREATE, 0, PR_SCHED_CORE_SCOPE_THREAD_GROUP, 0) < 0)
    child_fail(c, S_CORE_SCHED, 0, errno);

  {
    int nfd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (nfd < 0) child_fail(c, S_STDIO, 0, errno);
    for (int i = 0; i < 3; i++)
      if (dup2(nfd, i) < 0) child_fail(c, S_STDIO, 1, errno);
    if (nfd > 2) close(nfd);
  }
  {
    int keep[3] = {c->errfd, c->init_fd, c->confine.active && c->confine.ll_have_ruleset ? c->confine.ll_ruleset_fd : -1};
    int crc = wn_close_fds_except(3, keep, 3);
    if (crc < 0) child_fail(c, S_CLOSE_FDS, 0, -crc);
  }
  int rc = wn_caps_drop(wn_default_caps);
  if (rc < 0) child_fail(c, S_CAPS, 0, -rc);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) child_fail(c, S_NNP, 0, errno);
  /* seccomp / Landlock / AppArmor / rlimits, the last step before exec */
  if (s->confine) {
    int cf_step = 0;
    int crc = wn_confine_apply(&c->confine, c->init_fd, &cf_step);
    if (crc < 0) child_fail(c, S_CONFINE, cf_step, -crc);
  }

  static const char *const argv[] = {"warren-init", NULL};
  static const char *const envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", NULL};
  TRACE();
  syscall(SYS_execveat, c->init_fd, "", argv, envp, AT_EMPTY_PATH);
  child_fail(c, S_EXEC, 0, errno);
}

/* ---- parent side ------------------------------------------------------------ */

static int check_overlay_path(wn_error *e, const char *what, const char *p) {
  if (wn_check_abs_path(e, what, p) < 0) return -1;
  if (strpbrk(p, ",:\\") != NULL)
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "%s must not contain ',', ':' or '\\' (overlay option syntax)", what);
  return 0;
}

int wn_spawn_spec_check(const wn_spawn_spec *s, wn_error *e) {
  if (wn_check_id(e, "id", s->id) < 0) return -1;
  if (!wn_valid_hostname(s->hostname))
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "hostname must match ^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$");
  if (s->n_lower < 1 || s->n_lower > WN_MAX_LOWER_DIRS)
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "lowerDirs must have 1..%d entries", WN_MAX_LOWER_DIRS);
  for (size_t i = 0; i < s->n_lower; i++)
    if (check_overlay_path(e, "lowerDirs[]", s->lower_dirs[i]) < 0) return -1;
  if (check_overlay_path(e, "upperDir", s->upper_dir) < 0 || check_overlay_path(e, "workDir", s->work_dir) < 0 ||
      wn_check_abs_path(e, "rootfsDir", s->rootfs_dir) < 0 || wn_check_abs_path(e, "initPath", s->init_path) < 0)
    return -1;
  if (strcmp(s->rootfs_dir, "/") == 0) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "rootfsDir must not be /");
  if (s->shm_dir != NULL && wn_check_abs_path(e, "shmDir", s->shm_dir) < 0) return -1;
  if (s->dev_dir != NULL && wn_check_abs_path(e, "devDir", s->dev_dir) < 0) return -1;
  if (s->shm_bytes != 0 && (s->shm_bytes < 4096 || s->shm_bytes > (1ull << 40)))
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "shmBytes must be 4096..2^40");
  if (wn_confine_check(s->confine, e) < 0) return -1;
  if (s->has_mnt_template && s->mnt_template_fd < 0) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "mountTemplateFd must be a descriptor");
  if (s->mask_dir != NULL) {
    if (!s->has_mnt_template) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "maskDir needs mountTemplateFd (it is a mount of the template)");
    if (wn_check_abs_path(e, "maskDir", s->mask_dir) < 0) return -1;
  }
  if (s->sysfs_dir != NULL) {
    if (!s->has_mnt_template) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "sysfsDir needs mountTemplateFd (it is a mount of the template)");
    if (wn_check_abs_path(e, "sysfsDir", s->sysfs_dir) < 0) return -1;
  }
  return 0;
}

static int report_error(const struct spawn_ctx *c, const struct child_report *r, wn_error *e) {
  const wn_spawn_spec *s = c->s;
  int err = r->err;
  const wn_cg_layout *l = NULL;
  switch (r->step) {
    case S_CGROUP_JOIN: {
      char path[512] = "?";
      if (wn_cg_layout_get(&l, NULL) == 0 && r->index >= 0 && r->index <= c->n_cg)
        wn_cg_path(l, r->index == c->n_cg ? WN_CG_UNIFIED : c->cg_roles[r->index], s->id, path, sizeof path);
      return wn_fail(e, WN_CGROUP_ERROR, err, "join cgroup %s/cgroup.procs", path);
    }
    case S_UNSHARE_CGROUP: return wn_fail(e, WN_SPAWN_ERROR, err, "unshare cgroup namespace");
    case S_MAKE_PRIVATE: return wn_fail(e, WN_MOUNT_ERROR, err, "make / rprivate");
    case S_OVERLAY: return wn_fail(e, WN_MOUNT_ERROR, err, "mount overlay on %s", s->rootfs_dir);
    case S_CHDIR_ROOT: return wn_fail(e, WN_MOUNT_ERROR, err, "chdir %s", s->rootfs_dir);
    case S_OP: {
      if (r->index < 0 || (size_t)r->index >= N_OPS) break;
      const setup_op *op = &k_ops[r->index];
      const char *root = s->rootfs_dir;
      switch (op->kind) {
        case OP_MKDIR: return wn_fail(e, WN_MOUNT_ERROR, err, "mkdir %s/%s", root, op->path);
        case OP_MOUNT: return wn_fail(e, WN_MOUNT_ERROR, err, "mount %s on %s/%s", op->fstype, root, op->path);
        case OP_DEVBIND: return wn_fail(e, WN_MOUNT_ERROR, err, "bind %s on %s/%s", op->src, root, op->path);
        case OP_SYMLINK: return wn_fail(e, WN_MOUNT_ERROR, err, "symlink %s/%s -> %s", root, op->path, op->src);
        case OP_MASK: return wn_fail(e, WN_MOUNT_ERROR, err, "mask %s/%s", root, op->path);
        case OP_READONLY: return wn_fail(e, WN_MOUNT_ERROR, err, "make %s/%s read-only", root, op->path);
      }
      break;
    }
    case S_HOSTNAME: return wn_fail(e, WN_SPAWN_ERROR, err, "sethostname %s", s->hostname);
    case S_NETNS: return wn_fail(e, WN_SPAWN_ERROR, err, "join network namespace %s", s->netns_path);
    case S_LOOPBACK: return wn_fail(e, WN_SPAWN_ERROR, err, "bring up lo (%s)", r->index ? "SIOCSIFFLAGS" : "SIOCGIFFLAGS");
    case S_PIVOT: return wn_fail(e, WN_MOUNT_ERROR, err, "pivot_root to %s", s->rootfs_dir);
    case S_DETACH_OLD: return wn_fail(e, WN_MOUNT_ERROR, err, "detach old root");
    case S_SCHED_IDLE: return wn_fail(e, WN_SPAWN_ERROR, err, "sched_setscheduler SCHED_IDLE");
    case S_CORE_SCHED:
      if (err == EINVAL || err == ENODEV)
        return wn_fail(e, WN_NOT_SUPPORTED, err, "core scheduling (PR_SCHED_CORE_CREATE)");
      return wn_fail(e, WN_SPAWN_ERROR, err, "prctl PR_SCHED_CORE_CREATE");
    case S_STDIO: return wn_fail(e, WN_SPAWN_ERROR, err, "stdio to /dev/null");
    case S_CLOSE_FDS: return wn_fail(e, WN_SPAWN_ERROR, err, "close_range");
    case S_CAPS: return wn_fail(e, WN_SPAWN_ERROR, err, "drop capabilities");
    case S_NNP: return wn_fail(e, WN_SPAWN_ERROR, err, "prctl PR_SET_NO_NEW_PRIVS");
    case S_EXEC: return wn_fail(e, WN_SPAWN_ERROR, err, "execveat %s", s->init_path);
    case S_CONFINE: return wn_fail(e, WN_SPAWN_ERROR, err, "confine sandbox init: %s", wn_confine_step_name(r->index));
    case S_TEMPLATE:
      if (r->index >= 2 && r->index - 2 < c->n_clones)
        return wn_fail(e, WN_SPAWN_ERROR, err, "move the mount of %s into the sandbox", c->clone_at[r->index - 2]);
      return wn_fail(e, WN_SPAWN_ERROR, err, "%s the mount template", r->index == 0 ? "join" : "copy");
  }
  return wn_fail(e, WN_SPAWN_ERROR, err, "sandbox init setup (step %d.%d)", r->step, r->index);
}

/* Clones (open_tree) of the mounts under the sandbox's paths: each layer that is a mount of its
   own, and the sandbox directory when its disk tmpfs is mounted there. Paths that are not mount
   roots lie on a filesystem the template keeps. */
static int clone_if_mount_root(struct spawn_ctx *c, const char *path, wn_error *e) {
  struct statx stx;
  if (statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &stx) < 0)
    return wn_fail_errno(e, WN_SPAWN_ERROR, "statx %s", path);
  if (!(stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT))
    return wn_fail(e, WN_NOT_SUPPORTED, ENOSYS, "this kernel does not report mount roots (statx, Linux 5.8)");
  if (!(stx.stx_attributes & STATX_ATTR_MOUNT_ROOT)) return 0;
  if (c->n_clones >= MAX_CLONES) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "too many mounts under the sandbox's paths");
  int fd = (int)syscall(SYS_open_tree, AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
  if (fd < 0) return wn_fail_errno(e, WN_SPAWN_ERROR, "open_tree %s", path);
  c->clone_fds[c->n_clones] = fd;
  c->clone_at[c->n_clones] = path;
  c->n_clones++;
  return 0;
}

static int prepare_clones(struct spawn_ctx *c, wn_error *e) {
  const wn_spawn_spec *s = c->s;
  size_t n = strlen(s->upper_dir);
  if (n >= sizeof c->disk_dir) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "upperDir too long");
  memcpy(c->disk_dir, s->upper_dir, n + 1);
  char *slash = strrchr(c->disk_dir, '/');
  if (slash != NULL && slash != c->disk_dir) {
    *slash = '\0';
    if (clone_if_mount_root(c, c->disk_dir, e) < 0) return -1;
  }
  for (size_t i = 0; i < s->n_lower; i++)
    if (clone_if_mount_root(c, s->lower_dirs[i], e) < 0) return -1;
  return 0;
}

struct clone_guard {
  struct spawn_ctx *c;
};
static void close_clones(struct clone_guard *g) {
  for (int i = 0; i < g->c->n_clones; i++) close(g->c->clone_fds[i]);
  g->c->n_clones = 0;
}

static void close_all(int *fds, int n) {
  for (int i = 0; i < n; i++)
    if (fds[i] >= 0) close(fds[i]);
}

int wn_spawn_sandbox(const wn_spawn_spec *s, wn_spawn_result *r, wn_error *e) {
  if (wn_spawn_spec_check(s, e) < 0) return -1;
  if (s->core_sched && !wn_core_sched_supported())
    return wn_fail(e, WN_NOT_SUPPORTED, EINVAL, "core scheduling is not supported by this kernel (PR_SCHED_CORE)");

  struct spawn_ctx c;
  memset(&c, 0, sizeof c);
  c.s = s;
  c.errfd = c.init_fd = c.unified_dir = c.unified_procs = -1;
  if (s->confine) c.confine = *s->confine;
  c.mask_dir = s->mask_dir; /* only with a template (wn_spawn_spec_check) */

  /* overlay options: lowerdir=a:b:c,upperdir=...,workdir=... */
  size_t off = 0;
  int n = snprintf(c.overlay_opts, sizeof c.overlay_opts, "lowerdir=");
  off = (size_t)n;
  for (size_t i = 0; i < s->n_lower && off < sizeof c.overlay_opts; i++) {
    n = snprintf(c.overlay_opts + off, sizeof c.overlay_opts - off, "%s%s", i ? ":" : "", s->lower_dirs[i]);
    off += (size_t)n;
  }
  if (off < sizeof c.overlay_opts)
    off += (size_t)snprintf(c.overlay_opts + off, sizeof c.overlay_opts - off, ",upperdir=%s,workdir=%s", s->upper_dir,
                            s->work_dir);
  if (off >= sizeof c.overlay_opts)
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "overlay options exceed %zu bytes (too many or too long lowerDirs)",
                   sizeof c.overlay_opts - 1);
  snprintf(c.shm_data, sizeof c.shm_data, "mode=1777,size=%llu",
           (unsigned long long)(s->shm_bytes ? s->shm_bytes : DEFAULT_SHM_BYTES));

  cleanup_fd int init_fd = open(s->init_path, O_PATH | O_CLOEXEC);
  if (init_fd < 0) return wn_fail_errno(e, WN_SPAWN_ERROR, "open init %s", s->init_path);
  struct stat st;
  if (fstat(init_fd, &st) < 0) return wn_fail_errno(e, WN_SPAWN_ERROR, "stat init %s", s->init_path);
  if (!S_ISREG(st.st_mode)) return wn_fail(e, WN_SPAWN_ERROR, EACCES, "init %s is not a regular file", s->init_path);
  c.init_fd = init_fd;
  c.netns_fd = -1;
  cleanup_fd int netns_fd = -1;
  if (s->netns_path != NULL) {
    netns_fd = open(s->netns_path, O_RDONLY | O_CLOEXEC);
    if (netns_fd < 0) return wn_fail_errno(e, errno == ENOENT ? WN_FILE_NOT_FOUND : WN_SPAWN_ERROR, "open network namespace %s", s->netns_path);
    c.netns_fd = netns_fd;
  }

  /* closed on every return below, whatever the child did with them */
  struct clone_guard g __attribute__((cleanup(close_clones))) = {&c};
  if (s->has_mnt_template && prepare_clones(&c, e) < 0) return -1;

  if (wn_cg_open_procs(s->id, c.cg_fds, c.cg_roles, &c.n_cg, &c.unified_dir, &c.unified_procs, e) < 0) return -1;
  cleanup_fd int unified_dir = c.unified_dir;
  cleanup_fd int unified_procs = c.unified_procs;

  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) < 0) {
    close_all(c.cg_fds, c.n_cg);
    return wn_fail_errno(e, WN_SPAWN_ERROR, "pipe2");
  }
  cleanup_fd int err_rd = pipefd[0];
  int err_wr = pipefd[1];
  c.errfd = err_wr;
  /* What the child needs once it has left the caller's table, in slots below files_top: the
     error pipe, the init it executes and a Landlock ruleset (nsexec.c, the descriptor table). */
  int slots = wn_slots_take();
  if (slots >= 0) {
    int ok = (c.errfd = wn_slot_place(slots, 4, err_wr)) >= 0;
    if (ok) ok = (c.init_fd = wn_slot_place(slots, 0, init_fd)) >= 0;
    if (ok && c.confine.active && c.confine.ll_have_ruleset) ok = (c.confine.ll_ruleset_fd = wn_slot_place(slots, 5, s->confine->ll_ruleset_fd)) >= 0;
    if (ok) {
      c.shared_files = 1;
      c.files_top = wn_slots_top();
    } else {
      wn_slots_give(slots);
      slots = -1;
      c.errfd = err_wr;
      c.init_fd = init_fd;
      if (s->confine) c.confine.ll_ruleset_fd = s->confine->ll_ruleset_fd;
    }
  }

  char *stack = mmap(NULL, CHILD_STACK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) {
    close(err_wr);
    wn_slots_give(slots);
    close_all(c.cg_fds, c.n_cg);
    return wn_fail_errno(e, WN_SPAWN_ERROR, "mmap child stack");
  }

  wn_protect_memory();
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int pidfd = -1;
  const int flags = CLONE_VM | CLONE_VFORK | CLONE_PIDFD | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC |
                    (s->has_mnt_template ? 0 : CLONE_NEWNS) | (c.netns_fd >= 0 ? 0 : CLONE_NEWNET) |
                    (c.shared_files ? CLONE_FILES : 0);
  pid_t pid = -1;
  if (unified_dir >= 0) {
    /* born in the cgroup2 group: no migration there */
    c.into_cgroup = 1;
    pid = wn_clone3(sandbox_child, &c, stack, CHILD_STACK_SIZE, (uint64_t)flags | CLONE_INTO_CGROUP, SIGCHLD,
                    unified_dir, &pidfd, NULL);
    if (pid < 0 && (errno == ENOSYS || errno == E2BIG)) c.into_cgroup = 0;
  }
  if (!c.into_cgroup) pid = clone(sandbox_child, stack + CHILD_STACK_SIZE, flags | SIGCHLD, &c, &pidfd);
  int clone_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, NULL);

  munmap(stack, CHILD_STACK_SIZE);
  close(err_wr);
  /* the child has exec'd or exited (vfork): it holds its own table now */
  wn_slots_give(slots);
  close_all(c.cg_fds, c.n_cg);
  if (pid < 0) return wn_fail(e, WN_SPAWN_ERROR, clone_errno, "clone sandbox init");

  struct child_report rep;
  ssize_t got;
  do got = read(err_rd, &rep, sizeof rep);
  while (got < 0 && errno == EINTR);
  if (got == (ssize_t)sizeof rep) {
    while (waitpid(pid, NULL, __WALL) < 0 && errno == EINTR) {
    }
    if (pidfd >= 0) close(pidfd);
    return report_error(&c, &rep, e);
  }
  if (got != 0) {
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, __WALL) < 0 && errno == EINTR) {
    }
    if (pidfd >= 0) close(pidfd);
    return wn_fail(e, WN_SPAWN_ERROR, got < 0 ? errno : EIO, "read child status");
  }
  r->pid = pid;
  r->pidfd = pidfd;
  if (wn_process_start_time(pid, &r->start_time, e) < 0) {
    /* cannot happen for our own unreaped child; keep the pidfd usable anyway */
    r->start_time = 0;
  }
  return 0;
}
