// Device collectives between the GPUs of one host, over CUDA IPC.
//
// Every rank owns one region of device memory that every peer maps (cuIpcOpenMemHandle). Per
// thread block ("channel") b and peer q it holds:
//   ctrl(b, q).head   written by q: how many chunks q has put in my slots for (b, q)
//   ctrl(b, q).tail   written by q: how many of my chunks to q (on b) q has consumed
//   ctrl(b, q).sent   mine alone: chunks I have sent q on b
//   ctrl(b, q).recvd  mine alone: chunks I have received from q on b
//   slots(b, q)       nslots buffers of slot_bytes that q writes (a FIFO)
//   ctrl(b, q).wready, wdone (written by q), wsent, wrecvd (mine alone): the windowed mode's
//                     numbers (win_modes), which writes peers' outputs with no slot between
//   ctrl(0, me).wgrab, wfin (mine alone): the windowed mode's piece counter
// Data is pushed: a sender writes the receiver's slot over NVLink, then publishes head with a
// system-scope release; the receiver waits for head, reads its own memory and frees the slot
// (tail). How a wait and a free synchronize is the step protocol's (wait_ge, post_peers): the byte
// mover acquires and releases, the reducing programs run NCCL's lean one.
// sent/recvd live in device memory and carry over from call to call, so a captured CUDA graph
// replays with the right sequence numbers. Every rank computes the same grid and the same chunk
// loop from the call's arguments, so both ends of a channel count alike.

#define OCCL_MAXR 8
#define OCCL_CTRL 256

enum {
    M_AR_ONESHOT = 0,
    M_AR_TWOSHOT = 1,
    M_AR_RING = 2,
    M_RS = 3,
    M_REDUCE = 4,
    M_AG = 5,
    M_BCAST = 6,
    M_A2A = 7,
    M_SEND = 8,
    M_RECV = 9,
    M_BCAST_RING = 10,
    M_RS_RING = 11,
    M_REDUCE_RING = 12,
};

// Mirrors occl_kernels::coll::CollArgs field for field.
struct CollArgs {
    u64 in, out;
    u64 count;   // elements each rank contributes per block of the operation (see each mode)
    u64 stride;  // elements between rank blocks of in/out (shard size for all-reduce)
    u64 total;   // elements of the whole all-reduce buffer (shards past it are clipped)
    u64 regions[OCCL_MAXR];
    u64 ctrl_off, data_off, slot_bytes, timeout_ns;
    unsigned mode, rank, nranks, root;  // root: the peer of send/recv
    unsigned div, nslots;
    unsigned pre;  // the pre-multiply sum's scalar: 0 none, 1 its bits in `scalar`, 2 its address
    unsigned nch;  // channels of this launch (lanes past it idle)
    u64 timers;  // host-mapped (start, stop) records of this launch, one per block; 0: untimed
    u64 scalar;
    u64 phases;  // this launch's phase records, one per channel; 0: none (read by OCCL_PHASES builds only)
    // The windowed mode (win_modes): win[p] is where this rank's share lands in rank p's output,
    // win[rank] this rank's own part of its output; win[rank] == 0: the slots.
    u64 win[OCCL_MAXR];
};

struct Ctrl {
    u64 head;
    u64 wready;  // written by q: q's output is free for my windowed call number wready to it
    // In my own pair of channel 0 (ctrl(r, 0, r), no peer's): the windowed mode's piece counter
    // and count of channels done with it (win_modes); 0 between calls.
    u64 wgrab;
    u64 wfin;
    u64 pad0[12];
    u64 tail;
    u64 wdone;  // written by q: q's windowed call number wdone to me has landed in my output
    u64 pad1[6];
    u64 sent;
    u64 recvd;
    u64 wsent;   // mine alone: windowed calls I have pushed to q on b
    u64 wrecvd;  // mine alone: windowed calls q has pushed to me on b
    u64 nslots;  // mine alone: the slot count of my last sends to q on b (see drain_sends)
};

DEV u64 ld_acquire(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// A wait's load (see wait_ge).
DEV u64 ld_relaxed(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

DEV void st_release(u64* p, u64 v) { asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); }
// A system-scope store with no fence: for a post that orders only loads whose values the lane has
// already used (see post_peers).
DEV void st_relaxed(u64* p, u64 v) { asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); }

// The step protocol. The reducing programs (OCCL_REDUCING) run NCCL's lean one: a wait spins on
// relaxed loads with no acquire, a receive frees its slot with a relaxed store, no lane barrier
// follows a post, and each channel keeps its slot indices beside its counts. All-reduce moves
// 3-9% more with it at 4 GPUs (bench/baselines/kernel-phases.md run 10), where a ring step's post
// weighs more; the byte mover, which lost 1-2% with it (run 9), keeps acquiring waits, released
// frees and the barrier.
// Both are the same protocol on the wire (the same counts in the same words), so calls of either
// program follow each other on a channel.
#ifdef OCCL_REDUCING
#define OCCL_LEAN 1
#else
#define OCCL_LEAN 0
#endif
DEV u64 ld_wait(const u64* p) { return OCCL_LEAN ? ld_relaxed(p) : ld_acquire(p); }
DEV void st_free(u64* p, u64 v) {
    if (OCCL_LEAN) st_relaxed(p, v);
    else st_release(p, v);
}

DEV u64 globaltimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

DEV Ctrl* ctrl(const CollArgs& a, unsigned owner, unsigned b, unsigned q) {
    return (Ctrl*)(a.regions[owner] + a.ctrl_off + ((u64)b * a.nranks + q) * OCCL_CTRL);
}

// A thread block runs blockDim.x / OCCL_LANE channels side by side ("lanes"), each with its own
// threads, named barrier (lane i: barrier i + 1) and channel state: while one lane waits on a
// flag or for its stores to land, another copies, so an SM keeps several channels' traffic in
// flight and a collective reaches the link's bandwidth on fewer SMs (the SMs a model's kernels
// can keep). Every channel runs the same chunk loop whichever block holds it: lanes change
// nothing the peer sees. A block is at most OCCL_BLOCK threads and a lane OCCL_LANE, both set
// by the program (occl_kernels::coll::source):
//   - the byte mover: blocks of up to 1024, lanes of 512 (two to a block) or 256 (four);
//   - a reducing program: blocks of 512, so that a thread has 128 registers (a 1024-thread
//     block has 64), enough for a fold to keep a whole turn of both its sources' loads in flight;
//     its lanes are 512, 256 or 128 threads (one, two or four to a block).
#ifndef OCCL_BLOCK
#define OCCL_BLOCK 1024
#endif
#ifndef OCCL_LANE
#define OCCL_LANE 512
#endif
#define OCCL_LANES_MAX (OCCL_BLOCK / OCCL_LANE)

DEV unsigned lane() { return threadIdx.x / OCCL_LANE; }
// This thread's index within its lane.
DEV unsigned lt() { return threadIdx.x % OCCL_LANE; }
DEV unsigned chan_id() { return blockIdx.x * (blockDim.x / OCCL_LANE) + lane(); }
// __syncthreads for the lane's threads only (barrier 0 stays the block's).
DEV void lane_sync() { asm volatile("bar.sync %0, %1;" ::"r"(lane() + 1), "n"(OCCL_LANE) : "memory"); }
// lane_sync that also tells every thread whether any thread of the lane passed true.
DEV bool lane_any(bool v) {
    unsigned r;
    asm volatile(
        "{ .reg .pred p, q; setp.ne.u32 p, %1, 0; bar.red.or.pred q, %2, %3, p; selp.u32 %0, 1, 0, q; }"
        : "=r"(r)
        : "r"((unsigned)v), "r"(lane() + 1), "n"(OCCL_LANE)
        : "memory");
    return r != 0;
}

// The phase profile, compiled in only when the program defines OCCL_PHASES (a module of its
// own; occl_kernels::phases decodes it). Thread 0 of each lane adds clock64 deltas into its
// channel's counters at the edges of wait_peers and post_peers, which every mode goes through:
// waiting for a free slot (send) and for a received chunk (recv); the data work between the
// wait and the post, counted as a push when the post publishes a send (the call writes peers'
// slots, whatever else it copies) and as copy-out otherwise (it only reads this rank's slots);
// the post itself (lane barrier, releases). The lane barriers at those edges make thread 0's
// clock the whole lane's. clock64 is exact and cheap but per SM and at the SM's clock, so the
// record also holds %globaltimer at the channel's start and end: the host converts cycles to ns
// with that ratio and compares channels by it. Record words (mirrored in occl_kernels::phases):
enum {
    PH_START_NS = 0,  // %globaltimer as the channel opens
    PH_END_NS = 1,    // and as it closes
    PH_CYCLES = 2,    // clock64 between the two
    PH_WAIT_SEND = 3,
    PH_WAIT_RECV = 4,
    PH_PUSH = 5,
    PH_COPY = 6,
    PH_POST = 7,
    PH_CHUNKS = 8,  // turns of the channel's chunk loop
    PH_STEPS = 9,   // posts
    PH_WORDS = 10,
};

#ifdef OCCL_PHASES
struct Phases {
    u64 v[PH_WORDS];
    u64 mark, c0;  // clock64 at the last edge, at the start
    int on;
};
#define OCCL_CHAN_PHASES Phases ph;
// Opens the record when the launch asks for one.
#define PH_OPEN(a, c)                                           \
    if (lt() == 0) {                                            \
        (c).ph.on = (a).phases != 0;                            \
        for (int i = 0; i < PH_WORDS; i++) (c).ph.v[i] = 0;     \
        (c).ph.v[PH_START_NS] = globaltimer();                  \
        (c).ph.c0 = (c).ph.mark = clock64();                    \
    }
// The time since the last edge goes to counter k (PH_SKIP: to none; it stays in the total).
#define PH_EDGE(c, k, add)                                      \
    if (lt() == 0 && (c).ph.on) {                               \
        const u64 now = clock64();                              \
        if (add) (c).ph.v[k] += now - (c).ph.mark;              \
        (c).ph.mark = now;                                      \
    }
#define PH_ADD(c, k) PH_EDGE(c, k, true)
#define PH_SKIP(c) PH_EDGE(c, 0, false)
#define PH_COUNT(c, k) \
    if (lt() == 0 && (c).ph.on) (c).ph.v[k]++;
#define PH_CLOSE(a, c)                                                        \
    if (lt() == 0 && (c).ph.on) {                                             \
        (c).ph.v[PH_CYCLES] = clock64() - (c).ph.c0;                          \
        (c).ph.v[PH_END_NS] = globaltimer();                                  \
        u64* r = (u64*)(a).phases + (u64)chan_id() * PH_WORDS;                \
        for (int i = 0; i < PH_WORDS; i++) r[i] = (c).ph.v[i];                \
    }
#else
#define OCCL_CHAN_PHASES
#define PH_OPEN(a, c)
#define PH_ADD(c, k)
#define PH_SKIP(c)
#define PH_COUNT(c, k)
#define PH_CLOSE(a, c)
#endif

// The per-channel state, in shared memory for the kernel's duration.
struct Chan {
    u64 sent[OCCL_MAXR];
    u64 recvd[OCCL_MAXR];
    // sent[p] and recvd[p] modulo nslots: the slots they name, kept beside them so that finding a
    // slot takes no 64-bit division (the lean protocol's; the byte mover divides).
    unsigned sidx[OCCL_MAXR];
    unsigned ridx[OCCL_MAXR];
    int failed;
    OCCL_CHAN_PHASES
};

// The slot after slot i of a FIFO of n slots (the lean protocol's indices).
DEV unsigned slot_next(unsigned i, unsigned n) { return i + 1 == n ? 0 : i + 1; }

// Spins until *p >= want; on timeout marks the region's error word and the block as failed, so
// that the rest of the kernel runs through without waiting (the host reads the word).
// In the lean protocol the loads are relaxed, with no acquire (an acquire at system scope
// invalidates the SM's L1, CCTL.IVALL, on every spin): every read of data a peer has released
// goes to L2 (ld.global.cg, which the peer's writes reach before its count does) and is issued
// after the lane barrier that follows this wait, as after NCCL's volatile spin.
DEV void wait_ge(const CollArgs& a, Chan& c, const u64* p, u64 want) {
    if (ld_wait(p) >= want) return;
    const u64 t0 = globaltimer();
    unsigned spins = 0;
    while (ld_wait(p) < want) {
        if (c.failed) return;
        if ((++spins & 1023) == 0) {
            u64* err = (u64*)a.regions[a.rank];
            if (ld_wait(err) != 0 || globaltimer() - t0 > a.timeout_ns) {
                st_release(err, 1);
                c.failed = 1;
                return;
            }
        }
    }
}

// Thread t waits until peer t has freed the slot of my next chunk to it.
DEV void wait_slot(const CollArgs& a, Chan& c, unsigned b, unsigned t) {
    wait_ge(a, c, &ctrl(a, a.rank, b, t)->tail, c.sent[t] + 1 > a.nslots ? c.sent[t] + 1 - a.nslots : 0);
}

// A call may group a FIFO's slots into fewer, larger ones (CollArgs::nslots and slot_bytes, the
// host's Layout::steps): step s lives in slot s % nslots of the call's geometry, so a step of
// the previous geometry still unread could overlap the next one's. Before its first send in a
// new geometry, thread t waits until peer t has freed every chunk sent to it on b, then records
// the geometry. Receivers need nothing: both ends of a call compute the same geometry.
DEV void drain_sends(const CollArgs& a, Chan& c, unsigned b, unsigned t) {
    Ctrl* k = ctrl(a, a.rank, b, t);
    wait_ge(a, c, &k->tail, c.sent[t]);
    if (!c.failed) k->nslots = a.nslots;
}

// Thread q waits for peer q: a free slot towards it (send) and/or a chunk from it (recv).
DEV void wait_peers(const CollArgs& a, Chan& c, unsigned b, unsigned send, unsigned recv) {
    const unsigned t = lt();
    PH_SKIP(c);
#ifdef OCCL_PHASES
    if (send && recv) {  // both: a lane barrier between the two waits splits their time
        if (t < a.nranks && !c.failed && ((send >> t) & 1)) wait_slot(a, c, b, t);
        lane_sync();
        PH_ADD(c, PH_WAIT_SEND);
        send = 0;
    }
#endif
    if (t < a.nranks && !c.failed) {
        if ((send >> t) & 1) wait_slot(a, c, b, t);
        if ((recv >> t) & 1) wait_ge(a, c, &ctrl(a, a.rank, b, t)->head, c.recvd[t] + 1);
    }
    lane_sync();
    PH_ADD(c, recv ? PH_WAIT_RECV : PH_WAIT_SEND);
}

// After the lane's writes to peers' slots (send) and reads of its own (recv): publish them. A
// send releases head, so that the peer that acquires it sees the slot's data. In the lean
// protocol a receive frees the slot with a plain store: every load of it has returned its value
// to a thread that used it before the lane barrier, so no later write of the sender can reach
// those loads (NCCL frees its slots the same way).
DEV void post_peers(const CollArgs& a, Chan& c, unsigned b, unsigned send, unsigned recv) {
    lane_sync();
    PH_ADD(c, send ? PH_PUSH : PH_COPY);
    const unsigned t = lt();
    if (t < a.nranks) {
        if ((send >> t) & 1) {
            c.sent[t]++;
            if (OCCL_LEAN) c.sidx[t] = slot_next(c.sidx[t], a.nslots);
            st_release(&ctrl(a, t, b, a.rank)->head, c.sent[t]);
        }
        if ((recv >> t) & 1) {
            c.recvd[t]++;
            if (OCCL_LEAN) c.ridx[t] = slot_next(c.ridx[t], a.nslots);
            st_free(&ctrl(a, t, b, a.rank)->tail, c.recvd[t]);
        }
    }
    // In the lean protocol no barrier follows the post: thread t alone reads sent[t]/recvd[t]
    // before the next barrier (the next wait_peers', p2p_group's or chan_close's), and the others
    // read them only after it. The phase profile keeps one, to time the post.
#if defined(OCCL_PHASES) || !OCCL_LEAN
    lane_sync();
#endif
    PH_ADD(c, PH_POST);
    PH_COUNT(c, PH_STEPS);
}

DEV unsigned char* send_slot(const CollArgs& a, const Chan& c, unsigned b, unsigned p) {
    return (unsigned char*)(a.regions[p] + a.data_off +
                            (((u64)b * a.nranks + a.rank) * a.nslots + (OCCL_LEAN ? c.sidx[p] : c.sent[p] % a.nslots)) *
                                a.slot_bytes);
}

DEV const unsigned char* recv_slot(const CollArgs& a, const Chan& c, unsigned b, unsigned q) {
    return (const unsigned char*)(a.regions[a.rank] + a.data_off +
                                  (((u64)b * a.nranks + q) * a.nslots + (OCCL_LEAN ? c.ridx[q] : c.recvd[q] % a.nslots)) *
                                      a.slot_bytes);
}

// The pre-multiply of a pre-multiply sum (NCCL's ncclRedOpCreatePreMulSum): source `k` of a
// fold, this rank's own input, is multiplied by `s` as it is read and rounded to S once, as the
// host path does; no source when k < 0.
template <class E>
struct Pre {
    int k;
    typename E::W s;
};

template <class E>
DEV typename E::S pre_one(typename E::S x, typename E::W s) { return E::st(E::mul(E::ld(x), s)); }

template <class E>
DEV void pre_pack(Pack<typename E::S>& x, typename E::W s) {
#pragma unroll
    for (int e = 0; e < 16 / (int)sizeof(typename E::S); e++) x.e[e] = pre_one<E>(x.e[e], s);
}

// Packs of each source per thread per turn of a fold: as many as the block's registers hold.
#if OCCL_BLOCK > 512
#define OCCL_CU 4
#else
#define OCCL_CU 8
#endif

// x = x op y, element by element of one pack.
template <class E, class O>
DEV void op_pack(Pack<typename E::S>& x, const Pack<typename E::S>& y) {
#pragma unroll
    for (int e = 0; e < 16 / (int)sizeof(typename E::S); e++)
        x.e[e] = E::st(O::template ap<E>(E::ld(x.e[e]), E::ld(y.e[e])));
}

// x = x op y for one pack of each source (source pre.k, 0 or 1, pre-multiplied when PRE).
template <class E, class O, bool PRE>
DEV void fold2_one(Pack<typename E::S>& x, Pack<typename E::S>& y, const Pre<E>& pre) {
    if (PRE && pre.k == 0) pre_pack<E>(x, pre.s);
    if (PRE && pre.k == 1) pre_pack<E>(y, pre.s);
    op_pack<E, O>(x, y);
}

// Two sources into ND destinations (1 or 2), nv 16-byte packs, every address aligned: the ring's
// step (a received chunk and this rank's input) and the two-rank two-shot. Both sources' loads
// of a turn are issued before the first is combined, and the pointers stay in registers, so a
// turn waits for one round trip; the generic fold below loads a source at a time.
template <class E, class O, bool PRE, int ND>
static __device__ __noinline__ void fold2_packs(uint4* d0, uint4* d1, const uint4* a, const uint4* b, u64 nv,
                                                const Pre<E> pre) {
    typedef typename E::S S;
    const u64 st = OCCL_LANE;
    u64 i = lt();
    // Whole turns: no bounds inside, so no pack stays live from one turn to the next.
    for (; i + (OCCL_CU - 1) * st < nv; i += OCCL_CU * st) {
        Pack<S> x[OCCL_CU], y[OCCL_CU];
#pragma unroll
        for (int u = 0; u < OCCL_CU; u++) x[u].v = __ldcg(a + i + u * st);
#pragma unroll
        for (int u = 0; u < OCCL_CU; u++) y[u].v = __ldcg(b + i + u * st);
#pragma unroll
        for (int u = 0; u < OCCL_CU; u++) fold2_one<E, O, PRE>(x[u], y[u], pre);
#pragma unroll
        for (int u = 0; u < OCCL_CU; u++) {
            d0[i + u * st] = x[u].v;
            if (ND == 2) d1[i + u * st] = x[u].v;
        }
    }
    for (; i < nv; i += st) {
        Pack<S> x, y;
        x.v = __ldcg(a + i);
        y.v = __ldcg(b + i);
        fold2_one<E, O, PRE>(x, y, pre);
        d0[i] = x.v;
        if (ND == 2) d1[i] = x.v;
    }
}

// dst[0..nd) = src[0] op src[1] op ... op src[ns-1] (then / div), over n elements. With one
// source and no divisor it is a copy. 16-byte packs when every address is 16-byte aligned,
// else element by element. Peer-written slots are read with .cg (L2), never a stale L1 line.
// PRE: source pre.k is pre-multiplied (a compile-time switch, so other folds pay nothing).
template <class E, class O, bool PRE>
static __device__ __noinline__ void fold(typename E::S* const* dst, int nd, const typename E::S* const* src, int ns, u64 n, unsigned div, const Pre<E> pre) {
    typedef typename E::S S;
    enum { EPP = 16 / sizeof(S) };
    const u64 t = lt(), st = OCCL_LANE;
    u64 al = 0;
#pragma unroll
    for (int k = 0; k < OCCL_MAXR + 1; k++) {
        if (k < nd) al |= (u64)dst[k];
        if (k < ns) al |= (u64)src[k];
    }
    const u64 nv = (al & 15) == 0 ? n / EPP : 0;
    const bool red = ns > 1 || div != 0;
    // Two sources and no divisor (the ring's and the two-rank two-shot's steps): the packed
    // fold moves the packs, and the loop below is left with none.
    const bool two = ns == 2 && nd <= 2 && div == 0 && nv > 0;
    if (two) {
        if (nd == 1)
            fold2_packs<E, O, PRE, 1>((uint4*)dst[0], 0, (const uint4*)src[0], (const uint4*)src[1], nv, pre);
        else
            fold2_packs<E, O, PRE, 2>((uint4*)dst[0], (uint4*)dst[1], (const uint4*)src[0], (const uint4*)src[1], nv, pre);
    }
    for (u64 base = two ? nv : t; base < nv; base += st * OCCL_CU) {
        Pack<S> x[OCCL_CU];
#pragma unroll
        for (int u = 0; u < OCCL_CU; u++) {
            const u64 i = base + u * st;
            if (i < nv) x[u].v = __ldcg((const uint4*)src[0] + i);
        }
        if (PRE && pre.k == 0) {
#pragma unroll
            for (int u = 0; u < OCCL_CU; u++) pre_pack<E>(x[u], pre.s);
        }
        if (red) {
#pragma unroll 1
            for (int k = 1; k < OCCL_MAXR; k++) {
                if (k < ns) {
#pragma unroll
                    for (int u = 0; u < OCCL_CU; u++) {
                        const u64 i = base + u * st;
                        if (i < nv) {
                            Pack<S> y;
                            y.v = __ldcg((const uint4*)src[k] + i);
                            if (PRE && k == pre.k) pre_pack<E>(y, pre.s);
                            op_pack<E, O>(x[u], y);
                        }
                    }
                }
            }
            if (div) {
#pragma unroll
                for (int u = 0; u < OCCL_CU; u++)
#pragma unroll
                    for (int e = 0; e < EPP; e++) x[u].e[e] = E::st(E::div(E::ld(x[u].e[e]), div));
            }
        }
#pragma unroll 1
        for (int k = 0; k < OCCL_MAXR + 1; k++) {
            if (k < nd) {
#pragma unroll
                for (int u = 0; u < OCCL_CU; u++) {
                    const u64 i = base + u * st;
                    if (i < nv) ((uint4*)dst[k])[i] = x[u].v;
                }
            }
        }
    }
    for (u64 i = nv * EPP + t; i < n; i += st) {
        S r = __ldcg(src[0] + i);
        if (PRE && pre.k == 0) r = pre_one<E>(r, pre.s);
        for (int k = 1; k < ns; k++) {
            S y = __ldcg(src[k] + i);
            if (PRE && k == pre.k) y = pre_one<E>(y, pre.s);
            r = E::st(O::template ap<E>(E::ld(r), E::ld(y)));
        }
        if (div) r = E::st(E::div(E::ld(r), div));
        for (int k = 0; k < nd; k++) dst[k][i] = r;
    }
}

// The copy of 16-byte packs into ND destinations, all aligned: every load of a group issued
// before its stores, no per-pack bookkeeping (the generic fold spends more instructions per pack
// than an SM can issue at NVLink rate). The destinations live in registers once unrolled.
#define OCCL_CCU 8
template <int ND>
static __device__ __noinline__ void copy_packs(uint4* const* dst, const uint4* s, u64 nv) {
    uint4* d[ND];
#pragma unroll
    for (int k = 0; k < ND; k++) d[k] = dst[k];
    const u64 st = OCCL_LANE;
    u64 i = lt();
    for (; i + (OCCL_CCU - 1) * st < nv; i += OCCL_CCU * st) {
        uint4 x[OCCL_CCU];
#pragma unroll
        for (int u = 0; u < OCCL_CCU; u++) x[u] = __ldcg(s + i + u * st);
#pragma unroll
        for (int k = 0; k < ND; k++)
#pragma unroll
            for (int u = 0; u < OCCL_CCU; u++) d[k][i + u * st] = x[u];
    }
    for (; i < nv; i += st) {
        const uint4 x = __ldcg(s + i);
#pragma unroll
        for (int k = 0; k < ND; k++) d[k][i] = x;
    }
}

// One copy of n bytes into nd destinations (1 to OCCL_MAXR + 1).
DEV void copy_bytes(unsigned char* const* dst, int nd, const unsigned char* src, u64 n) {
    u64 al = (u64)src | n;
    for (int k = 0; k < nd; k++) al |= (u64)dst[k];
    if ((al & 15) == 0) {
        uint4* const* d = (uint4* const*)dst;
        const uint4* s = (const uint4*)src;
        const u64 nv = n / 16;
        switch (nd) {
            case 1: copy_packs<1>(d, s, nv); return;
            case 2: copy_packs<2>(d, s, nv); return;
            case 3: copy_packs<3>(d, s, nv); return;
            case 4: copy_packs<4>(d, s, nv); return;
            case 5: copy_packs<5>(d, s, nv); return;
            case 6: copy_packs<6>(d, s, nv); return;
            case 7: copy_packs<7>(d, s, nv); return;
            case 8: copy_packs<8>(d, s, nv); return;
            case 9: copy_packs<9>(d, s, nv); return;
            default: break;
        }
    }
    const unsigned char* s[1] = {src};
    fold<U8, OpSum, false>(dst, nd, s, 1, n, 0, Pre<U8>{-1, 0});
}

DEV void copy1(unsigned char* dst, const unsigned char* src, u64 n) {
    unsigned char* d[1] = {dst};
    copy_bytes(d, 1, src, n);
}

// This rank's input (m elements) on its way out into nd destinations: copied, or pre-multiplied
// by `s` when PRE (a fold of one source).
template <class E, bool PRE>
DEV void send_in(unsigned char* const* dst, int nd, const typename E::S* src, u64 m, typename E::W s) {
    typedef typename E::S S;
    if (PRE) {
        const S* one[1] = {src};
        fold<E, OpSum, true>((S* const*)dst, nd, one, 1, m, 0, Pre<E>{0, s});
    } else {
        copy_bytes(dst, nd, (const unsigned char*)src, m * sizeof(S));
    }
}

template <class E, bool PRE>
DEV void send_in1(unsigned char* dst, const typename E::S* src, u64 m, typename E::W s) {
    unsigned char* d[1] = {dst};
    send_in<E, PRE>(d, 1, src, m, s);
}

// The scalar of a pre-multiply sum, read when the kernel runs (from device memory when pre is 2:
// a graph replay sees the value of that moment).
template <class E>
DEV typename E::W pre_scalar(const CollArgs& a) {
    typedef typename E::S S;
    union {
        u64 u;
        S v;
    } x;
    x.u = a.scalar;
    if (a.pre == 2) x.v = *(const S*)a.scalar;
    return E::ld(x.v);
}

// Block b's part of [0, len): whole 16-byte units split as evenly as the grid allows.
DEV void share(u64 len, u64 unit, unsigned b, unsigned nb, u64& lo, u64& hi) {
    const u64 units = (len + unit - 1) / unit;
    const u64 per = units / nb, rem = units % nb;
    const u64 ulo = b * per + (b < rem ? b : rem);
    const u64 uhi = ulo + per + (b < rem ? 1 : 0);
    lo = ulo * unit < len ? ulo * unit : len;
    hi = uhi * unit < len ? uhi * unit : len;
}

DEV u64 clip(u64 total, u64 start, u64 n) { return start >= total ? 0 : (total - start < n ? total - start : n); }

// The ring's reduce-scatter, for one chunk (`m` elements at `o` of each block): block k
// travels r+1 -> r+2 -> ..., each rank folding in its own block k, and rank r folds the last
// contribution to block r into `fin`, and also on to the next rank when `forward` (the
// all-reduce's all-gather starts from there). Blocks lie `a.stride` apart and are clipped to
// `a.total` elements. PRE: this rank's input is pre-multiplied by `ps` as it is read.
template <class E, class O, bool PRE>
DEV void ring_reduce_scatter(const CollArgs& a, Chan& c, u64 o, u64 m, typename E::S* fin, bool forward,
                             typename E::W ps) {
    typedef typename E::S S;
    const unsigned b = chan_id(), r = a.rank, n = a.nranks;
    const u64 sh = a.stride;
    const S* in = (const S*)a.in;
    const unsigned nx = (r + 1) % n, pv = (r + n - 1) % n, tx = 1u << nx, rx = 1u << pv;
    wait_peers(a, c, b, tx, 0);
    send_in1<E, PRE>(send_slot(a, c, b, nx), in + pv * sh + o, clip(a.total, pv * sh + o, m), ps);
    post_peers(a, c, b, tx, 0);
    for (unsigned s = 1; s < n; s++) {
        const unsigned k = (r + 2 * n - 1 - s) % n;
        const bool last = s == n - 1;
        const unsigned fwd = last && !forward ? 0 : tx;
        wait_peers(a, c, b, fwd, rx);
        const S* src[2] = {(const S*)recv_slot(a, c, b, pv), in + k * sh + o};
        const u64 len = clip(a.total, k * sh + o, m);
        // Destination counts as constants, as each mode had them before they shared this.
        S* next = (S*)send_slot(a, c, b, nx);
        const Pre<E> pre = {1, ps};
        if (!last) {
            S* d[1] = {next};
            fold<E, O, PRE>(d, 1, src, 2, len, 0, pre);
        } else if (forward) {
            S* d[2] = {next, fin};
            fold<E, O, PRE>(d, 2, src, 2, len, a.div, pre);
        } else {
            S* d[1] = {fin};
            fold<E, O, PRE>(d, 1, src, 2, len, a.div, pre);
        }
        post_peers(a, c, b, fwd, rx);
    }
}

// The all-reduce family and the other reducing collectives, for element type E and operator O.
// PRE: a pre-multiply sum (O is OpSum): this rank's input is multiplied by `ps` wherever it is
// read, on its way to a peer or into a fold, so no pass over memory is added.
template <class E, class O, bool PRE>
DEV void reduce_modes(const CollArgs& a, Chan& c, typename E::W ps) {
    typedef typename E::S S;
    const unsigned b = chan_id(), nb = a.nch, r = a.rank, n = a.nranks;
    const unsigned all = ((1u << n) - 1) & ~(1u << r);
    const u64 es = sizeof(S), chunk = a.slot_bytes / es, unit = 16 / es;
    const S* in = (const S*)a.in;
    S* out = (S*)a.out;
    u64 lo, hi;
    share(a.count, unit, b, nb, lo, hi);
    for (u64 o = lo; o < hi; o += chunk) {
        const u64 m = hi - o < chunk ? hi - o : chunk;
        PH_COUNT(c, PH_CHUNKS);
        if (a.mode == M_AR_ONESHOT) {
            // Push my whole chunk to every peer, then fold every rank's copy in rank order (all
            // ranks then round alike).
            wait_peers(a, c, b, all, 0);
            {
                unsigned char* d[OCCL_MAXR];
                int nd = 0;
                for (unsigned k = 1; k < n; k++) d[nd++] = send_slot(a, c, b, (r + k) % n);
                send_in<E, PRE>(d, nd, in + o, m, ps);
            }
            post_peers(a, c, b, all, 0);
            wait_peers(a, c, b, 0, all);
            {
                const S* s[OCCL_MAXR];
                for (unsigned k = 0; k < n; k++) s[k] = k == r ? in + o : (const S*)recv_slot(a, c, b, k);
                S* d[1] = {out + o};
                fold<E, O, PRE>(d, 1, s, n, m, a.div, Pre<E>{(int)r, ps});
            }
            post_peers(a, c, b, 0, all);
        } else if (a.mode == M_AR_TWOSHOT) {
            // Shard p of every rank goes to rank p, which folds it and pushes the result to all.
            const u64 sh = a.stride;
            wait_peers(a, c, b, all, 0);
            for (unsigned k = 1; k < n; k++) {
                const unsigned p = (r + k) % n;
                send_in1<E, PRE>(send_slot(a, c, b, p), in + p * sh + o, clip(a.total, p * sh + o, m), ps);
            }
            post_peers(a, c, b, all, 0);
            wait_peers(a, c, b, all, all);
            {
                const S* s[OCCL_MAXR];
                for (unsigned k = 0; k < n; k++) s[k] = k == r ? in + r * sh + o : (const S*)recv_slot(a, c, b, k);
                S* d[OCCL_MAXR + 1];
                int nd = 0;
                d[nd++] = out + r * sh + o;
                for (unsigned k = 1; k < n; k++) d[nd++] = (S*)send_slot(a, c, b, (r + k) % n);
                fold<E, O, PRE>(d, nd, s, n, clip(a.total, r * sh + o, m), a.div, Pre<E>{(int)r, ps});
            }
            post_peers(a, c, b, all, all);
            wait_peers(a, c, b, 0, all);
            for (unsigned q = 0; q < n; q++)
                if (q != r) copy1((unsigned char*)(out + q * sh + o), recv_slot(a, c, b, q), clip(a.total, q * sh + o, m) * es);
            post_peers(a, c, b, 0, all);
        } else if (a.mode == M_AR_RING) {
            // Reduce-scatter then all-gather around the ring r -> r+1; rank r finishes shard r,
            // into the output and on to the next rank.
            const u64 sh = a.stride;
            const unsigned nx = (r + 1) % n, pv = (r + n - 1) % n, tx = 1u << nx, rx = 1u << pv;
            ring_reduce_scatter<E, O, PRE>(a, c, o, m, out + r * sh + o, true, ps);
            for (unsigned t = 0; t + 1 < n; t++) {
                const unsigned k = (r + 2 * n - 1 - t) % n;
                const unsigned fwd = t + 2 < n ? tx : 0;
                wait_peers(a, c, b, fwd, rx);
                unsigned char* d[2] = {(unsigned char*)(out + k * sh + o), fwd ? send_slot(a, c, b, nx) : 0};
                copy_bytes(d, fwd ? 2 : 1, recv_slot(a, c, b, pv), clip(a.total, k * sh + o, m) * es);
                post_peers(a, c, b, fwd, rx);
            }
        } else if (a.mode == M_RS) {
            // Block p of every rank's input goes to rank p, which folds them in rank order.
            wait_peers(a, c, b, all, 0);
            for (unsigned k = 1; k < n; k++) {
                const unsigned p = (r + k) % n;
                send_in1<E, PRE>(send_slot(a, c, b, p), in + p * a.stride + o, m, ps);
            }
            post_peers(a, c, b, all, 0);
            wait_peers(a, c, b, 0, all);
            const S* s[OCCL_MAXR];
            for (unsigned k = 0; k < n; k++) s[k] = k == r ? in + r * a.stride + o : (const S*)recv_slot(a, c, b, k);
            S* d[1] = {out + o};
            fold<E, O, PRE>(d, 1, s, n, m, a.div, Pre<E>{(int)r, ps});
            post_peers(a, c, b, 0, all);
        } else if (a.mode == M_RS_RING) {
            ring_reduce_scatter<E, O, PRE>(a, c, o, m, out + o, false, ps);
        } else if (a.mode == M_REDUCE) {
            const unsigned root = a.root;
            if (r != root) {
                wait_peers(a, c, b, 1u << root, 0);
                send_in1<E, PRE>(send_slot(a, c, b, root), in + o, m, ps);
                post_peers(a, c, b, 1u << root, 0);
            } else {
                wait_peers(a, c, b, 0, all);
                const S* s[OCCL_MAXR];
                for (unsigned k = 0; k < n; k++) s[k] = k == r ? in + o : (const S*)recv_slot(a, c, b, k);
                S* d[1] = {out + o};
                fold<E, O, PRE>(d, 1, s, n, m, a.div, Pre<E>{(int)r, ps});
                post_peers(a, c, b, 0, all);
            }
        } else if (a.mode == M_REDUCE_RING) {
            // Along the ring towards the root: the rank after it starts, each rank folds its
            // chunk into what it received and passes it on, the root folds last into its
            // output, so every link carries the message once (not the root's link every copy).
            const unsigned pos = (r + 2 * n - a.root - 1) % n, nx = (r + 1) % n, pv = (r + n - 1) % n;
            const unsigned tx = pos + 1 < n ? 1u << nx : 0, rx = pos > 0 ? 1u << pv : 0;
            wait_peers(a, c, b, tx, rx);
            if (pos == 0) {
                send_in1<E, PRE>(send_slot(a, c, b, nx), in + o, m, ps);
            } else {
                const S* src[2] = {(const S*)recv_slot(a, c, b, pv), in + o};
                S* d[1] = {tx ? (S*)send_slot(a, c, b, nx) : out + o};
                fold<E, O, PRE>(d, 1, src, 2, m, tx ? 0 : a.div, Pre<E>{1, ps});
            }
            post_peers(a, c, b, tx, rx);
        }
    }
}

// All-gather, out-of-place all-to-all and direct broadcast whose output lies in a symmetric window
// on every rank (the host sets a.win, occl::cuda::ops::kernel_windows, and launches occl_coll_win,
// a kernel of its own so that occl_coll_copy's code stays as it is): the sender writes its share
// straight into every receiver's output, with no slot and no copy-out. Per channel b and pair
// (sender q, receiver r), one handshake per call:
//   r releases wready = its call number into q's ctrl(b, r) as the call starts: its output is free;
//   q acquires it, writes pieces into r's output, then releases wdone = the number into r's
//   ctrl(b, q); r acquires every sender's wdone before the kernel ends.
// Which pieces a channel writes is not fixed: the sender's channels take pieces of its share one
// at a time from a counter in its own region (wgrab), so a channel that the memory system serves
// faster writes more and all end together (with a fixed share per channel the last one ends up
// to a third of the call after the first: bench/baselines/kernel-phases.md). A receiver needs no piece list: every sender channel
// releases its wdone after its last piece, and r waits for all of them. The last channel done
// with the counter (wfin) zeroes both, so the next call, and a graph replay, starts from 0.
// Why a peer's next call cannot overwrite an output that later work of this rank still reads:
// q writes r's output for call N+1 only after r's wready N+1, which r's call N+1 releases once it
// runs, so after every earlier piece of work on r's stream (stream order), the readers of call
// N's output among them. The output of call N is whole when r's kernel ends (every channel waited
// for every sender's channel), so work after it on r's stream reads finished data.
// Why the numbers replay in a CUDA graph: wsent/wrecvd live in device memory, are read as the
// kernel starts and written back as it ends, as sent/recvd are; every windowed call advances both
// ends of each pair by one on every channel (every rank takes the windowed mode for the same calls
// and the same grid), so a replay continues the count instead of repeating a captured number.
// Phase profile: the readiness wait counts as wait send, the pieces as push (one chunk each), the
// wdone release as post and the wait for the senders' wdone as wait recv.
#define OCCL_WIN_MIN_PIECE (8ull << 10)
#define OCCL_WIN_MAX_PIECE (256ull << 10)
DEV void win_modes(const CollArgs& a, Chan& c) {
    const unsigned b = chan_id(), r = a.rank, n = a.nranks, t = lt();
    const unsigned all = ((1u << n) - 1) & ~(1u << r);
    const bool root = a.mode != M_BCAST || r == a.root;
    const unsigned tx = root ? all : 0;
    const unsigned rx = a.mode != M_BCAST ? all : (root ? 0 : 1u << a.root);
    const unsigned char* in = (const unsigned char*)a.in;
    PH_SKIP(c);
    Ctrl* k = t < n ? ctrl(a, r, b, t) : 0;
    const bool txt = t < n && ((tx >> t) & 1), rxt = t < n && ((rx >> t) & 1);
    const u64 ns = txt ? k->wsent + 1 : 0, nr = rxt ? k->wrecvd + 1 : 0;
    if (rxt) st_release(&ctrl(a, t, b, r)->wready, nr);
    if (txt && !c.failed) wait_ge(a, c, &k->wready, ns);
    lane_sync();
    PH_ADD(c, PH_WAIT_SEND);
    if (tx) {
        // Pieces of 8-256 KiB, about four per channel; an all-to-all's n blocks are numbered
        // peer-minor, so the channels write every peer at once rather than one after another.
        const bool a2a = a.mode == M_A2A;
        const u64 blocks = a2a ? n : 1;
        u64 piece = (a.count * blocks / (4ull * a.nch) + 15) & ~15ull;
        piece = piece < OCCL_WIN_MIN_PIECE ? OCCL_WIN_MIN_PIECE : piece > OCCL_WIN_MAX_PIECE ? OCCL_WIN_MAX_PIECE : piece;
        const u64 per = (a.count + piece - 1) / piece, pieces = per * blocks;
        Ctrl* own = ctrl(a, r, 0, r);
        __shared__ u64 next[OCCL_LANES_MAX];
        const unsigned char* mine = (const unsigned char*)a.win[r];
        if (t == 0) next[lane()] = c.failed ? pieces : atomicAdd(&own->wgrab, 1ull);
        lane_sync();
        for (;;) {
            const u64 id = next[lane()];
            if (id >= pieces) break;
            lane_sync();
            if (t == 0) next[lane()] = c.failed ? pieces : atomicAdd(&own->wgrab, 1ull);
            PH_COUNT(c, PH_CHUNKS);
            const u64 o = (a2a ? id / n : id) * piece;
            const u64 m = a.count - o < piece ? a.count - o : piece;
            if (a2a) {
                const unsigned p = (r + 1 + id % n) % n;
                copy1(p == r ? (unsigned char*)mine + o : (unsigned char*)a.win[p] + o, in + p * a.stride + o, m);
            } else {
                unsigned char* d[OCCL_MAXR];
                int nd = 0;
                for (unsigned j = 1; j < n; j++) d[nd++] = (unsigned char*)a.win[(r + j) % n] + o;
                if (in != mine) d[nd++] = (unsigned char*)mine + o;
                copy_bytes(d, nd, in + o, m);
            }
            lane_sync();
        }
        // Every channel of the launch counts itself done after its last take, so the last one
        // zeroes the counter only once no channel takes from it any more.
        if (t == 0 && atomicAdd(&own->wfin, 1ull) + 1 == a.nch) {
            own->wgrab = 0;
            own->wfin = 0;
        }
    }
    lane_sync();
    PH_ADD(c, PH_PUSH);
    if (txt && !c.failed) st_release(&ctrl(a, t, b, r)->wdone, ns);
    lane_sync();
    PH_ADD(c, PH_POST);
    PH_COUNT(c, PH_STEPS);
    if (rxt && !c.failed) wait_ge(a, c, &k->wdone, nr);
    if (txt) k->wsent = ns;
    if (rxt) k->wrecvd = nr;
    lane_sync();
    PH_ADD(c, PH_WAIT_RECV);
}

// A small out-of-place all-to-all between two ranks splits each pair of its channels into a
// sender and a receiver of one FIFO: lane 2b pushes channel b's chunks to the peer while lane
// 2b+1 copies the peer's chunks of channel b out, and this rank's own block, as NVIDIA's grouped
// sends and receives run their send and receive warps side by side. In one lane the two
// alternate, and with a few chunks a lane every lane copies out at once while the link idles.
// The receiver copies the own block before each wait, filling the time the peer's chunk takes
// to arrive. With many chunks a lane the lanes drift apart and fill the link themselves, and a
// split lane's sender, one lane an SM, pushes less than two lanes taking turns: so the split
// takes the calls whose lanes would have at most 4 chunks each. On 2×H200 it moves 1.06-1.13×
// of one lane's way from 8 to 64 MiB buffers, 1.02× at 128, and 0.90-0.97× from 256 MiB
// (bench/baselines/gpu-overlap.md run 20); more ranks were not measured. In place it cannot
// split (a receiver would overwrite a block the sender has yet to read), nor windowed (no FIFO).
// Both ends decide alike, from the call's arguments.
DEV bool a2a_split(const CollArgs& a) {
    return a.mode == M_A2A && a.nranks == 2 && a.win[a.rank] == 0 && a.in != a.out && a.nch >= 2 &&
           a.count <= 4ull * a.nch * a.slot_bytes;
}

// The FIFO channel of this lane, and its role there: 0 the sender and 1 the receiver of a split
// pair (a2a_split), 2 both (no split), -1 none (the odd lane past the split's last pair).
DEV unsigned chan_of(const CollArgs& a, int& role) {
    const unsigned id = chan_id();
    if (!a2a_split(a)) {
        role = 2;
        return id;
    }
    role = id >= (a.nch & ~1u) ? -1 : (int)(id & 1);
    return id / 2;
}

// Channel b of a split all-to-all (a2a_split): its sender (role 0) or its receiver (role 1).
DEV void a2a_lanes(const CollArgs& a, Chan& c, unsigned b, int role) {
    const unsigned r = a.rank, n = a.nranks;
    const unsigned all = ((1u << n) - 1) & ~(1u << r);
    const u64 chunk = a.slot_bytes;
    const unsigned char* in = (const unsigned char*)a.in;
    unsigned char* out = (unsigned char*)a.out;
    u64 lo, hi;
    share(a.count, 16, b, a.nch / 2, lo, hi);
    for (u64 o = lo; o < hi; o += chunk) {
        const u64 m = hi - o < chunk ? hi - o : chunk;
        PH_COUNT(c, PH_CHUNKS);
        if (role == 0) {
            wait_peers(a, c, b, all, 0);
            for (unsigned k = 1; k < n; k++) {
                const unsigned p = (r + k) % n;
                copy1(send_slot(a, c, b, p), in + p * a.stride + o, m);
            }
            post_peers(a, c, b, all, 0);
        } else {
            copy1(out + r * a.stride + o, in + r * a.stride + o, m);
            wait_peers(a, c, b, 0, all);
            for (unsigned q = 0; q < n; q++)
                if (q != r) copy1(out + q * a.stride + o, recv_slot(a, c, b, q), m);
            post_peers(a, c, b, 0, all);
        }
    }
}

// Collectives that only move bytes (count and stride in bytes).
DEV void copy_modes(const CollArgs& a, Chan& c) {
    int role;
    const unsigned ab = chan_of(a, role);
    if (role < 0) return;
    if (role < 2) {
        a2a_lanes(a, c, ab, role);
        return;
    }
    const unsigned b = chan_id(), nb = a.nch, r = a.rank, n = a.nranks;
    const unsigned all = ((1u << n) - 1) & ~(1u << r);
    const u64 chunk = a.slot_bytes;
    const unsigned char* in = (const unsigned char*)a.in;
    unsigned char* out = (unsigned char*)a.out;
    u64 lo, hi;
    share(a.count, 16, b, nb, lo, hi);
    for (u64 o = lo; o < hi; o += chunk) {
        const u64 m = hi - o < chunk ? hi - o : chunk;
        PH_COUNT(c, PH_CHUNKS);
        if (a.mode == M_AG) {
            // Push my block to every peer (and into my own output), take theirs.
            wait_peers(a, c, b, all, 0);
            unsigned char* d[OCCL_MAXR + 1];
            int nd = 0;
            for (unsigned k = 1; k < n; k++) d[nd++] = send_slot(a, c, b, (r + k) % n);
            if (in != out + r * a.stride) d[nd++] = out + r * a.stride + o;
            copy_bytes(d, nd, in + o, m);
            post_peers(a, c, b, all, 0);
            wait_peers(a, c, b, 0, all);
            for (unsigned q = 0; q < n; q++)
                if (q != r) copy1(out + q * a.stride + o, recv_slot(a, c, b, q), m);
            post_peers(a, c, b, 0, all);
        } else if (a.mode == M_BCAST) {
            const unsigned root = a.root;
            if (r == root) {
                wait_peers(a, c, b, all, 0);
                unsigned char* d[OCCL_MAXR + 1];
                int nd = 0;
                for (unsigned k = 1; k < n; k++) d[nd++] = send_slot(a, c, b, (r + k) % n);
                if (in != out) d[nd++] = out + o;
                copy_bytes(d, nd, in + o, m);
                post_peers(a, c, b, all, 0);
            } else {
                wait_peers(a, c, b, 0, 1u << root);
                copy1(out + o, recv_slot(a, c, b, root), m);
                post_peers(a, c, b, 0, 1u << root);
            }
        } else if (a.mode == M_BCAST_RING) {
            // Along the ring from the root: each rank keeps the chunk and passes it on, the
            // last one only keeps it, so every link carries the message once.
            const unsigned pos = (r + n - a.root) % n, nx = (r + 1) % n, pv = (r + n - 1) % n;
            const unsigned tx = pos + 1 < n ? 1u << nx : 0, rx = pos > 0 ? 1u << pv : 0;
            wait_peers(a, c, b, tx, rx);
            unsigned char* d[2];
            int nd = 0;
            if (tx) d[nd++] = send_slot(a, c, b, nx);
            if (pos > 0 || in != out) d[nd++] = out + o;
            if (nd) copy_bytes(d, nd, pos > 0 ? recv_slot(a, c, b, pv) : in + o, m);
            post_peers(a, c, b, tx, rx);
        } else if (a.mode == M_A2A) {
            // Block p of my input to rank p; chunk o of every block is sent before any is
            // overwritten, so in == out works too.
            wait_peers(a, c, b, all, 0);
            for (unsigned k = 1; k < n; k++) {
                const unsigned p = (r + k) % n;
                copy1(send_slot(a, c, b, p), in + p * a.stride + o, m);
            }
            if (in != out) copy1(out + r * a.stride + o, in + r * a.stride + o, m);
            post_peers(a, c, b, all, 0);
            wait_peers(a, c, b, 0, all);
            for (unsigned q = 0; q < n; q++)
                if (q != r) copy1(out + q * a.stride + o, recv_slot(a, c, b, q), m);
            post_peers(a, c, b, 0, all);
        } else if (a.mode == M_SEND) {
            const unsigned p = a.root;
            wait_peers(a, c, b, 1u << p, 0);
            copy1(send_slot(a, c, b, p), in + o, m);
            post_peers(a, c, b, 1u << p, 0);
        } else if (a.mode == M_RECV) {
            const unsigned q = a.root;
            wait_peers(a, c, b, 0, 1u << q);
            copy1(out + o, recv_slot(a, c, b, q), m);
            post_peers(a, c, b, 0, 1u << q);
        }
    }
}

// KernelCh record `idx` of the launch (NCCL's pTimer pair): the start, then the stop with a
// system-scope release, so the host takes a record with a non-zero stop as complete. Returns the
// stop (to the lane's thread 0). The branch is uniform (a kernel argument): an untimed launch
// only tests it.
DEV u64 stamp(const CollArgs& a, u64 idx, u64 t0) {
    if (!a.timers) return 0;
    lane_sync();
    if (lt() != 0) return 0;
    u64* r = (u64*)a.timers + 2 * idx;
    r[0] = t0;
    const u64 t1 = globaltimer();
    st_release(&r[1], t1 ? t1 : 1);
    return t1;
}

// The channel's KernelCh record: one per channel of a collective.
DEV void chan_time(const CollArgs& a, u64 t0) { stamp(a, chan_id(), t0); }

// Grouped send/recv (NCCL's ncclGroupStart..End of p2p calls): one launch runs every send and
// receive of a group at once, each connection (peer, direction) on channels of its own, so that
// no send waits behind a receive queued after it. The channels are lanes, packed into blocks as
// the collectives' are. Mirrors occl_kernels::p2p.
#define OCCL_P2P_OPS 128
#define OCCL_P2P_CONNS (2 * (OCCL_MAXR - 1))

struct P2pConn {
    unsigned peer, send;   // send: 1 to the peer, 0 from it
    unsigned first, nops;  // its operations, in call order, at ops[first..first+nops)
    unsigned channels, pad;  // its channels 0..channels, one lane each
};

struct P2pOp {
    u64 buf, bytes;
};

struct P2pArgs {
    CollArgs a;  // regions, layout, rank, timeout (mode, in, out and count unused)
    unsigned nconns, pad[3];
    P2pConn conns[OCCL_P2P_CONNS];
    P2pOp ops[OCCL_P2P_OPS];
};

// Lane -> (connection, channel b); lanes past the last connection's idle. Only the counter of
// this connection's direction is loaded and stored: the opposite direction with the same peer
// and channel runs in another lane of this launch. Both ends split each operation over the
// same channels in the same chunks, so the counters of a channel stay equal on both sides, as
// the collectives expect.
//
// Timed (a.timers), a channel stamps a record per operation (NCCL's KernelCh per work item: an
// operation on a channel, from the previous one's end): connection k's records follow every
// earlier connection's, operation by operation, channel by channel (occl_kernels::p2p::records).
DEV void p2p_group(const P2pArgs& g, Chan& c, u64 t0) {
    const CollArgs& a = g.a;
    unsigned b = chan_id(), k = 0;
    u64 rec = 0;
    while (k < g.nconns && b >= g.conns[k].channels) {
        rec += (u64)g.conns[k].nops * g.conns[k].channels;
        b -= g.conns[k++].channels;
    }
    if (k >= g.nconns) return;
    const P2pConn& cn = g.conns[k];
    const unsigned p = cn.peer, nb = cn.channels, bit = 1u << p;
    const unsigned tx = cn.send ? bit : 0, rx = cn.send ? 0 : bit;
    PH_OPEN(a, c);
    bool regroup = false;
    if (lt() == 0) {
        c.failed = 0;
        const Ctrl* x = ctrl(a, a.rank, b, p);
        if (cn.send) {
            c.sent[p] = x->sent;
            c.sidx[p] = (unsigned)(x->sent % a.nslots);
            regroup = x->nslots != a.nslots;
        } else {
            c.recvd[p] = x->recvd;
            c.ridx[p] = (unsigned)(x->recvd % a.nslots);
        }
    }
    if (lane_any(regroup)) {
        if (regroup) drain_sends(a, c, b, p);
        lane_sync();
    }
    for (unsigned i = cn.first; i < cn.first + cn.nops; i++) {
        unsigned char* buf = (unsigned char*)g.ops[i].buf;
        u64 lo, hi;
        share(g.ops[i].bytes, 16, b, nb, lo, hi);
        for (u64 o = lo; o < hi; o += a.slot_bytes) {
            const u64 m = hi - o < a.slot_bytes ? hi - o : a.slot_bytes;
            PH_COUNT(c, PH_CHUNKS);
            wait_peers(a, c, b, tx, rx);
            if (cn.send) copy1(send_slot(a, c, b, p), buf + o, m);
            else copy1(buf + o, recv_slot(a, c, b, p), m);
            post_peers(a, c, b, tx, rx);
        }
        t0 = stamp(a, rec + (u64)(i - cn.first) * nb + b, t0);
    }
    lane_sync();
    if (lt() == 0) {
        Ctrl* x = ctrl(a, a.rank, b, p);
        if (cn.send) x->sent = c.sent[p];
        else x->recvd = c.recvd[p];
    }
    PH_CLOSE(a, c);
}

// Loads this block's sequence numbers (draining a FIFO whose geometry changes), runs the mode,
// stores them back for the next call. A split lane (chan_of) loads and stores only its own
// direction's number: the other lane of its FIFO stores the other one in the same launch.
DEV void chan_open(const CollArgs& a, Chan& c) {
    const unsigned t = lt();
    if (t == 0) c.failed = 0;
    PH_OPEN(a, c);
    int role;
    const unsigned b = chan_of(a, role);
    bool regroup = false;
    if (t < a.nranks && role >= 0) {
        const Ctrl* k = ctrl(a, a.rank, b, t);
        if (role != 1) {
            c.sent[t] = k->sent;
            c.sidx[t] = (unsigned)(k->sent % a.nslots);
            regroup = k->nslots != a.nslots;
        }
        if (role != 0) {
            c.recvd[t] = k->recvd;
            c.ridx[t] = (unsigned)(k->recvd % a.nslots);
        }
    }
    if (lane_any(regroup)) {
        if (regroup) drain_sends(a, c, b, t);
        lane_sync();
    }
}

DEV void chan_close(const CollArgs& a, Chan& c) {
    lane_sync();
    const unsigned t = lt();
    int role;
    const unsigned b = chan_of(a, role);
    if (t < a.nranks && role >= 0) {
        Ctrl* k = ctrl(a, a.rank, b, t);
        if (role != 1) k->sent = c.sent[t];
        if (role != 0) k->recvd = c.recvd[t];
    }
}

// A collective kernel NAME: each channel opens (its sequence numbers loaded), runs the statement
// after NAME (the mode's work, over `a` and its Chan `c`), closes and stamps its timer record.
#define OCCL_CHAN_KERNEL(NAME, ...)                                                                 \
    extern "C" __global__ void __launch_bounds__(OCCL_BLOCK, 1)                                     \
        NAME(const CollArgs a) {                                                                    \
        __shared__ Chan cs[OCCL_LANES_MAX];                                                         \
        Chan& c = cs[lane()];                                                                       \
        if (chan_id() >= a.nch) return;                                                             \
        const u64 t0 = a.timers ? globaltimer() : 0;                                                \
        chan_open(a, c);                                                                            \
        __VA_ARGS__;                                                                                \
        chan_close(a, c);                                                                           \
        PH_CLOSE(a, c);                                                                             \
        chan_time(a, t0);                                                                           \
    }

#define OCCL_COLL_KERNEL(T, E, OPN, O, PRE, PS)                                                     \
    OCCL_CHAN_KERNEL(occl_coll_##T##_##OPN, reduce_modes<E, O, PRE>(a, c, PS))

#define OCCL_COLL(T, E, OPN, O) OCCL_COLL_KERNEL(T, E, OPN, O, false, typename E::W())

// Clock calibration (occl_kernels::timer::Probe): answers the host's requests first..first+n-1,
// posted in box[0], with %globaltimer in box[1], then the request's number in box[2]; gives up
// after a second without a request.
extern "C" __global__ void occl_clock_probe(u64 box, u64 first, unsigned n) {
    if (threadIdx.x != 0) return;
    u64* b = (u64*)box;
    u64 last = globaltimer();
    for (u64 i = first; i < first + n; i++) {
        while (ld_acquire(&b[0]) < i)
            if (globaltimer() - last > 1000000000ull) return;
        const u64 t = globaltimer();
        b[1] = t;
        st_release(&b[2], i);
        last = t;
    }
}

#define OCCL_COLL_COPY                                                                              \
    OCCL_CHAN_KERNEL(occl_coll_copy, copy_modes(a, c))                                              \
    extern "C" __global__ void __launch_bounds__(OCCL_BLOCK, 1)                                     \
        occl_p2p_group(const P2pArgs g) {                                                           \
        __shared__ Chan cs[OCCL_LANES_MAX];                                                         \
        p2p_group(g, cs[lane()], g.a.timers ? globaltimer() : 0);                                   \
    }                                                                                               \
    OCCL_CHAN_KERNEL(occl_coll_win, win_modes(a, c))

#define OCCL_COLL_TYPE(T, E)                                                                        \
    OCCL_COLL(T, E, sum, OpSum)                                                                     \
    OCCL_COLL(T, E, prod, OpProd)                                                                   \
    OCCL_COLL(T, E, max, OpMax)                                                                     \
    OCCL_COLL(T, E, min, OpMin)                                                                     \
    OCCL_COLL_KERNEL(T, E, premulsum, OpSum, true, pre_scalar<E>(a))

// The program for one element type ends with OCCL_COLL_TYPE(name, E) (occl_kernels::coll::source).
