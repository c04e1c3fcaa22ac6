// SPDX-License-Identifier: Apache-2.0
/*
 * Per-sandbox egress allowlist, attached to each sandbox's cgroup in the cgroup2
 * hierarchy and keyed by that cgroup's id.
 *
 * connect4/connect6/sendmsg4/sendmsg6 return 0 for a destination the sandbox's
 * current policy generation does not allow: the caller gets EPERM at once.
 * cgroup_skb/egress is the backstop for packets that never pass those hooks
 * (ping sockets, anything a future socket type adds): it drops them. Every
 * denial is reported on the egress_events ring buffer.
 *
 * Addresses are compared as IPv6; IPv4 (and IPv4-mapped IPv6, which the kernel
 * hands to connect6 for dual-stack sockets) is ::ffff:a.b.c.d, so one allow
 * entry covers both forms.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "sandbox_egress.h"

char LICENSE[] SEC("license") = "GPL";

#define DNS_PORT 53
#define CIDR_FIXED_BITS 96 /* port + proto + generation + cgroup_id */

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
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, WARREN_MAX_CIDR_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct egress_cidr_key);
	__type(value, struct egress_cidr_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_cidrs SEC(".maps");

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

static __always_inline int is_v4(const __u8 addr[16])
{
	__u64 hi;
	__u32 mid;

	__builtin_memcpy(&hi, addr, 8);
	__builtin_memcpy(&mid, &addr[8], 4);
	return hi == 0 && mid == bpf_htonl(0x0000ffff);
}

static __always_inline int is_loopback(const __u8 addr[16])
{
	__u64 hi, lo;

	if (is_v4(addr))
		return addr[12] == 127;
	__builtin_memcpy(&hi, addr, 8);
	__builtin_memcpy(&lo, &addr[8], 8);
	return hi == 0 && lo == bpf_cpu_to_be64(1); /* ::1 */
}

/* check_expiry = 0 for the skb backstop: a connection allowed at connect() keeps flowing after the
 * DNS TTL ends; the loader deletes expired bindings after a grace period. */
static __always_inline int allowed(const struct sandbox_policy *policy, __u64 cgid, const __u8 addr[16], __u16 port,
				   __u8 proto, int check_expiry)
{
	struct egress_key key = {};
	struct egress_cidr_key ckey = {};
	struct egress_value *val;

	if (policy->allow_dns && port == DNS_PORT && (proto == IPPROTO_UDP || proto == IPPROTO_TCP) && is_v4(addr) &&
	    __builtin_memcmp(&addr[12], &policy->resolver_v4, 4) == 0)
		return 1;

	key.cgroup_id = cgid;
	__builtin_memcpy(key.addr, addr, 16);
	key.proto = proto;
	key.generation = policy->generation;
	key.port = port;
	val = bpf_map_lookup_elem(&egress_allow, &key);
	if (!val) {
		key.port = 0;
		val = bpf_map_lookup_elem(&egress_allow, &key);
	}
	if (val)
		return !check_expiry || val->expires_ns == 0 || val->expires_ns > bpf_ktime_get_ns();

	ckey.prefixlen = CIDR_FIXED_BITS + 128;
	ckey.port = port;
	ckey.proto = proto;
	ckey.generation = policy->generation;
	ckey.cgroup_id = cgid;
	__builtin_memcpy(ckey.addr, addr, 16);
	if (bpf_map_lookup_elem(&egress_cidrs, &ckey))
		return 1;
	ckey.port = 0;
	return bpf_map_lookup_elem(&egress_cidrs, &ckey) != NULL;
}

static __always_inline void report(__u64 cgid, const __u8 addr[16], __u16 port, __u8 proto, __u8 kind, __u32 pid)
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
	ev->pid = pid;
	bpf_ringbuf_submit(ev, 0);
}

static __always_inline int decide(__u8 addr[16], __u16 port, __u8 proto, __u8 kind)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	struct sandbox_policy *policy = bpf_map_lookup_elem(&sandbox_policies, &cgid);

	if (!policy || !policy->enforce)
		return 1;
	if (is_loopback(addr) || allowed(policy, cgid, addr, port, proto, 1))
		return 1;
	report(cgid, addr, port, proto, kind, bpf_get_current_pid_tgid() >> 32);
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

SEC("cgroup_skb/egress")
int egress_skb(struct __sk_buff *skb)
{
	__u64 cgid = bpf_skb_cgroup_id(skb);
	struct sandbox_policy *policy = bpf_map_lookup_elem(&sandbox_policies, &cgid);
	__u8 addr[16];
	__u8 proto;
	__u16 ports[2] = {};
	__u32 l4;

	if (!policy || !policy->enforce)
		return 1;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)) < 0)
			return 0;
		map_v4(addr, ip.daddr);
		proto = ip.protocol;
		l4 = ip.ihl * 4;
		if (ip.frag_off & bpf_htons(0x1fff))
			proto = 0; /* non-first fragment: no ports to check; allowed only by an any-port entry */
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, 0, &ip6, sizeof(ip6)) < 0)
			return 0;
		__builtin_memcpy(addr, &ip6.daddr, 16);
		proto = ip6.nexthdr;
		l4 = sizeof(ip6);
	} else {
		return 1;
	}
	if (is_loopback(addr))
		return 1;
	if ((proto == IPPROTO_TCP || proto == IPPROTO_UDP) && bpf_skb_load_bytes(skb, l4, ports, sizeof(ports)) < 0)
		return 0;
	if (allowed(policy, cgid, addr, bpf_ntohs(ports[1]), proto, 0))
		return 1;
	report(cgid, addr, bpf_ntohs(ports[1]), proto, EGRESS_EVENT_SKB_EGRESS, 0);
	return 0;
}
