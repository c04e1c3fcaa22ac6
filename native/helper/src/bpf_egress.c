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
