"""Collective schedules: who writes which bytes to whom, in which order, as NCCL-style algorithms do.

Pure and deterministic: the launcher and every agent build the same schedule from the same
parameters, so the agents need no negotiation and the tests check schedules without a network.

A schedule gives each rank a small program of steps (a DAG). A step becomes ready when the steps
it depends on are complete; it then runs its `pre` local operations and posts its `sends` (RDMA
WRITEs into the peer's memory); it completes when every transfer in its `recvs` has arrived,
after which its `post` operations run (reductions of what arrived). Channels are independent
chains over disjoint parts of the buffer, as NCCL's channels are.

Memory: each rank has named regions (`input`, `output`, `work`, `scratch`), sizes in bytes. A
transfer lands directly in the destination region; data that must be reduced lands in a private
`scratch` range first (the RDMA WRITE target), and a `post` operation adds it in.

Out of place or in place (nccl-tests runs each size both ways): out of place, the user's send
buffer is the `input` region and the receive buffer the `output` region. In place, one of them
lives inside the other, at the offset nccl-tests' getCollByteCount gives: AllReduce, AlltoAll(v)
and the bisection test send from the receive buffer itself; AllGather and Gather send from the
rank's slice of the receive buffer (every rank has one in place, as in nccl-tests); ReduceScatter
receives into the rank's slice of the send buffer. The schedule is built as out of place and then
rewritten so that every transfer and local operation names the region the bytes really live in
(the aliased region disappears): the RNICs, the engine and the memory see plain regions, and
`buffers` says where each rank's send and receive buffers are. The bytes on the wire are the same.

Sizes follow nccl-tests: `size` is the per-rank buffer of AllReduce, the total output of
AllGather and Gather, the total input of ReduceScatter and Scatter, the bytes each rank sends in
AlltoAll(v) (its own block included), and the bytes each rank sends to its partner in the
bisection test.
Elements are 4 bytes (float32); buffers are split into blocks on element boundaries.

PXN (NCCL's "PCI x NVLink"): on a rail-optimized fabric NIC i of every host sits on rail i, and
a rank reaches a peer on another rail only through the spines. With `pxn` (each rank's host and
NIC index) every transfer between two hosts on different NIC indexes is relayed instead: first to
the sender's local rank on the receiver's rail (an intra-host hop, the scale-up domain), which
writes it to the receiver on that rail. The relay lands in the proxy's `scratch` and is sent on
from there; `relays` records each such pair of transfers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from fabriclab.loading import excerpt

ELEMENT_BYTES = 4
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "alltoallv", "gather",
               "scatter", "bisection")
BLOCKED = ("allgather", "reducescatter", "alltoall", "gather", "scatter")
"""Collectives that cut `size` into one block per rank (a multiple of the rank count)."""
ALGORITHMS = {"allreduce": ("ring", "tree")}
"""Collectives with a choice of algorithm; the others have one (ring, or direct exchange)."""
IN_PLACE_UNDEFINED = ("alltoall", "alltoallv", "bisection")
"""In place, these send from and receive into one buffer with no staging (NCCL's grouped
send/recv): a peer's write may land on a block before it was sent, so the result depends on
timing. nccl-tests times them in place and checks nothing (its #wrong is N/A); so does the lab."""


@dataclass(frozen=True)
class Transfer:
    """`nbytes` from src's `src_region` at `src_off` into dst's `dst_region` at `dst_off`."""

    tag: int
    src: int
    dst: int
    channel: int
    nbytes: int
    src_region: str
    src_off: int
    dst_region: str
    dst_off: int


@dataclass(frozen=True)
class LocalOp:
    """out = sum of srcs (one src: a copy). Each is (region, byte offset); nbytes long."""

    out: tuple
    srcs: tuple
    nbytes: int


@dataclass(frozen=True)
class Buffer:
    """Where a user buffer (a rank's send or receive buffer) lives: `nbytes` at `offset` of
    `region`."""

    region: str
    offset: int
    nbytes: int


@dataclass
class Step:
    rank: int
    id: int
    channel: int
    deps: tuple = ()
    pre: list = field(default_factory=list)
    sends: list = field(default_factory=list)
    recvs: list = field(default_factory=list)
    post: list = field(default_factory=list)


@dataclass
class Schedule:
    collective: str
    algorithm: str
    ranks: int
    size: int                    # bytes, nccl-tests semantics (after rounding to elements)
    channels: int
    regions: list                # per rank: {region: bytes}
    programs: list               # per rank: [Step]
    transfers: list              # every Transfer, indexed by tag
    root: int = 0
    in_place: bool = False
    buffers: list = field(default_factory=list)   # per rank: {"input"|"output": Buffer or None}
    relays: dict = field(default_factory=dict)    # PXN: first hop's tag -> second hop's tag

    @property
    def defined(self):
        """Whether the result is defined, so that it can be checked (see IN_PLACE_UNDEFINED)."""
        return not (self.in_place and self.collective in IN_PLACE_UNDEFINED)

    def sent_bytes(self, rank):
        return sum(t.nbytes for t in self.transfers if t.src == rank)

    def received_bytes(self, rank):
        return sum(t.nbytes for t in self.transfers if t.dst == rank)

    def connections(self):
        """The (low rank, high rank, channel) pairs that need QPs."""
        return sorted({(min(t.src, t.dst), max(t.src, t.dst), t.channel) for t in self.transfers})


def split(total, parts):
    """(offset, count) of `parts` near-equal pieces of `total` (the first ones one bigger)."""
    base, extra = divmod(total, parts)
    out, offset = [], 0
    for i in range(parts):
        count = base + (1 if i < extra else 0)
        out.append((offset, count))
        offset += count
    return out


class _Builder:
    def __init__(self, collective, algorithm, ranks, size, channels):
        self.collective, self.algorithm = collective, algorithm
        self.n, self.size, self.channels = ranks, size, channels
        self.programs = [[] for _ in range(ranks)]
        self.transfers = []
        self.scratch = [0] * ranks
        self.regions = [{} for _ in range(ranks)]

    def step(self, rank, channel, deps=()):
        step = Step(rank=rank, id=len(self.programs[rank]), channel=channel, deps=tuple(deps))
        self.programs[rank].append(step)
        return step

    def transfer(self, send_step, recv_step, nbytes, src_region, src_off, dst_region, dst_off,
                 channel):
        t = Transfer(len(self.transfers), send_step.rank, recv_step.rank, channel, nbytes,
                     src_region, src_off, dst_region, dst_off)
        self.transfers.append(t)
        send_step.sends.append(t)
        recv_step.recvs.append(t)
        return t

    def reduce_transfer(self, send_step, recv_step, nbytes, src_region, src_off, out, base,
                        channel):
        """A transfer into the receiver's scratch, then out = base + scratch at the receiver."""
        dst = recv_step.rank
        landing = self.scratch[dst]
        self.scratch[dst] += nbytes
        t = self.transfer(send_step, recv_step, nbytes, src_region, src_off, "scratch", landing,
                          channel)
        recv_step.post.append(LocalOp(out, (base, ("scratch", landing)), nbytes))
        return t

    def schedule(self, root=0, aliases=None):
        """The Schedule; `aliases` (in place): per rank {region: (region it lives in, offset)}."""
        buffers = [{name: Buffer(name, 0, regions[name]) if name in regions else None
                    for name in ("input", "output")} for regions in self.regions]
        if aliases is not None:
            buffers = self._alias(aliases, buffers)
        for rank in range(self.n):
            if self.scratch[rank]:
                self.regions[rank]["scratch"] = self.scratch[rank]
        return Schedule(self.collective, self.algorithm, self.n, self.size, self.channels,
                        self.regions, self.programs, self.transfers, root,
                        in_place=aliases is not None, buffers=buffers)

    def _alias(self, aliases, buffers):
        """Rewrite every transfer and local operation to name the region its bytes live in; a
        copy onto itself goes. Returns the buffers where they now are."""
        def where(rank, region, offset):
            base, shift = aliases[rank].get(region, (region, 0))
            return base, shift + offset

        for rank, regions in enumerate(self.regions):
            for name, (base, shift) in aliases[rank].items():
                regions[base] = max(regions.get(base, 0), shift + regions.pop(name))
        moved = {}
        for t in self.transfers:
            moved[t.tag] = Transfer(t.tag, t.src, t.dst, t.channel, t.nbytes,
                                    *where(t.src, t.src_region, t.src_off),
                                    *where(t.dst, t.dst_region, t.dst_off))
        self.transfers = [moved[t.tag] for t in self.transfers]
        for program in self.programs:
            for step in program:
                step.sends = [moved[t.tag] for t in step.sends]
                step.recvs = [moved[t.tag] for t in step.recvs]
                for ops in (step.pre, step.post):
                    ops[:] = [op for op in (LocalOp(where(step.rank, *op.out),
                                                    tuple(where(step.rank, *s) for s in op.srcs),
                                                    op.nbytes) for op in ops)
                              if op.srcs != (op.out,)]
        return [{name: buf and Buffer(*where(rank, buf.region, 0), buf.nbytes)
                 for name, buf in per_rank.items()} for rank, per_rank in enumerate(buffers)]


def _blocks(size_elems, n, channels):
    """blocks[j][c] = (byte offset, bytes) of channel c's slice of block j."""
    out = []
    for off, count in split(size_elems, n):
        out.append([((off + o) * ELEMENT_BYTES, c * ELEMENT_BYTES) for o, c in split(count, channels)])
    return out


# -- ring algorithms ----------------------------------------------------------------------------------

def _ring_reduce_scatter(b, blocks, channel, deps_of, final_out, acc_region):
    """n-1 steps: at step s rank r sends block (r-s-1) to r+1 and reduces block (r-s-2) from r-1.

    After the last step rank r holds block r fully reduced, written to `final_out(r, c)`.
    Returns, per rank, the last step (so AllGather can follow).
    """
    n = b.n
    prev = {r: deps_of(r) for r in range(n)}
    steps = {r: [b.step(r, channel, prev[r] if s == 0 else ()) for s in range(n - 1)]
             for r in range(n)}
    for r in range(n):
        for s in range(1, n - 1):
            steps[r][s].deps = (steps[r][s - 1].id,)
    for s in range(n - 1):
        for r in range(n):
            right = (r + 1) % n
            blk = (r - s - 1) % n
            off, nbytes = blocks[blk][channel]
            if nbytes == 0:
                continue
            src_region = "input" if s == 0 else acc_region
            last = s == n - 2
            out = final_out(right, channel) if last else (acc_region, off)
            b.reduce_transfer(steps[r][s], steps[right][s], nbytes, src_region, off, out,
                              ("input", off), channel)
    return {r: steps[r][-1] for r in range(n)}


def _ring_all_gather(b, blocks, channel, deps_of, region, own_src):
    """n-1 steps: at step s rank r forwards block (r-s) to r+1 (block r at step 0)."""
    n = b.n
    steps = {r: [] for r in range(n)}
    for r in range(n):
        for s in range(n - 1):
            deps = deps_of(r) if s == 0 else (steps[r][s - 1].id,)
            steps[r].append(b.step(r, channel, deps))
        own = blocks[r][channel]
        if own[1] and own_src is not None:
            steps[r][0].pre.append(LocalOp((region, own[0]), (own_src(r, own[0]),), own[1]))
    for s in range(n - 1):
        for r in range(n):
            right = (r + 1) % n
            off, nbytes = blocks[(r - s) % n][channel]
            if nbytes:
                b.transfer(steps[r][s], steps[right][s], nbytes, region, off, region, off, channel)


def _ring_allreduce(b, size_elems):
    n, C = b.n, b.channels
    blocks = _blocks(size_elems, n, C)
    for r in range(n):
        b.regions[r].update(input=size_elems * ELEMENT_BYTES, output=size_elems * ELEMENT_BYTES)
    if n == 1:
        step = b.step(0, 0)
        step.pre.append(LocalOp(("output", 0), (("input", 0),), size_elems * ELEMENT_BYTES))
        return
    for c in range(C):
        last = _ring_reduce_scatter(b, blocks, c, lambda r: (),
                                    lambda r, ch: ("output", blocks[r][ch][0]), "output")
        _ring_all_gather(b, blocks, c, lambda r: (last[r].id,), "output", None)


def _ring_reduce_scatter_only(b, size_elems):
    n, C = b.n, b.channels
    blocks = _blocks(size_elems, n, C)
    for r in range(n):
        b.regions[r].update(input=size_elems * ELEMENT_BYTES,
                            output=sum(nb for _, nb in blocks[r]), work=size_elems * ELEMENT_BYTES)
    base = [blocks[r][0][0] for r in range(n)]

    def final_out(r, c):
        return ("output", blocks[r][c][0] - base[r])

    if n == 1:
        b.step(0, 0).pre.append(LocalOp(("output", 0), (("input", 0),), size_elems * ELEMENT_BYTES))
        return
    for c in range(C):
        _ring_reduce_scatter(b, blocks, c, lambda r: (), final_out, "work")


def _ring_all_gather_only(b, size_elems):
    n, C = b.n, b.channels
    blocks = _blocks(size_elems, n, C)
    base = [blocks[r][0][0] for r in range(n)]
    for r in range(n):
        b.regions[r].update(input=sum(nb for _, nb in blocks[r]), output=size_elems * ELEMENT_BYTES)
    if n == 1:
        b.step(0, 0).pre.append(LocalOp(("output", 0), (("input", 0),), size_elems * ELEMENT_BYTES))
        return
    for c in range(C):
        _ring_all_gather(b, blocks, c, lambda r: (), "output",
                         lambda r, off: ("input", off - base[r]))


# -- tree allreduce ---------------------------------------------------------------------------------

def _tree(n, mirrored):
    """parent and children of each rank in a binary tree rooted at rank 0 (or n-1, mirrored).

    Channel pairs alternate between a tree and its mirror image, so a rank that is a leaf in one
    is interior in the other: NCCL's double binary tree idea, which balances send and receive.
    """
    label = (lambda i: n - 1 - i) if mirrored else (lambda i: i)      # position -> rank
    parent, children = {}, {r: [] for r in range(n)}
    for pos in range(n):
        rank = label(pos)
        parent[rank] = label((pos - 1) // 2) if pos else None
        for child in (2 * pos + 1, 2 * pos + 2):
            if child < n:
                children[rank].append(label(child))
    return parent, children


def _tree_allreduce(b, size_elems, piece_bytes):
    """Reduce up a binary tree and broadcast down it, pipelined in pieces of `piece_bytes`."""
    n, C = b.n, b.channels
    for r in range(n):
        b.regions[r].update(input=size_elems * ELEMENT_BYTES, output=size_elems * ELEMENT_BYTES)
    piece_elems = max(1, piece_bytes // ELEMENT_BYTES)
    for c, (c_off, c_count) in enumerate(split(size_elems, C)):
        if c_count == 0:
            continue
        parent, children = _tree(n, mirrored=bool(c % 2))
        npieces = -(-c_count // piece_elems)
        pieces = [((c_off + o) * ELEMENT_BYTES, k * ELEMENT_BYTES) for o, k in split(c_count, npieces)]
        up = {r: [] for r in range(n)}       # per piece: the step that reduced it at rank r
        for r in range(n):
            for k, (off, nbytes) in enumerate(pieces):
                deps = (up[r][-1].id,) if up[r] else ()
                step = b.step(r, c, deps)
                if not children[r]:
                    step.pre.append(LocalOp(("output", off), (("input", off),), nbytes))
                up[r].append(step)
        for r in range(n):
            for k, (off, nbytes) in enumerate(pieces):
                for i, child in enumerate(children[r]):
                    base = ("input", off) if i == 0 else ("output", off)
                    # The child sends its reduced piece once it has it: from its own reduce step
                    # for a leaf (the copy runs first) or after its reduce completes.
                    if children[child]:
                        send = b.step(child, c, (up[child][k].id,))
                    else:
                        send = up[child][k]
                    b.reduce_transfer(send, up[r][k], nbytes, "output", off, ("output", off),
                                      base, c)
        down = {r: [] for r in range(n)}     # per piece: the step holding the final piece
        for r in range(n):
            if parent[r] is None:
                down[r] = up[r]
                continue
            for k in range(len(pieces)):
                deps = (down[r][-1].id,) if down[r] else ()
                down[r].append(b.step(r, c, deps))
        for r in range(n):
            for k, (off, nbytes) in enumerate(pieces):
                for child in children[r]:
                    if parent[r] is None:
                        send = b.step(r, c, (up[r][k].id,))
                    else:
                        send = b.step(r, c, (down[r][k].id,))
                    b.transfer(send, down[child][k], nbytes, "output", off, "output", off, c)


# -- direct exchanges ---------------------------------------------------------------------------------

def alltoallv_matrix(n, size, imbalance, seed):
    """Bytes rank i sends rank j: weights in [1, imbalance] (seeded), scaled so the average rank
    sends `size` bytes; multiples of 4. imbalance 1 gives AlltoAll's equal blocks."""
    rng = random.Random(seed)
    weights = [[1 + (imbalance - 1) * rng.random() for _ in range(n)] for _ in range(n)]
    total = sum(map(sum, weights))
    scale = size * n / total
    return [[int(w * scale) // ELEMENT_BYTES * ELEMENT_BYTES for w in row] for row in weights]


def _alltoall(b, matrix):
    """Every rank writes block j of its input to rank j's output, at the slot for the sender."""
    n, C = b.n, b.channels
    for r in range(n):
        b.regions[r].update(input=sum(matrix[r]), output=sum(matrix[i][r] for i in range(n)))
    steps = [[b.step(r, c) for c in range(C)] for r in range(n)]
    below = [0] * n                         # per destination: what the ranks before src send it
    for src in range(n):
        src_off = 0                         # what src sends the ranks before dst
        for dst in range(n):
            nbytes = matrix[src][dst]
            dst_off = below[dst]
            below[dst] += nbytes
            for c, (o, k) in enumerate(split(nbytes // ELEMENT_BYTES, C)):
                if not k:
                    continue
                o *= ELEMENT_BYTES
                k *= ELEMENT_BYTES
                if src == dst:
                    steps[src][c].pre.append(LocalOp(("output", dst_off + o), (("input", src_off + o),), k))
                else:
                    b.transfer(steps[src][c], steps[dst][c], k, "input", src_off + o, "output",
                               dst_off + o, c)
            src_off += nbytes


def _rooted(b, size_elems, root, to_root):
    """One block per rank, between each rank and the root; the root's own block is a local copy.
    Gather (`to_root`): N:1 incast, every rank writes its block into the root's output. Scatter:
    1:N, the root writes block r of its input into rank r's output (seed 002 6.7's one-to-many).
    Every rank has both buffers where nccl-tests gives it both: Gather's senders their block,
    Scatter's ranks the whole send buffer."""
    n, C = b.n, b.channels
    blocks = _blocks(size_elems, n, C)
    base = [blocks[r][0][0] for r in range(n)]
    whole = size_elems * ELEMENT_BYTES
    for r in range(n):
        own = sum(nb for _, nb in blocks[r])
        b.regions[r].update({"input": own} if to_root else {"input": whole, "output": own})
    if to_root:
        b.regions[root]["output"] = whole
    hub = [b.step(root, c) for c in range(C)]
    for r in range(n):
        for c in range(C):
            off, nbytes = blocks[r][c]
            if not nbytes:
                continue
            # (region, offset) at the rank and at the root, in the direction the bytes move
            at_rank = ("input" if to_root else "output", off - base[r])
            at_root = ("output" if to_root else "input", off)
            src, dst = (at_rank, at_root) if to_root else (at_root, at_rank)
            if r == root:
                hub[c].pre.append(LocalOp(dst, (src,), nbytes))
            elif to_root:
                b.transfer(b.step(r, c), hub[c], nbytes, *src, *dst, c)
            else:
                b.transfer(hub[c], b.step(r, c), nbytes, *src, *dst, c)


def _bisection(b, size_elems):
    """Ranks r and r + n/2 write `size` bytes to each other at once (ib_write_bw -b)."""
    n, C = b.n, b.channels
    nbytes_total = size_elems * ELEMENT_BYTES
    for r in range(n):
        b.regions[r].update(input=nbytes_total, output=nbytes_total)
    steps = [[b.step(r, c) for c in range(C)] for r in range(n)]
    for r in range(n):
        partner = (r + n // 2) % n
        for c, (o, k) in enumerate(split(size_elems, C)):
            if k:
                off = o * ELEMENT_BYTES
                b.transfer(steps[r][c], steps[partner][c], k * ELEMENT_BYTES, "input", off,
                           "output", off, c)


# -- entry point --------------------------------------------------------------------------------------

def effective_size(collective, ranks, size):
    """The size actually run: whole elements, and for the block collectives a multiple of the
    rank count (nccl-tests rounds the same way), at least one element per block."""
    elems = size // ELEMENT_BYTES
    if collective in BLOCKED:
        elems -= elems % ranks
    return elems * ELEMENT_BYTES


# Steps and transfers of one schedule, at most. Each is a Python object (about 450 bytes; 4 us to
# build) in the launcher and again in every agent, which builds the same schedule: a million is
# about 4 s and 450 MB in each. A ring over 64 ranks and 64 channels is 1.03 million; past this
# are runaways such as a tree AllReduce of 4 GiB in 4-byte pieces (billions of steps).
MAX_SCHEDULE_ITEMS = 1 << 20


def schedule_items(collective, algorithm, ranks, size, channels, piece_bytes):
    """An upper bound on the steps plus transfers `build` makes (without building them), before
    PXN's relays (which add at most half again)."""
    n, C = ranks, channels
    elems = effective_size(collective, ranks, size) // ELEMENT_BYTES
    if collective == "allreduce" and algorithm == "tree":
        pieces = elems // max(1, piece_bytes // ELEMENT_BYTES) + C    # over every channel
        items = 6 * n * pieces                    # up and down: a step and a transfer per rank
    elif collective == "allreduce":
        items = 4 * n * (n - 1) * C               # reduce-scatter then all-gather, n - 1 steps each
    elif collective in ("reducescatter", "allgather"):
        items = 2 * n * (n - 1) * C
    elif collective in ("alltoall", "alltoallv"):
        items = n * n * C + n * C
    else:                                         # gather, scatter, bisection: a step and a transfer a rank
        items = 2 * n * C + C
    return items


def validate(collective, ranks, size, *, algorithm=None, channels=1, piece_bytes=65536,
             imbalance=4.0, root=0):
    """The algorithm `build` would use, or ValueError for what it would refuse: every check of
    `build`, and the schedule's size against MAX_SCHEDULE_ITEMS, without building anything."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {excerpt(collective)} (known: {', '.join(COLLECTIVES)})")
    algorithm = algorithm or ALGORITHMS.get(collective, ("ring",))[0]
    if algorithm not in ALGORITHMS.get(collective, ("ring",)):
        raise ValueError(f"{collective} has no {excerpt(algorithm)} algorithm "
                         f"(choose from {', '.join(ALGORITHMS.get(collective, ('ring',)))})")
    if ranks < 2:
        raise ValueError(f"a collective needs at least 2 ranks, got {ranks}")
    if channels < 1:
        raise ValueError(f"channels must be >= 1, got {channels}")
    if collective == "bisection" and ranks % 2:
        raise ValueError(f"the bisection test pairs ranks: it needs an even rank count, got {ranks}")
    if not 0 <= root < ranks:
        raise ValueError(f"root rank {root} is not one of the {ranks} ranks")
    minimum = ELEMENT_BYTES * (ranks if collective in BLOCKED else 1)
    if effective_size(collective, ranks, size) < minimum:
        raise ValueError(f"{collective} over {ranks} ranks needs at least {minimum} bytes")
    if collective == "alltoallv" and imbalance < 1:
        raise ValueError(f"imbalance is a max/min ratio >= 1, got {imbalance}")
    items = schedule_items(collective, algorithm, ranks, size, channels, piece_bytes)
    if items > MAX_SCHEDULE_ITEMS:
        raise ValueError(f"{collective} ({algorithm}) of {size} bytes over {ranks} ranks and {channels} "
                         f"channel(s) is up to {items} steps and transfers, more than {MAX_SCHEDULE_ITEMS}: "
                         f"fewer channels or ranks, or larger pieces")
    return algorithm


def build(collective, ranks, size, *, algorithm=None, channels=1, piece_bytes=65536,
          imbalance=4.0, seed=0, root=0, in_place=False, pxn=None):
    """The Schedule of one collective, out of place or in place; `pxn`: per rank its (host, NIC
    index), to relay cross-rail transfers through the sender's host (see the module's doc).
    Raises ValueError on impossible parameters (`validate`)."""
    algorithm = validate(collective, ranks, size, algorithm=algorithm, channels=channels,
                         piece_bytes=piece_bytes, imbalance=imbalance, root=root)
    size = effective_size(collective, ranks, size)
    b = _Builder(collective, algorithm, ranks, size, channels)
    elems = size // ELEMENT_BYTES
    if collective == "allreduce" and algorithm == "ring":
        _ring_allreduce(b, elems)
    elif collective == "allreduce":
        _tree_allreduce(b, elems, piece_bytes)
    elif collective == "reducescatter":
        _ring_reduce_scatter_only(b, elems)
    elif collective == "allgather":
        _ring_all_gather_only(b, elems)
    elif collective == "alltoall":
        _alltoall(b, [[size // ranks] * ranks for _ in range(ranks)])
    elif collective == "alltoallv":
        matrix = alltoallv_matrix(ranks, size, imbalance, seed)
        _alltoall(b, matrix)
        b.size = sum(map(sum, matrix)) // ranks      # what the average rank really sends
    elif collective in ("gather", "scatter"):
        _rooted(b, elems, root, to_root=collective == "gather")
    else:
        _bisection(b, elems)
    schedule = b.schedule(root, _in_place_aliases(b, elems) if in_place else None)
    if pxn is not None:
        relay_across_rails(schedule, pxn)
    return schedule


def relay_across_rails(schedule, locality):
    """Rewrite `schedule` in place so that no transfer goes between two hosts on different NIC
    indexes: each goes first to the sender host's rank on the receiver's NIC index (the intra-
    host hop), which sends it on to the receiver. A transfer whose host has no rank on that NIC
    stays as it is (there is no local GPU to relay through). `locality`: per rank (host, nic)."""
    if len(locality) != schedule.ranks:
        raise ValueError(f"pxn needs the host and NIC of each of the {schedule.ranks} ranks, "
                         f"got {len(locality)}")
    rank_at = {tuple(where): rank for rank, where in enumerate(locality)}
    moved = {}          # tag -> (original, first hop, second hop)
    for t in list(schedule.transfers):
        (src_host, src_nic), (dst_host, dst_nic) = locality[t.src], locality[t.dst]
        proxy = rank_at.get((src_host, dst_nic))
        if src_host == dst_host or src_nic == dst_nic or proxy is None:
            continue
        regions = schedule.regions[proxy]
        landing = regions.get("scratch", 0)
        regions["scratch"] = landing + t.nbytes
        first = Transfer(t.tag, t.src, proxy, t.channel, t.nbytes, t.src_region, t.src_off,
                         "scratch", landing)
        second = Transfer(len(schedule.transfers), proxy, t.dst, t.channel, t.nbytes, "scratch",
                          landing, t.dst_region, t.dst_off)
        schedule.transfers[t.tag] = first
        schedule.transfers.append(second)
        program = schedule.programs[proxy]
        arrive = Step(rank=proxy, id=len(program), channel=t.channel, recvs=[first])
        program.append(arrive)
        program.append(Step(rank=proxy, id=len(program), channel=t.channel, deps=(arrive.id,),
                            sends=[second]))
        schedule.relays[first.tag] = second.tag
        moved[t.tag] = (t, first, second)
    # The original steps name the original transfer: the sender now sends the first hop, the
    # receiver waits for the second (the proxy's new steps hold the other ends).
    for program in schedule.programs:
        for step in program:
            step.sends = [moved[t.tag][1] if t.tag in moved and t is moved[t.tag][0] else t
                          for t in step.sends]
            step.recvs = [moved[t.tag][2] if t.tag in moved and t is moved[t.tag][0] else t
                          for t in step.recvs]
    return schedule


def _in_place_aliases(b, elems):
    """Where the aliased buffer of each rank lives in place: nccl-tests' in-place offsets."""
    n, collective = b.n, b.collective
    slices = [offset * ELEMENT_BYTES for offset, _count in split(elems, n)]
    if collective in ("allgather", "gather"):
        if collective == "gather":          # every rank has a receive buffer in nccl-tests
            for regions in b.regions:
                regions["output"] = elems * ELEMENT_BYTES
        return [{"input": ("output", slices[r])} for r in range(n)]
    if collective in ("reducescatter", "scatter"):
        return [{"output": ("input", slices[r])} for r in range(n)]
    return [{"input": ("output", 0)} for _ in range(n)]


def bus_factor(collective, ranks):
    """nccl-tests' busbw = algbw x factor, so busbw compares with a link's bandwidth."""
    if collective == "allreduce":
        return 2 * (ranks - 1) / ranks
    if collective in ("allgather", "reducescatter", "alltoall", "alltoallv", "gather", "scatter"):
        return (ranks - 1) / ranks
    return 1.0


# -- reference results (numpy) ---------------------------------------------------------------------

def reference_outputs(schedule, inputs):
    """What each rank's receive buffer must hold, computed directly with numpy from the inputs
    (a list of float32 arrays, one per rank). None for a rank with no receive buffer. In place,
    a Gather's non-root rank must find its buffer as it left it (its own slice, zeros around);
    a collective whose in-place result is undefined has no reference (ValueError)."""
    import numpy as np

    n, collective = schedule.ranks, schedule.collective
    if not schedule.defined:
        raise ValueError(f"in-place {collective} has no defined result")
    if collective == "allreduce":
        total = np.sum(inputs, axis=0, dtype=np.float64).astype(np.float32)
        return [total.copy() for _ in range(n)]
    if collective == "reducescatter":
        total = np.sum(inputs, axis=0, dtype=np.float64).astype(np.float32)
        blocks = split(len(total), n)
        return [total[o:o + k].copy() for o, k in blocks]
    if collective == "allgather":
        full = np.concatenate(inputs)
        return [full.copy() for _ in range(n)]
    if collective in ("alltoall", "alltoallv"):
        out = []
        for dst in range(n):
            parts = []
            for src in range(n):
                sizes = [t for t in _row(schedule, src)]
                start = sum(sizes[:dst]) // ELEMENT_BYTES
                parts.append(inputs[src][start:start + sizes[dst] // ELEMENT_BYTES])
            out.append(np.concatenate(parts))
        return out
    if collective == "scatter":
        blocks = split(len(inputs[schedule.root]), n)
        return [inputs[schedule.root][o:o + k].copy() for o, k in blocks]
    if collective == "gather":
        full = np.concatenate(inputs)
        if not schedule.in_place:
            return [full if r == schedule.root else None for r in range(n)]
        untouched = [np.zeros_like(full) for _ in range(n)]
        for r, (offset, count) in enumerate(split(len(full), n)):
            untouched[r][offset:offset + count] = inputs[r]
        return [full if r == schedule.root else untouched[r] for r in range(n)]
    return [inputs[(r + n // 2) % n].copy() for r in range(n)]


def _row(schedule, src):
    """Bytes `src` sends to each rank in an AlltoAll(v) (its own block included); a relayed
    transfer counts for its final receiver, not its proxy."""
    row = [0] * schedule.ranks
    onward = set(schedule.relays.values())         # a proxy's second hops: not its own bytes
    for t in schedule.transfers:
        if t.src == src and t.tag not in onward:
            final = schedule.transfers[schedule.relays[t.tag]] if t.tag in schedule.relays else t
            row[final.dst] += t.nbytes
    own = schedule.buffers[src]["input"].nbytes - sum(row)
    row[src] = own
    return row
