/*
 * wn_prefetch: bring the swapped-out pages of a (resumed) sandbox process back before it needs them.
 *
 *   WN_PREFETCH_TOUCH     read every swapped-out page of the process with process_vm_readv: the
 *                         kernel faults each one in for us (swap-in, decompression for zram) and
 *                         maps it into the process, so its own first touch costs nothing. Which
 *                         pages are in swap comes from /proc/<pid>/pagemap (bit 62), so resident
 *                         pages are not copied.
 *   WN_PREFETCH_WILLNEED  process_madvise(MADV_WILLNEED) over the process's private writable
 *                         mappings: swap readahead into the swap cache; the process's first touch
 *                         of each page is then a minor fault (no decompression, but still a fault).
 *
 * Runs on a thread-pool thread; reports the bytes it asked for.
 */
#include "wn.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef SYS_process_madvise
#define SYS_process_madvise 440
#endif
#define PM_SWAPPED (UINT64_C(1) << 62)
#define CHUNK (1u << 20)
#define BATCH 512

struct region {
  uintptr_t start, end;
  int anon_rw;
};

/* Readable mappings of the process (no [vvar], [vsyscall], [vdso]). */
static int read_maps(pid_t pid, struct region **out, size_t *n, wn_error *e) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
  FILE *f = fopen(path, "re");
  if (f == NULL) return wn_fail_errno(e, errno == ENOENT ? WN_SANDBOX_NOT_RUNNING : WN_NATIVE_ERROR, "open %s", path);
  size_t cap = 64, k = 0;
  struct region *r = malloc(cap * sizeof *r);
  char line[4352];
  while (r != NULL && fgets(line, sizeof line, f) != NULL) {
    unsigned long s, en;
    char perms[8] = "";
    unsigned long long off;
    char dev[16];
    unsigned long inode;
    int name_at = 0;
    if (sscanf(line, "%lx-%lx %7s %llx %15s %lu %n", &s, &en, perms, &off, dev, &inode, &name_at) < 6) continue;
    const char *name = name_at > 0 ? line + name_at : "";
    if (perms[0] != 'r') continue;
    if (strncmp(name, "[vvar]", 6) == 0 || strncmp(name, "[vsyscall]", 10) == 0 || strncmp(name, "[vdso]", 6) == 0) continue;
    if (k == cap) {
      cap *= 2;
      struct region *nr = realloc(r, cap * sizeof *r);
      if (nr == NULL) {
        free(r);
        r = NULL;
        break;
      }
      r = nr;
    }
    r[k].start = s;
    r[k].end = en;
    r[k].anon_rw = perms[1] == 'w' && perms[3] == 'p';
    k++;
  }
  fclose(f);
  if (r == NULL) return wn_fail(e, WN_NATIVE_ERROR, ENOMEM, "prefetch: out of memory");
  *out = r;
  *n = k;
  return 0;
}

static int touch(pid_t pid, const struct region *r, size_t n, uint64_t *bytes, wn_error *e) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/pagemap", (int)pid);
  cleanup_fd int pm = open(path, O_RDONLY | O_CLOEXEC);
  if (pm < 0) return wn_fail_errno(e, WN_NATIVE_ERROR, "open %s", path);
  long page = sysconf(_SC_PAGESIZE);
  char *buf = mmap(NULL, CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) return wn_fail_errno(e, WN_NATIVE_ERROR, "mmap");
  uint64_t ent[BATCH];
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    for (uintptr_t a = r[i].start; a < r[i].end && rc == 0;) {
      size_t want = (r[i].end - a) / (uintptr_t)page;
      if (want > BATCH) want = BATCH;
      ssize_t got = pread(pm, ent, want * sizeof ent[0], (off_t)((a / (uintptr_t)page) * sizeof ent[0]));
      if (got <= 0) break;
      size_t m = (size_t)got / sizeof ent[0];
      /* runs of swapped pages, read in chunks of at most CHUNK */
      for (size_t j = 0; j < m;) {
        if (!(ent[j] & PM_SWAPPED)) {
          j++;
          continue;
        }
        size_t k = j;
        while (k < m && (ent[k] & PM_SWAPPED) && (k - j + 1) * (size_t)page <= CHUNK) k++;
        struct iovec local = {buf, (k - j) * (size_t)page};
        struct iovec remote = {(void *)(a + j * (uintptr_t)page), (k - j) * (size_t)page};
        ssize_t rd = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (rd < 0 && errno == ESRCH) {
          rc = wn_fail_errno(e, WN_SANDBOX_NOT_RUNNING, "process_vm_readv %d", (int)pid);
          break;
        }
        /* EFAULT: the mapping changed under us; the rest of the run is skipped */
        if (rd > 0) *bytes += (uint64_t)rd;
        j = k;
      }
      a += m * (uintptr_t)page;
    }
  }
  munmap(buf, CHUNK);
  return rc;
}

static int willneed(pid_t pid, const struct region *r, size_t n, uint64_t *bytes, wn_error *e) {
  cleanup_fd int pidfd = wn_pidfd_open(pid, 0);
  if (pidfd < 0) return wn_fail_errno(e, WN_SANDBOX_NOT_RUNNING, "pidfd_open %d", (int)pid);
  struct iovec iov[256];
  size_t k = 0;
  for (size_t i = 0; i <= n; i++) {
    if (i < n && r[i].anon_rw) {
      iov[k].iov_base = (void *)r[i].start;
      iov[k].iov_len = r[i].end - r[i].start;
      *bytes += iov[k].iov_len;
      k++;
    }
    if (k > 0 && (k == sizeof iov / sizeof iov[0] || i == n)) {
      if (syscall(SYS_process_madvise, pidfd, iov, k, MADV_WILLNEED, 0) < 0 && errno != EFAULT && errno != ENOMEM && errno != EINVAL) {
        if (errno == ESRCH) return wn_fail_errno(e, WN_SANDBOX_NOT_RUNNING, "process_madvise %d", (int)pid);
        return wn_fail_errno(e, errno == ENOSYS ? WN_NOT_SUPPORTED : WN_NATIVE_ERROR, "process_madvise MADV_WILLNEED %d", (int)pid);
      }
      k = 0;
    }
  }
  return 0;
}

int wn_prefetch(pid_t pid, int mode, uint64_t *bytes, wn_error *e) {
  *bytes = 0;
  if (pid < 1 || pid > WN_PID_MAX) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "pid must be 1..%d", WN_PID_MAX);
  struct region *r = NULL;
  size_t n = 0;
  if (read_maps(pid, &r, &n, e) < 0) return -1;
  int rc = mode == WN_PREFETCH_WILLNEED ? willneed(pid, r, n, bytes, e) : touch(pid, r, n, bytes, e);
  free(r);
  return rc;
}
