/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Map and event layouts shared by sandbox_egress.bpf.c and the loader.
 * src/native/bpf-layouts.ts mirrors these structs byte for byte; the
 * `layout-check` test compiles this header and compares offsets and sizes.
 */
#ifndef WARREN_SANDBOX_EGRESS_H
#define WARREN_SANDBOX_EGRESS_H

#define WARREN_MAX_SANDBOXES 65536
#define WARREN_MAX_ALLOW_ENTRIES 262144

/* Key of the allow map: one entry per (sandbox cgroup, destination, port). Port 0 = any port. */
struct egress_key {
	__u64 cgroup_id;
	__u8 addr[16]; /* IPv6, or IPv4-mapped IPv6 (::ffff:a.b.c.d) for IPv4 */
	__u16 port;    /* host byte order */
	__u8 proto;    /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad[5];
};

struct egress_value {
	__u64 expires_ns; /* CLOCK_MONOTONIC (bpf_ktime_get_ns); 0 = never */
	__u32 service_id;
	__u32 pad;
};

/* Per-sandbox settings, keyed by cgroup id. A cgroup absent from this map is not filtered. */
struct sandbox_policy {
	__u8 enforce;      /* 1 = deny anything not in the allow map */
	__u8 allow_dns;    /* allow UDP/TCP 53 to the platform resolver */
	__u8 pad[2];
	__u32 resolver_v4; /* network byte order */
};

#define EGRESS_EVENT_CONNECT4 1
#define EGRESS_EVENT_CONNECT6 2
#define EGRESS_EVENT_SENDMSG4 3
#define EGRESS_EVENT_SENDMSG6 4

struct egress_event {
	__u64 cgroup_id;
	__u64 timestamp_ns;
	__u8 addr[16];
	__u16 port;
	__u8 proto;
	__u8 kind; /* EGRESS_EVENT_* */
	__u32 pid;
};

#endif
