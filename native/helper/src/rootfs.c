/*
 * openInRoot / mkdirInRoot: a race-free userspace walk confined to a root
 * directory (in the spirit of filepath-securejoin).
 *
 * The walk starts at an O_PATH fd of the root and opens one component at a time
 * with O_PATH|O_NOFOLLOW. Symlinks are read with readlinkat and spliced into the
 * remaining path; absolute targets restart at the root fd. ".." pops a stack of
 * already-opened ancestor fds, so it can never climb above the root (that is
 * PATH_ESCAPE) and is immune to directories being moved meanwhile. Any
 * component on procfs is refused (PATH_ESCAPE): this blocks magic links such as
 * /proc/self/root or /proc/1/cwd inside the sandbox.
 */
#include "wn.h"

#include <fcntl.h>
#include <limits.h>
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

int wn_open_in_root(const char *root_dir, const char *path, int how, mode_t mode, wn_error *e) {
  if (check_rel_path(path, e) < 0) return -1;
  if (how < WN_OPEN_READ || how > WN_OPEN_DIR) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "bad open flags");
  if (mode > 07777) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "mode must be 0..07777");
  cleanup_fd int rootfd = open_root(root_dir, e);
  if (rootfd < 0) return -1;

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

int wn_mkdir_in_root(const char *root_dir, const char *path, mode_t mode, int recursive, wn_error *e) {
  if (check_rel_path(path, e) < 0) return -1;
  if (mode > 07777) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "mode must be 0..07777");
  cleanup_fd int rootfd = open_root(root_dir, e);
  if (rootfd < 0) return -1;
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
