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
 *
 * Before any allow entry is consulted, two deny layers run, so a bad allow entry
 * (a DNS answer the responder should have refused, a bug in the loader) cannot
 * open them: special-use ranges compiled in here (unspecified, link-local and the
 * cloud metadata addresses, multicast, broadcast/reserved, IPv6 forms that embed
 * an IPv4 address other than ::ffff:a.b.c.d), and the node-wide egress_deny trie
 * (the node's own addresses, the sandbox subnet, operator-listed ranges) that the
 * loader fills. The node resolver on port 53 and the sandbox's own loopback come
 * first: they are always allowed.
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

#include "egress_common.h"

static __always_inline int decide(__u8 addr[16], __u16 port, __u8 proto, __u8 kind)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	struct sandbox_policy *policy = bpf_map_lookup_elem(&sandbox_policies, &cgid);
	__u8 reason;

	if (!policy || !policy->enforce)
		return 1;
	if (allowed(policy, cgid, addr, port, proto, 1, &reason))
		return 1;
	report(cgid, addr, port, proto, kind, bpf_get_current_pid_tgid() >> 32, reason);
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
	__u8 reason;

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
	if (allowed(policy, cgid, addr, bpf_ntohs(ports[1]), proto, 0, &reason))
		return 1;
	report(cgid, addr, bpf_ntohs(ports[1]), proto, EGRESS_EVENT_SKB_EGRESS, 0, reason);
	return 0;
}
