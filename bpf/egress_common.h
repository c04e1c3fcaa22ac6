/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The maps and the decision shared by every egress program: the cgroup programs
 * (sandbox_egress.bpf.c) and the tap programs of microVMs (tap_egress.bpf.c).
 * Both objects pin their maps by name under the node's pin directory, so they
 * read and write the same maps: one policy per sandbox whichever way its
 * traffic leaves.
 */
#ifndef WARREN_EGRESS_COMMON_H
#define WARREN_EGRESS_COMMON_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "sandbox_egress.h"

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
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, WARREN_MAX_DENY_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct egress_deny_key);
	__type(value, struct egress_deny_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_deny SEC(".maps");

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

/* The special-use ranges no allowlist can open (the loader's egress_deny trie adds the node's own). */
static __always_inline __u8 special_reason(const __u8 a[16])
{
	__u64 hi, lo;
	__u32 w2;

	if (is_v4(a)) {
		const __u8 *v4 = &a[12];

		if (v4[0] == 0)
			return EGRESS_REASON_UNSPECIFIED; /* 0.0.0.0/8 */
		if (v4[0] == 169 && v4[1] == 254)
			return v4[2] == 169 && v4[3] == 254 ? EGRESS_REASON_METADATA : EGRESS_REASON_LINK_LOCAL;
		if (v4[0] == 100 && v4[1] == 100 && v4[2] == 100 && v4[3] == 200)
			return EGRESS_REASON_METADATA; /* Alibaba Cloud's metadata service */
		if (v4[0] >= 224 && v4[0] < 240)
			return EGRESS_REASON_MULTICAST;
		if (v4[0] >= 240)
			return EGRESS_REASON_BROADCAST; /* 240.0.0.0/4 reserved, 255.255.255.255 */
		return 0;
	}
	__builtin_memcpy(&hi, a, 8);
	__builtin_memcpy(&lo, &a[8], 8);
	__builtin_memcpy(&w2, &a[8], 4);
	if (hi == 0 && lo == 0)
		return EGRESS_REASON_UNSPECIFIED;
	if (a[0] == 0xfe && (a[1] & 0xc0) == 0x80)
		return EGRESS_REASON_LINK_LOCAL; /* fe80::/10 */
	if (a[0] == 0xff)
		return EGRESS_REASON_MULTICAST;
	/* fd00:ec2::254, AWS's IPv6 metadata endpoint */
	if (hi == bpf_cpu_to_be64(0xfd000ec200000000ULL) && lo == bpf_cpu_to_be64(0x254ULL))
		return EGRESS_REASON_METADATA;
	/* IPv6 that a translator turns into IPv4: it must never open an IPv4 address by another
	 * name. ::a.b.c.d (compatible, ::1 and :: handled above), ::ffff:0:a.b.c.d (translated),
	 * 64:ff9b::/96 and 64:ff9b:1::/48 (NAT64), 2002::/16 (6to4), 2001::/32 (Teredo). */
	if (hi == 0 && (w2 == 0 || w2 == bpf_htonl(0xffff0000)))
		return EGRESS_REASON_EMBEDDED_IPV4;
	if (a[0] == 0x00 && a[1] == 0x64 && a[2] == 0xff && a[3] == 0x9b && ((a[4] == 0 && a[5] == 0) || (a[4] == 0 && a[5] == 1)))
		return EGRESS_REASON_EMBEDDED_IPV4;
	if (a[0] == 0x20 && (a[1] == 0x02 || (a[1] == 0x01 && a[2] == 0 && a[3] == 0)))
		return EGRESS_REASON_EMBEDDED_IPV4;
	return 0;
}

static __always_inline int cidr_allowed(const struct sandbox_policy *policy, __u64 cgid, const __u8 addr[16], __u16 port,
					__u8 proto)
{
	struct egress_cidr_key ckey = {};

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

/*
 * 1 = allowed; 0 = denied, with *reason set (EGRESS_REASON_*).
 * check_expiry = 0 for the skb backstop: a connection allowed at connect() keeps flowing after the
 * DNS TTL ends; the loader deletes expired bindings after a grace period.
 */
static __always_inline int allowed(const struct sandbox_policy *policy, __u64 cgid, const __u8 addr[16], __u16 port,
				   __u8 proto, int check_expiry, __u8 *reason)
{
	struct egress_key key = {};
	struct egress_deny_key dkey = {};
	struct egress_deny_value *deny;
	struct egress_value *val;
	__u8 special;

	*reason = EGRESS_REASON_NOT_ALLOWED;
	if (is_loopback(addr))
		return 1;
	if (policy->allow_dns && port == DNS_PORT && (proto == IPPROTO_UDP || proto == IPPROTO_TCP) && is_v4(addr) &&
	    __builtin_memcmp(&addr[12], &policy->resolver_v4, 4) == 0)
		return 1;
	special = special_reason(addr);
	if (special) {
		*reason = special;
		return 0;
	}

	dkey.prefixlen = 128;
	__builtin_memcpy(dkey.addr, addr, 16);
	deny = bpf_map_lookup_elem(&egress_deny, &dkey);
	if (deny) {
		/* Only the sandbox's CIDR entries (a service's cidrs, an account rule: written by the
		 * operator) can open an overridable range; a DNS binding never does. */
		if ((deny->flags & EGRESS_DENY_OVERRIDABLE) && cidr_allowed(policy, cgid, addr, port, proto))
			return 1;
		*reason = deny->reason ? deny->reason : EGRESS_REASON_OPERATOR;
		return 0;
	}

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
	if (val && (!check_expiry || val->expires_ns == 0 || val->expires_ns > bpf_ktime_get_ns()))
		return 1;
	return cidr_allowed(policy, cgid, addr, port, proto);
}

static __always_inline void report(__u64 cgid, const __u8 addr[16], __u16 port, __u8 proto, __u8 kind, __u32 pid,
				   __u8 reason)
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
	ev->reason = reason;
	__builtin_memset(ev->pad, 0, sizeof(ev->pad));
	bpf_ringbuf_submit(ev, 0);
}

#endif
