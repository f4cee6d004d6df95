// SPDX-License-Identifier: GPL-2.0
/*
 * fabriclab uplink selection stage: the per-packet half of the E-ECMP, flowlet and adaptive
 * routing apps, on the tc clsact egress of every switch port that faces another switch.
 *
 * Open vSwitch's select group has already chosen a member (the port the packet is leaving by); it
 * cannot parse the RoCE BTH, nor see port load. This program chooses again among the same group's
 * members, which the controller keeps in `members` keyed by (the port OVS chose, destination
 * /24) with each member's capacity weight, and bpf_redirects the packet to the egress of its
 * choice when that differs:
 *   - MODE_HASH (E-ECMP): a hash of the 5-tuple plus, for RoCEv2 (UDP 4791), the BTH destination
 *     QP carried in this very packet; `flow_hash` in select_stage.py is the same function.
 *   - MODE_FLOWLET: a flow keeps its member while its packets are closer than the flowlet gap; a
 *     new flow, or one idle longer than the gap, goes to the member that sent the fewest bytes
 *     over the last one to two load windows.
 *   - MODE_AR (adaptive routing, seed 002 section 4.1): every packet goes to a member with the
 *     least queued bytes, depth divided by the member's weight (the capacity left behind it, so a
 *     member with half the capacity counts its queue twice), compared in steps of `quantum`;
 *     among the members tied at the least step, one drawn with probability proportional to its
 *     weight. No per-flow state. The depth is the queue model's own occupancy of the port (all
 *     classes) when the fabric runs one (`queue_stats`, linked by user space), else a virtual
 *     queue the stage keeps: bytes sent minus what the link's rate has drained since.
 * Local link failure, in the data path (where the kernel lets a tc program read its device,
 * STAGE_READS_CARRIER): a packet that finds the port it leaves by without carrier marks the port
 * down in `port_down` and, if its group has a live member, is sent there instead; every later
 * choice skips the port, before the controller has heard of the failure. A packet that finds a
 * port up clears the mark (and user space clears it when the controller sees the port come back).
 *
 * A redirected packet carries STAGE_MARK, so the stage passes it at the second port without
 * deciding again (unless that port is down). The stage runs at prio 1, before link loss (2) and the
 * queue model (3), which then accounts the packet at the port it really leaves by.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#define MAX_MEMBERS 16
#define MODE_OFF 0
#define MODE_HASH 1
#define MODE_FLOWLET 2
#define MODE_AR 3
#define CFG_CARRIER 1u        /* flags: leave a member without carrier at once, in the data path */
#define ROCE_PORT 4791
#define STAGE_MARK 0x40000000u
#define HIST_BUCKETS 32
#define QUEUE_CLASSES 3       /* the queue model's classes per port (fabriclab/queues/config.py) */
#define NO_CHOICE 0xffffffffu

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
	ST_AR_TIED,          /* AR decisions with two or more members at the least depth */
	ST_AR_QUEUE_MODEL,   /* AR decisions that read the queue model's occupancy */
	ST_AR_VIRTUAL,       /* AR decisions on the stage's virtual queues */
	ST_CARRIER_LOST,     /* packets that found their port without carrier */
	ST_RESCUED,          /* ... and went to a live member instead */
	ST_SKIPPED_DOWN,     /* decisions that left out a member marked down */
	ST_NO_LIVE,          /* decisions with no live member (passed where they were) */
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
	__u32 flags;          /* CFG_CARRIER */
	__u32 quantum;        /* AR: depths compare in steps of this many bytes (0: exactly) */
	__u32 pad;
};

struct member_key {
	__u32 ifindex;        /* the port OVS chose */
	__u32 net;            /* destination /24, network byte order */
};

struct members {
	__u32 n;
	__u32 ifindex[MAX_MEMBERS];
	__u32 weight[MAX_MEMBERS];   /* capacity behind each member (1 each when unweighted) */
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

struct port_cfg {           /* written by user space for every port the stage is attached to */
	__u64 rate_bytes;     /* the link's rate, bytes per second (drains the virtual queue) */
	__u32 qport;          /* the queue model's index of this port + 1 (0: none) */
	__u32 basis;          /* the hash basis of the port's switch (apps/hashing.py: switch_basis) */
};

struct vqueue {
	__u64 bytes;          /* backlog at `ns` */
	__u64 ns;
};

struct port_state {         /* the data path's record of a port, read by tests and the lab */
	__u64 chosen;         /* packets the stage sent here by its own choice */
	__u64 last_chosen_ns;
	__u64 down_seen_ns;   /* when a packet last found the port without carrier (it was up before) */
	__u64 down_events;
	__u64 chosen_down_ns; /* carrier check off: the last choice of the port while it was down */
};

/* The queue model's per (port, class) row (fabricq.bpf.c struct qstat, datapath.QStat): only
 * `occ` is read; the layout up to it and the size must match (tests/lab check both). */
struct qstat_view {
	__u64 counters[6];    /* tx_pkts, tx_bytes, marks, drops, lossless_drops, wd_drops */
	__s64 occ;            /* bytes in the port's egress queue of this class */
	__u64 rest[11];
	__u32 paused;
	__u32 pad;
};
/* Used by value once, so that the compiler describes the whole struct to libbpf (a struct only
 * reached through pointers is emitted as a bare name, and libbpf cannot size the inner map). */
const struct qstat_view qstat_view_type;

struct decision {
	__u32 chosen;         /* ifindex of the last decision (tests read it) */
	__u32 event;
	__u32 tied_weight;    /* AR: the weight of the members tied at the least depth */
	__u32 pad;
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
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct port_cfg);
} port_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct vqueue);
} vqueues SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);         /* since when (ns) */
} port_down SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct port_state);
} port_state SEC(".maps");

/* The queue model's `stats` map, linked in slot 0 by user space once the model runs (its size,
 * ports x classes, is set on the template before load); empty: virtual queues. */
struct queue_rows {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct qstat_view);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct queue_rows);
} queue_stats SEC(".maps");

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

/* -- the port's own link state ------------------------------------------------------------------ */
#ifdef STAGE_READS_CARRIER
/* Linux 6.3+: the program reads the device it runs on (select_stage.py loads this variant where
 * the kernel has bpf_cast_to_kern_ctx, else the one below). */
struct net_device {
	unsigned int flags;
	unsigned long state;
} __attribute__((preserve_access_index));

struct sk_buff {
	struct net_device *dev;
} __attribute__((preserve_access_index));

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

#define IFF_UP_FLAG 0x1
#define LINK_STATE_NOCARRIER 2       /* enum netdev_state_t: __LINK_STATE_NOCARRIER */

static __always_inline int port_has_carrier(struct __sk_buff *skb)
{
	struct sk_buff *kskb = bpf_cast_to_kern_ctx(skb);
	struct net_device *dev = kskb->dev;
	if (!dev)
		return 1;
	return (dev->flags & IFF_UP_FLAG) && !(dev->state & (1UL << LINK_STATE_NOCARRIER));
}
#else
static __always_inline int port_has_carrier(struct __sk_buff *skb)
{
	return 1;
}
#endif

static __always_inline struct port_state *state_of(__u32 ifindex)
{
	struct port_state *st = bpf_map_lookup_elem(&port_state, &ifindex);
	if (st)
		return st;
	struct port_state fresh = {};
	bpf_map_update_elem(&port_state, &ifindex, &fresh, BPF_NOEXIST);
	return bpf_map_lookup_elem(&port_state, &ifindex);
}

/* Note what the packet found about its own port: down ports go into port_down. */
static __always_inline void note_carrier(__u32 here, int live, __u64 now)
{
	__u64 *since = bpf_map_lookup_elem(&port_down, &here);
	if (live) {
		if (since)
			bpf_map_delete_elem(&port_down, &here);
		return;
	}
	count(ST_CARRIER_LOST);
	if (since)
		return;
	bpf_map_update_elem(&port_down, &here, &now, BPF_NOEXIST);
	struct port_state *st = state_of(here);
	if (st) {
		st->down_seen_ns = now;
		__sync_fetch_and_add(&st->down_events, 1);
	}
}

static __always_inline int is_down(struct config *cfg, __u32 ifindex)
{
	return (cfg->flags & CFG_CARRIER) && bpf_map_lookup_elem(&port_down, &ifindex);
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

/* -- load windows (flowlet) and virtual queues (AR) ---------------------------------------------- */
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

/* What a virtual queue holds at `now`: its backlog less what the link's rate has drained since. */
static __always_inline __u64 vq_depth(struct vqueue *q, struct port_cfg *pc, __u64 now)
{
	if (!q)
		return 0;
	__u64 elapsed = now > q->ns ? now - q->ns : 0;
	if (elapsed > 1000000000ULL)            /* a second drains any lab buffer: avoid overflow */
		return 0;
	__u64 rate = pc ? pc->rate_bytes : 0;
	__u64 drained = elapsed * rate / 1000000000ULL;
	return q->bytes > drained ? q->bytes - drained : 0;
}

/* Every packet leaving a port: its bytes enter the port's load window and virtual queue. */
static __always_inline void account(__u32 here, __u64 now, __u64 window, __u32 len)
{
	add_load(here, now, window, len);
	struct port_cfg *pc = bpf_map_lookup_elem(&port_cfg, &here);
	struct vqueue *q = bpf_map_lookup_elem(&vqueues, &here);
	if (!q) {
		struct vqueue fresh = { .bytes = len, .ns = now };
		bpf_map_update_elem(&vqueues, &here, &fresh, BPF_NOEXIST);
		return;
	}
	/* races between CPUs only blur the estimate by a packet */
	q->bytes = vq_depth(q, pc, now) + len;
	q->ns = now;
}

/* The bytes queued at a port: the larger of its virtual queue and, when the queue model is linked
 * and knows the port (then with MODELLED set), the model's occupancy over its classes. The model
 * counts what waits in the qdisc (a PFC pause holds it there) but not the packet the shaper has
 * just let go, whose bytes the link is still serializing: on a fabric under half load the
 * occupancy is 0 at almost every decision and AR drew at random (uplink max/mean 1.11-1.17 on
 * the ar2x2 ring); the virtual queue is that serialization backlog. A global function, so the
 * verifier checks it once instead of once per member and path of AR's scan. */
#define MODELLED (1ULL << 63)

__noinline __u64 queue_depth(__u32 ifindex, __u64 now)
{
	struct port_cfg *pc = bpf_map_lookup_elem(&port_cfg, &ifindex);
	__u64 backlog = vq_depth(bpf_map_lookup_elem(&vqueues, &ifindex), pc, now);
	__u32 zero = 0;
	void *rows = bpf_map_lookup_elem(&queue_stats, &zero);
	if (rows && pc && pc->qport) {
		__s64 total = 0;
		for (__u32 c = 0; c < QUEUE_CLASSES; c++) {
			__u32 row = (pc->qport - 1) * QUEUE_CLASSES + c;
			struct qstat_view *q = bpf_map_lookup_elem(rows, &row);
			if (q)
				total += q->occ;
		}
		__u64 held = total > 0 ? (__u64)total : 0;
		return MODELLED | (held > backlog ? held : backlog);
	}
	return backlog;
}

/* -- the choices --------------------------------------------------------------------------------- */
/* The least-loaded live member, scanning from the hash's member so ties spread like ECMP. */
static __always_inline __u32 least_loaded(struct config *cfg, struct members *m, __u32 n, __u32 h,
					  __u64 now, __u64 window)
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
		if (is_down(cfg, candidate)) {
			count(ST_SKIPPED_DOWN);
			continue;
		}
		__u64 load = port_load(candidate, now, window);
		if (load < best_load) {
			best_load = load;
			best = candidate;
		}
	}
	return best;
}

/* The hash's member, or the next live one after it (OVS's dp_hash walks its table the same way). */
static __always_inline __u32 hashed_member(struct config *cfg, struct members *m, __u32 n, __u32 h)
{
	__u32 start = h % n;
	for (__u32 i = 0; i < MAX_MEMBERS; i++) {
		if (i >= n)
			break;
		__u32 j = start + i;
		if (j >= n)
			j -= n;
		/* the compiler knows j < n <= 16 and would drop the check; the verifier does not */
		asm volatile("" : "+r"(j));
		if (j >= MAX_MEMBERS)
			break;
		__u32 candidate = m->ifindex[j];
		if (!is_down(cfg, candidate))
			return candidate;
		count(ST_SKIPPED_DOWN);
	}
	return 0;
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

/* How many packets the stage has sent to a port (the tie-break among equally deep members). Not
 * inlined: verified once, its result is one unknown number to ar_member's loop, not a branch. */
__noinline __u64 times_chosen(__u32 ifindex)
{
	struct port_state *st = bpf_map_lookup_elem(&port_state, &ifindex);
	return st ? st->chosen : 0;
}

/* Adaptive routing: the live member with the least weighted depth (in quanta). Among members tied
 * at that depth (idle links, mostly): with equal weights the one the stage has chosen least, so
 * idle members take turns (a random draw left the lab's few thousand packets a ring sends 5-10%
 * apart per uplink); with unequal weights one drawn by weight. `tied_weight` returns the weight of
 * every member at the least depth (more than the chosen one's: a tie). The bookkeeping stays in
 * values the verifier cannot know (sums of map values), so it does not explore every tie count
 * separately. */
static __always_inline __u32 ar_member(struct config *cfg, struct members *m, __u32 n, __u64 now,
				       __u32 *tied_weight)
{
	__u32 wmax = 1;
	for (__u32 i = 0; i < MAX_MEMBERS; i++) {
		if (i >= n)
			break;
		if (m->weight[i] > wmax)
			wmax = m->weight[i];
	}
	__u64 quantum = cfg->quantum ? cfg->quantum : 1;
	__u64 best_level = ~0ULL;
	__u32 best = 0, best_weight = 0, total = 0, uneven = 0;
	__u32 least = 0;
	__u64 least_chosen = ~0ULL;
	__u64 virtual = 0;
	for (__u32 i = 0; i < MAX_MEMBERS; i++) {
		if (i >= n)
			break;
		__u32 candidate = m->ifindex[i];
		__u32 w = m->weight[i];
		if (!w)
			continue;
		if (is_down(cfg, candidate)) {
			count(ST_SKIPPED_DOWN);
			continue;
		}
		__u64 depth = queue_depth(candidate, now);
		virtual |= ~depth & MODELLED;
		__u64 level = (depth & ~MODELLED) * wmax / w / quantum;
		__u64 chosen = times_chosen(candidate);
		if (level < best_level) {
			best_level = level;
			best = candidate;
			best_weight = w;
			total = w;
			uneven = 0;
			least = candidate;
			least_chosen = chosen;
		} else if (level == best_level) {
			/* weighted reservoir sampling: each tied member ends up chosen with probability
			 * w / (sum of the tied weights) */
			uneven |= w ^ best_weight;
			total += w;
			if (bpf_get_prandom_u32() % total < w) {
				best = candidate;
				best_weight = w;
			}
			if (chosen < least_chosen) {
				least = candidate;
				least_chosen = chosen;
			}
		}
	}
	if (total > best_weight) {
		count(ST_AR_TIED);
		if (!uneven)
			best = least;
	}
	if (best)
		count(virtual ? ST_AR_VIRTUAL : ST_AR_QUEUE_MODEL);
	*tied_weight = total;
	return best;
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
	int live = port_has_carrier(skb);
	note_carrier(here, live, now);

	if (skb->mark & STAGE_MARK) {         /* redirected here by the stage itself */
		skb->mark &= ~STAGE_MARK;
		if (live || !(cfg->flags & CFG_CARRIER)) {
			account(here, now, window, skb->len);
			return TC_ACT_UNSPEC;
		}
		/* the port died since the stage chose it: choose again below, without it */
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
		account(here, now, window, skb->len);
		return TC_ACT_UNSPEC;
	}
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->ihl < 5) {
		account(here, now, window, skb->len);
		return TC_ACT_UNSPEC;
	}

	struct member_key mk = { .ifindex = here, .net = ip->daddr & bpf_htonl(0xffffff00) };
	struct members *m = bpf_map_lookup_elem(&members, &mk);
	__u32 n = m ? m->n : 0;
	if (!m || n < 2 || n > MAX_MEMBERS) {
		if (!m)
			count(ST_NO_MEMBERS);
		account(here, now, window, skb->len);
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
	/* each switch hashes from its own basis: one basis everywhere would make the same choice at
	   every tier (apps/hashing.py says why) */
	struct port_cfg *basis = bpf_map_lookup_elem(&port_cfg, &here);
	__u32 h = basis ? basis->basis : cfg->seed;
	h = mix(h, bpf_ntohl(fk.saddr));
	h = mix(h, bpf_ntohl(fk.daddr));
	h = mix(h, ((__u32)fk.sport << 16) | fk.dport);
	h = mix(h, fk.proto);

	count(ST_PACKETS);
	if (roce)
		count(ST_ROCE);
	__u32 chosen;
	__u32 event = 0;
	__u32 tied = 0;
	if (cfg->mode == MODE_HASH) {
		if (roce)
			h = mix(h, qp);
		chosen = hashed_member(cfg, m, n, h);
	} else if (cfg->mode == MODE_AR) {
		chosen = ar_member(cfg, m, n, now, &tied);
		event = ST_AR_TIED;
	} else {
		if (roce && cfg->hash_qp) {
			h = mix(h, qp);
			fk.qp = qp;
		}
		struct flowlet *fl = bpf_map_lookup_elem(&flowlets, &fk);
		if (!fl) {
			chosen = least_loaded(cfg, m, n, h, now, window);
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
			if (!is_member(m, n, fl->ifindex) || is_down(cfg, fl->ifindex)) {
				chosen = least_loaded(cfg, m, n, h, now, window);
				count(ST_MEMBER_GONE);
				event = ST_MEMBER_GONE;
			} else if (gap < cfg->gap_ns) {
				chosen = fl->ifindex;
				count(ST_FLOWLET_KEPT);
				event = ST_FLOWLET_KEPT;
			} else {
				chosen = least_loaded(cfg, m, n, h, now, window);
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
	if (!live && (cfg->flags & CFG_CARRIER) && chosen && chosen != here) {
		count(ST_RESCUED);
		event = ST_RESCUED;
	}
	struct decision *d = bpf_map_lookup_elem(&last, &zero);
	if (d) {
		d->chosen = chosen;
		d->event = event;
		d->tied_weight = tied;
	}
	if (!chosen) {
		count(ST_NO_LIVE);
		account(here, now, window, skb->len);
		return TC_ACT_UNSPEC;
	}
	struct port_state *st = state_of(chosen);
	if (st) {
		__sync_fetch_and_add(&st->chosen, 1);
		st->last_chosen_ns = now;
		if (!(cfg->flags & CFG_CARRIER) && bpf_map_lookup_elem(&port_down, &chosen))
			st->chosen_down_ns = now;
	}
	if (chosen == here) {
		account(here, now, window, skb->len);
		return TC_ACT_UNSPEC;
	}
	count(ST_REDIRECTED);
	skb->mark |= STAGE_MARK;
	return bpf_redirect(chosen, 0);
}

char _license[] SEC("license") = "GPL";
