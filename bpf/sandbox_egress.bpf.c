// SPDX-License-Identifier: Apache-2.0
/*
 * Per-sandbox egress allowlist, attached to each sandbox's cgroup in the cgroup2
 * hierarchy. connect4/connect6/sendmsg4/sendmsg6 return 0 (EPERM to the caller)
 * for destinations not in the sandbox's allow map; every denial is reported on
 * a ring buffer.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "sandbox_egress.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, WARREN_MAX_SANDBOXES);
	__type(key, __u64);
	__type(value, struct sandbox_policy);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sandbox_policies SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, WARREN_MAX_ALLOW_ENTRIES);
	__type(key, struct egress_key);
	__type(value, struct egress_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_allow SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_events SEC(".maps");

static __always_inline void map_v4(__u8 addr[16], __u32 ip4_be)
{
	__builtin_memset(addr, 0, 16);
	addr[10] = 0xff;
	addr[11] = 0xff;
	__builtin_memcpy(&addr[12], &ip4_be, 4);
}

static __always_inline int allowed(__u64 cgid, const __u8 addr[16], __u16 port, __u8 proto)
{
	struct egress_key key = {};
	struct egress_value *val;

	key.cgroup_id = cgid;
	__builtin_memcpy(key.addr, addr, 16);
	key.proto = proto;
	key.port = port;
	val = bpf_map_lookup_elem(&egress_allow, &key);
	if (!val) {
		key.port = 0;
		val = bpf_map_lookup_elem(&egress_allow, &key);
	}
	if (!val)
		return 0;
	return val->expires_ns == 0 || val->expires_ns > bpf_ktime_get_ns();
}

static __always_inline void report(__u64 cgid, const __u8 addr[16], __u16 port, __u8 proto, __u8 kind)
{
	struct egress_event *ev = bpf_ringbuf_reserve(&egress_events, sizeof(*ev), 0);

	if (!ev)
		return;
	ev->cgroup_id = cgid;
	ev->timestamp_ns = bpf_ktime_get_ns();
	__builtin_memcpy(ev->addr, addr, 16);
	ev->port = port;
	ev->proto = proto;
	ev->kind = kind;
	ev->pid = bpf_get_current_pid_tgid() >> 32;
	bpf_ringbuf_submit(ev, 0);
}

static __always_inline int decide(__u8 addr[16], __u16 port, __u8 proto, __u8 kind)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	struct sandbox_policy *policy = bpf_map_lookup_elem(&sandbox_policies, &cgid);

	if (!policy || !policy->enforce)
		return 1;
	/* loopback stays reachable inside the sandbox's own netns */
	if (addr[10] == 0xff && addr[11] == 0xff && addr[12] == 127)
		return 1;
	if (policy->allow_dns && port == 53 && addr[10] == 0xff && addr[11] == 0xff &&
	    __builtin_memcmp(&addr[12], &policy->resolver_v4, 4) == 0)
		return 1;
	if (allowed(cgid, addr, port, proto))
		return 1;
	report(cgid, addr, port, proto, kind);
	return 0;
}

SEC("cgroup/connect4")
int egress_connect4(struct bpf_sock_addr *ctx)
{
	__u8 addr[16];

	map_v4(addr, ctx->user_ip4);
	return decide(addr, bpf_ntohs(ctx->user_port), ctx->protocol, EGRESS_EVENT_CONNECT4);
}

SEC("cgroup/sendmsg4")
int egress_sendmsg4(struct bpf_sock_addr *ctx)
{
	__u8 addr[16];

	map_v4(addr, ctx->user_ip4);
	return decide(addr, bpf_ntohs(ctx->user_port), ctx->protocol, EGRESS_EVENT_SENDMSG4);
}

static __always_inline void load_v6(__u8 addr[16], struct bpf_sock_addr *ctx)
{
	__u32 w0 = ctx->user_ip6[0], w1 = ctx->user_ip6[1], w2 = ctx->user_ip6[2], w3 = ctx->user_ip6[3];

	__builtin_memcpy(&addr[0], &w0, 4);
	__builtin_memcpy(&addr[4], &w1, 4);
	__builtin_memcpy(&addr[8], &w2, 4);
	__builtin_memcpy(&addr[12], &w3, 4);
}

SEC("cgroup/connect6")
int egress_connect6(struct bpf_sock_addr *ctx)
{
	__u8 addr[16];

	load_v6(addr, ctx);
	return decide(addr, bpf_ntohs(ctx->user_port), ctx->protocol, EGRESS_EVENT_CONNECT6);
}

SEC("cgroup/sendmsg6")
int egress_sendmsg6(struct bpf_sock_addr *ctx)
{
	__u8 addr[16];

	load_v6(addr, ctx);
	return decide(addr, bpf_ntohs(ctx->user_port), ctx->protocol, EGRESS_EVENT_SENDMSG6);
}
