// Byte copy into one or two destinations (the ring's "copy and pass on" step), any alignment.
//
// The widest word that every pointer shares an offset in (16 bytes, else 4, else 1) is used: a
// byte head aligns the destination, words move the body, a byte tail ends it.

template <class V>
DEV void copy_words(unsigned char* d, unsigned char* d2, const unsigned char* s, u64 n) {
    const u64 t = gtid(), st = gstride();
    u64 head = (sizeof(V) - ((u64)d & (sizeof(V) - 1))) & (sizeof(V) - 1);
    if (head > n) head = n;
    for (u64 i = t; i < head; i += st) {
        d[i] = s[i];
        if (d2) d2[i] = s[i];
    }
    const u64 nw = (n - head) / sizeof(V);
    const V* sv = (const V*)(s + head);
    V* dv = (V*)(d + head);
    V* d2v = (V*)(d2 + head);
    for (u64 base = t; base < nw; base += st * OCCL_UNROLL) {
        V x[OCCL_UNROLL];
#pragma unroll
        for (int u = 0; u < OCCL_UNROLL; u++) {
            const u64 i = base + u * st;
            if (i < nw) x[u] = sv[i];
        }
#pragma unroll
        for (int u = 0; u < OCCL_UNROLL; u++) {
            const u64 i = base + u * st;
            if (i < nw) {
                dv[i] = x[u];
                if (d2) d2v[i] = x[u];
            }
        }
    }
    for (u64 i = head + nw * sizeof(V) + t; i < n; i += st) {
        d[i] = s[i];
        if (d2) d2[i] = s[i];
    }
}

// occl_copy(dst, dst2 or null, src, bytes)
extern "C" __global__ void __launch_bounds__(512) occl_copy(void* d, void* d2, const void* s, u64 n) {
    u64 diff = (u64)s ^ (u64)d;
    if (d2) diff |= (u64)d2 ^ (u64)d;
    unsigned char* db = (unsigned char*)d;
    unsigned char* d2b = (unsigned char*)d2;
    const unsigned char* sb = (const unsigned char*)s;
    if ((diff & 15) == 0)
        copy_words<uint4>(db, d2b, sb, n);
    else if ((diff & 3) == 0)
        copy_words<unsigned>(db, d2b, sb, n);
    else
        copy_words<unsigned char>(db, d2b, sb, n);
}
