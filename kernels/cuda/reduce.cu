// Elementwise reduction kernels: dst = a op b (and the same into dst2, the fused copy of a ring
// step), and the unary scale kernel dst = a (premultiplied and/or divided, for the average).
//
// Any element-aligned pointers work. When every pointer has the same offset within 16 bytes, a
// scalar head brings them to 16-byte alignment, the body moves 16-byte packs and a scalar tail
// ends it; otherwise the whole range goes element by element (still coalesced). The branch is
// the same for every thread of the grid.

// What one element becomes: pre(a) op b, then divided by `div` when it is nonzero (the average,
// finished as occl's host path does it: rounded to S after the sum, then divided and rounded).
template <class E, class O, bool UNARY>
struct Fn {
    typedef typename E::S S;
    typedef typename E::W W;
    double s;
    unsigned div;
    bool pre;
    __device__ __forceinline__ S one(S a, S b) const {
        W x = E::ld(a);
        if (pre) x = E::ld(E::st(E::scale(x, s)));
        S r = UNARY ? E::st(x) : E::st(O::template ap<E>(x, E::ld(b)));
        if (div) r = E::st(E::div(E::ld(r), div));
        return r;
    }
};

// Packs per thread per loop turn: their loads are all issued before the first use.
#define OCCL_UNROLL 2

template <class E, class O, bool UNARY, bool TWO>
DEV void run(typename E::S* d, typename E::S* d2, const typename E::S* a, const typename E::S* b, u64 n,
             const Fn<E, O, UNARY>& f) {
    typedef typename E::S S;
    enum { EPP = 16 / sizeof(S) };
    const u64 t = gtid(), st = gstride();
    const u64 da = (u64)d;
    u64 diff = (u64)a ^ da;
    if (!UNARY) diff |= (u64)b ^ da;
    if (TWO) diff |= (u64)d2 ^ da;
    u64 head = n;
    if ((diff & 15) == 0) {
        head = ((16 - (da & 15)) & 15) / sizeof(S);
        if (head > n) head = n;
    }
    for (u64 i = t; i < head; i += st) {
        S r = f.one(a[i], UNARY ? a[i] : b[i]);
        d[i] = r;
        if (TWO) d2[i] = r;
    }
    if (head == n) return;

    const u64 nv = (n - head) / EPP;
    const uint4* av = (const uint4*)(a + head);
    const uint4* bv = (const uint4*)(b + head);
    uint4* dv = (uint4*)(d + head);
    uint4* d2v = (uint4*)(d2 + head);
    for (u64 base = t; base < nv; base += st * OCCL_UNROLL) {
        Pack<S> x[OCCL_UNROLL], y[OCCL_UNROLL];
#pragma unroll
        for (int u = 0; u < OCCL_UNROLL; u++) {
            const u64 i = base + u * st;
            if (i < nv) {
                x[u].v = av[i];
                if (!UNARY) y[u].v = bv[i];
            }
        }
#pragma unroll
        for (int u = 0; u < OCCL_UNROLL; u++) {
            const u64 i = base + u * st;
            if (i < nv) {
                Pack<S> z;
#pragma unroll
                for (int k = 0; k < EPP; k++) z.e[k] = f.one(x[u].e[k], UNARY ? x[u].e[k] : y[u].e[k]);
                dv[i] = z.v;
                if (TWO) d2v[i] = z.v;
            }
        }
    }
    for (u64 i = head + nv * EPP + t; i < n; i += st) {
        S r = f.one(a[i], UNARY ? a[i] : b[i]);
        d[i] = r;
        if (TWO) d2[i] = r;
    }
}

template <class E, class O, bool UNARY>
DEV void entry(void* d, void* d2, const void* a, const void* b, u64 n, double s, unsigned div, int pre) {
    typedef typename E::S S;
    const Fn<E, O, UNARY> f = {s, div, pre != 0};
    if (d2)
        run<E, O, UNARY, true>((S*)d, (S*)d2, (const S*)a, (const S*)b, n, f);
    else
        run<E, O, UNARY, false>((S*)d, (S*)0, (const S*)a, (const S*)b, n, f);
}

// occl_reduce_<type>_<op>(dst, dst2 or null, a, b, count, premul scalar, divisor or 0, premul?)
#define OCCL_REDUCE(T, E, OPN, O)                                                                  \
    extern "C" __global__ void __launch_bounds__(512)                                              \
        occl_reduce_##T##_##OPN(void* d, void* d2, const void* a, const void* b, u64 n, double s,  \
                                unsigned div, int pre) {                                           \
        entry<E, O, false>(d, d2, a, b, n, s, div, pre);                                           \
    }

// occl_scale_<type>(dst, dst2 or null, a, count, premul scalar, divisor or 0, premul?)
#define OCCL_SCALE(T, E)                                                                           \
    extern "C" __global__ void __launch_bounds__(512)                                              \
        occl_scale_##T(void* d, void* d2, const void* a, u64 n, double s, unsigned div, int pre) { \
        entry<E, OpSum, true>(d, d2, a, a, n, s, div, pre);                                        \
    }

#define OCCL_TYPE(T, E)                                                                            \
    OCCL_REDUCE(T, E, sum, OpSum)                                                                  \
    OCCL_REDUCE(T, E, prod, OpProd)                                                                \
    OCCL_REDUCE(T, E, max, OpMax)                                                                  \
    OCCL_REDUCE(T, E, min, OpMin)                                                                  \
    OCCL_SCALE(T, E)

OCCL_TYPE(i8, I8)
OCCL_TYPE(u8, U8)
OCCL_TYPE(i32, I32)
OCCL_TYPE(u32, U32)
OCCL_TYPE(i64, I64)
OCCL_TYPE(u64, U64)
OCCL_TYPE(f16, F16)
OCCL_TYPE(bf16, BF16)
OCCL_TYPE(f32, F32)
OCCL_TYPE(f64, F64)
#ifdef OCCL_HAVE_FP8
OCCL_TYPE(f8e4m3, F8E4M3)
OCCL_TYPE(f8e5m2, F8E5M2)
#endif
