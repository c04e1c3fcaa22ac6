/*
 * cgroups behind one interface: v1 (one directory per controller, plus the
 * controller-less cgroup2 tree at /sys/fs/cgroup/unified when present) and v2
 * (/sys/fs/cgroup is cgroup2). Groups live under a "warren" parent in every
 * hierarchy: <mount>/warren/<name>.
 */
#include "wn.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>

#ifndef CGROUP_SUPER_MAGIC
#define CGROUP_SUPER_MAGIC 0x27e0eb
#endif
#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

#define CG_ROOT "/sys/fs/cgroup"
#define CG_PARENT "warren"
#define FREEZE_TIMEOUT_MS 10000

const char *const wn_cg_role_names[WN_CG_NROLES] = {"cpu", "cpuacct", "memory", "pids", "freezer", "unified"};

/* ---- layout -------------------------------------------------------------- */

static int is_fs(const char *path, long magic) {
  struct statfs sfs;
  if (statfs(path, &sfs) < 0) return 0;
  return (long)sfs.f_type == magic;
}

/* Undo mountinfo's octal escapes (\040 etc.) in place. */
static void unescape_mountinfo(char *s) {
  char *w = s;
  for (char *r = s; *r; r++) {
    if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' && r[3] >= '0' && r[3] <= '7') {
      *w++ = (char)(((r[1] - '0') << 6) | ((r[2] - '0') << 3) | (r[3] - '0'));
      r += 3;
    } else {
      *w++ = *r;
    }
  }
  *w = '\0';
}

/* Find a v1 mount carrying `ctrl` in /proc/self/mountinfo (for hosts without /sys/fs/cgroup/<ctrl>). */
static int find_v1_mount(const char *ctrl, char *out, size_t cap) {
  cleanup_free char *data = NULL;
  if (wn_read_file_alloc("/proc/self/mountinfo", &data) < 0) return -1;
  char *save = NULL;
  for (char *line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *sep = strstr(line, " - ");
    if (!sep) continue;
    *sep = '\0';
    char *fields[6] = {0};
    char *fs_save = NULL;
    int nf = 0;
    for (char *f = strtok_r(line, " ", &fs_save); f && nf < 6; f = strtok_r(NULL, " ", &fs_save)) fields[nf++] = f;
    if (nf < 5) continue;
    char *tail_save = NULL;
    char *fstype = strtok_r(sep + 3, " ", &tail_save);
    (void)strtok_r(NULL, " ", &tail_save); /* source */
    char *opts = strtok_r(NULL, " ", &tail_save);
    if (!fstype || !opts || strcmp(fstype, "cgroup") != 0) continue;
    if (strcmp(fields[3], "/") != 0) continue; /* a bind of a sub-group */
    char *o_save = NULL;
    for (char *o = strtok_r(opts, ",", &o_save); o; o = strtok_r(NULL, ",", &o_save)) {
      if (strcmp(o, ctrl) == 0) {
        unescape_mountinfo(fields[4]);
        if (strlen(fields[4]) >= cap) return -1;
        strcpy(out, fields[4]);
        return 0;
      }
    }
  }
  errno = ENOENT;
  return -1;
}

static wn_cg_layout g_layout;
static wn_error g_layout_err;
static int g_layout_rc;
static pthread_once_t g_layout_once = PTHREAD_ONCE_INIT;

static void detect_layout(void) {
  wn_cg_layout *l = &g_layout;
  memset(l, 0, sizeof *l);
  for (int i = 0; i < WN_CG_NROLES; i++) l->same_as[i] = i;
  /* WARREN_CGROUP_ROOT: where the hierarchies are mounted (default /sys/fs/cgroup). The tests point
     it at a controller-less cgroup2 tree to run the v2 code paths on a v1 host. */
  const char *root = getenv("WARREN_CGROUP_ROOT");
  if (root == NULL || root[0] != '/' || strlen(root) >= sizeof l->mount[0] - 16) root = CG_ROOT;
  if (is_fs(root, CGROUP2_SUPER_MAGIC)) {
    l->version = 2;
    for (int i = 0; i < WN_CG_NROLES; i++) {
      strcpy(l->mount[i], root);
      l->same_as[i] = WN_CG_UNIFIED;
    }
    l->same_as[WN_CG_UNIFIED] = WN_CG_UNIFIED;
    return;
  }
  l->version = 1;
  for (int i = 0; i < WN_CG_UNIFIED; i++) {
    char path[PATH_MAX], real[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", root, wn_cg_role_names[i]);
    if (realpath(path, real) != NULL && is_fs(real, CGROUP_SUPER_MAGIC) && strlen(real) < sizeof l->mount[i]) {
      strcpy(l->mount[i], real);
    } else if (find_v1_mount(wn_cg_role_names[i], real, sizeof l->mount[i]) == 0) {
      strcpy(l->mount[i], real);
    } else {
      l->mount[i][0] = '\0';
    }
  }
  char unified[PATH_MAX];
  snprintf(unified, sizeof unified, "%s/unified", root);
  if (is_fs(unified, CGROUP2_SUPER_MAGIC) && strlen(unified) < sizeof l->mount[WN_CG_UNIFIED])
    strcpy(l->mount[WN_CG_UNIFIED], unified);
  /* co-mounted controllers (cpu,cpuacct) share one directory: act on it once */
  for (int i = 0; i < WN_CG_NROLES; i++) {
    if (!l->mount[i][0]) continue;
    for (int j = 0; j < i; j++)
      if (l->mount[j][0] && strcmp(l->mount[i], l->mount[j]) == 0) {
        l->same_as[i] = l->same_as[j];
        break;
      }
  }
  for (int i = 0; i < WN_CG_UNIFIED; i++) {
    if (!l->mount[i][0]) {
      g_layout_rc = wn_fail(&g_layout_err, WN_NOT_SUPPORTED, 0,
                            "cgroup v1 controller '%s' is not mounted (need cpu, cpuacct, memory, pids, freezer)",
                            wn_cg_role_names[i]);
      return;
    }
  }
}

int wn_cg_layout_get(const wn_cg_layout **out, wn_error *e) {
  pthread_once(&g_layout_once, detect_layout);
  if (g_layout_rc < 0) {
    if (e) *e = g_layout_err;
    return -1;
  }
  *out = &g_layout;
  return 0;
}

int wn_cg_path(const wn_cg_layout *l, int role, const char *name, char *buf, size_t cap) {
  if (!l->mount[role][0]) return -1;
  int n = name ? snprintf(buf, cap, "%s/" CG_PARENT "/%s", l->mount[role], name)
               : snprintf(buf, cap, "%s/" CG_PARENT, l->mount[role]);
  if (n < 0 || (size_t)n >= cap) return -1;
  return 0;
}

/* Distinct hierarchies, in role order. */
static int distinct_roles(const wn_cg_layout *l, int roles[WN_CG_NROLES]) {
  int n = 0;
  for (int i = 0; i < WN_CG_NROLES; i++)
    if (l->mount[i][0] && l->same_as[i] == i) roles[n++] = i;
  return n;
}

/* ---- file helpers ---------------------------------------------------------- */

static int cg_write(const wn_cg_layout *l, int role, const char *name, const char *file, const char *value,
                    wn_error *e) {
  char path[PATH_MAX];
  if (wn_cg_path(l, role, name, path, sizeof path) < 0) return wn_fail(e, WN_CGROUP_ERROR, ENOENT, "no %s hierarchy", wn_cg_role_names[role]);
  size_t n = strlen(path);
  snprintf(path + n, sizeof path - n, "/%s", file);
  if (wn_write_file_at(AT_FDCWD, path, value) < 0) {
    int err = errno;
    return wn_fail(e, WN_CGROUP_ERROR, err, "write '%s' to %s", value, path);
  }
  return 0;
}

/* Returns length, or -1 (errno set; message filled when e != NULL). */
static ssize_t cg_read(const wn_cg_layout *l, int role, const char *name, const char *file, char *buf, size_t cap,
                       wn_error *e) {
  char path[PATH_MAX];
  if (wn_cg_path(l, role, name, path, sizeof path) < 0) {
    errno = ENOENT;
    wn_fail(e, WN_CGROUP_ERROR, ENOENT, "no %s hierarchy", wn_cg_role_names[role]);
    return -1;
  }
  size_t n = strlen(path);
  snprintf(path + n, sizeof path - n, "/%s", file);
  ssize_t r = wn_read_file_at(AT_FDCWD, path, buf, cap);
  if (r < 0) {
    int err = errno;
    wn_fail(e, WN_CGROUP_ERROR, err, "read %s", path);
    errno = err;
  }
  return r;
}

static int cg_read_u64(const wn_cg_layout *l, int role, const char *name, const char *file, uint64_t *out,
                       wn_error *e) {
  char buf[64];
  if (cg_read(l, role, name, file, buf, sizeof buf, e) < 0) return -1;
  if (strncmp(buf, "max", 3) == 0) {
    *out = UINT64_MAX;
    return 0;
  }
  if (wn_parse_u64(buf, out) < 0)
    return wn_fail(e, WN_CGROUP_ERROR, 0, "parse %s/%s/%s: '%s'", l->mount[role], name, file, buf);
  return 0;
}

/* Value of "key N" in a flat-keyed file (memory.events, cpu.stat, memory.oom_control). */
static int cg_read_key(const wn_cg_layout *l, int role, const char *name, const char *file, const char *key,
                       uint64_t *out, wn_error *e) {
  char buf[4096];
  if (cg_read(l, role, name, file, buf, sizeof buf, e) < 0) return -1;
  size_t klen = strlen(key);
  char *save = NULL;
  for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (strncmp(line, key, klen) == 0 && line[klen] == ' ') {
      if (wn_parse_u64(line + klen + 1, out) < 0) break;
      return 0;
    }
  }
  *out = 0;
  return 0; /* absent key: the event never happened on this kernel's accounting */
}

static void fmt_limit(char *buf, size_t cap, int64_t v, int v2) {
  if (v == WN_LIMIT_MAX)
    snprintf(buf, cap, "%s", v2 ? "max" : "-1");
  else
    snprintf(buf, cap, "%lld", (long long)v);
}

/* ---- limits ---------------------------------------------------------------- */

void wn_cg_limits_init(wn_cg_limits *l) {
  l->cpu_quota_us = l->cpu_period_us = l->memory_bytes = l->memory_swap_bytes = l->pids_max = WN_LIMIT_UNSET;
}

int wn_cg_limits_check(const wn_cg_limits *l, wn_error *e) {
  if (l->cpu_quota_us != WN_LIMIT_UNSET && l->cpu_quota_us != WN_LIMIT_MAX &&
      (l->cpu_quota_us < 1000 || l->cpu_quota_us > 1000000LL * 1000000))
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "cpuQuotaUs must be -1 (unlimited) or 1000..1e12");
  if (l->cpu_period_us != WN_LIMIT_UNSET && (l->cpu_period_us < 1000 || l->cpu_period_us > 1000000))
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "cpuPeriodUs must be 1000..1000000");
  const int64_t max_bytes = INT64_C(1) << 52;
  if (l->memory_bytes != WN_LIMIT_UNSET && l->memory_bytes != WN_LIMIT_MAX &&
      (l->memory_bytes < (1 << 20) || l->memory_bytes > max_bytes))
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "memoryBytes must be -1 (unlimited) or 1 MiB..4 PiB");
  if (l->memory_swap_bytes != WN_LIMIT_UNSET && l->memory_swap_bytes != WN_LIMIT_MAX &&
      (l->memory_swap_bytes < (1 << 20) || l->memory_swap_bytes > max_bytes))
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "memorySwapBytes must be -1 (unlimited) or 1 MiB..4 PiB");
  if (l->memory_swap_bytes >= 0 && l->memory_bytes != WN_LIMIT_UNSET &&
      (l->memory_bytes == WN_LIMIT_MAX || l->memory_swap_bytes < l->memory_bytes))
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "memorySwapBytes (memory+swap) must be >= memoryBytes");
  if (l->pids_max != WN_LIMIT_UNSET && l->pids_max != WN_LIMIT_MAX && (l->pids_max < 1 || l->pids_max > WN_PID_MAX))
    return wn_fail(e, WN_INVALID_ARGUMENT, 0, "pidsMax must be -1 (unlimited) or 1..%d", WN_PID_MAX);
  return 0;
}

static int apply_limits(const wn_cg_layout *l, const char *name, const wn_cg_limits *lim, wn_error *e) {
  char v[64];
  int v2 = l->version == 2;
  /* cpu */
  if (lim->cpu_quota_us != WN_LIMIT_UNSET || lim->cpu_period_us != WN_LIMIT_UNSET) {
    if (v2) {
      char cur[64] = "max 100000";
      cg_read(l, WN_CG_CPU, name, "cpu.max", cur, sizeof cur, NULL);
      char cur_quota[32] = "max";
      long long cur_period = 100000;
      sscanf(cur, "%31s %lld", cur_quota, &cur_period);
      long long period = lim->cpu_period_us != WN_LIMIT_UNSET ? lim->cpu_period_us : cur_period;
      if (lim->cpu_quota_us == WN_LIMIT_UNSET)
        snprintf(v, sizeof v, "%s %lld", cur_quota, period);
      else if (lim->cpu_quota_us == WN_LIMIT_MAX)
        snprintf(v, sizeof v, "max %lld", period);
      else
        snprintf(v, sizeof v, "%lld %lld", (long long)lim->cpu_quota_us, period);
      if (cg_write(l, WN_CG_CPU, name, "cpu.max", v, e) < 0) return -1;
    } else {
      if (lim->cpu_period_us != WN_LIMIT_UNSET) {
        fmt_limit(v, sizeof v, lim->cpu_period_us, 0);
        if (cg_write(l, WN_CG_CPU, name, "cpu.cfs_period_us", v, e) < 0) return -1;
      }
      if (lim->cpu_quota_us != WN_LIMIT_UNSET) {
        fmt_limit(v, sizeof v, lim->cpu_quota_us, 0);
        if (cg_write(l, WN_CG_CPU, name, "cpu.cfs_quota_us", v, e) < 0) return -1;
      }
    }
  }
  /* memory (+swap) */
  int64_t mem = lim->memory_bytes, memsw = lim->memory_swap_bytes;
  if (mem != WN_LIMIT_UNSET && memsw == WN_LIMIT_UNSET) memsw = mem; /* no swap */
  if (v2) {
    if (mem != WN_LIMIT_UNSET) {
      fmt_limit(v, sizeof v, mem, 1);
      if (cg_write(l, WN_CG_MEMORY, name, "memory.max", v, e) < 0) return -1;
    }
    if (memsw != WN_LIMIT_UNSET) {
      int64_t swap;
      if (memsw == WN_LIMIT_MAX || mem == WN_LIMIT_MAX) {
        swap = WN_LIMIT_MAX;
      } else {
        int64_t m = mem;
        if (m == WN_LIMIT_UNSET) {
          uint64_t cur = 0;
          if (cg_read_u64(l, WN_CG_MEMORY, name, "memory.max", &cur, e) < 0) return -1;
          m = cur == UINT64_MAX ? memsw : (int64_t)cur;
        }
        swap = memsw > m ? memsw - m : 0;
      }
      fmt_limit(v, sizeof v, swap, 1);
      wn_error tmp;
      if (cg_write(l, WN_CG_MEMORY, name, "memory.swap.max", v, &tmp) < 0 && tmp.errnum != ENOENT) {
        *e = tmp;
        return -1;
      }
    }
  } else {
    char path[PATH_MAX];
    wn_cg_path(l, WN_CG_MEMORY, name, path, sizeof path);
    strncat(path, "/memory.memsw.limit_in_bytes", sizeof path - strlen(path) - 1);
    int have_memsw = access(path, F_OK) == 0;
    char vm[64], vs[64];
    fmt_limit(vm, sizeof vm, mem, 0);
    fmt_limit(vs, sizeof vs, memsw, 0);
    if (mem != WN_LIMIT_UNSET) {
      /* memsw must stay >= memory: raising memory may need memsw first. */
      wn_error tmp;
      if (cg_write(l, WN_CG_MEMORY, name, "memory.limit_in_bytes", vm, &tmp) < 0) {
        if (!(tmp.errnum == EINVAL && have_memsw && memsw != WN_LIMIT_UNSET)) {
          *e = tmp;
          return -1;
        }
        if (cg_write(l, WN_CG_MEMORY, name, "memory.memsw.limit_in_bytes", vs, e) < 0) return -1;
        if (cg_write(l, WN_CG_MEMORY, name, "memory.limit_in_bytes", vm, e) < 0) return -1;
        memsw = WN_LIMIT_UNSET; /* done */
      }
    }
    if (have_memsw && memsw != WN_LIMIT_UNSET) {
      if (cg_write(l, WN_CG_MEMORY, name, "memory.memsw.limit_in_bytes", vs, e) < 0) return -1;
    }
  }
  if (lim->pids_max != WN_LIMIT_UNSET) {
    fmt_limit(v, sizeof v, lim->pids_max, 1);
    if (cg_write(l, WN_CG_PIDS, name, "pids.max", v, e) < 0) return -1;
  }
  return 0;
}

/* ---- lifecycle ---------------------------------------------------------- */

static int mkdir_ok(const char *path, wn_error *e) {
  if (mkdir(path, 0755) < 0 && errno != EEXIST) return wn_fail_errno(e, WN_CGROUP_ERROR, "mkdir %s", path);
  return 0;
}

static int has_token(const char *list, const char *tok) {
  char tmp[512];
  snprintf(tmp, sizeof tmp, "%s", list);
  char *save = NULL;
  for (char *t = strtok_r(tmp, " \n", &save); t; t = strtok_r(NULL, " \n", &save))
    if (strcmp(t, tok) == 0) return 1;
  return 0;
}

/* v2: make cpu, memory and pids available to children of `dir` (those the kernel offers there;
   a missing one surfaces later as a failed limit write, e.g. "write ... memory.max: ENOENT"). */
static int enable_controllers(const char *dir, wn_error *e) {
  char path[PATH_MAX], avail[512], cur[512];
  snprintf(path, sizeof path, "%s/cgroup.controllers", dir);
  if (wn_read_file_at(AT_FDCWD, path, avail, sizeof avail) < 0) return wn_fail_errno(e, WN_CGROUP_ERROR, "read %s", path);
  snprintf(path, sizeof path, "%s/cgroup.subtree_control", dir);
  if (wn_read_file_at(AT_FDCWD, path, cur, sizeof cur) < 0) return wn_fail_errno(e, WN_CGROUP_ERROR, "read %s", path);
  static const char *const ctrls[] = {"cpu", "memory", "pids"};
  for (size_t i = 0; i < sizeof ctrls / sizeof ctrls[0]; i++) {
    if (has_token(cur, ctrls[i]) || !has_token(avail, ctrls[i])) continue;
    char val[32];
    snprintf(val, sizeof val, "+%s", ctrls[i]);
    if (wn_write_file_at(AT_FDCWD, path, val) < 0) return wn_fail_errno(e, WN_CGROUP_ERROR, "write '%s' to %s", val, path);
  }
  return 0;
}

static int ensure_parents(const wn_cg_layout *l, wn_error *e) {
  int roles[WN_CG_NROLES];
  int n = distinct_roles(l, roles);
  for (int i = 0; i < n; i++) {
    char path[PATH_MAX];
    if (wn_cg_path(l, roles[i], NULL, path, sizeof path) < 0) continue;
    if (l->version == 2 && enable_controllers(l->mount[roles[i]], e) < 0) return -1;
    if (mkdir_ok(path, e) < 0) return -1;
    if (l->version == 2 && enable_controllers(path, e) < 0) return -1;
  }
  return 0;
}

static void rmdir_all(const wn_cg_layout *l, const char *name) {
  int roles[WN_CG_NROLES];
  int n = distinct_roles(l, roles);
  for (int i = 0; i < n; i++) {
    char path[PATH_MAX];
    if (wn_cg_path(l, roles[i], name, path, sizeof path) == 0) rmdir(path);
  }
}

int wn_cg_create(const char *name, const wn_cg_limits *lim, wn_error *e) {
  const wn_cg_layout *l;
  if (wn_check_id(e, "cgroup name", name) < 0 || wn_cg_limits_check(lim, e) < 0) return -1;
  if (wn_cg_layout_get(&l, e) < 0) return -1;
  if (ensure_parents(l, e) < 0) return -1;
  int roles[WN_CG_NROLES];
  int n = distinct_roles(l, roles);
  for (int i = 0; i < n; i++) {
    char path[PATH_MAX];
    if (wn_cg_path(l, roles[i], name, path, sizeof path) < 0) continue;
    if (mkdir(path, 0755) < 0) {
      int err = errno;
      if (i > 0 || err != EEXIST) rmdir_all(l, name);
      if (err == EEXIST) return wn_fail(e, WN_ALREADY_EXISTS, err, "cgroup %s already exists (%s)", name, path);
      return wn_fail(e, WN_CGROUP_ERROR, err, "mkdir %s", path);
    }
  }
  if (l->version == 1) {
    /* OOM kills, never pauses, inside the group. */
    wn_error tmp;
    if (cg_write(l, WN_CG_MEMORY, name, "memory.oom_control", "0", &tmp) < 0 && tmp.errnum != ENOENT) {
      *e = tmp;
      rmdir_all(l, name);
      return -1;
    }
  }
  if (apply_limits(l, name, lim, e) < 0) {
    rmdir_all(l, name);
    return -1;
  }
  return 0;
}

static int require_group(const wn_cg_layout *l, const char *name, wn_error *e) {
  char path[PATH_MAX];
  int role = l->version == 2 ? WN_CG_UNIFIED : WN_CG_MEMORY;
  wn_cg_path(l, role, name, path, sizeof path);
  if (access(path, F_OK) < 0) return wn_fail_errno(e, WN_CGROUP_ERROR, "cgroup %s (%s)", name, path);
  return 0;
}

int wn_cg_update(const char *name, const wn_cg_limits *lim, wn_error *e) {
  const wn_cg_layout *l;
  if (wn_check_id(e, "cgroup name", name) < 0 || wn_cg_limits_check(lim, e) < 0) return -1;
  if (wn_cg_layout_get(&l, e) < 0 || require_group(l, name, e) < 0) return -1;
  return apply_limits(l, name, lim, e);
}

int wn_cg_stats_read(const char *name, wn_cg_stats *st, wn_error *e) {
  const wn_cg_layout *l;
  if (wn_check_id(e, "cgroup name", name) < 0) return -1;
  if (wn_cg_layout_get(&l, e) < 0 || require_group(l, name, e) < 0) return -1;
  memset(st, 0, sizeof *st);
  char buf[256];
  if (l->version == 2) {
    if (cg_read_u64(l, WN_CG_MEMORY, name, "memory.current", &st->memory_current, e) < 0) return -1;
    if (cg_read_u64(l, WN_CG_MEMORY, name, "memory.peak", &st->memory_peak, NULL) < 0)
      st->memory_peak = st->memory_current; /* kernels before 5.19 */
    if (cg_read_key(l, WN_CG_MEMORY, name, "memory.events", "oom_kill", &st->oom_kills, e) < 0) return -1;
    if (cg_read_key(l, WN_CG_CPU, name, "cpu.stat", "usage_usec", &st->cpu_usage_us, e) < 0) return -1;
    uint64_t frozen = 0;
    if (cg_read_key(l, WN_CG_UNIFIED, name, "cgroup.events", "frozen", &frozen, e) < 0) return -1;
    st->frozen = frozen == 1;
  } else {
    if (cg_read_u64(l, WN_CG_MEMORY, name, "memory.usage_in_bytes", &st->memory_current, e) < 0) return -1;
    if (cg_read_u64(l, WN_CG_MEMORY, name, "memory.max_usage_in_bytes", &st->memory_peak, e) < 0) return -1;
    if (cg_read_key(l, WN_CG_MEMORY, name, "memory.oom_control", "oom_kill", &st->oom_kills, e) < 0) return -1;
    uint64_t ns = 0;
    if (cg_read_u64(l, WN_CG_CPUACCT, name, "cpuacct.usage", &ns, e) < 0) return -1;
    st->cpu_usage_us = ns / 1000;
    if (cg_read(l, WN_CG_FREEZER, name, "freezer.state", buf, sizeof buf, e) < 0) return -1;
    st->frozen = strncmp(buf, "FROZEN", 6) == 0;
  }
  if (cg_read_u64(l, WN_CG_PIDS, name, "pids.current", &st->pids_current, e) < 0) return -1;
  return 0;
}

/* The group's OOM kill count alone: one file, read before and after every exec, where
   wn_cg_stats_read reads six (cpuacct.usage sums every cpu). */
int wn_cg_oom_kills(const char *name, uint64_t *out, wn_error *e) {
  const wn_cg_layout *l;
  if (wn_check_id(e, "cgroup name", name) < 0) return -1;
  if (wn_cg_layout_get(&l, e) < 0) return -1;
  *out = 0;
  return cg_read_key(l, WN_CG_MEMORY, name, l->version == 2 ? "memory.events" : "memory.oom_control", "oom_kill", out, e);
}

static int read_procs(const wn_cg_layout *l, int role, const char *name, pid_t **out, size_t *n, wn_error *e) {
  char path[PATH_MAX];
  wn_cg_path(l, role, name, path, sizeof path);
  strncat(path, "/cgroup.procs", sizeof path - strlen(path) - 1);
  cleanup_free char *data = NULL;
  if (wn_read_file_alloc(path, &data) < 0) return wn_fail_errno(e, WN_CGROUP_ERROR, "read %s", path);
  size_t cap = 16, cnt = 0;
  pid_t *pids = malloc(cap * sizeof *pids);
  if (!pids) return wn_fail(e, WN_NATIVE_ERROR, ENOMEM, "read %s", path);
  char *save = NULL;
  for (char *t = strtok_r(data, "\n", &save); t; t = strtok_r(NULL, "\n", &save)) {
    uint64_t v;
    if (wn_parse_u64(t, &v) < 0 || v == 0 || v > INT32_MAX) continue;
    if (cnt == cap) {
      pid_t *np = realloc(pids, cap * 2 * sizeof *pids);
      if (!np) {
        free(pids);
        return wn_fail(e, WN_NATIVE_ERROR, ENOMEM, "read %s", path);
      }
      pids = np;
      cap *= 2;
    }
    pids[cnt++] = (pid_t)v;
  }
  *out = pids;
  *n = cnt;
  return 0;
}

int wn_cg_procs(const char *name, pid_t **out, size_t *n, wn_error *e) {
  const wn_cg_layout *l;
  if (wn_check_id(e, "cgroup name", name) < 0) return -1;
  if (wn_cg_layout_get(&l, e) < 0) return -1;
  return read_procs(l, l->version == 2 ? WN_CG_UNIFIED : WN_CG_PIDS, name, out, n, e);
}

static void sleep_ms(int ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

static int freeze_v1(const wn_cg_layout *l, const char *name, wn_error *e) {
  char buf[64];
  for (int waited = 0;; waited++) {
    /* Re-request FROZEN: tasks that were in uninterruptible sleep get another chance (as runc does). */
    if (waited % 10 == 0 && cg_write(l, WN_CG_FREEZER, name, "freezer.state", "FROZEN", e) < 0) return -1;
    if (cg_read(l, WN_CG_FREEZER, name, "freezer.state", buf, sizeof buf, e) < 0) return -1;
    if (strncmp(buf, "FROZEN", 6) == 0) return 0;
    if (waited >= FREEZE_TIMEOUT_MS) {
      cg_write(l, WN_CG_FREEZER, name, "freezer.state", "THAWED", NULL);
      return wn_fail(e, WN_TIMEOUT, ETIMEDOUT, "freeze cgroup %s: still %.*s after %d ms", name,
                     (int)strcspn(buf, "\n"), buf, FREEZE_TIMEOUT_MS);
    }
    sleep_ms(1);
  }
}

static int freeze_v2(const wn_cg_layout *l, const char *name, wn_error *e) {
  if (cg_write(l, WN_CG_UNIFIED, name, "cgroup.freeze", "1", e) < 0) return -1;
  for (int waited = 0;; waited++) {
    uint64_t frozen = 0;
    if (cg_read_key(l, WN_CG_UNIFIED, name, "cgroup.events", "frozen", &frozen, e) < 0) return -1;
    if (frozen == 1) return 0;
    if (waited >= FREEZE_TIMEOUT_MS) {
      cg_write(l, WN_CG_UNIFIED, name, "cgroup.freeze", "0", NULL);
      return wn_fail(e, WN_TIMEOUT, ETIMEDOUT, "freeze cgroup %s: not frozen after %d ms", name, FREEZE_TIMEOUT_MS);
    }
    sleep_ms(1);
  }
}

int wn_cg_freeze(const char *name, int frozen, wn_error *e) {
  const wn_cg_layout *l;
  if (wn_check_id(e, "cgroup name", name) < 0) return -1;
  if (wn_cg_layout_get(&l, e) < 0 || require_group(l, name, e) < 0) return -1;
  if (l->version == 2) {
    if (frozen) return freeze_v2(l, name, e);
    return cg_write(l, WN_CG_UNIFIED, name, "cgroup.freeze", "0", e);
  }
  if (frozen) return freeze_v1(l, name, e);
  return cg_write(l, WN_CG_FREEZER, name, "freezer.state", "THAWED", e);
}

int wn_cg_is_frozen(const char *name, wn_error *e) {
  const wn_cg_layout *l;
  if (wn_cg_layout_get(&l, e) < 0) return -1;
  char buf[64];
  if (l->version == 2) {
    if (cg_read(l, WN_CG_UNIFIED, name, "cgroup.freeze", buf, sizeof buf, e) < 0) return -1;
    return buf[0] == '1';
  }
  if (cg_read(l, WN_CG_FREEZER, name, "freezer.state", buf, sizeof buf, e) < 0) return -1;
  return strncmp(buf, "THAWED", 6) != 0;
}

int wn_cg_kill(const char *name, wn_error *e) {
  const wn_cg_layout *l;
  if (wn_check_id(e, "cgroup name", name) < 0) return -1;
  if (wn_cg_layout_get(&l, e) < 0 || require_group(l, name, e) < 0) return -1;
  int role = l->version == 2 ? WN_CG_UNIFIED : WN_CG_FREEZER;
  pid_t *pids = NULL;
  size_t n = 0;
  if (l->version == 2) {
    char path[PATH_MAX];
    wn_cg_path(l, role, name, path, sizeof path);
    strncat(path, "/cgroup.kill", sizeof path - strlen(path) - 1);
    if (access(path, F_OK) == 0) {
      if (read_procs(l, role, name, &pids, &n, e) < 0) return -1;
      free(pids);
      if (cg_write(l, role, name, "cgroup.kill", "1", e) < 0) return -1;
      return (int)n;
    }
  }
  /* v1 (and v2 before 5.14): freeze so nothing forks behind our back, kill all, thaw. */
  wn_error ferr;
  int froze = l->version == 2 ? freeze_v2(l, name, &ferr) : freeze_v1(l, name, &ferr);
  if (read_procs(l, role, name, &pids, &n, e) < 0) {
    wn_cg_freeze(name, 0, NULL);
    return -1;
  }
  int killed = 0;
  for (size_t i = 0; i < n; i++)
    if (kill(pids[i], SIGKILL) == 0) killed++;
  free(pids);
  if (l->version == 2)
    cg_write(l, role, name, "cgroup.freeze", "0", NULL);
  else
    cg_write(l, role, name, "freezer.state", "THAWED", NULL);
  (void)froze;
  return killed;
}

int wn_cg_destroy(const char *name, wn_error *e) {
  const wn_cg_layout *l;
  if (wn_check_id(e, "cgroup name", name) < 0) return -1;
  if (wn_cg_layout_get(&l, e) < 0) return -1;
  int roles[WN_CG_NROLES];
  int n = distinct_roles(l, roles);
  int rc = 0;
  for (int i = n - 1; i >= 0; i--) {
    char path[PATH_MAX];
    if (wn_cg_path(l, roles[i], name, path, sizeof path) < 0) continue;
    if (rmdir(path) < 0 && errno != ENOENT && rc == 0) rc = wn_fail_errno(e, WN_CGROUP_ERROR, "rmdir %s", path);
  }
  return rc;
}

int wn_cg_exists(const char *name, wn_error *e) {
  const wn_cg_layout *l;
  if (wn_check_id(e, "cgroup name", name) < 0) return -1;
  if (wn_cg_layout_get(&l, e) < 0) return -1;
  char path[PATH_MAX];
  wn_cg_path(l, l->version == 2 ? WN_CG_UNIFIED : WN_CG_MEMORY, name, path, sizeof path);
  struct stat st;
  if (stat(path, &st) == 0) return S_ISDIR(st.st_mode) ? 1 : 0;
  if (errno == ENOENT) return 0;
  return wn_fail_errno(e, WN_CGROUP_ERROR, "stat %s", path);
}

int wn_cg_attach(const char *name, pid_t pid, wn_error *e) {
  const wn_cg_layout *l;
  if (wn_check_id(e, "cgroup name", name) < 0) return -1;
  if (pid < 1 || pid > WN_PID_MAX) return wn_fail(e, WN_INVALID_ARGUMENT, 0, "pid must be 1..%d", WN_PID_MAX);
  if (wn_cg_layout_get(&l, e) < 0 || require_group(l, name, e) < 0) return -1;
  int roles[WN_CG_NROLES];
  int n = distinct_roles(l, roles);
  char val[32];
  snprintf(val, sizeof val, "%d", (int)pid);
  for (int i = 0; i < n; i++) {
    char path[PATH_MAX];
    if (wn_cg_path(l, roles[i], name, path, sizeof path) < 0) continue;
    if (roles[i] == WN_CG_UNIFIED && l->version == 1 && access(path, F_OK) < 0) continue;
    if (cg_write(l, roles[i], name, "cgroup.procs", val, e) < 0) return -1;
  }
  return 0;
}

int wn_cg_open_procs(const char *name, int fds[WN_CG_MAX_FDS], int out_roles[WN_CG_MAX_FDS], int *n, int *unified_dir,
                     int *unified_procs, wn_error *e) {
  const wn_cg_layout *l;
  *n = 0;
  if (unified_dir) *unified_dir = *unified_procs = -1;
  if (wn_check_id(e, "cgroup name", name) < 0) return -1;
  if (wn_cg_layout_get(&l, e) < 0) return -1;
  int roles[WN_CG_NROLES];
  int nr = distinct_roles(l, roles);
  for (int i = 0; i < nr; i++) {
    char path[PATH_MAX];
    if (wn_cg_path(l, roles[i], name, path, sizeof path) < 0) continue;
    int is_unified = roles[i] == WN_CG_UNIFIED;
    int fd = -1, pfd = -1;
    if (is_unified && unified_dir) {
      fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (fd >= 0) {
        pfd = openat(fd, "cgroup.procs", O_WRONLY | O_CLOEXEC);
        if (pfd < 0) {
          int err = errno;
          close(fd);
          fd = -1;
          errno = err;
        }
      }
    } else {
      strncat(path, "/cgroup.procs", sizeof path - strlen(path) - 1);
      fd = open(path, O_WRONLY | O_CLOEXEC);
    }
    if (fd < 0) {
      int err = errno;
      /* v1 hybrid: the unified group is joined when it exists */
      if (err == ENOENT && is_unified && l->version == 1) continue;
      for (int j = 0; j < *n; j++) close(fds[j]);
      *n = 0;
      if (unified_dir && *unified_dir >= 0) {
        close(*unified_dir);
        close(*unified_procs);
        *unified_dir = *unified_procs = -1;
      }
      return wn_fail(e, WN_CGROUP_ERROR, err, "open %s", path);
    }
    if (is_unified && unified_dir) {
      *unified_dir = fd;
      *unified_procs = pfd;
      continue;
    }
    if (out_roles) out_roles[*n] = roles[i];
    fds[(*n)++] = fd;
  }
  return 0;
}

int wn_cg_pid_in_group(pid_t pid, const char *name, wn_error *e) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
  cleanup_free char *data = NULL;
  if (wn_read_file_alloc(path, &data) < 0) {
    if (errno == ENOENT || errno == ESRCH) return 0;
    return wn_fail_errno(e, WN_NATIVE_ERROR, "read %s", path);
  }
  char want[128];
  snprintf(want, sizeof want, "/" CG_PARENT "/%s", name);
  size_t wl = strlen(want);
  char *save = NULL;
  for (char *line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *p = strchr(line, ':');
    if (!p) continue;
    p = strchr(p + 1, ':');
    if (!p) continue;
    p++;
    size_t len = strlen(p);
    if (len >= wl && strcmp(p + len - wl, want) == 0) return 1;
  }
  return 0;
}
