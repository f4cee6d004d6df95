// SPDX-License-Identifier: GPL-2.0
/*
 * fabriclab queue model: the per-packet half, on the clsact hooks of every lab port.
 *
 * egress (a port about to queue a packet on its htb tree):
 *   - classify by DSCP and steer into the class's htb leaf (skb->priority = 1:<minor>);
 *   - account the egress queue of (port, class); tail-drop lossy traffic above the buffer;
 *     drop lossless traffic only when its ingress port overran XOFF + headroom, or above a
 *     buffer fault's cut (any class);
 *   - at switch ports, mark CE on ECN-capable packets by the RED or step profile; or, where the
 *     port's RED qdisc marks instead (ecn_mode ECN_QDISC), note packets that enter already CE;
 *     or (ECN_AR) only when the egress queue and every other member of the packet's adaptive-
 *     routing group (`ar_groups`, by switch and destination /24) are at or above their kmin;
 * ingress (a packet arrived from the other end of the cable):
 *   - the packet has left the peer port's queue: the peer's egress occupancy falls, and so do the
 *     bytes the peer's switch holds for the port that packet had entered by (XON when low enough);
 *     a CE packet from a port whose qdisc marks counts as that port's mark unless it entered CE;
 *   - at a switch, the packet now counts against this ingress port (XOFF when high enough) and
 *     the packet (its flow and IP id) is remembered so its departure can be charged back to this
 *     port: a flow whose packets take several paths (adaptive routing, a PLB's planes, a rehash)
 *     enters one switch by several ports at once, and each packet is released against its own.
 * wire (the egress of the interface a cable between machines is tunnelled over, fabriclab.cluster.cluster):
 *   - a packet in a VXLAN tunnel of this run has left its port's queue (the tunnel's end, a port of
 *     this machine): the departure the far end's ingress would see, seen on this machine, whose
 *     maps hold that port's occupancy and its switch's accounts. The far end, on another machine
 *     (`peer_remote`), leaves them alone and only admits the packet.
 * XOFF and XON go to user space over a ring buffer; the user-space PFC agent closes or opens the
 * upstream port's tbf gate for the class. A packet OVS itself drops was counted in by the ingress
 * hook and never leaves: user space repairs such leaked accounts through the `bias` map (the bytes
 * to take off a port's `held`; only user space writes it, see queues/leaks.py). Occupancies are exact: a packet counts from its enqueue
 * until the far end of the cable sees it, so the htb queue itself is what is measured.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define NCLASS 3
#define CLASS_LOSSLESS 0
#define CLASS_CONTROL 1
#define CLASS_LOSSY 2
#define PROB_BITS 20
#define HTB_MAJOR 0x00010000u

#define ECN_QDISC 3           /* the port's RED qdisc marks; this program only counts */
#define ECN_AR 4              /* step at kmin, only when every member of the AR group is there too */
#define AR_MAX_MEMBERS 16

#define VXLAN_PORT 4789
/* What a tunnelled frame carries before it: Ethernet, IPv4 without options, UDP, VXLAN. */
#define WIRE_HLEN (ETH_HLEN + 20 + 8 + 8)

#define EV_XOFF 1
#define EV_XON 2

struct port {
	__u32 idx;            /* this port's row (rows are idx * NCLASS + class) */
	__u32 peer;           /* row base of the port at the other end of the cable */
	__u32 node;           /* owning node id */
	__u32 peer_node;
	__u32 is_switch;
	__u32 peer_is_switch;
	__u32 peer_remote;    /* the peer runs on another machine: its departures are seen there */
};

struct qcfg {
	__u32 ecn_mode;       /* 0 off, 1 RED, 2 step, 3 ECN_QDISC */
	__u32 kmin;
	__u32 kmax;
	__u32 pmax;           /* probability in 1/2^20 */
	__u32 limit;          /* egress tail drop, bytes */
	__u32 pfc;            /* lossless with PFC */
	__u32 xoff;
	__u32 xon;
	__u32 headroom_limit;
	__u32 pad;
};

struct qstat {
	__u64 tx_pkts;
	__u64 tx_bytes;
	__u64 marks;
	__u64 drops;
	__u64 lossless_drops;
	__u64 wd_drops;
	__s64 occ;
	__u64 occ_hwm;
	__s64 held;           /* ingress accounting: bytes in this switch that entered here */
	__u64 held_hwm;
	__u64 pause_tx;       /* XOFFs this ingress port sent upstream */
	__u64 xon_tx;
	__u64 pause_rx;       /* XOFFs this port received (its egress gate closed) */
	__u64 pause_ns;       /* total time this ingress port held its upstream paused */
	__u64 xoff_ts;
	__u64 rx_pkts;
	__u64 rx_bytes;
	__s64 ce_queued;      /* ECN_QDISC: packets that entered already CE, not yet seen leave */
	__u32 paused;
	__u32 pad;
};

struct ctl {
	__u64 wd_drop_until;  /* watchdog: drop this (port, class) until this time (ns) */
};

struct event {
	__u32 kind;
	__u32 port;           /* the ingress port that sent XOFF/XON (row base) */
	__u32 target;         /* its upstream peer, whose gate closes or opens (row base) */
	__u32 cls;
	__u64 ts;
	__s64 held;
};

/* One packet in a switch: its flow and IP id. A packet with id 0 (DF datagrams of an unconnected
 * socket, rxe's among them) shares its flow's entry, the last ingress port the flow came by. */
struct flow_key {
	__u32 node;
	__u32 saddr;
	__u32 daddr;
	__u16 sport;
	__u16 dport;
	__u16 proto;
	__u16 id;
};

/* Indexed by port row base. A port is known by the classid of its tc filter (fab:<idx+1>): tc
 * hands its minor number to the program in skb->tc_classid (16 bits). ifindex cannot serve, since
 * every host's namespace numbers its own interfaces from 2. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct port);
} ports SEC(".maps");

static __always_inline struct port *port_of(struct __sk_buff *skb)
{
	__u32 id = skb->tc_classid & 0xffff;
	if (!id)
		return 0;
	__u32 key = id - 1;
	return bpf_map_lookup_elem(&ports, &key);
}

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 3072);
	__type(key, __u32);
	__type(value, struct qcfg);
} qcfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 3072);
	__type(key, __u32);
	__type(value, struct qstat);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 3072);
	__type(key, __u32);
	__type(value, struct ctl);
} ctl SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 3072);
	__type(key, __u32);
	__type(value, __s64);
} bias SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} dscp_class SEC(".maps");

/* A buffer fault (fabriclab/workflows/faultkinds/buffer.py): per row, the bytes a switch port's
 * class may hold once its usable buffer is cut; 0 when it is not. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 3072);
	__type(key, __u32);
	__type(value, __u32);
} cut SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, __u32);
} flows SEC(".maps");

/* A VXLAN network id of this run -> the port (row base) that is its tunnel's end here. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} wire SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 18);
} events SEC(".maps");

/* ECN_AR: the ports adaptive routing could choose among for a packet, by its switch and its
 * destination's /24 (host order); written by user space (queues/model.py set_ar_groups). */
struct ar_key {
	__u32 node;
	__u32 net;
};

struct ar_group {
	__u32 n;
	__u32 idx[AR_MAX_MEMBERS];   /* member ports' row bases */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct ar_key);
	__type(value, struct ar_group);
} ar_groups SEC(".maps");

struct pkt {
	__u32 saddr;
	__u32 daddr;
	__u16 sport;
	__u16 dport;
	__u32 proto;
	__u32 tos;
	__u16 id;
};

/* The frame at byte `off` of the packet (0, or WIRE_HLEN inside a tunnel). */
static __always_inline int parse_at(struct __sk_buff *skb, __u32 off, struct pkt *p)
{
	if (skb->data + off + ETH_HLEN + 20 + 4 > skb->data_end)
		bpf_skb_pull_data(skb, off + ETH_HLEN + 60 + 4);
	void *data = (void *)(long)skb->data + off;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return 0;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end)
		return 0;
	p->saddr = ip->saddr;
	p->daddr = ip->daddr;
	p->proto = ip->protocol;
	p->tos = ip->tos;
	p->id = ip->id;
	p->sport = 0;
	p->dport = 0;
	__u32 ihl = (ip->ihl & 0xf) * 4;
	if ((p->proto == IPPROTO_UDP || p->proto == IPPROTO_TCP) && ihl >= 20 &&
	    !(ip->frag_off & bpf_htons(0x1fff))) {
		__u16 *l4 = (void *)ip + ihl;
		if ((void *)(l4 + 2) <= end) {
			p->sport = l4[0];
			p->dport = l4[1];
		}
	}
	return 1;
}

static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	return parse_at(skb, 0, p);
}

static __always_inline struct flow_key flow_of(__u32 node, struct pkt *p)
{
	struct flow_key k = {.node = node, .saddr = p->saddr, .daddr = p->daddr, .sport = p->sport,
			     .dport = p->dport, .proto = p->proto, .id = p->id};
	return k;
}

static __always_inline __u32 class_of(struct pkt *p)
{
	__u32 dscp = p->tos >> 2;
	__u32 *c = bpf_map_lookup_elem(&dscp_class, &dscp);
	return (c && *c < NCLASS) ? *c : CLASS_LOSSY;
}

static __always_inline void emit(__u32 kind, __u32 port, __u32 target, __u32 cls, __u64 now, __s64 held)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return;
	e->kind = kind;
	e->port = port;
	e->target = target;
	e->cls = cls;
	e->ts = now;
	e->held = held;
	bpf_ringbuf_submit(e, 0);
}

static __always_inline void hwm(__u64 *mark, __s64 value)
{
	if (value > 0 && (__u64)value > *mark)
		*mark = value;
}

/* What user space took off a row's held bytes: the leaked bytes it repaired. */
static __always_inline __s64 bias_of(__u32 row)
{
	__s64 *b = bpf_map_lookup_elem(&bias, &row);
	return b ? *b : 0;
}

/* Ingress port `idx` (row base) stops pausing its upstream for class cls: XON. */
static __always_inline void resume(struct qstat *st, __u32 idx, __u32 cls, __u64 now, __s64 held)
{
	if (__sync_val_compare_and_swap(&st->paused, 1, 0) != 1)
		return;
	__u64 since = st->xoff_ts;
	if (since && now > since)
		__sync_fetch_and_add(&st->pause_ns, now - since);
	__sync_fetch_and_add(&st->xon_tx, 1);
	struct port *ip = bpf_map_lookup_elem(&ports, &idx);
	if (ip)
		emit(EV_XON, idx, ip->peer, cls, now, held);
}

/* The bytes a switch holds for the ingress port a flow entered by fall by len (the packet left
 * the switch, or was dropped in it); XON when they reach the port's XON threshold. */
static __always_inline void release(__u32 node, struct pkt *p, __u32 cls, __u32 len, __u64 now)
{
	struct flow_key k = flow_of(node, p);
	__u32 *in = bpf_map_lookup_elem(&flows, &k);
	if (!in)
		return;
	__u32 in_idx = *in;
	if (k.id)                       /* the packet's own entry: it leaves once */
		bpf_map_delete_elem(&flows, &k);
	__u32 row = in_idx * NCLASS + cls;
	struct qstat *st = bpf_map_lookup_elem(&stats, &row);
	struct qcfg *cf = bpf_map_lookup_elem(&qcfg, &row);
	if (!st || !cf)
		return;
	__s64 held = __sync_fetch_and_add(&st->held, -(__s64)len) - len - bias_of(row);
	if (cf->pfc && st->paused && held <= (__s64)cf->xon)
		resume(st, in_idx, cls, now, held);
}

/* A packet entered a switch by ingress port `pt`: count it against the port; XOFF at the
 * port's XOFF threshold (the upstream peer's gate for this class closes). */
static __always_inline void admit(struct port *pt, __u32 cls, __u32 len, __u64 now)
{
	__u32 row = pt->idx * NCLASS + cls;
	struct qstat *st = bpf_map_lookup_elem(&stats, &row);
	struct qcfg *cf = bpf_map_lookup_elem(&qcfg, &row);
	if (!st || !cf)
		return;
	__s64 held = __sync_fetch_and_add(&st->held, (__s64)len) + len - bias_of(row);
	hwm(&st->held_hwm, held);
	/* Paused with no more than XON held before this packet: nothing left to release would ever
	 * send the XON (user space repaired a leak and opened the gate), so this arrival does. */
	if (cf->pfc && st->paused && held - (__s64)len <= (__s64)cf->xon)
		resume(st, pt->idx, cls, now, held);
	if (cf->pfc && !st->paused && held >= (__s64)cf->xoff &&
	    __sync_val_compare_and_swap(&st->paused, 0, 1) == 0) {
		st->xoff_ts = now;
		__sync_fetch_and_add(&st->pause_tx, 1);
		__u32 prow = pt->peer * NCLASS + cls;
		struct qstat *up = bpf_map_lookup_elem(&stats, &prow);
		if (up)
			__sync_fetch_and_add(&up->pause_rx, 1);
		emit(EV_XOFF, pt->idx, pt->peer, cls, now, held);
		/* A packet leaving the switch on another CPU may have taken held down to XON between
		 * the count above and the flag, and seen no pause to end: with nothing left to
		 * release, the port would pause its upstream for good (seen once in ~20 runs on two
		 * cores). Look again now that the flag is set; a release after this sees it. */
		__s64 again = __sync_fetch_and_add(&st->held, 0) - bias_of(row);
		if (again <= (__s64)cf->xon)
			resume(st, pt->idx, cls, now, again);
	}
}

static __always_inline int should_mark(struct qcfg *cf, __s64 occ)
{
	if (!cf->ecn_mode || cf->ecn_mode == ECN_QDISC || cf->ecn_mode == ECN_AR || occ < (__s64)cf->kmin)
		return 0;
	if (cf->ecn_mode == 2 || occ >= (__s64)cf->kmax || cf->kmax <= cf->kmin)
		return 1;
	__u64 threshold = (__u64)cf->pmax * (__u64)(occ - cf->kmin) / (cf->kmax - cf->kmin);
	return (bpf_get_prandom_u32() & ((1u << PROB_BITS) - 1)) < threshold;
}

/* ECN_AR (config.ar_mark): mark when this queue is at or above kmin and so is every other member
 * of the packet's AR group; a destination with no group (one way there) has only this port. */
static __always_inline int ar_should_mark(struct port *pt, struct pkt *p, __u32 cls, struct qcfg *cf,
					  __s64 occ)
{
	if (occ < (__s64)cf->kmin)
		return 0;
	struct ar_key k = {.node = pt->node, .net = bpf_ntohl(p->daddr) & 0xffffff00};
	struct ar_group *g = bpf_map_lookup_elem(&ar_groups, &k);
	if (!g)
		return 1;
	for (__u32 i = 0; i < AR_MAX_MEMBERS; i++) {
		if (i >= g->n)
			break;
		__u32 row = g->idx[i] * NCLASS + cls;
		if (g->idx[i] == pt->idx)
			continue;
		struct qstat *mst = bpf_map_lookup_elem(&stats, &row);
		struct qcfg *mcf = bpf_map_lookup_elem(&qcfg, &row);
		if (mst && mcf && mst->occ < (__s64)mcf->kmin)
			return 0;    /* a member with room: adaptive routing can still move the burst */
	}
	return 1;
}

/* Set ECN to CE (11) in the IPv4 header and patch its checksum. The RoCE ICRC masks these bits. */
static __always_inline void mark_ce(struct __sk_buff *skb, __u32 tos)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	if (data + ETH_HLEN + sizeof(struct iphdr) > end)
		return;
	__u16 *word = data + ETH_HLEN;            /* version/IHL and TOS, network order */
	__u16 old = *word;
	__u8 bytes[2] = {*(__u8 *)word, (__u8)(tos | 3)};
	__u16 new = *(__u16 *)bytes;
	bpf_l3_csum_replace(skb, ETH_HLEN + __builtin_offsetof(struct iphdr, check), old, new, 2);
	bpf_skb_store_bytes(skb, ETH_HLEN + 1, &bytes[1], 1, 0);
}

/* A CE packet arrived from the peer port (row `row`). If the peer's RED qdisc marks, it was marked
 * there, unless it had entered that queue CE already: those are counted in ce_queued and each CE
 * arrival takes one back first. Packets leave a class in order, so once the queue drains `marks`
 * is exact; meanwhile it may lag by the CE packets still queued. */
static __always_inline void qdisc_mark_seen(struct qstat *st, __u32 row)
{
	struct qcfg *cf = bpf_map_lookup_elem(&qcfg, &row);
	if (!cf || cf->ecn_mode != ECN_QDISC)
		return;
	__s64 queued = st->ce_queued;
	if (queued > 0 && __sync_val_compare_and_swap(&st->ce_queued, queued, queued - 1) == queued)
		return;
	__sync_fetch_and_add(&st->marks, 1);
}

/* A buffer cut tail-drops whatever would queue past it, lossless class included, as seed 000's
 * outdated SRAM size did (6.4.2); counted in the row's `drops`, which a PFC class never adds to
 * otherwise. */
static __always_inline int cut_drop(__u32 row, struct qstat *st, __s64 occ, __u32 len)
{
	__u32 *limit = bpf_map_lookup_elem(&cut, &row);
	if (!limit || !*limit || occ + len <= *limit)
		return 0;
	__sync_fetch_and_add(&st->drops, 1);
	return 1;
}

/* A packet of class cls left port `idx` (row base) of node `node`: its egress occupancy falls,
 * and the bytes its switch held for the port it had entered by. */
static __always_inline void depart(__u32 idx, __u32 node, __u32 is_switch, struct pkt *p, __u32 cls,
				   __u32 len, __u64 now)
{
	__u32 row = idx * NCLASS + cls;
	struct qstat *st = bpf_map_lookup_elem(&stats, &row);
	if (st) {
		__sync_fetch_and_add(&st->occ, -(__s64)len);
		if ((p->tos & 3) == 3)
			qdisc_mark_seen(st, row);
	}
	if (is_switch)
		release(node, p, cls, len, now);
}

SEC("tc")
int fq_egress(struct __sk_buff *skb)
{
	struct port *pt = port_of(skb);
	struct pkt p;
	if (!pt || !parse(skb, &p))
		return TC_ACT_OK;       /* not a lab port, or not IPv4: htb's default (lossy) class */
	__u32 cls = class_of(&p);
	skb->priority = HTB_MAJOR | ((cls + 1) << 4);
	__u32 row = pt->idx * NCLASS + cls;
	struct qstat *st = bpf_map_lookup_elem(&stats, &row);
	struct qcfg *cf = bpf_map_lookup_elem(&qcfg, &row);
	struct ctl *ct = bpf_map_lookup_elem(&ctl, &row);
	if (!st || !cf || !ct)
		return TC_ACT_OK;
	__u32 len = skb->len;
	__u64 now = bpf_ktime_get_ns();

	if (ct->wd_drop_until > now) {
		__sync_fetch_and_add(&st->wd_drops, 1);
		goto drop;
	}
	__s64 occ = st->occ;
	if (pt->is_switch && cut_drop(row, st, occ, len))
		goto drop;
	if (cf->pfc) {
		if (pt->is_switch) {
			struct flow_key k = flow_of(pt->node, &p);
			__u32 *in = bpf_map_lookup_elem(&flows, &k);
			if (in) {
				__u32 irow = *in * NCLASS + cls;
				struct qstat *ist = bpf_map_lookup_elem(&stats, &irow);
				struct qcfg *icf = bpf_map_lookup_elem(&qcfg, &irow);
				if (ist && icf && ist->held - bias_of(irow) > (__s64)icf->headroom_limit) {
					__sync_fetch_and_add(&st->lossless_drops, 1);
					goto drop;
				}
			}
		}
	} else if (occ + len > cf->limit) {
		__sync_fetch_and_add(&st->drops, 1);
		goto drop;
	}
	__sync_fetch_and_add(&st->tx_pkts, 1);
	__sync_fetch_and_add(&st->tx_bytes, len);
	occ = __sync_fetch_and_add(&st->occ, (__s64)len) + len;
	hwm(&st->occ_hwm, occ);
	__u32 ecn = p.tos & 3;
	if (pt->is_switch && ecn && ecn != 3 &&
	    (cf->ecn_mode == ECN_AR ? ar_should_mark(pt, &p, cls, cf, occ - len) : should_mark(cf, occ - len))) {
		__sync_fetch_and_add(&st->marks, 1);
		mark_ce(skb, p.tos);
	}
	if (cf->ecn_mode == ECN_QDISC && ecn == 3)
		__sync_fetch_and_add(&st->ce_queued, 1);
	return TC_ACT_OK;
drop:
	if (pt->is_switch)
		release(pt->node, &p, cls, len, now);
	return TC_ACT_SHOT;
}

SEC("tc")
int fq_ingress(struct __sk_buff *skb)
{
	struct port *pt = port_of(skb);
	struct pkt p;
	if (!pt || !parse(skb, &p))
		return TC_ACT_OK;
	__u32 cls = class_of(&p);
	__u32 len = skb->len;
	__u64 now = bpf_ktime_get_ns();

	/* The packet has left the far end's egress queue, and with it the far switch (seen by the
	 * wire program of the far end's machine when that is another one). */
	if (!pt->peer_remote)
		depart(pt->peer, pt->peer_node, pt->peer_is_switch, &p, cls, len, now);

	__u32 row = pt->idx * NCLASS + cls;
	struct qstat *st = bpf_map_lookup_elem(&stats, &row);
	if (st) {
		__sync_fetch_and_add(&st->rx_pkts, 1);
		__sync_fetch_and_add(&st->rx_bytes, len);
	}
	if (pt->is_switch) {
		struct flow_key k = flow_of(pt->node, &p);
		__u32 idx = pt->idx;
		bpf_map_update_elem(&flows, &k, &idx, BPF_ANY);
		admit(pt, cls, len, now);
	}
	return TC_ACT_OK;
}

/* The egress of the interface the run's tunnels leave by: a frame a tunnel end of this machine
 * sent has left that port's queue (its qdisc dequeued it into the tunnel). */
SEC("tc")
int fq_wire(struct __sk_buff *skb)
{
	if (skb->data + WIRE_HLEN > skb->data_end)
		bpf_skb_pull_data(skb, WIRE_HLEN + ETH_HLEN + 60 + 4);
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
		return TC_ACT_OK;
	__u16 *udp = (void *)(ip + 1);
	__u8 *vx = (void *)(udp + 4);
	if ((void *)(vx + 8) > end || udp[1] != bpf_htons(VXLAN_PORT))
		return TC_ACT_OK;
	__u32 vni = ((__u32)vx[4] << 16) | ((__u32)vx[5] << 8) | vx[6];
	__u32 *idx = bpf_map_lookup_elem(&wire, &vni);
	if (!idx)
		return TC_ACT_OK;        /* another run's tunnel, or none of the lab's */
	__u32 key = *idx;
	struct port *pt = bpf_map_lookup_elem(&ports, &key);
	struct pkt p;
	if (!pt || skb->len <= WIRE_HLEN || !parse_at(skb, WIRE_HLEN, &p))
		return TC_ACT_OK;
	depart(pt->idx, pt->node, pt->is_switch, &p, class_of(&p), skb->len - WIRE_HLEN, bpf_ktime_get_ns());
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
