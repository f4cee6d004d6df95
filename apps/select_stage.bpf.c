// SPDX-License-Identifier: GPL-2.0
/*
 * fabriclab uplink selection stage: the per-packet half of the E-ECMP and flowlet apps, on the tc
 * clsact egress of every switch port that belongs to a multi-member ECMP group.
 *
 * Open vSwitch's select group has already chosen a member (the port the packet is leaving by); it
 * cannot parse the RoCE BTH, nor see port load. This program chooses again among the same group's
 * members, which the controller keeps in `members` keyed by (the port OVS chose, destination
 * /24), and bpf_redirects the packet to the egress of its choice when that differs:
 *   - MODE_HASH (E-ECMP): a hash of the 5-tuple plus, for RoCEv2 (UDP 4791), the BTH destination
 *     QP carried in this very packet; `flow_hash` in select_stage.py is the same function.
 *   - MODE_FLOWLET: a flow keeps its member while its packets are closer than the flowlet gap; a
 *     new flow, or one idle longer than the gap, goes to the member that sent the fewest bytes
 *     over the last one to two load windows.
 * A redirected packet carries STAGE_MARK, so the stage passes it at the second port without
 * deciding again. The stage runs at prio 1, before link loss (2) and the queue model (3), which then
 * accounts the packet at the port it really leaves by.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define MAX_MEMBERS 16
#define MODE_OFF 0
#define MODE_HASH 1
#define MODE_FLOWLET 2
#define ROCE_PORT 4791
#define STAGE_MARK 0x40000000u
#define HIST_BUCKETS 32

enum {
	ST_PACKETS,          /* packets the stage decided for */
	ST_REDIRECTED,       /* ... and sent to another member than OVS's */
	ST_ROCE,             /* ... that were RoCEv2 (their QP entered the hash) */
	ST_NO_MEMBERS,       /* packets with no group entry (passed as OVS chose) */
	ST_FLOWLET_NEW,      /* flows seen for the first time */
	ST_FLOWLET_KEPT,     /* packets within the gap: same member */
	ST_FLOWLET_EXPIRED,  /* gaps longer than the interval: a new decision ... */
	ST_FLOWLET_MOVED,    /* ... that changed the flow's member */
	ST_MEMBER_GONE,      /* a flow's member left the group (link down): moved at once */
	ST_GAP_HIST,         /* HIST_BUCKETS slots: gaps between a flow's packets, log2(us) + 1 */
	ST_COUNT = ST_GAP_HIST + HIST_BUCKETS,
};

struct config {
	__u32 mode;
	__u32 hash_qp;        /* flowlet: flows are 5-tuple + QP (E-ECMP always hashes the QP) */
	__u64 gap_ns;
	__u64 window_ns;
	__u64 clock_ns;       /* non-zero: the time to use (tests drive a fake clock) */
	__u32 seed;
	__u32 pad;
};

struct member_key {
	__u32 ifindex;        /* the port OVS chose */
	__u32 net;            /* destination /24, network byte order */
};

struct members {
	__u32 n;
	__u32 ifindex[MAX_MEMBERS];
};

struct flow_key {
	__u32 saddr;
	__u32 daddr;
	__u16 sport;
	__u16 dport;
	__u32 proto;
	__u32 qp;
	__u32 net;            /* the same flow may cross several switches: one entry each group */
	__u32 group;          /* first member of the group, identifying the switch */
};

struct flowlet {
	__u64 last_ns;
	__u32 ifindex;
	__u32 pad;
};

struct load {
	__u64 start_ns;       /* start of the current window */
	__u64 cur;            /* bytes in the current window */
	__u64 prev;           /* bytes in the window before */
};

struct decision {
	__u32 chosen;         /* ifindex of the last decision (tests read it) */
	__u32 event;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct member_key);
	__type(value, struct members);
} members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, struct flowlet);
} flowlets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct load);
} loads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ST_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct decision);
} last SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);
	if (v)
		__sync_fetch_and_add(v, 1);
}

/* murmur3's 32-bit finalizer, applied after folding in each word */
static __always_inline __u32 mix(__u32 h, __u32 w)
{
	h ^= w;
	h ^= h >> 16;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	h *= 0xc2b2ae35u;
	h ^= h >> 16;
	return h;
}

static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 r = 0;
	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) { r += 1; }
	return r;
}

/* Bytes a port sent over the last one to two windows (0 when it has been quiet longer). */
static __always_inline __u64 port_load(__u32 ifindex, __u64 now, __u64 window)
{
	struct load *l = bpf_map_lookup_elem(&loads, &ifindex);
	if (!l)
		return 0;
	__u64 age = now > l->start_ns ? now - l->start_ns : 0;
	if (age >= 2 * window)
		return 0;
	if (age >= window)
		return l->cur;
	return l->cur + l->prev;
}

static __always_inline void add_load(__u32 ifindex, __u64 now, __u64 window, __u32 len)
{
	struct load *l = bpf_map_lookup_elem(&loads, &ifindex);
	if (!l) {
		struct load fresh = { .start_ns = now, .cur = len };
		bpf_map_update_elem(&loads, &ifindex, &fresh, BPF_NOEXIST);
		return;
	}
	__u64 age = now > l->start_ns ? now - l->start_ns : 0;
	if (age >= window) {
		/* races between CPUs only blur one window's estimate */
		l->prev = age >= 2 * window ? 0 : l->cur;
		l->cur = 0;
		l->start_ns = now;
	}
	__sync_fetch_and_add(&l->cur, len);
}

/* The least-loaded member, scanning from the hash's member so ties spread like ECMP. */
static __always_inline __u32 least_loaded(struct members *m, __u32 n, __u32 h, __u64 now, __u64 window)
{
	__u32 start = h % n;
	__u32 best = 0;
	__u64 best_load = ~0ULL;
	for (__u32 i = 0; i < MAX_MEMBERS; i++) {
		if (i >= n)
			break;
		__u32 j = start + i;
		if (j >= n)
			j -= n;
		if (j >= MAX_MEMBERS)
			break;
		__u32 candidate = m->ifindex[j];
		__u64 load = port_load(candidate, now, window);
		if (load < best_load) {
			best_load = load;
			best = candidate;
		}
	}
	return best;
}

static __always_inline int is_member(struct members *m, __u32 n, __u32 ifindex)
{
	for (__u32 i = 0; i < MAX_MEMBERS; i++) {
		if (i >= n)
			break;
		if (m->ifindex[i] == ifindex)
			return 1;
	}
	return 0;
}

SEC("tc")
int select_egress(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || cfg->mode == MODE_OFF)
		return TC_ACT_UNSPEC;
	__u64 now = cfg->clock_ns ? cfg->clock_ns : bpf_ktime_get_ns();
	__u32 here = skb->ifindex;
	__u64 window = cfg->window_ns ? cfg->window_ns : 1;

	if (skb->mark & STAGE_MARK) {         /* redirected here by the stage itself */
		skb->mark &= ~STAGE_MARK;
		add_load(here, now, window, skb->len);
		return TC_ACT_UNSPEC;
	}

	/* Open vSwitch's AF_PACKET transmit leaves all but the Ethernet header in page fragments:
	 * make the headers up to the BTH's destination QP linear before reading them. */
	__u32 want = ETH_HLEN + 60 + 8 + 8;
	if (skb->data + want > skb->data_end)
		bpf_skb_pull_data(skb, want < skb->len ? want : skb->len);
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP)) {
		add_load(here, now, window, skb->len);
		return TC_ACT_UNSPEC;
	}
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->ihl < 5) {
		add_load(here, now, window, skb->len);
		return TC_ACT_UNSPEC;
	}

	struct member_key mk = { .ifindex = here, .net = ip->daddr & bpf_htonl(0xffffff00) };
	struct members *m = bpf_map_lookup_elem(&members, &mk);
	__u32 n = m ? m->n : 0;
	if (!m || n < 2 || n > MAX_MEMBERS) {
		if (!m)
			count(ST_NO_MEMBERS);
		add_load(here, now, window, skb->len);
		return TC_ACT_UNSPEC;
	}

	struct flow_key fk = { .saddr = ip->saddr, .daddr = ip->daddr, .proto = ip->protocol,
			       .net = mk.net, .group = m->ifindex[0] };
	__u32 qp = 0;
	int roce = 0;
	void *l4 = (void *)ip + ip->ihl * 4;
	if (ip->protocol == IPPROTO_UDP || ip->protocol == IPPROTO_TCP) {
		__u16 *ports = l4;
		if ((void *)(ports + 2) <= end) {
			fk.sport = bpf_ntohs(ports[0]);
			fk.dport = bpf_ntohs(ports[1]);
		}
		if (ip->protocol == IPPROTO_UDP && fk.dport == ROCE_PORT) {
			/* UDP header (8) then BTH: opcode, flags, pkey (2), reserved, dest QP (3 bytes) */
			__u8 *bth = (__u8 *)l4 + 8;
			if ((void *)(bth + 8) <= end) {
				qp = ((__u32)bth[5] << 16) | ((__u32)bth[6] << 8) | bth[7];
				roce = 1;
			}
		}
	}
	__u32 h = cfg->seed;
	h = mix(h, bpf_ntohl(fk.saddr));
	h = mix(h, bpf_ntohl(fk.daddr));
	h = mix(h, ((__u32)fk.sport << 16) | fk.dport);
	h = mix(h, fk.proto);

	count(ST_PACKETS);
	if (roce)
		count(ST_ROCE);
	__u32 chosen;
	__u32 event = 0;
	if (cfg->mode == MODE_HASH) {
		if (roce)
			h = mix(h, qp);
		__u32 idx = h % n;
		/* the compiler knows idx < n <= 16 and would drop the check; the verifier does not */
		asm volatile("" : "+r"(idx));
		if (idx >= MAX_MEMBERS)
			return TC_ACT_UNSPEC;
		chosen = m->ifindex[idx];
	} else {
		if (roce && cfg->hash_qp) {
			h = mix(h, qp);
			fk.qp = qp;
		}
		struct flowlet *fl = bpf_map_lookup_elem(&flowlets, &fk);
		if (!fl) {
			chosen = least_loaded(m, n, h, now, window);
			struct flowlet fresh = { .last_ns = now, .ifindex = chosen };
			bpf_map_update_elem(&flowlets, &fk, &fresh, BPF_ANY);
			count(ST_FLOWLET_NEW);
			event = ST_FLOWLET_NEW;
		} else {
			__u64 gap = now > fl->last_ns ? now - fl->last_ns : 0;
			__u64 us = gap / 1000;
			__u32 bucket = us ? log2_u64(us) + 1 : 0;
			if (bucket >= HIST_BUCKETS)
				bucket = HIST_BUCKETS - 1;
			count(ST_GAP_HIST + bucket);
			if (!is_member(m, n, fl->ifindex)) {
				chosen = least_loaded(m, n, h, now, window);
				count(ST_MEMBER_GONE);
				event = ST_MEMBER_GONE;
			} else if (gap < cfg->gap_ns) {
				chosen = fl->ifindex;
				count(ST_FLOWLET_KEPT);
				event = ST_FLOWLET_KEPT;
			} else {
				chosen = least_loaded(m, n, h, now, window);
				count(ST_FLOWLET_EXPIRED);
				event = ST_FLOWLET_EXPIRED;
				if (chosen != fl->ifindex) {
					count(ST_FLOWLET_MOVED);
					event = ST_FLOWLET_MOVED;
				}
			}
			fl->ifindex = chosen;
			fl->last_ns = now;
		}
	}
	struct decision *d = bpf_map_lookup_elem(&last, &zero);
	if (d) {
		d->chosen = chosen;
		d->event = event;
	}
	if (!chosen || chosen == here) {
		add_load(here, now, window, skb->len);
		return TC_ACT_UNSPEC;
	}
	count(ST_REDIRECTED);
	skb->mark |= STAGE_MARK;
	return bpf_redirect(chosen, 0);
}

char _license[] SEC("license") = "GPL";
