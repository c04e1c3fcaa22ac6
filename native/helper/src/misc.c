/* mount/umount, scheduling and pty helpers. */
#include "wn.h"

#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <termios.h>

#ifndef PR_SCHED_CORE
#define PR_SCHED_CORE 62
#define PR_SCHED_CORE_GET 0
#endif

static int valid_token(const char *s, size_t max, int allow_empty) {
  size_t n = strlen(s);
  if (n > max || (n == 0 && !allow_empty)) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == '-'))
      return 0;
  }
  return 1;
}

int wn_mount(const char *source, const char *target, const char *fstype, unsigned flags, const char *data,
             wn_error *e) {
  if (wn_check_abs_path(e, "target", target) < 0) return -1;
  int bind = (flags & WN_MNT_BIND) != 0;
  int propagation_only = (flags & WN_MNT_PRIVATE) && !bind && fstype[0] == '\0';
  if (!propagation_only) {
    if (!(source[0] == '/' ? wn_valid_abs_path(source) : valid_token(source, 64, 0)))
      return wn_fail(e, WN_INVALID_ARGUMENT, 0, "source must be an absolute normalized path or a name like 'overlay'");
    if (!valid_token(fstype, 32, bind))
      return wn_fail(e, WN_INVALID_ARGUMENT, 0, "fstype must match ^[A-Za-z0-9._-]{1,32}$");
  }
  if (strlen(data) > 4095) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "data must be at most 4095 bytes");
  if (bind && data[0] != '\0') return wn_fail(e, WN_INVALID_ARGUMENT, 0, "data is not allowed with 'bind'");

  unsigned long ms = 0;
  if (flags & WN_MNT_RO) ms |= MS_RDONLY;
  if (flags & WN_MNT_NOSUID) ms |= MS_NOSUID;
  if (flags & WN_MNT_NODEV) ms |= MS_NODEV;
  if (flags & WN_MNT_NOEXEC) ms |= MS_NOEXEC;
  unsigned long rec = (flags & WN_MNT_REC) ? MS_REC : 0;

  if (bind) {
    if (mount(source, target, NULL, MS_BIND | rec, NULL) < 0)
      return wn_fail_errno(e, WN_MOUNT_ERROR, "bind %s on %s", source, target);
    /* a bind mount ignores ro/nosuid/...: they need a remount */
    if (ms && mount(NULL, target, NULL, MS_BIND | MS_REMOUNT | ms, NULL) < 0) {
      int err = errno;
      umount2(target, MNT_DETACH);
      return wn_fail(e, WN_MOUNT_ERROR, err, "remount bind %s read-only/restricted", target);
    }
  } else if (!propagation_only) {
    if (mount(source, target, fstype, ms, data[0] ? data : NULL) < 0)
      return wn_fail_errno(e, WN_MOUNT_ERROR, "mount %s %s on %s", fstype, source, target);
  }
  if ((flags & WN_MNT_PRIVATE) && mount(NULL, target, NULL, MS_PRIVATE | rec, NULL) < 0)
    return wn_fail_errno(e, WN_MOUNT_ERROR, "make %s private", target);
  return 0;
}

int wn_umount(const char *target, int detach, wn_error *e) {
  if (wn_check_abs_path(e, "target", target) < 0) return -1;
  if (umount2(target, UMOUNT_NOFOLLOW | (detach ? MNT_DETACH : 0)) < 0)
    return wn_fail_errno(e, WN_MOUNT_ERROR, "umount %s", target);
  return 0;
}

int wn_core_sched_supported(void) {
  static int cached = -1; /* cache only: the answer never changes */
  int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (v >= 0) return v;
  unsigned long cookie = 0;
  v = prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET, 0, 0 /* PIDTYPE_PID */, &cookie) == 0;
  __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
  return v;
}

int wn_set_sched_idle(pid_t pid, wn_error *e) {
  if (pid < 1 || pid > WN_PID_MAX) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "pid must be 1..%d", WN_PID_MAX);
  struct sched_param sp = {.sched_priority = 0};
  /* the policy is per thread: apply to every thread of the process */
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (!d) {
    if (sched_setscheduler(pid, SCHED_IDLE, &sp) < 0)
      return wn_fail_errno(e, WN_NATIVE_ERROR, "sched_setscheduler %d SCHED_IDLE", (int)pid);
    return 0;
  }
  int done = 0, rc = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
    pid_t tid = (pid_t)atoi(de->d_name);
    if (sched_setscheduler(tid, SCHED_IDLE, &sp) < 0) {
      if (errno == ESRCH) continue;
      rc = wn_fail_errno(e, WN_NATIVE_ERROR, "sched_setscheduler %d SCHED_IDLE", (int)tid);
      break;
    }
    done++;
  }
  closedir(d);
  if (rc == 0 && done == 0) return wn_fail(e, WN_NATIVE_ERROR, ESRCH, "sched_setscheduler %d SCHED_IDLE", (int)pid);
  return rc;
}

int wn_pty_resize(int fd, int cols, int rows, wn_error *e) {
  if (fd < 0) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "bad fd");
  if (cols < 1 || cols > 10000 || rows < 1 || rows > 10000)
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "cols/rows must be 1..10000");
  struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
  if (ioctl(fd, TIOCSWINSZ, &ws) < 0) return wn_fail_errno(e, WN_NATIVE_ERROR, "resize pty fd %d", fd);
  return 0;
}
