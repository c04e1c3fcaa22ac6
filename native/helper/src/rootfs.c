/*
 * openInRoot / mkdirInRoot: open or create a path confined to a root
 * directory, optionally with the file-system credentials of the sandbox
 * program it is done for.
 *
 * Resolution: openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) first, where
 * the kernel has it: the kernel refuses any step above the root, and magic
 * links (/proc/<pid>/root, /proc/self/fd/N) are never followed. The object is
 * opened O_PATH, its type checked (only regular files and directories; a
 * device node is never opened), then reopened with the wanted access, which is
 * checked again under the credentials in force. What BENEATH refuses without
 * being an escape - an absolute symlink, which the sandbox itself resolves
 * from its own root - and kernels without openat2 go through the walk below.
 *
 * The walk (in the spirit of filepath-securejoin) starts at an O_PATH fd of
 * the root and opens one component at a time with O_PATH|O_NOFOLLOW. Symlinks
 * are read with readlinkat and spliced into the remaining path; absolute
 * targets restart at the root fd. ".." pops a stack of already-opened ancestor
 * fds, so it can never climb above the root (that is PATH_ESCAPE) and is
 * immune to directories being moved meanwhile. Any component on procfs is
 * refused (PATH_ESCAPE): this blocks magic links such as /proc/self/root or
 * /proc/1/cwd inside the sandbox.
 *
 * Credentials: with a wn_creds the whole operation runs on a short-lived
 * thread whose fsuid, fsgid and supplementary groups are the program's (raw
 * syscalls: they change that thread only; the kernel drops the file
 * capabilities of a non-zero fsuid). Permission checks, and the owner of
 * anything created, are then exactly the program's; the caller's thread never
 * changes identity.
 */
#include "wn.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <linux/capability.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/magic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>

#define MAX_LINKS 40
#define MAX_DEPTH 256
#define REST_CAP (2 * PATH_MAX)

typedef struct walk {
  int root;              /* borrowed */
  int stack[MAX_DEPTH];  /* ancestors of cur (owned) */
  int depth;
  int cur;               /* current directory (owned) */
} walk;

typedef struct resolved {
  int parent;          /* directory holding the final component (owned), -1 when the path is the root */
  int target;          /* the final object (O_PATH, owned), -1 when it does not exist */
  char name[NAME_MAX + 1];
  struct stat st;      /* of target when it exists */
} resolved;

static void walk_reset(walk *w) {
  for (int i = 0; i < w->depth; i++) close(w->stack[i]);
  w->depth = 0;
  if (w->cur >= 0) close(w->cur);
  w->cur = -1;
}

static void resolved_free(resolved *r) {
  if (r->parent >= 0) close(r->parent);
  if (r->target >= 0) close(r->target);
  r->parent = r->target = -1;
}

static int on_procfs(int fd) {
  struct statfs sfs;
  if (fstatfs(fd, &sfs) < 0) return -1;
  return sfs.f_type == PROC_SUPER_MAGIC;
}

/*
 * Resolve `path` inside w->root. With mkdirs, missing intermediate directories
 * are created with `mode`. The final component is followed when it is a symlink.
 */
static int resolve(int rootfd, const char *path, int mkdirs, mode_t mode, resolved *out, wn_error *e) {
  walk w = {.root = rootfd, .depth = 0, .cur = -1};
  out->parent = out->target = -1;
  out->name[0] = '\0';
  char rest[REST_CAP];
  size_t plen = strlen(path);
  if (plen >= sizeof rest) return wn_fail(e, WN_INVALID_ARGUMENT, ENAMETOOLONG, "path too long");
  memcpy(rest, path, plen + 1);
  char *pos = rest;
  int links = 0;
  char comp[NAME_MAX + 1];

  w.cur = fcntl(rootfd, F_DUPFD_CLOEXEC, 3);
  if (w.cur < 0) return wn_fail_errno(e, WN_NATIVE_ERROR, "dup root fd");

  for (;;) {
    while (*pos == '/') pos++;
    if (*pos == '\0') {
      /* the path ends at a directory we hold (root, "a/..", "a/.") */
      out->target = w.cur;
      w.cur = -1;
      if (w.depth > 0) {
        out->parent = w.stack[--w.depth];
      }
      walk_reset(&w);
      if (fstat(out->target, &out->st) < 0) {
        resolved_free(out);
        return wn_fail_errno(e, WN_NATIVE_ERROR, "fstat");
      }
      strcpy(out->name, ".");
      return 0;
    }
    char *end = strchrnul(pos, '/');
    size_t clen = (size_t)(end - pos);
    if (clen > NAME_MAX) {
      walk_reset(&w);
      return wn_fail(e, WN_INVALID_ARGUMENT, ENAMETOOLONG, "path component too long");
    }
    memcpy(comp, pos, clen);
    comp[clen] = '\0';
    pos = end;
    const char *q = pos;
    while (*q == '/') q++;
    int is_last = *q == '\0';

    if (strcmp(comp, ".") == 0) continue;
    if (strcmp(comp, "..") == 0) {
      if (w.depth == 0) {
        walk_reset(&w);
        return wn_fail(e, WN_PATH_ESCAPE, 0, "path %s escapes its root", path);
      }
      close(w.cur);
      w.cur = w.stack[--w.depth];
      continue;
    }

    int fd = openat(w.cur, comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && !is_last && mkdirs) {
      if (mkdirat(w.cur, comp, mode) < 0 && errno != EEXIST) {
        int err = errno;
        walk_reset(&w);
        return wn_fail(e, err == ENOENT ? WN_FILE_NOT_FOUND : WN_NATIVE_ERROR, err, "mkdir %s", comp);
      }
      fd = openat(w.cur, comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0) {
      int err = errno;
      if (err == ENOENT && is_last) {
        out->parent = w.cur;
        w.cur = -1;
        walk_reset(&w);
        memcpy(out->name, comp, clen + 1);
        return 0;
      }
      walk_reset(&w);
      if (err == ENOENT || err == ENOTDIR) return wn_fail(e, WN_FILE_NOT_FOUND, err, "%s", path);
      return wn_fail(e, WN_NATIVE_ERROR, err, "open %s (component %s)", path, comp);
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
      int err = errno;
      close(fd);
      walk_reset(&w);
      return wn_fail(e, WN_NATIVE_ERROR, err, "fstat %s", comp);
    }
    if (S_ISLNK(st.st_mode)) {
      char target[PATH_MAX];
      ssize_t tl = readlinkat(fd, "", target, sizeof target - 1);
      int err = errno;
      close(fd);
      if (++links > MAX_LINKS) {
        walk_reset(&w);
        return wn_fail(e, WN_INVALID_ARGUMENT, ELOOP, "%s: more than %d symbolic links", path, MAX_LINKS);
      }
      if (tl < 0) {
        walk_reset(&w);
        return wn_fail(e, WN_NATIVE_ERROR, err, "readlink %s", comp);
      }
      target[tl] = '\0';
      /* new rest = target + "/" + remaining */
      size_t rl = strlen(pos);
      if ((size_t)tl + 1 + rl + 1 > sizeof rest) {
        walk_reset(&w);
        return wn_fail(e, WN_INVALID_ARGUMENT, ENAMETOOLONG, "%s: path too long after symlink expansion", path);
      }
      memmove(rest + tl + 1, pos, rl + 1);
      memcpy(rest, target, (size_t)tl);
      rest[tl] = '/';
      pos = rest;
      if (target[0] == '/') {
        walk_reset(&w);
        w.cur = fcntl(rootfd, F_DUPFD_CLOEXEC, 3);
        if (w.cur < 0) return wn_fail_errno(e, WN_NATIVE_ERROR, "dup root fd");
      }
      continue;
    }
    int proc = on_procfs(fd);
    if (proc != 0) {
      int err = errno;
      close(fd);
      walk_reset(&w);
      if (proc < 0) return wn_fail(e, WN_NATIVE_ERROR, err, "fstatfs %s", comp);
      return wn_fail(e, WN_PATH_ESCAPE, 0, "path %s crosses into procfs", path);
    }
    if (is_last) {
      out->parent = w.cur;
      w.cur = -1;
      out->target = fd;
      out->st = st;
      memcpy(out->name, comp, clen + 1);
      walk_reset(&w);
      return 0;
    }
    if (!S_ISDIR(st.st_mode)) {
      close(fd);
      walk_reset(&w);
      return wn_fail(e, WN_FILE_NOT_FOUND, ENOTDIR, "%s", path);
    }
    if (w.depth >= MAX_DEPTH) {
      close(fd);
      walk_reset(&w);
      return wn_fail(e, WN_INVALID_ARGUMENT, ENAMETOOLONG, "%s: more than %d levels", path, MAX_DEPTH);
    }
    w.stack[w.depth++] = w.cur;
    w.cur = fd;
  }
}

static int open_root(const char *root_dir, wn_error *e) {
  if (wn_check_abs_path(e, "rootDir", root_dir) < 0) return -1;
  int fd = open(root_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return wn_fail_errno(e, WN_NATIVE_ERROR, "open root %s", root_dir);
  return fd;
}

static int check_rel_path(const char *path, wn_error *e) {
  size_t n = strlen(path);
  if (n == 0 || n > WN_MAX_PATH) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "path must be 1..%d bytes", WN_MAX_PATH);
  return 0;
}

static int open_walk(int rootfd, const char *path, int how, mode_t mode, wn_error *e) {

  for (int attempt = 0; attempt < 4; attempt++) {
    resolved r;
    if (resolve(rootfd, path, 0, 0, &r, e) < 0) return -1;
    int fd;
    if (how == WN_OPEN_DIR) {
      if (r.target < 0) {
        resolved_free(&r);
        return wn_fail(e, WN_FILE_NOT_FOUND, ENOENT, "%s", path);
      }
      if (!S_ISDIR(r.st.st_mode)) {
        resolved_free(&r);
        return wn_fail(e, WN_FILE_NOT_FOUND, ENOTDIR, "%s", path);
      }
      fd = openat(r.target, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      int err = errno;
      resolved_free(&r);
      if (fd < 0) return wn_fail(e, WN_NATIVE_ERROR, err, "open %s", path);
      return fd;
    }
    if (r.target >= 0 && !S_ISREG(r.st.st_mode)) {
      resolved_free(&r);
      if (S_ISDIR(r.st.st_mode)) return wn_fail(e, WN_INVALID_ARGUMENT, EISDIR, "%s is a directory", path);
      return wn_fail(e, WN_INVALID_ARGUMENT, EINVAL, "%s is not a regular file", path);
    }
    if (r.parent < 0) { /* only the root itself resolves without a parent; it is a directory */
      resolved_free(&r);
      return wn_fail(e, WN_INVALID_ARGUMENT, EISDIR, "%s is a directory", path);
    }
    int flags = O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK;
    if (how == WN_OPEN_READ) flags |= O_RDONLY;
    if (how == WN_OPEN_WRITE) flags |= O_WRONLY | O_TRUNC;
    if (how == WN_OPEN_APPEND) flags |= O_WRONLY | O_APPEND;
    if (r.target < 0) {
      if (how == WN_OPEN_READ) {
        resolved_free(&r);
        return wn_fail(e, WN_FILE_NOT_FOUND, ENOENT, "%s", path);
      }
      fd = openat(r.parent, r.name, flags | O_CREAT | O_EXCL, mode);
      if (fd < 0 && errno == EEXIST) { /* raced with a creator: resolve again */
        resolved_free(&r);
        continue;
      }
    } else {
      fd = openat(r.parent, r.name, flags);
    }
    int err = errno;
    if (fd < 0) {
      resolved_free(&r);
      if (err == ELOOP || err == ENOENT) continue; /* swapped for a symlink / removed meanwhile */
      return wn_fail(e, WN_NATIVE_ERROR, err, "open %s", path);
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
        (r.target >= 0 && (st.st_dev != r.st.st_dev || st.st_ino != r.st.st_ino))) {
      close(fd);
      resolved_free(&r);
      continue;
    }
    resolved_free(&r);
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
  }
  return wn_fail(e, WN_NATIVE_ERROR, EAGAIN, "open %s: the path kept changing", path);
}

static int mkdir_walk(int rootfd, const char *path, mode_t mode, int recursive, wn_error *e) {
  resolved r;
  if (resolve(rootfd, path, recursive, mode, &r, e) < 0) return -1;
  int rc = 0;
  if (r.target >= 0) {
    if (!(recursive && S_ISDIR(r.st.st_mode))) rc = wn_fail(e, WN_ALREADY_EXISTS, EEXIST, "%s", path);
  } else if (mkdirat(r.parent, r.name, mode) < 0) {
    if (errno == EEXIST && recursive) {
      struct stat st;
      if (fstatat(r.parent, r.name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))
        rc = wn_fail(e, WN_ALREADY_EXISTS, EEXIST, "%s", path);
    } else {
      rc = wn_fail_errno(e, errno == EEXIST ? WN_ALREADY_EXISTS : WN_NATIVE_ERROR, "mkdir %s", path);
    }
  }
  resolved_free(&r);
  return rc;
}

/* ---- openat2 fast path ---- */

static int open_flags(int how) {
  int flags = O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK;
  if (how == WN_OPEN_READ) flags |= O_RDONLY;
  if (how == WN_OPEN_WRITE) flags |= O_WRONLY | O_TRUNC;
  if (how == WN_OPEN_APPEND) flags |= O_WRONLY | O_APPEND;
  return flags;
}

static int openat2_beneath(int dirfd, const char *path, uint64_t flags, uint64_t mode) {
  struct open_how h;
  memset(&h, 0, sizeof h);
  h.flags = flags;
  h.mode = mode;
  h.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  return (int)syscall(SYS_openat2, dirfd, path, &h, sizeof h);
}

/* 1: done (*out is the fd, or -1 with e filled); 0: use the walk. */
static int open_fast(int rootfd, const char *path, int how, mode_t mode, int *out, wn_error *e) {
  while (*path == '/') path++;
  const char *rel = *path ? path : ".";
  int p = openat2_beneath(rootfd, rel, O_PATH | O_CLOEXEC, 0);
  if (p < 0) {
    int err = errno;
    if (err == ENOENT && (how == WN_OPEN_WRITE || how == WN_OPEN_APPEND)) {
      int fd = openat2_beneath(rootfd, rel, (uint64_t)(open_flags(how) | O_CREAT | O_EXCL), mode);
      if (fd < 0) return 0; /* a dangling symlink, a race, a missing parent: the walk says which */
      int fl = fcntl(fd, F_GETFL);
      if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
      *out = fd;
      return 1;
    }
    if (err == EACCES) {
      *out = wn_fail(e, WN_FORBIDDEN, err, "%s: permission denied", path);
      return 1;
    }
    return 0; /* ENOSYS, EXDEV (absolute symlink or escape), ELOOP, ENOENT, ENOTDIR: the walk decides */
  }
  struct stat st;
  struct statfs sfs;
  if (fstat(p, &st) < 0 || fstatfs(p, &sfs) < 0) {
    int err = errno;
    close(p);
    *out = wn_fail(e, WN_NATIVE_ERROR, err, "fstat %s", path);
    return 1;
  }
  if (sfs.f_type == PROC_SUPER_MAGIC) {
    close(p);
    *out = wn_fail(e, WN_PATH_ESCAPE, 0, "path %s crosses into procfs", path);
    return 1;
  }
  if (how == WN_OPEN_DIR ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
    close(p);
    if (S_ISLNK(st.st_mode)) return 0;
    if (how == WN_OPEN_DIR) *out = wn_fail(e, WN_FILE_NOT_FOUND, ENOTDIR, "%s", path);
    else if (S_ISDIR(st.st_mode)) *out = wn_fail(e, WN_INVALID_ARGUMENT, EISDIR, "%s is a directory", path);
    else *out = wn_fail(e, WN_INVALID_ARGUMENT, EINVAL, "%s is not a regular file", path);
    return 1;
  }
  /* Reopen the very inode with the wanted access; the check is the credentials' own. */
  char self[64];
  snprintf(self, sizeof self, "/proc/thread-self/fd/%d", p);
  int flags = how == WN_OPEN_DIR ? (O_RDONLY | O_DIRECTORY | O_CLOEXEC) : (open_flags(how) & ~O_NOFOLLOW);
  int fd = open(self, flags);
  int err = errno;
  close(p);
  if (fd < 0) {
    if (err == EACCES || err == EPERM) *out = wn_fail(e, WN_FORBIDDEN, err, "%s: permission denied", path);
    else *out = wn_fail(e, WN_NATIVE_ERROR, err, "open %s", path);
    return 1;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  *out = fd;
  return 1;
}

static int open_in_root_fd(int rootfd, const char *path, int how, mode_t mode, wn_error *e) {
  int fd;
  if (open_fast(rootfd, path, how, mode, &fd, e)) return fd;
  fd = open_walk(rootfd, path, how, mode, e);
  /* The walk opens with the same credentials; name a refusal for what it is. */
  if (fd < 0 && (e->errnum == EACCES || e->errnum == EPERM) && e->code == WN_NATIVE_ERROR) e->code = WN_FORBIDDEN;
  return fd;
}

/* ---- credentials ---- */

struct creds_job {
  const wn_creds *cr;
  int rootfd;
  const char *path;
  int how;
  mode_t mode;
  int mkdir, recursive;
  int rc;
  wn_error *e;
};

static int set_thread_creds(const wn_creds *cr, wn_error *e) {
  if (syscall(SYS_setgroups, (size_t)cr->n_groups, cr->groups) < 0) return wn_fail_errno(e, WN_NATIVE_ERROR, "setgroups");
  /* The capabilities a sandbox's root keeps, no more (CAP_DAC_READ_SEARCH, CAP_LINUX_IMMUTABLE
     and the rest go); before the fsuid switch, which then drops the file ones for non-root. */
  struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct data[2];
  for (int i = 0; i < 2; i++) {
    uint32_t v = (uint32_t)(wn_default_caps >> (32 * i));
    data[i].effective = v;
    data[i].permitted = v;
    data[i].inheritable = 0;
  }
  if (syscall(SYS_capset, &hdr, data) < 0) return wn_fail_errno(e, WN_NATIVE_ERROR, "capset");
  syscall(SYS_setfsgid, cr->gid);
  syscall(SYS_setfsuid, cr->uid);
  /* setfs*id report the previous id and never fail visibly: read both back. */
  if ((uid_t)syscall(SYS_setfsuid, (uid_t)-1) != cr->uid || (gid_t)syscall(SYS_setfsgid, (gid_t)-1) != cr->gid)
    return wn_fail(e, WN_NATIVE_ERROR, EPERM, "cannot take fsuid %u / fsgid %u", (unsigned)cr->uid, (unsigned)cr->gid);
  return 0;
}

static void *creds_thread(void *arg) {
  struct creds_job *j = arg;
  if (set_thread_creds(j->cr, j->e) < 0) {
    j->rc = -1;
    return NULL;
  }
  j->rc = j->mkdir ? mkdir_walk(j->rootfd, j->path, j->mode, j->recursive, j->e) : open_in_root_fd(j->rootfd, j->path, j->how, j->mode, j->e);
  if (j->mkdir && j->rc < 0 && (j->e->errnum == EACCES || j->e->errnum == EPERM) && j->e->code == WN_NATIVE_ERROR) j->e->code = WN_FORBIDDEN;
  return NULL;
}

static int run_with_creds(struct creds_job *j) {
  if (j->cr == NULL) {
    return j->mkdir ? mkdir_walk(j->rootfd, j->path, j->mode, j->recursive, j->e) : open_in_root_fd(j->rootfd, j->path, j->how, j->mode, j->e);
  }
  if (j->cr->n_groups < 0 || j->cr->n_groups > WN_MAX_GROUPS) return wn_fail(j->e, WN_INVALID_ARGUMENT, 0, "at most %d groups", WN_MAX_GROUPS);
  pthread_t th;
  int err = pthread_create(&th, NULL, creds_thread, j);
  if (err != 0) return wn_fail(j->e, WN_NATIVE_ERROR, err, "pthread_create");
  pthread_join(th, NULL);
  return j->rc;
}

int wn_open_in_root(const char *root_dir, const char *path, int how, mode_t mode, const wn_creds *cr, wn_error *e) {
  if (check_rel_path(path, e) < 0) return -1;
  if (how < WN_OPEN_READ || how > WN_OPEN_DIR) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "bad open flags");
  if (mode > 07777) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "mode must be 0..07777");
  cleanup_fd int rootfd = open_root(root_dir, e);
  if (rootfd < 0) return -1;
  struct creds_job j = {.cr = cr, .rootfd = rootfd, .path = path, .how = how, .mode = mode, .mkdir = 0, .recursive = 0, .rc = -1, .e = e};
  return run_with_creds(&j);
}

int wn_mkdir_in_root(const char *root_dir, const char *path, mode_t mode, int recursive, const wn_creds *cr, wn_error *e) {
  if (check_rel_path(path, e) < 0) return -1;
  if (mode > 07777) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "mode must be 0..07777");
  cleanup_fd int rootfd = open_root(root_dir, e);
  if (rootfd < 0) return -1;
  struct creds_job j = {.cr = cr, .rootfd = rootfd, .path = path, .how = 0, .mode = mode, .mkdir = 1, .recursive = recursive, .rc = -1, .e = e};
  return run_with_creds(&j);
}
