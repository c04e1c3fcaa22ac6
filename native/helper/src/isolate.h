/*
 * Per-process isolation for FnCall invocations, applied by the exec
 * child (nsexec.c) after it entered the sandbox's namespaces and before it
 * drops capabilities:
 *
 *   - a new IPC namespace (SysV IPC and POSIX message queues of one
 *     invocation vanish with it);
 *   - a private mount namespace in which the root is remounted read-only
 *     (bind remount: only this namespace's view), `writable` paths stay
 *     writable (bind-mounted onto themselves first), and a fresh, size-limited
 *     tmpfs is mounted on each `tmpfs` path (gone when the invocation ends);
 *   - `binds`: directories of the sandbox bind-mounted onto other paths in that
 *     namespace (a scratch directory shown at /mnt, /home, ...);
 *   - `net`: a new network namespace with only loopback, brought up here, so
 *     that sockets, TIME_WAIT entries, conntrack state and bound ports of one
 *     invocation die with it;
 *   - resource limits (RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_CORE, RLIMIT_NOFILE).
 *
 * With `in_place`, the tmpfs mounts are made in the sandbox's own mount
 * namespace instead (no unshare, nothing else): FnCall uses it once per pool
 * container to put a size-limited tmpfs on its work dir.
 *
 * Header-only so that the addon and the static warren-nsexec share it without
 * build changes. The child side makes raw syscalls only: everything it needs
 * (mount data strings) is prepared by the caller.
 */
#ifndef WARREN_ISOLATE_H
#define WARREN_ISOLATE_H

#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/mount.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define WN_ISO_MAX_PATHS 16

typedef struct wn_isolate {
  int ipc;                                   /* new IPC namespace */
  int mount_ns;                              /* private mount namespace */
  int ro_root;                               /* remount / read-only (needs mount_ns) */
  int in_place;                              /* tmpfs mounts in the sandbox's mount namespace (no mount_ns) */
  const char *writable[WN_ISO_MAX_PATHS];    /* absolute paths kept writable */
  int n_writable;
  const char *tmpfs[WN_ISO_MAX_PATHS];       /* absolute mount points for fresh tmpfs */
  const char *tmpfs_data[WN_ISO_MAX_PATHS];  /* "size=N,mode=O" for each */
  int n_tmpfs;
  const char *bind_src[WN_ISO_MAX_PATHS];    /* absolute source directories ... */
  const char *bind_dst[WN_ISO_MAX_PATHS];    /* ... bind-mounted onto these */
  int n_binds;
  int net;                                   /* new network namespace, loopback up */
  int64_t rl_cpu_s;                          /* < 0: unchanged */
  int64_t rl_fsize;
  int64_t rl_core;
  int64_t rl_nofile;
} wn_isolate;

/* Steps reported as the child_report index. */
enum { WN_ISO_IPC = 1, WN_ISO_MNTNS, WN_ISO_PRIVATE, WN_ISO_WRITABLE, WN_ISO_RO_ROOT, WN_ISO_TMPFS, WN_ISO_RLIMIT, WN_ISO_BIND, WN_ISO_NETNS, WN_ISO_LO };

static inline const char *wn_isolate_step_name(int step) {
  switch (step) {
    case WN_ISO_IPC: return "unshare IPC namespace";
    case WN_ISO_MNTNS: return "unshare mount namespace";
    case WN_ISO_PRIVATE: return "make mounts private";
    case WN_ISO_WRITABLE: return "bind a writable path";
    case WN_ISO_RO_ROOT: return "remount / read-only";
    case WN_ISO_TMPFS: return "mount tmpfs";
    case WN_ISO_RLIMIT: return "setrlimit";
    case WN_ISO_BIND: return "bind a scratch directory";
    case WN_ISO_NETNS: return "unshare network namespace";
    case WN_ISO_LO: return "bring up loopback";
  }
  return "isolate";
}

static inline int wn_isolate_rlimit(int resource, int64_t v) {
  if (v < 0) return 0;
  struct rlimit rl = {(rlim_t)v, (rlim_t)v};
  return syscall(SYS_prlimit64, 0, resource, &rl, NULL) < 0 ? -errno : 0;
}

/* A new network namespace has a loopback interface that is down: bring it up. */
static inline int wn_isolate_lo_up(void) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  memcpy(ifr.ifr_name, "lo", 3);
  int rc = 0;
  if (ioctl(fd, SIOCGIFFLAGS, &ifr) < 0) rc = -errno;
  if (rc == 0) {
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(fd, SIOCSIFFLAGS, &ifr) < 0) rc = -errno;
  }
  close(fd);
  return rc;
}

/* Child side: returns 0 or -errno, *step = WN_ISO_* that failed. */
static inline int wn_isolate_apply(const wn_isolate *iso, int *step) {
  if (iso->ipc) {
    *step = WN_ISO_IPC;
    if (unshare(CLONE_NEWIPC) < 0) return -errno;
  }
  if (iso->net) {
    *step = WN_ISO_NETNS;
    if (unshare(CLONE_NEWNET) < 0) return -errno;
    *step = WN_ISO_LO;
    int lrc = wn_isolate_lo_up();
    if (lrc < 0) return lrc;
  }
  if (iso->in_place) {
    *step = WN_ISO_TMPFS;
    for (int i = 0; i < iso->n_tmpfs; i++)
      if (mount("tmpfs", iso->tmpfs[i], "tmpfs", MS_NOSUID | MS_NODEV, iso->tmpfs_data[i]) < 0) return -errno;
  } else if (iso->mount_ns) {
    *step = WN_ISO_MNTNS;
    if (unshare(CLONE_NEWNS) < 0) return -errno;
    *step = WN_ISO_PRIVATE;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return -errno;
    *step = WN_ISO_WRITABLE;
    for (int i = 0; i < iso->n_writable; i++)
      if (mount(iso->writable[i], iso->writable[i], NULL, MS_BIND | MS_REC, NULL) < 0) return -errno;
    *step = WN_ISO_BIND;
    for (int i = 0; i < iso->n_binds; i++)
      if (mount(iso->bind_src[i], iso->bind_dst[i], NULL, MS_BIND, NULL) < 0) return -errno;
    if (iso->ro_root) {
      *step = WN_ISO_RO_ROOT;
      if (mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0) return -errno;
    }
    *step = WN_ISO_TMPFS;
    for (int i = 0; i < iso->n_tmpfs; i++)
      if (mount("tmpfs", iso->tmpfs[i], "tmpfs", MS_NOSUID | MS_NODEV, iso->tmpfs_data[i]) < 0) return -errno;
  }
  *step = WN_ISO_RLIMIT;
  int rc;
  if ((rc = wn_isolate_rlimit(RLIMIT_CPU, iso->rl_cpu_s)) < 0) return rc;
  if ((rc = wn_isolate_rlimit(RLIMIT_FSIZE, iso->rl_fsize)) < 0) return rc;
  if ((rc = wn_isolate_rlimit(RLIMIT_CORE, iso->rl_core)) < 0) return rc;
  if ((rc = wn_isolate_rlimit(RLIMIT_NOFILE, iso->rl_nofile)) < 0) return rc;
  return 0;
}

/* Caller side: validate again what TypeScript validated. Returns NULL or a message. */
static inline const char *wn_isolate_invalid(const wn_isolate *iso) {
  if (iso->n_writable < 0 || iso->n_writable > WN_ISO_MAX_PATHS || iso->n_tmpfs < 0 || iso->n_tmpfs > WN_ISO_MAX_PATHS)
    return "isolate: at most 16 writable and 16 tmpfs paths";
  if (iso->n_binds < 0 || iso->n_binds > WN_ISO_MAX_PATHS) return "isolate: at most 16 binds";
  if (iso->in_place && (iso->mount_ns || iso->ro_root || iso->n_writable || iso->n_binds)) return "isolate.inPlace allows tmpfs mounts only";
  if ((iso->ro_root || iso->n_writable || iso->n_tmpfs || iso->n_binds) && !iso->mount_ns && !iso->in_place) return "isolate: mounts need a mount namespace";
  for (int i = 0; i < iso->n_binds; i++)
    if (!iso->bind_src[i] || !iso->bind_dst[i] || iso->bind_src[i][0] != '/' || iso->bind_dst[i][0] != '/' || strstr(iso->bind_src[i], "..") ||
        strstr(iso->bind_dst[i], "..") || strlen(iso->bind_src[i]) > 4095 || strlen(iso->bind_dst[i]) > 4095)
      return "isolate.binds: paths must be absolute, without '..'";
  for (int i = 0; i < iso->n_writable; i++)
    if (!iso->writable[i] || iso->writable[i][0] != '/' || strstr(iso->writable[i], "..") || strlen(iso->writable[i]) > 4095)
      return "isolate.writable: paths must be absolute, without '..'";
  for (int i = 0; i < iso->n_tmpfs; i++)
    if (!iso->tmpfs[i] || iso->tmpfs[i][0] != '/' || strstr(iso->tmpfs[i], "..") || strlen(iso->tmpfs[i]) > 4095 || !iso->tmpfs_data[i])
      return "isolate.tmpfs: paths must be absolute, without '..'";
  if (iso->rl_cpu_s > 86400 * 365 || iso->rl_fsize > ((int64_t)1 << 50) || iso->rl_core > ((int64_t)1 << 50) || iso->rl_nofile > 1048576)
    return "isolate: rlimit out of range";
  return NULL;
}

#endif
