/* Egress enforcement: loading, pinning and attaching the programs of
 * bpf/sandbox_egress.bpf.c, and raw map/ring-buffer access. The map layouts are
 * encoded by TypeScript (src/native/bpf-layouts.ts, generated with the C header
 * from bpf/layouts.json); this layer only checks sizes. Addon-only: libbpf is
 * not linked into the static helper binaries. */
#ifndef WN_BPF_EGRESS_H
#define WN_BPF_EGRESS_H

#include <stddef.h>
#include <stdint.h>

#include "wn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wn_bpf_map_info {
  uint32_t type;
  uint32_t key_size;
  uint32_t value_size;
  uint32_t max_entries;
  uint32_t id;
  char name[16];
} wn_bpf_map_info;

/* Loads the object at obj_path with its maps pinned by name under pin_dir (pinned maps that
 * already exist are reused, so a reload keeps every sandbox's entries) and pins each program
 * as pin_dir/<program name>. Programs already pinned are left as they are. Returns the number
 * of programs pinned by this call. */
int wn_bpf_load_pinned(const char *obj_path, const char *pin_dir, wn_error *e);

/* attach: "connect4" | "connect6" | "sendmsg4" | "sendmsg6" | "egress". Creates a bpf_link of the
 * pinned program on the cgroup2 directory and pins the link at link_pin: it outlives this
 * process and is removed by unlinking link_pin. */
int wn_bpf_attach_cgroup(const char *prog_pin, const char *cgroup_dir, const char *attach, const char *link_pin,
                         wn_error *e);

/* Loads a copy of the tap programs of obj_path (egress_tap, egress_tap_return) with `cfg` (a
 * struct tap_port; the interface indexes are filled in here) as their constant settings, the maps
 * reused from pin_dir, and attaches them at tcx ingress of `tap` and `uplink` in the network
 * namespace at netns_path; the links are pinned at the two paths (they end with the interfaces,
 * or when unlinked). */
int wn_bpf_attach_tap(const char *obj_path, const char *pin_dir, const char *netns_path, const char *tap,
                      const char *uplink, const void *cfg, size_t cfg_len, const char *link_tap_pin,
                      const char *link_ret_pin, wn_error *e);

/* Returns an O_CLOEXEC fd of a pinned object. */
int wn_bpf_obj_get(const char *path, wn_error *e);
int wn_bpf_map_get_info(int fd, wn_bpf_map_info *info, wn_error *e);
/* flags: BPF_ANY / BPF_NOEXIST / BPF_EXIST. */
int wn_bpf_map_update(int fd, const void *key, size_t key_len, const void *value, size_t value_len, uint64_t flags,
                      wn_error *e);
/* 1 deleted, 0 absent, -1 error. */
int wn_bpf_map_delete(int fd, const void *key, size_t key_len, wn_error *e);
/* 1 found, 0 absent, -1 error. */
int wn_bpf_map_lookup(int fd, const void *key, size_t key_len, void *value, size_t value_len, wn_error *e);
/* key NULL = first key. 1 found, 0 no more keys, -1 error. */
int wn_bpf_map_next_key(int fd, const void *key, void *next, size_t key_len, wn_error *e);

/* Ring buffer consumer over a BPF_MAP_TYPE_RINGBUF fd. */
typedef struct wn_ringbuf wn_ringbuf;
typedef void (*wn_ringbuf_record_fn)(void *ctx, const void *data, size_t len);
wn_ringbuf *wn_ringbuf_open(int map_fd, wn_error *e);
/* Consumes every record available now, without blocking (the buffer is small: 256 KiB);
 * returns the number consumed or -1. */
int wn_ringbuf_drain(wn_ringbuf *rb, wn_ringbuf_record_fn fn, void *ctx, wn_error *e);
void wn_ringbuf_close(wn_ringbuf *rb);

#ifdef __cplusplus
}
#endif
#endif
