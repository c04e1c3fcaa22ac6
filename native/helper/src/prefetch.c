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
 * Runs on a thread-pool thread (touch adds threads of its own, see below); reports the bytes it
 * asked for.
 *
 * wn_pageout is the way back: process_madvise(MADV_PAGEOUT) over the same private writable
 * mappings pushes their pages to swap whichever LRU list they are on. Pages just read back in
 * are all on the active list, where a memory limit's reclaim round finds nothing to take.
 */
#include "wn.h"

#include <fcntl.h>
#include <pthread.h>
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
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
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

/*
 * touch: swap-in is the kernel decompressing pages (zram) on the calling thread, so the address
 * space is read by up to PREFETCH_THREADS threads at once, one per online CPU: each takes every
 * Nth STRIPE of every region, with its own pagemap descriptor and buffer.
 */
#define PREFETCH_THREADS 4
#define STRIPE (4u << 20)

static unsigned online_cpus(void) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus < 1 ? 1 : (unsigned)cpus;
}

/* `want` threads, within 1..PREFETCH_THREADS (the size of the job arrays). */
static unsigned threads_for(unsigned want) {
  return want < 1 ? 1 : want > PREFETCH_THREADS ? PREFETCH_THREADS : want;
}

/*
 * Run `worker` over jobs[0..count) (each `size` bytes): job 0 on this thread, the others on
 * threads of their own; a job whose thread cannot be made runs on this thread too, so every
 * stripe is still done once.
 */
static void fan_out(void *(*worker)(void *), void *jobs, size_t size, unsigned count) {
  pthread_t tids[PREFETCH_THREADS];
  unsigned made = 1;
  for (unsigned t = 1; t < count; t++) {
    if (pthread_create(&tids[t], NULL, worker, (char *)jobs + t * size) != 0) break;
    made++;
  }
  for (unsigned t = made; t < count; t++) worker((char *)jobs + t * size);
  worker(jobs);
  for (unsigned t = 1; t < made; t++) pthread_join(tids[t], NULL);
}

struct touch_job {
  pid_t pid;
  const struct region *r;
  size_t n;
  unsigned index, count;
  uint64_t bytes;
  int gone;  /* the process went away (ESRCH) */
  int err;   /* errno of a failure to start (open, mmap), 0 otherwise */
};

static void touch_range(struct touch_job *j, int pm, char *buf, uintptr_t from, uintptr_t to, long page) {
  uint64_t ent[BATCH];
  for (uintptr_t a = from; a < to && !j->gone;) {
    size_t want = (to - a) / (uintptr_t)page;
    if (want > BATCH) want = BATCH;
    ssize_t got = pread(pm, ent, want * sizeof ent[0], (off_t)((a / (uintptr_t)page) * sizeof ent[0]));
    if (got <= 0) return;
    size_t m = (size_t)got / sizeof ent[0];
    /* runs of swapped pages, read in chunks of at most CHUNK */
    for (size_t i = 0; i < m;) {
      if (!(ent[i] & PM_SWAPPED)) {
        i++;
        continue;
      }
      size_t k = i;
      while (k < m && (ent[k] & PM_SWAPPED) && (k - i + 1) * (size_t)page <= CHUNK) k++;
      struct iovec local = {buf, (k - i) * (size_t)page};
      struct iovec remote = {(void *)(a + i * (uintptr_t)page), (k - i) * (size_t)page};
      ssize_t rd = process_vm_readv(j->pid, &local, 1, &remote, 1, 0);
      if (rd < 0 && errno == ESRCH) {
        j->gone = 1;
        return;
      }
      /* EFAULT: the mapping changed under us; the rest of the run is skipped */
      if (rd > 0) j->bytes += (uint64_t)rd;
      i = k;
    }
    a += m * (uintptr_t)page;
  }
}

static void *touch_worker(void *arg) {
  struct touch_job *j = arg;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/pagemap", (int)j->pid);
  cleanup_fd int pm = open(path, O_RDONLY | O_CLOEXEC);
  if (pm < 0) {
    j->err = errno;
    return NULL;
  }
  long page = sysconf(_SC_PAGESIZE);
  char *buf = mmap(NULL, CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) {
    j->err = errno;
    return NULL;
  }
  uint64_t stripe = 0;
  for (size_t i = 0; i < j->n && !j->gone; i++) {
    for (uintptr_t a = j->r[i].start; a < j->r[i].end && !j->gone; a += STRIPE, stripe++) {
      if (stripe % j->count != j->index) continue;
      uintptr_t to = j->r[i].end - a > STRIPE ? a + STRIPE : j->r[i].end;
      touch_range(j, pm, buf, a, to, page);
    }
  }
  munmap(buf, CHUNK);
  return NULL;
}

static int touch(pid_t pid, const struct region *r, size_t n, uint64_t *bytes, wn_error *e) {
  unsigned count = threads_for(online_cpus());
  struct touch_job jobs[PREFETCH_THREADS];
  for (unsigned t = 0; t < count; t++) jobs[t] = (struct touch_job){.pid = pid, .r = r, .n = n, .index = t, .count = count};
  fan_out(touch_worker, jobs, sizeof jobs[0], count);
  int gone = 0, err = 0;
  for (unsigned t = 0; t < count; t++) {
    *bytes += jobs[t].bytes;
    gone |= jobs[t].gone;
    if (jobs[t].err && !err) err = jobs[t].err;
  }
  if (gone) return wn_fail(e, WN_SANDBOX_NOT_RUNNING, ESRCH, "process_vm_readv %d", (int)pid);
  if (err) return wn_fail(e, err == ENOENT ? WN_SANDBOX_NOT_RUNNING : WN_NATIVE_ERROR, err, "prefetch %d: pagemap or buffer", (int)pid);
  return 0;
}

/*
 * process_madvise(advice) over the process's private writable mappings, cut into STRIPEs dealt to
 * `threads` threads (this one and threads-1 more), each passing its stripes in IOV batches and
 * sharing the pidfd. Paging out is the kernel compressing pages (zram) on the calling thread, as
 * swap-in is decompressing them: MADV_PAGEOUT gets one thread per online CPU, as touch does.
 */
struct advise_job {
  int pidfd, advice;
  const struct region *r;
  size_t n;
  unsigned index, count;
  uint64_t bytes;
  int err; /* errno of a failure that is not a mapping changing under us, 0 otherwise */
};

static void advise_batch(struct advise_job *j, struct iovec *iov, size_t k) {
  /* EFAULT, ENOMEM, EINVAL: a mapping changed or cannot take the advice; the others still do */
  if (k > 0 && syscall(SYS_process_madvise, j->pidfd, iov, k, j->advice, 0) < 0 && errno != EFAULT && errno != ENOMEM && errno != EINVAL) j->err = errno;
}

static void *advise_worker(void *arg) {
  struct advise_job *j = arg;
  struct iovec iov[256];
  size_t k = 0;
  uint64_t stripe = 0;
  for (size_t i = 0; i < j->n && j->err == 0; i++) {
    if (!j->r[i].anon_rw) continue;
    for (uintptr_t a = j->r[i].start; a < j->r[i].end && j->err == 0; a += STRIPE, stripe++) {
      if (stripe % j->count != j->index) continue;
      uintptr_t to = j->r[i].end - a > STRIPE ? a + STRIPE : j->r[i].end;
      iov[k] = (struct iovec){(void *)a, to - a};
      j->bytes += to - a;
      if (++k == sizeof iov / sizeof iov[0]) advise_batch(j, iov, k), k = 0;
    }
  }
  if (j->err == 0) advise_batch(j, iov, k);
  return NULL;
}

static int advise(pid_t pid, const struct region *r, size_t n, int advice, const char *what, unsigned threads, uint64_t *bytes, wn_error *e) {
  int pidfd = wn_pidfd_open(pid, 0);
  if (pidfd < 0) return wn_fail_errno(e, WN_SANDBOX_NOT_RUNNING, "pidfd_open %d", (int)pid);
  unsigned count = threads_for(threads);
  struct advise_job jobs[PREFETCH_THREADS];
  for (unsigned t = 0; t < count; t++) jobs[t] = (struct advise_job){.pidfd = pidfd, .advice = advice, .r = r, .n = n, .index = t, .count = count};
  fan_out(advise_worker, jobs, sizeof jobs[0], count);
  close(pidfd);
  int err = 0;
  for (unsigned t = 0; t < count; t++) {
    *bytes += jobs[t].bytes;
    if (jobs[t].err && !err) err = jobs[t].err;
  }
  if (err == ESRCH) return wn_fail(e, WN_SANDBOX_NOT_RUNNING, err, "process_madvise %d", (int)pid);
  if (err) return wn_fail(e, err == ENOSYS ? WN_NOT_SUPPORTED : WN_NATIVE_ERROR, err, "process_madvise %s %d", what, (int)pid);
  return 0;
}

int wn_prefetch(pid_t pid, int mode, uint64_t *bytes, wn_error *e) {
  *bytes = 0;
  if (pid < 1 || pid > WN_PID_MAX) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "pid must be 1..%d", WN_PID_MAX);
  struct region *r = NULL;
  size_t n = 0;
  if (read_maps(pid, &r, &n, e) < 0) return -1;
  int rc = mode == WN_PREFETCH_WILLNEED ? advise(pid, r, n, MADV_WILLNEED, "MADV_WILLNEED", 1, bytes, e) : touch(pid, r, n, bytes, e);
  free(r);
  return rc;
}

int wn_pageout(pid_t pid, uint64_t *bytes, wn_error *e) {
  *bytes = 0;
  if (pid < 1 || pid > WN_PID_MAX) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "pid must be 1..%d", WN_PID_MAX);
  struct region *r = NULL;
  size_t n = 0;
  if (read_maps(pid, &r, &n, e) < 0) return -1;
  int rc = advise(pid, r, n, MADV_PAGEOUT, "MADV_PAGEOUT", online_cpus(), bytes, e);
  free(r);
  return rc;
}
