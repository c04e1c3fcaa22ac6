/* Egress enforcement: libbpf loading, pinning, cgroup links and map access (bpf_egress.h). */
#include "bpf_egress.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <net/if.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

static int silent_print(enum libbpf_print_level level, const char *fmt, va_list ap) { return 0; }

static void quiet_libbpf(void) {
  static int done;
  if (!done) {
    libbpf_set_print(silent_print);
    done = 1;
  }
}

int wn_bpf_load_pinned(const char *obj_path, const char *pin_dir, wn_error *e) {
  quiet_libbpf();
  if (mkdir(pin_dir, 0700) < 0 && errno != EEXIST) return wn_fail_errno(e, WN_NATIVE_ERROR, "mkdir %s", pin_dir);
  LIBBPF_OPTS(bpf_object_open_opts, opts, .pin_root_path = pin_dir);
  struct bpf_object *obj = bpf_object__open_file(obj_path, &opts);
  if (obj == NULL) return wn_fail(e, WN_NATIVE_ERROR, errno, "open BPF object %s", obj_path);

  struct bpf_program *prog;
  int missing = 0;
  char path[PATH_MAX];
  bpf_object__for_each_program(prog, obj) {
    if (snprintf(path, sizeof path, "%s/%s", pin_dir, bpf_program__name(prog)) >= (int)sizeof path) {
      bpf_object__close(obj);
      return wn_fail(e, WN_INVALID_ARGUMENT, ENAMETOOLONG, "pin path under %s is too long", pin_dir);
    }
    if (access(path, F_OK) < 0) missing++;
  }
  if (missing == 0) {
    bpf_object__close(obj);
    return 0;
  }
  int err = bpf_object__load(obj);
  if (err) {
    bpf_object__close(obj);
    return wn_fail(e, -err == EPERM ? WN_NOT_SUPPORTED : WN_NATIVE_ERROR, -err,
                   "load BPF object %s (maps pinned under %s)", obj_path, pin_dir);
  }
  int pinned = 0;
  bpf_object__for_each_program(prog, obj) {
    snprintf(path, sizeof path, "%s/%s", pin_dir, bpf_program__name(prog));
    if (access(path, F_OK) == 0) continue;
    err = bpf_program__pin(prog, path);
    if (err && err != -EEXIST) {
      bpf_object__close(obj);
      return wn_fail(e, WN_NATIVE_ERROR, -err, "pin program at %s", path);
    }
    pinned++;
  }
  bpf_object__close(obj);
  return pinned;
}

static int attach_type(const char *name) {
  if (strcmp(name, "connect4") == 0) return BPF_CGROUP_INET4_CONNECT;
  if (strcmp(name, "connect6") == 0) return BPF_CGROUP_INET6_CONNECT;
  if (strcmp(name, "sendmsg4") == 0) return BPF_CGROUP_UDP4_SENDMSG;
  if (strcmp(name, "sendmsg6") == 0) return BPF_CGROUP_UDP6_SENDMSG;
  if (strcmp(name, "egress") == 0) return BPF_CGROUP_INET_EGRESS;
  return -1;
}

int wn_bpf_attach_cgroup(const char *prog_pin, const char *cgroup_dir, const char *attach, const char *link_pin,
                         wn_error *e) {
  int type = attach_type(attach);
  if (type < 0) return wn_fail(e, WN_INVALID_ARGUMENT, EINVAL, "unknown attach type %s", attach);
  int prog_fd = bpf_obj_get(prog_pin);
  if (prog_fd < 0) return wn_fail(e, errno == ENOENT ? WN_FILE_NOT_FOUND : WN_NATIVE_ERROR, errno, "open pinned program %s", prog_pin);
  int cg_fd = open(cgroup_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (cg_fd < 0) {
    int err = errno;
    close(prog_fd);
    return wn_fail(e, err == ENOENT ? WN_FILE_NOT_FOUND : WN_CGROUP_ERROR, err, "open cgroup %s", cgroup_dir);
  }
  int link_fd = bpf_link_create(prog_fd, cg_fd, (enum bpf_attach_type)type, NULL);
  int err = errno;
  close(cg_fd);
  close(prog_fd);
  if (link_fd < 0) return wn_fail(e, WN_NATIVE_ERROR, err, "attach %s to %s", attach, cgroup_dir);
  if (bpf_obj_pin(link_fd, link_pin) < 0) {
    err = errno;
    close(link_fd); /* the only reference: the link detaches */
    return wn_fail(e, err == EEXIST ? WN_ALREADY_EXISTS : WN_NATIVE_ERROR, err, "pin link at %s", link_pin);
  }
  close(link_fd);
  return 0;
}

/* Not in Debian 12's 6.1 uapi headers (tcx came with 6.6): the kernel's value. */
#define WN_BPF_TCX_INGRESS 46

/* Run fn in the network namespace ns_fd on this thread, then come back (abort if that fails:
 * the thread would stay in a sandbox's namespace). */
static int in_netns(int ns_fd, int (*fn)(void *), void *arg, wn_error *e, const char *netns_path) {
  int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (self < 0) return wn_fail_errno(e, WN_NATIVE_ERROR, "open own netns");
  if (setns(ns_fd, CLONE_NEWNET) < 0) {
    int err = errno;
    close(self);
    return wn_fail(e, WN_NATIVE_ERROR, err, "enter netns %s", netns_path);
  }
  int rc = fn(arg);
  if (setns(self, CLONE_NEWNET) < 0) abort();
  close(self);
  return rc;
}

struct tap_job {
  const char *tap, *uplink;
  unsigned tap_idx, up_idx;
  int prog_tap, prog_ret;
  int link_tap, link_ret;
  int err;
  const char *what;
};

static int find_ifaces(void *arg) {
  struct tap_job *j = arg;
  j->tap_idx = if_nametoindex(j->tap);
  if (j->tap_idx == 0) return j->err = errno, j->what = j->tap, -1;
  j->up_idx = if_nametoindex(j->uplink);
  if (j->up_idx == 0) return j->err = errno, j->what = j->uplink, -1;
  return 0;
}

static int link_tcx(void *arg) {
  struct tap_job *j = arg;
  j->link_tap = bpf_link_create(j->prog_tap, (int)j->tap_idx, (enum bpf_attach_type)WN_BPF_TCX_INGRESS, NULL);
  if (j->link_tap < 0) return j->err = errno, j->what = j->tap, -1;
  j->link_ret = bpf_link_create(j->prog_ret, (int)j->up_idx, (enum bpf_attach_type)WN_BPF_TCX_INGRESS, NULL);
  if (j->link_ret < 0) return j->err = errno, j->what = j->uplink, -1;
  return 0;
}

int wn_bpf_attach_tap(const char *obj_path, const char *pin_dir, const char *netns_path, const char *tap,
                      const char *uplink, const void *cfg, size_t cfg_len, const char *link_tap_pin,
                      const char *link_ret_pin, wn_error *e) {
  quiet_libbpf();
  if (cfg_len != 32) return wn_fail(e, WN_INVALID_ARGUMENT, EINVAL, "tap settings are %zu bytes, not 32", cfg_len);
  int ns_fd = open(netns_path, O_RDONLY | O_CLOEXEC);
  if (ns_fd < 0) return wn_fail(e, errno == ENOENT ? WN_FILE_NOT_FOUND : WN_NATIVE_ERROR, errno, "open netns %s", netns_path);
  struct tap_job j = {.tap = tap, .uplink = uplink, .prog_tap = -1, .prog_ret = -1, .link_tap = -1, .link_ret = -1};
  int rc = in_netns(ns_fd, find_ifaces, &j, e, netns_path);
  if (rc < 0) {
    close(ns_fd);
    if (j.what == NULL) return -1; /* e is set */
    return wn_fail(e, WN_FILE_NOT_FOUND, j.err, "no interface %s in %s", j.what, netns_path);
  }
  /* the settings, with the interface indexes as the namespace numbers them */
  unsigned char conf[32];
  memcpy(conf, cfg, sizeof conf);
  uint32_t up = j.up_idx, tp = j.tap_idx;
  memcpy(conf + 8, &up, 4);
  memcpy(conf + 12, &tp, 4);

  LIBBPF_OPTS(bpf_object_open_opts, opts, .pin_root_path = pin_dir);
  struct bpf_object *obj = bpf_object__open_file(obj_path, &opts);
  if (obj == NULL) {
    close(ns_fd);
    return wn_fail(e, WN_NATIVE_ERROR, errno, "open BPF object %s", obj_path);
  }
  struct bpf_map *ro = bpf_object__find_map_by_name(obj, ".rodata");
  struct bpf_program *pt = bpf_object__find_program_by_name(obj, "egress_tap");
  struct bpf_program *pr = bpf_object__find_program_by_name(obj, "egress_tap_return");
  int err = 0;
  if (ro == NULL || pt == NULL || pr == NULL) {
    rc = wn_fail(e, WN_NATIVE_ERROR, EINVAL, "%s lacks the tap programs or their settings", obj_path);
  } else if ((err = bpf_map__set_initial_value(ro, conf, sizeof conf)) != 0) {
    rc = wn_fail(e, WN_NATIVE_ERROR, -err, "set the tap settings of %s", obj_path);
  } else if ((err = bpf_object__load(obj)) != 0) {
    rc = wn_fail(e, -err == EPERM ? WN_NOT_SUPPORTED : WN_NATIVE_ERROR, -err, "load BPF object %s (maps pinned under %s)", obj_path, pin_dir);
  } else {
    j.prog_tap = bpf_program__fd(pt);
    j.prog_ret = bpf_program__fd(pr);
    rc = in_netns(ns_fd, link_tcx, &j, e, netns_path);
    if (rc < 0 && j.what != NULL) wn_fail(e, j.err == EINVAL ? WN_NOT_SUPPORTED : WN_NATIVE_ERROR, j.err, "attach tcx ingress of %s in %s", j.what, netns_path);
  }
  if (rc == 0 && bpf_obj_pin(j.link_tap, link_tap_pin) < 0) rc = wn_fail(e, errno == EEXIST ? WN_ALREADY_EXISTS : WN_NATIVE_ERROR, errno, "pin link at %s", link_tap_pin);
  if (rc == 0 && bpf_obj_pin(j.link_ret, link_ret_pin) < 0) {
    rc = wn_fail(e, errno == EEXIST ? WN_ALREADY_EXISTS : WN_NATIVE_ERROR, errno, "pin link at %s", link_ret_pin);
    unlink(link_tap_pin);
  }
  /* the pins hold the links (and the links the programs); closing the rest detaches nothing pinned */
  if (j.link_tap >= 0) close(j.link_tap);
  if (j.link_ret >= 0) close(j.link_ret);
  bpf_object__close(obj);
  close(ns_fd);
  return rc;
}

int wn_bpf_obj_get(const char *path, wn_error *e) {
  int fd = bpf_obj_get(path);
  if (fd < 0) return wn_fail(e, errno == ENOENT ? WN_FILE_NOT_FOUND : WN_NATIVE_ERROR, errno, "open pinned object %s", path);
  return fd;
}

int wn_bpf_map_get_info(int fd, wn_bpf_map_info *out, wn_error *e) {
  struct bpf_map_info info;
  uint32_t len = sizeof info;
  memset(&info, 0, sizeof info);
  if (bpf_obj_get_info_by_fd(fd, &info, &len) < 0) return wn_fail_errno(e, WN_NATIVE_ERROR, "map info of fd %d", fd);
  out->type = info.type;
  out->key_size = info.key_size;
  out->value_size = info.value_size;
  out->max_entries = info.max_entries;
  out->id = info.id;
  memcpy(out->name, info.name, sizeof out->name);
  out->name[sizeof out->name - 1] = 0;
  return 0;
}

int wn_bpf_map_update(int fd, const void *key, size_t key_len, const void *value, size_t value_len, uint64_t flags,
                      wn_error *e) {
  (void)key_len;
  (void)value_len;
  if (bpf_map_update_elem(fd, key, value, flags) < 0) {
    int err = errno;
    wn_code code = err == E2BIG || err == ENOMEM ? WN_NATIVE_ERROR : err == EEXIST ? WN_ALREADY_EXISTS
                 : err == ENOENT ? WN_FILE_NOT_FOUND : WN_NATIVE_ERROR;
    return wn_fail(e, code, err, err == E2BIG ? "BPF map is full" : "BPF map update");
  }
  return 0;
}

int wn_bpf_map_delete(int fd, const void *key, size_t key_len, wn_error *e) {
  (void)key_len;
  if (bpf_map_delete_elem(fd, key) == 0) return 1;
  if (errno == ENOENT) return 0;
  return wn_fail_errno(e, WN_NATIVE_ERROR, "BPF map delete");
}

int wn_bpf_map_lookup(int fd, const void *key, size_t key_len, void *value, size_t value_len, wn_error *e) {
  (void)key_len;
  (void)value_len;
  if (bpf_map_lookup_elem(fd, key, value) == 0) return 1;
  if (errno == ENOENT) return 0;
  return wn_fail_errno(e, WN_NATIVE_ERROR, "BPF map lookup");
}

int wn_bpf_map_next_key(int fd, const void *key, void *next, size_t key_len, wn_error *e) {
  (void)key_len;
  if (bpf_map_get_next_key(fd, key, next) == 0) return 1;
  if (errno == ENOENT) return 0;
  return wn_fail_errno(e, WN_NATIVE_ERROR, "BPF map next key");
}

struct wn_ringbuf {
  struct ring_buffer *rb;
  wn_ringbuf_record_fn fn;
  void *ctx;
  size_t seen;
};

static int on_record(void *arg, void *data, size_t len) {
  struct wn_ringbuf *w = arg;
  w->fn(w->ctx, data, len);
  w->seen++;
  return 0;
}

wn_ringbuf *wn_ringbuf_open(int map_fd, wn_error *e) {
  quiet_libbpf();
  struct wn_ringbuf *w = calloc(1, sizeof *w);
  if (w == NULL) {
    wn_fail(e, WN_NATIVE_ERROR, ENOMEM, "ring buffer");
    return NULL;
  }
  w->rb = ring_buffer__new(map_fd, on_record, w, NULL);
  if (w->rb == NULL) {
    wn_fail(e, WN_NATIVE_ERROR, errno, "open ring buffer of fd %d", map_fd);
    free(w);
    return NULL;
  }
  return w;
}

int wn_ringbuf_drain(wn_ringbuf *w, wn_ringbuf_record_fn fn, void *ctx, wn_error *e) {
  w->fn = fn;
  w->ctx = ctx;
  w->seen = 0;
  int n = ring_buffer__consume(w->rb);
  if (n < 0 && w->seen == 0) return wn_fail(e, WN_NATIVE_ERROR, -n, "consume ring buffer");
  return (int)w->seen;
}

void wn_ringbuf_close(wn_ringbuf *w) {
  if (w == NULL) return;
  ring_buffer__free(w->rb);
  free(w);
}
