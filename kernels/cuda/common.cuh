// Element types as the kernels see them, shared by every kernel source.
//
// Each element type E has a stored type S and a working type W: arithmetic runs in W and the
// result is rounded back to S once per operation, as occl's host reduction does (f16, bf16 and
// the fp8 formats work in f32). Integers wrap. Float max/min ignore a NaN operand (fmaxf).
// Float arithmetic uses the _rn intrinsics so that no multiply-add is ever contracted: results
// must equal the host reference bit for bit. No header is included: NVRTC needs no include path.

typedef unsigned long long u64;
typedef long long i64;

#define DEV static __device__ __forceinline__

DEV float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

DEV unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

DEV float bf2f(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }

DEV unsigned short f2bf(float f) {
#if __CUDA_ARCH__ >= 800
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    // Nearest even: add just under half an ulp plus the kept low bit; NaN stays a quiet NaN.
    unsigned x = __float_as_uint(f);
    if (f != f) return (unsigned short)((x | 0x00400000u) >> 16);
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
#endif
}

#if __CUDA_ARCH__ >= 890
#define OCCL_HAVE_FP8 1

DEV float e4m3_to_f(unsigned char b) {
    unsigned r;
    unsigned short in = b;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(in));
    return h2f((unsigned short)(r & 0xffffu));
}

// satfinite: past 448 saturates, as CUDA's __NV_SATFINITE and occl's host conversion.
DEV unsigned char f_to_e4m3(float x) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
    return (unsigned char)(r & 0xffu);
}

// E5M2 is the top byte of an f16.
DEV float e5m2_to_f(unsigned char b) { return h2f((unsigned short)(((unsigned)b) << 8)); }

// The hardware conversion to E5M2 only exists saturating; E5M2 has infinities and occl rounds
// to them as IEEE does: from 61440 (largest finite 57344 plus half an ulp) up.
DEV unsigned char f_to_e5m2(float x) {
    unsigned short r;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
    unsigned char c = (unsigned char)(r & 0xffu);
    if (fabsf(x) >= 61440.0f) c = (unsigned char)(((__float_as_uint(x) >> 24) & 0x80u) | 0x7cu);
    return c;
}
#endif

// Integers: wrapping add and multiply through the unsigned type; the average's division truncates,
// done in DIV_T so that an nranks past the element's range still truncates correctly.
#define INT_ELEM(NAME, S_, U_, DIV_T)                                                      \
    struct NAME {                                                                          \
        typedef S_ S;                                                                      \
        typedef S_ W;                                                                      \
        DEV W ld(S x) { return x; }                                                        \
        DEV S st(W x) { return x; }                                                        \
        DEV W add(W a, W b) { return (S)((U_)a + (U_)b); }                                 \
        DEV W mul(W a, W b) { return (S)((U_)a * (U_)b); }                                 \
        DEV W max(W a, W b) { return a > b ? a : b; }                                      \
        DEV W min(W a, W b) { return a < b ? a : b; }                                      \
        DEV W div(W a, unsigned n) { return (S)((DIV_T)a / (DIV_T)n); }                    \
        DEV W scale(W a, double) { return a; }                                             \
    };

INT_ELEM(I8, signed char, unsigned char, i64)
INT_ELEM(U8, unsigned char, unsigned char, i64)
INT_ELEM(I32, int, unsigned, i64)
INT_ELEM(U32, unsigned, unsigned, i64)
INT_ELEM(I64, i64, u64, i64)
INT_ELEM(U64, u64, u64, u64)

// Floats working in f32: S is the bit pattern, LD/ST convert.
#define F32W_ELEM(NAME, S_, LD, ST)                                                        \
    struct NAME {                                                                          \
        typedef S_ S;                                                                      \
        typedef float W;                                                                   \
        DEV W ld(S x) { return LD(x); }                                                    \
        DEV S st(W x) { return ST(x); }                                                    \
        DEV W add(W a, W b) { return __fadd_rn(a, b); }                                    \
        DEV W mul(W a, W b) { return __fmul_rn(a, b); }                                    \
        DEV W max(W a, W b) { return fmaxf(a, b); }                                        \
        DEV W min(W a, W b) { return fminf(a, b); }                                        \
        DEV W div(W a, unsigned n) { return __fdiv_rn(a, (float)n); }                      \
        DEV W scale(W a, double s) { return __fmul_rn(a, (float)s); }                      \
    };

DEV float f_id(float x) { return x; }

F32W_ELEM(F32, float, f_id, f_id)
F32W_ELEM(F16, unsigned short, h2f, f2h)
F32W_ELEM(BF16, unsigned short, bf2f, f2bf)
#ifdef OCCL_HAVE_FP8
F32W_ELEM(F8E4M3, unsigned char, e4m3_to_f, f_to_e4m3)
F32W_ELEM(F8E5M2, unsigned char, e5m2_to_f, f_to_e5m2)
#endif

struct F64 {
    typedef double S;
    typedef double W;
    DEV W ld(S x) { return x; }
    DEV S st(W x) { return x; }
    DEV W add(W a, W b) { return __dadd_rn(a, b); }
    DEV W mul(W a, W b) { return __dmul_rn(a, b); }
    DEV W max(W a, W b) { return fmax(a, b); }
    DEV W min(W a, W b) { return fmin(a, b); }
    DEV W div(W a, unsigned n) { return __ddiv_rn(a, (double)n); }
    DEV W scale(W a, double s) { return __dmul_rn(a, s); }
};

// Reduction operators.
struct OpSum { template <class E> DEV typename E::W ap(typename E::W a, typename E::W b) { return E::add(a, b); } };
struct OpProd { template <class E> DEV typename E::W ap(typename E::W a, typename E::W b) { return E::mul(a, b); } };
struct OpMax { template <class E> DEV typename E::W ap(typename E::W a, typename E::W b) { return E::max(a, b); } };
struct OpMin { template <class E> DEV typename E::W ap(typename E::W a, typename E::W b) { return E::min(a, b); } };

// 16 bytes seen as a vector (one 128-bit load or store) or as elements.
template <class S>
union Pack {
    uint4 v;
    S e[16 / sizeof(S)];
};

DEV u64 gtid() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
DEV u64 gstride() { return (u64)gridDim.x * blockDim.x; }
