// SPDX-License-Identifier: Apache-2.0
/*
 * Egress of microVMs. A microVM's traffic never passes a socket of the host: the
 * guest's frames come out of a tap, so the cgroup programs of sandbox_egress.bpf.c
 * do not see them. The tap lives in the sandbox's own network namespace next to
 * the veth to the node bridge, and two tcx programs join the two:
 *
 *   egress_tap         ingress of the tap (frames the guest sent): source MAC and
 *                      address must be the sandbox's, then the destination is judged
 *                      by the same decision and the same maps as a container's
 *                      packets; allowed frames are redirected out of the veth,
 *                      denied ones dropped and reported (EGRESS_EVENT_TAP)
 *   egress_tap_return  ingress of the veth (frames for the sandbox): back to the tap
 *
 * Each sandbox loads its own copy of the programs with its settings (its cgroup id,
 * interfaces, address and MAC) as constants, so nothing in a frame or in a shared
 * table decides which sandbox's policy applies. The maps are the node's pinned
 * ones. Nothing is bridged or routed in the namespace: without these programs no
 * frame passes, so a missing link closes the sandbox instead of opening it.
 *
 * The programs live in their own object because tcx links need a recent kernel;
 * the container programs keep loading without it.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "sandbox_egress.h"

char LICENSE[] SEC("license") = "GPL";

#include "egress_common.h"

/* Set by the loader before the programs are loaded (the object's only .rodata). */
const volatile struct tap_port port = {};

#define ARP_SENDER_HW 8	 /* offsets inside the ARP payload (Ethernet/IPv4) */
#define ARP_SENDER_IP 14
#define TCP_FLAGS_OFF 13 /* byte holding SYN/ACK in the TCP header */
#define TCP_SYN 0x02
#define TCP_ACK 0x10

/* b is the constant settings: read through volatile, or the compiler folds in the zero initializer */
static __always_inline int same_mac(const __u8 *a, const volatile __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] && a[5] == b[5];
}

static __always_inline int same_v4(const __u8 *a, const volatile __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

SEC("tc")
int egress_tap(struct __sk_buff *skb)
{
	struct sandbox_policy *policy;
	struct ethhdr eth;
	struct iphdr ip;
	__u8 addr[16];
	__u16 ports[2] = {};
	__u8 proto, flags = 0, reason;
	__u32 l4;
	__u64 cgid;
	int fresh;

	if (port.cgroup_id == 0)
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0 || !same_mac(eth.h_source, port.mac))
		return TC_ACT_SHOT;
	if (eth.h_proto == bpf_htons(ETH_P_ARP)) {
		__u8 hw[ETH_ALEN];
		__u8 sip[4];

		/* the guest may only speak for its own address: no ARP claims of a neighbour's */
		if (bpf_skb_load_bytes(skb, ETH_HLEN + ARP_SENDER_HW, hw, sizeof(hw)) < 0 ||
		    bpf_skb_load_bytes(skb, ETH_HLEN + ARP_SENDER_IP, sip, sizeof(sip)) < 0)
			return TC_ACT_SHOT;
		if (!same_mac(hw, port.mac) || !same_v4(sip, port.addr_v4))
			return TC_ACT_SHOT;
		return bpf_redirect(port.uplink_ifindex, 0);
	}
	/* IPv4 only, as in a container's namespace (IPv6 is off there) */
	if (eth.h_proto != bpf_htons(ETH_P_IP))
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0 || ip.ihl < 5)
		return TC_ACT_SHOT;
	if (!same_v4((const __u8 *)&ip.saddr, port.addr_v4))
		return TC_ACT_SHOT;

	cgid = port.cgroup_id;
	policy = bpf_map_lookup_elem(&sandbox_policies, &cgid);
	if (!policy || !policy->enforce)
		return TC_ACT_SHOT;
	map_v4(addr, ip.daddr);
	proto = ip.protocol;
	l4 = ETH_HLEN + ip.ihl * 4;
	if (ip.frag_off & bpf_htons(0x1fff))
		proto = 0; /* non-first fragment: no ports to check; allowed only by an any-port entry */
	if ((proto == IPPROTO_TCP || proto == IPPROTO_UDP) && bpf_skb_load_bytes(skb, l4, ports, sizeof(ports)) < 0)
		return TC_ACT_SHOT;
	if (proto == IPPROTO_TCP && bpf_skb_load_bytes(skb, l4 + TCP_FLAGS_OFF, &flags, 1) < 0)
		return TC_ACT_SHOT;
	/* What a container's connect()/sendmsg() checks: a DNS binding past its TTL opens no new
	 * connection (a SYN) and no datagram; packets of a connection already open keep flowing,
	 * as under the cgroup skb backstop. */
	fresh = (proto == IPPROTO_TCP && (flags & (TCP_SYN | TCP_ACK)) == TCP_SYN) || proto == IPPROTO_UDP;
	if (is_loopback(addr)) {
		reason = EGRESS_REASON_LOOPBACK; /* the guest's loopback never reaches its NIC */
	} else if (allowed(policy, cgid, addr, bpf_ntohs(ports[1]), proto, fresh, &reason)) {
		return bpf_redirect(port.uplink_ifindex, 0);
	}
	/* one report per attempt, not per retransmitted or streamed packet */
	if (fresh || (proto != IPPROTO_TCP && proto != IPPROTO_UDP))
		report(cgid, addr, bpf_ntohs(ports[1]), proto, EGRESS_EVENT_TAP, 0, reason);
	return TC_ACT_SHOT;
}

SEC("tc")
int egress_tap_return(struct __sk_buff *skb)
{
	if (port.cgroup_id == 0)
		return TC_ACT_SHOT;
	return bpf_redirect(port.tap_ifindex, 0);
}
