// SPDX-License-Identifier: GPL-2.0
/*
 * fabriclab link loss: drop a configured fraction of the packets leaving a port, at random (seed
 * 003 section 6.3: "a uniform random loss probability applied on every link").
 *
 * On the tc clsact egress of the sending end of a link direction: a switch port (the root network
 * namespace) or a host NIC (its host's namespace); one program and map per namespace, keyed by
 * ifindex. It runs after the selection stage (prio 1: a packet that stage redirects is judged at
 * the port it really leaves by) and before the queue model (a lost packet is never queued).
 * TC_ACT_UNSPEC lets the next filter see the packets it keeps.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

struct loss {
	__u32 threshold;     /* drop when bpf_get_prandom_u32() < threshold: p * 2^32 */
	__u32 pad;
	__u64 dropped;
	__u64 passed;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct loss);
} losses SEC(".maps");

SEC("classifier")
int loss_egress(struct __sk_buff *skb)
{
	__u32 key = skb->ifindex;
	struct loss *l = bpf_map_lookup_elem(&losses, &key);

	if (!l)
		return TC_ACT_UNSPEC;
	if (bpf_get_prandom_u32() < l->threshold) {
		__sync_fetch_and_add(&l->dropped, 1);
		return TC_ACT_SHOT;
	}
	__sync_fetch_and_add(&l->passed, 1);
	return TC_ACT_UNSPEC;
}

char _license[] SEC("license") = "GPL";
