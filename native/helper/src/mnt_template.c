/*
 * The mount namespace new sandboxes start from.
 *
 * A copy of the gateway's mount namespace (CLONE_NEWNS) holds one mount per sandbox (the
 * writable layer's tmpfs) and one per layer. The kernel copies every mount under
 * namespace_sem, then the child makes them all private and detaches them again with the old
 * root: at 7,500 host mounts `unshare -m true` takes 108 ms, and creates from such copies run
 * at ~13/s on a full node. A template is a copy made once, from which
 * every mount under the node's own directories and everything that is not the node's
 * filesystem, /dev, /proc or /sys is detached. A child joins it, unshares a copy of those few
 * mounts and moves in detached clones (open_tree) of exactly the mounts it uses: its layers
 * and its writable layer's tmpfs.
 *
 * The template pins no mount of Warren's (none is left in it) and is private, so nothing
 * mounted on the host later propagates into it.
 */
#include "wn.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define TEMPLATE_STACK (64 * 1024)

struct tmpl_ctx {
  const char *const *keep;
  size_t n_keep;
  const char *mask; /* NULL, or an empty directory that gets the node's mask tmpfs */
  const char *sysfs; /* NULL, or an empty directory that gets the node's sandbox sysfs */
  char *buf;
  size_t cap;
  int ns_fd; /* set by the child (CLONE_FILES: the fd is ours too) */
  int err;
};

/* mountinfo escapes space, tab, newline and backslash as \ooo */
static void unescape(char *s) {
  char *w = s;
  for (char *r = s; *r;) {
    if (r[0] == '\\' && r[1] >= '0' && r[1] <= '7' && r[2] >= '0' && r[2] <= '7' && r[3] >= '0' && r[3] <= '7') {
      *w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
      r += 4;
    } else {
      *w++ = *r++;
    }
  }
  *w = '\0';
}

static int under(const char *path, const char *dir) {
  size_t n = strlen(dir);
  if (strcmp(dir, "/") == 0) return 1;
  return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* A mount stays when it holds one of the keep paths (its mount point is the path or an
   ancestor of it) or is /dev, /proc, /sys or below them. */
static int keep_mount(const struct tmpl_ctx *c, const char *mp) {
  if (strcmp(mp, "/") == 0) return 1;
  if (under(mp, "/dev") || under(mp, "/proc") || under(mp, "/sys")) return 1;
  for (size_t i = 0; i < c->n_keep; i++)
    if (under(c->keep[i], mp)) return 1;
  return 0;
}

static int template_child(void *arg) {
  struct tmpl_ctx *c = arg;
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return c->err = errno, 1;
  int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return c->err = errno, 1;
  size_t len = 0;
  for (;;) {
    if (len + 1 >= c->cap) {
      close(fd);
      return c->err = E2BIG, 1;
    }
    ssize_t n = read(fd, c->buf + len, c->cap - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      close(fd);
      return c->err = e, 1;
    }
    if (n == 0) break;
    len += (size_t)n;
  }
  close(fd);
  c->buf[len] = '\0';
  /* field 5 is the mount point; lines come parents first, so a detached parent takes its
     children along and their own umount2 fails harmlessly */
  for (char *line = c->buf; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    char *f = line;
    for (int i = 0; i < 4 && f; i++) {
      f = strchr(f, ' ');
      if (f) f++;
    }
    if (f) {
      char *end = strchr(f, ' ');
      if (end) *end = '\0';
      unescape(f);
      if (!keep_mount(c, f)) umount2(f, MNT_DETACH);
    }
    line = nl ? nl + 1 : NULL;
  }
  /* One empty read-only tmpfs that every sandbox started from here binds over the directories
     it masks: a superblock per node instead of one per sandbox (spawn.c, on superblocks). */
  if (c->mask && mount("tmpfs", c->mask, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=555,size=4k") < 0)
    return c->err = errno, 1;
  /* One sysfs for every sandbox, read-only. A sysfs mount is a superblock of the mounter's network
     namespace: one per sandbox made each create look through all the others' (sget) and cost
     every memory cgroup a shrinker slot. This one belongs to a network namespace of its own,
     which ends with this child (the superblock holds it only passively, so even its `lo` goes):
     sandboxes see the kernel's devices and no network interface, the host's or their own. */
  if (c->sysfs) {
    if (unshare(CLONE_NEWNET) < 0) return c->err = errno, 1;
    if (mount("sysfs", c->sysfs, "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) return c->err = errno, 1;
  }
  int ns = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
  if (ns < 0) return c->err = errno, 1;
  c->ns_fd = ns;
  return 0;
}

int wn_mnt_template_create(const char *const *keep, size_t n_keep, const char *mask, const char *sysfs, wn_error *e) {
  for (size_t i = 0; i < n_keep; i++)
    if (wn_check_abs_path(e, "keep[]", keep[i]) < 0) return -1;
  if (mask != NULL && wn_check_abs_path(e, "mask", mask) < 0) return -1;
  if (sysfs != NULL && wn_check_abs_path(e, "sysfs", sysfs) < 0) return -1;
  /* room for the mountinfo as it is now and for growth while the child reads it */
  size_t cap = 1 << 20;
  {
    int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return wn_fail_errno(e, WN_SPAWN_ERROR, "open /proc/self/mountinfo");
    char tmp[65536];
    size_t total = 0;
    ssize_t n;
    while ((n = read(fd, tmp, sizeof tmp)) > 0) total += (size_t)n;
    close(fd);
    while (cap < total * 2 + 65536) cap *= 2;
  }
  struct tmpl_ctx c = {keep, n_keep, mask, sysfs, NULL, cap, -1, 0};
  c.buf = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (c.buf == MAP_FAILED) return wn_fail_errno(e, WN_SPAWN_ERROR, "mmap mountinfo buffer");
  char *stack = mmap(NULL, TEMPLATE_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) {
    munmap(c.buf, cap);
    return wn_fail_errno(e, WN_SPAWN_ERROR, "mmap stack");
  }
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = clone(template_child, stack + TEMPLATE_STACK, CLONE_VM | CLONE_VFORK | CLONE_FILES | CLONE_NEWNS | SIGCHLD, &c);
  int clone_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  int status = 0;
  if (pid > 0)
    while (waitpid(pid, &status, __WALL) < 0 && errno == EINTR) {
    }
  munmap(stack, TEMPLATE_STACK);
  munmap(c.buf, cap);
  if (pid < 0) return wn_fail(e, WN_SPAWN_ERROR, clone_errno, "clone mount template");
  if (c.ns_fd < 0) return wn_fail(e, WN_SPAWN_ERROR, c.err ? c.err : EIO, "make the mount template");
  return c.ns_fd;
}
