/* devrng._threefry_kernel: Threefry-2x32 (20 rounds) and the common draws on the CPU.
 *
 * Built when devrng is installed (setup.py, an optional extension: without a C
 * compiler the install goes on and CPU draws use tensor ops instead), so it sits in
 * site-packages and is trusted like the rest of the package: nothing is compiled or
 * loaded from a cache at run time. Plain C (GCC or clang) and Python's C API only,
 * no libtorch.
 *
 * The arithmetic is add, xor and rotate on 32-bit words, all wrapping mod 2**32, so
 * the result is the same bits whatever the compiler vectorises. x0 and x1 start as
 * the counter words plus the key; 20 rounds in five groups of four with a key
 * injection after each group (the schedule JAX uses).
 *
 * The float transforms (normal, exponential) repeat devrng._portable.threefry's tensor
 * ops one IEEE operation at a time, each rounded to float32 as torch's eager CPU
 * kernels round it: the same bits on every CPU, provided the compiler neither fuses a
 * multiply and an add nor reorders (no -ffast-math). setup.py passes -ffp-contract=off
 * (GCC, clang) or /fp:precise (MSVC); the pragmas below say the same in the source, and
 * a compiler that cannot be held to it stops the build here.
 *
 * A draw is made in blocks of NB elements: the block's counters, then their words
 * (generate), then one short loop per step of the mode's transform, each over the
 * whole block. Every loop has the same trip count whatever the draw's length (a last
 * partial block is computed whole and only its first elements are copied out), so
 * the code that runs is the same for every length, and short loops of independent
 * elements keep the CPU busy where one long loop per element waited on its chains of
 * dependent operations.
 *
 * Only the limited API of Python 3.11 (setup.py defines Py_LIMITED_API): one abi3 build
 * serves every later CPython.
 */
#if defined(__FAST_MATH__)
#error "devrng's kernel must not be built with -ffast-math: it reorders float operations"
#endif
#if defined(_MSC_VER) && !defined(__clang__)
#if _MSC_VER < 1930
#error "devrng's kernel needs MSVC 19.30 (Visual Studio 2022 17.0) or newer, where /fp:precise does not contract"
#endif
#pragma fp_contract(off)
#elif defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif !defined(__GNUC__)
#error "devrng's kernel is built with GCC, clang or MSVC, which it can keep from fusing multiply-adds"
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Function multi-versioning (AVX-512 / AVX2 picked at load time) where the
 * toolchain and the loader support it (GCC or clang with ifunc, on Linux x86-64). */
#if defined(__linux__) && defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef CLONES
#define CLONES
#endif
#define INLINE static inline __attribute__((always_inline))

#define NB 256 /* elements per block */
/* A loop over a block, not unrolled: every element runs the same machine code, so the
   kernel's check (threefry_cpu.py), whose draws run each loop, runs all of it. */
#define EACH(j) _Pragma("GCC unroll 1") for (int j = 0; j < NB; j++)
#define LANES 32 /* counters the generator advances together */
/* LANES words as one value: two AVX-512 registers, four AVX2 ones, eight SSE ones. The
   rounds of each register are a chain of dependent operations; several independent
   chains side by side keep the CPU's units busy (a third faster with AVX2 than the
   compiler's own vectorisation of one element per iteration). */
typedef uint32_t lanes __attribute__((vector_size(LANES * sizeof(uint32_t))));
/* The same, read from and written to any uint32_t array. */
typedef uint32_t lanes_at __attribute__((vector_size(LANES * sizeof(uint32_t)), aligned(4),
                                          may_alias));

#define ROTL(x, r) (((x) << (r)) | ((x) >> (32 - (r))))
#define ROUND(r) x0 += x1; x1 = ROTL(x1, r); x1 ^= x0;
#define ROUNDS(k0, k1, k2) \
    ROUND(13) ROUND(15) ROUND(26) ROUND(6) x0 += k1; x1 += k2 + 1u; \
    ROUND(17) ROUND(29) ROUND(16) ROUND(24) x0 += k2; x1 += k0 + 2u; \
    ROUND(13) ROUND(15) ROUND(26) ROUND(6) x0 += k0; x1 += k1 + 3u; \
    ROUND(17) ROUND(29) ROUND(16) ROUND(24) x0 += k1; x1 += k2 + 4u; \
    ROUND(13) ROUND(15) ROUND(26) ROUND(6) x0 += k2; x1 += k0 + 5u;

/* The counters of elements i to i + NB - 1 as high and low words: start + i + j, or
   counters[i + j], 0 past the m (<= NB) elements of the draw the block holds. */
INLINE void counter_words(uint64_t start, const uint64_t *counters, int64_t i, int64_t m,
                          uint32_t *hi, uint32_t *lo) {
    if (counters) {
        uint64_t padded[NB];
        const uint64_t *c = counters + i;
        if (m < NB) {
            memset(padded, 0, sizeof padded);
            memcpy(padded, c, (size_t)m * sizeof(uint64_t));
            c = padded;
        }
        EACH(j) {
            hi[j] = (uint32_t)(c[j] >> 32);
            lo[j] = (uint32_t)c[j];
        }
    } else {
        uint64_t first = start + (uint64_t)i;
        uint32_t h = (uint32_t)(first >> 32), l = (uint32_t)first;
        EACH(j) {
            lo[j] = l + (uint32_t)j;
            hi[j] = h + (lo[j] < l); /* the carry where the low word wraps */
        }
    }
}

/* Threefry-2x32 of the NB counters hi:lo under the key (k0, k1): x0 ^ x1 into out0
   (out1 NULL), or x0 into out0 and x1 into out1. */
INLINE void generate(uint32_t k0, uint32_t k1, const uint32_t *hi, const uint32_t *lo,
                     uint32_t *out0, uint32_t *out1) {
    const uint32_t k2 = k0 ^ k1 ^ 0x1BD11BDAu;
    _Pragma("GCC unroll 1") for (int j = 0; j < NB; j += LANES) {
        lanes x0 = *(const lanes_at *)(hi + j) + k0, x1 = *(const lanes_at *)(lo + j) + k1;
        ROUNDS(k0, k1, k2)
        if (out1) {
            *(lanes_at *)(out0 + j) = x0;
            *(lanes_at *)(out1 + j) = x1;
        } else {
            *(lanes_at *)(out0 + j) = x0 ^ x1;
        }
    }
}

typedef union { uint32_t u; float f; } f32bits;

/* jax.random.uniform's float32: the top 23 bits as the mantissa of [1, 2), minus 1. */
INLINE float unit32(uint32_t bits) {
    f32bits v;
    v.u = (bits >> 9) | 0x3F800000u;
    return v.f - 1.0f;
}

/* jax.random.uniform's float64: the top 52 of the 64 bits x0:x1, in the same way. */
INLINE double unit64(uint32_t x0, uint32_t x1) {
    union { uint64_t u; double d; } v;
    v.u = ((((uint64_t)x0 << 32) | x1) >> 12) | 0x3FF0000000000000u;
    return v.d - 1.0;
}

/* devrng._portable.threefry.log32: frexp, m moved into [sqrt(1/2), sqrt(2)), and
   log(m) = 2 atanh(s) as an odd series in s = (m - 1) / (m + 1). t is a positive
   normal float32 here. The constants are the Python doubles rounded to float32, as
   torch rounds a Python scalar to the tensor's dtype. */
INLINE float log32(float t) {
    f32bits v;
    v.f = t;
    int32_t exponent = (int32_t)(v.u >> 23) - 126;
    v.u = (v.u & 0x007FFFFFu) | 0x3F000000u; /* frexp's mantissa, in [0.5, 1) */
    float m = v.f;
    int small = m < 0.7071067690849304f;
    m *= small ? 2.0f : 1.0f; /* a select of constants, so that the loop vectorises */
    exponent -= small;
    float s = (m - 1.0f) / (m + 1.0f);
    float z = s * s;
    float p = (float)(2.0 / 9);
    p = p * z + (float)(2.0 / 7);
    p = p * z + (float)(2.0 / 5);
    p = p * z + (float)(2.0 / 3);
    p = p * z + 2.0f;
    return s * p + (float)exponent * (float)0.6931471805599453;
}

/* devrng._portable.threefry.erfinv32 (Giles' single-precision method):
   erfinv(x) = p(w) * x for w = -log((1 - x)(1 + x)), p a polynomial in w for w < 5 and
   another in sqrt(w) for the tails (w >= 5, about 1 draw in 300). */
INLINE float erfinv_central(float w) {
    float c = w - 2.5f;
    float p = 2.81022636e-08f;
    p = p * c + 3.43273939e-07f;
    p = p * c + -3.5233877e-06f;
    p = p * c + -4.39150654e-06f;
    p = p * c + 2.1858087e-04f;
    p = p * c + -1.25372503e-03f;
    p = p * c + -4.17768164e-03f;
    p = p * c + 2.46640727e-01f;
    p = p * c + 1.50140941e00f;
    return p;
}

INLINE float erfinv_tail(float w) {
    float t = __builtin_sqrtf(w) - 3.0f;
    float p = -2.00214257e-04f;
    p = p * t + 1.00950558e-04f;
    p = p * t + 1.34934322e-03f;
    p = p * t + -3.67342844e-03f;
    p = p * t + 5.73950773e-03f;
    p = p * t + -7.6224613e-03f;
    p = p * t + 9.43887047e-03f;
    p = p * t + 1.00167406e00f;
    p = p * t + 2.83297682e00f;
    return p;
}

/* devrng._portable.threefry.affine for float32: x * scale + shift in float64 (the
   product of a float32 and a float64 the tensor ops make there, then the sum), rounded
   once to float32. */
INLINE float affine32(float x, double scale, double shift) {
    return (float)((double)x * scale + shift);
}

/* devrng._portable.threefry.normal in float32 (NORMAL; NORMAL_AT with at = 1, then
   affine32) for a block of bits: sqrt(2) * erfinv(x) with x = jax.random.uniform on
   [nextafter(-1, 0), 1), that is u * 2 + lo rounded once (the tensor ops round the
   exact float64 value; the float32 sum of the exact 2u and lo rounds the same),
   clamped at lo. The tail polynomial runs only for a block that needs it. */
INLINE void normal_block(const uint32_t *bits, int at, double scale, double shift,
                         float *out) {
    const float lo = -0.99999994039535522f; /* -1 + 2**-24 */
    const float root2 = 1.41421353816986084f; /* sqrt(2) rounded to float32 */
    float x[NB], w[NB];
    EACH(j) {
        float u = unit32(bits[j]) * 2.0f + lo;
        x[j] = u < lo ? lo : u;
    }
    EACH(j) {
        w[j] = -log32((1.0f - x[j]) * (1.0f + x[j]));
    }
    int tails = 0;
    EACH(j) {
        float z = erfinv_central(w[j]) * x[j] * root2;
        out[j] = at ? affine32(z, scale, shift) : z;
        tails |= w[j] >= 5.0f;
    }
    /* The tails, by 32 elements: a block of 256 holds one in 58% of blocks, 32 in 10%. */
    _Pragma("GCC unroll 1") for (int k = 0; tails && k < NB; k += 32) {
        int here = 0;
        _Pragma("GCC unroll 1") for (int j = k; j < k + 32; j++) {
            here |= w[j] >= 5.0f;
        }
        if (here) {
            _Pragma("GCC unroll 1") for (int j = k; j < k + 32; j++) {
                float z = erfinv_tail(w[j]) * x[j] * root2;
                z = at ? affine32(z, scale, shift) : z;
                out[j] = w[j] >= 5.0f ? z : out[j];
            }
        }
    }
}

/* The float16 and bfloat16 bit patterns of a float32, rounded to nearest even (as torch's
   conversions round). */
INLINE uint16_t bf16_of(float x) {
    f32bits v;
    v.f = x;
    if ((v.u & 0x7FFFFFFFu) > 0x7F800000u) {
        return 0x7FC0u; /* NaN, as torch makes it */
    }
    return (uint16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}

INLINE uint16_t f16_of(float x) {
    /* Both roundings are computed and one is selected, so that the loops vectorise. */
    f32bits v, small;
    v.f = x;
    uint32_t sign = (v.u >> 16) & 0x8000u, a = v.u & 0x7FFFFFFFu;
    /* 2**-14 and above: float16's normal numbers, rounded on the 13 bits dropped */
    uint32_t normal = (a + 0xFFFu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
    normal = normal > 0x7C00u ? 0x7C00u : normal; /* beyond the largest: infinity */
    /* below: a multiple of 2**-24, rounded to nearest even by adding and removing 2**23 */
    small.u = a < 0x38800000u ? a : 0u;
    uint32_t sub = (uint32_t)((small.f * 16777216.0f + 8388608.0f) - 8388608.0f);
    uint32_t r = a < 0x38800000u ? sub : normal;
    return (uint16_t)(sign | (a > 0x7F800000u ? 0x7E00u : r)); /* NaN */
}

INLINE uint16_t half_of(float x, int bf16) { return bf16 ? bf16_of(x) : f16_of(x); }

/* x rounded to float16 (bfloat16), as a float32: f16_value(f16_of(x)), computed on the
   float32's own bits (the mantissa rounded to 10 (7) bits; below 2**-14, to a multiple of
   2**-24), for x not NaN. */
INLINE float half_rounded(float x, int bf16) {
    f32bits v, small, r;
    v.f = x;
    uint32_t sign = v.u & 0x80000000u, a = v.u & 0x7FFFFFFFu;
    if (bf16) {
        r.u = (v.u + 0x7FFFu + ((v.u >> 16) & 1u)) & 0xFFFF0000u;
        return r.f;
    }
    uint32_t normal = (a + 0xFFFu + ((a >> 13) & 1u)) & ~0x1FFFu;
    normal = normal > 0x477FE000u ? 0x7F800000u : normal; /* beyond 65504: infinity */
    small.u = a < 0x38800000u ? a : 0u;
    small.f = ((small.f * 16777216.0f + 8388608.0f) - 8388608.0f) * 5.9604644775390625e-08f;
    r.u = sign | (a < 0x38800000u ? small.u : normal);
    return r.f;
}

/* 2**e as a double (0 below the smallest subnormal), from its bits. */
INLINE double pow2(int e) {
    union { uint64_t u; double d; } v;
    v.u = e >= -1022 ? (uint64_t)(e + 1023) << 52 : e >= -1074 ? 1ull << (e + 1074) : 0;
    return v.d;
}

/* devrng._portable.distributions' float64 uniform on [lo, lo + span), u * span + lo rounded
   once (_formula's exact product, _two_sum and _sum_rounded_once, step for step): u is
   k * 2**-52, span is s * 2**a (s an integer of 53 bits), k * s = top * 2**52 + bottom
   exactly; first = top * 2**a and second = bottom * 2**(a - 52) are exact. */
INLINE double uniform64_at(double first, double second, double lo) {
    double high = first + second, low = second - (high - first);
    double total = lo + high, part = total - lo;
    double error = (lo - (total - part)) + (high - part);
    double small = error + low, small_part = small - error;
    double small_error = (error - (small - small_part)) + (low - small_part);
    double sum = total + small, sum_part = sum - total;
    double sum_error = (total - (sum - sum_part)) + (small - sum_part);
    double other = sum + 2.0 * sum_error;
    int halfway = sum_error != 0.0 && other - sum == 2.0 * sum_error;
    int beyond = small_error != 0.0 && ((small_error > 0.0) == (sum_error > 0.0));
    return halfway && beyond ? other : sum;
}

/* Modes of fill (out0/out1 element types in brackets):
   0 BITS        out0 = x0 ^ x1 (32 random bits) [uint32]
   1 WORDS       out0 = x0, out1 = x1 (64) [uint32, uint32]
   2 UNIFORM     out0 = jax.random.uniform's float32 from x0 ^ x1 [float]
   3 UNIFORM64   out0 = jax.random.uniform's float64 from x0:x1 [double]
   4 NORMAL      out0 = devrng's float32 normal from x0 ^ x1 [float]
   5 EXPONENTIAL out0 = -log(1 - u), u the float32 uniform [float]
   6 UNIFORM_AT  out0 = max(shift, affine32(u, scale, shift)): uniform on [shift,
                 shift + scale) [float]
   7 NORMAL_AT   out0 = affine32(z, scale, shift), z the float32 normal [float]
   8 UNIFORM64_AT  out0 = uniform64_at: the float64 uniform on [shift, shift + scale)
                 [double]
   9, 10 UNIT16  out0 = jax.random.uniform's float16 (9) or bfloat16 (10): the low 16 (8)
                 bits of x0 ^ x1 shifted right by 6 (1), times 2**-10 (2**-7) [uint16]
   11, 12 UNIFORM16_AT  out0 = that u, times scale plus shift in float32 (both exact
                 there: the caller checks), rounded to float16 (11) or bfloat16 (12) [uint16]
   13, 14 NORMAL16  out0 = the float32 normal rounded to float16 (13) or bfloat16 (14) [uint16]
   15, 16 NORMAL16_AT  out0 = that half z, times scale plus shift in double (two roundings),
                 rounded to float32 and then to float16 (15) or bfloat16 (16), as torch's
                 conversions from double round [uint16] */
#define MODES 17
enum { BITS, WORDS, UNIFORM, UNIFORM64, NORMAL, EXPONENTIAL, UNIFORM_AT, NORMAL_AT,
       UNIFORM64_AT, UNIT_F16, UNIT_BF16, UNIFORM_F16_AT, UNIFORM_BF16_AT, NORMAL_F16,
       NORMAL_BF16, NORMAL_F16_AT, NORMAL_BF16_AT };

/* The size in bytes of one output element of mode. */
static size_t element_size(int mode) {
    return mode == UNIFORM64 || mode == UNIFORM64_AT ? sizeof(double)
           : mode >= UNIT_F16 ? sizeof(uint16_t) : sizeof(uint32_t);
}

/* One block of mode's draws into out0 (and out1): NB elements of the mode's type. */
INLINE void fill_block(uint32_t k0, uint32_t k1, const uint32_t *hi, const uint32_t *lo,
                       int mode, double scale, double shift, void *out0, void *out1) {
    uint32_t x0[NB], x1[NB];
    float *f = out0, z[NB];
    uint16_t *h = out0;
    const int bf16 = mode >= UNIT_F16 && (mode - UNIT_F16) % 2;
    switch (mode) {
    case BITS:
        generate(k0, k1, hi, lo, out0, NULL);
        break;
    case WORDS:
        generate(k0, k1, hi, lo, out0, out1);
        break;
    case UNIFORM64:
    case UNIFORM64_AT:
        generate(k0, k1, hi, lo, x0, x1);
        if (mode == UNIFORM64) {
            EACH(j) {
                ((double *)out0)[j] = unit64(x0[j], x1[j]);
            }
        } else {
            union { uint64_t u; double d; } v;
            v.d = scale;
            const uint64_t mantissa = v.u & ((1ull << 52) - 1);
            double *d = out0, first[NB], second[NB];
            if (!(scale > 0.0) || !mantissa) { /* 0 or a power of two: u * span is exact */
                EACH(j) {
                    uint64_t k = (((uint64_t)x0[j] << 32) | x1[j]) >> 12;
                    d[j] = (double)k * 2.220446049250313e-16 * scale + shift; /* k * 2**-52 */
                }
                break;
            }
            const uint64_t s = mantissa | 1ull << 52; /* span = s * 2**a */
            const int a = (int)(v.u >> 52) - 1075;
            const double pow_a = pow2(a), pow_am = pow2(a - 52);
            EACH(j) {
                uint64_t k = (((uint64_t)x0[j] << 32) | x1[j]) >> 12;
                unsigned __int128 product = (unsigned __int128)k * s;
                first[j] = (double)(uint64_t)(product >> 52) * pow_a; /* below 2**53: exact */
                second[j] = (double)(uint64_t)(product & ((1ull << 52) - 1)) * pow_am;
            }
            EACH(j) {
                d[j] = uniform64_at(first[j], second[j], shift);
            }
        }
        break;
    default:
        generate(k0, k1, hi, lo, x0, NULL);
        if (mode == UNIFORM) {
            EACH(j) {
                f[j] = unit32(x0[j]);
            }
        } else if (mode == EXPONENTIAL) {
            EACH(j) {
                f[j] = -log32(1.0f - unit32(x0[j]));
            }
        } else if (mode == UNIFORM_AT) {
            const float low = (float)shift; /* shift is a float32 value */
            EACH(j) {
                float r = affine32(unit32(x0[j]), scale, shift);
                f[j] = r < low ? low : r;
            }
        } else if (mode == NORMAL) {
            normal_block(x0, 0, scale, shift, f);
        } else if (mode == NORMAL_AT) {
            normal_block(x0, 1, scale, shift, f);
        } else if (mode == UNIT_F16 || mode == UNIT_BF16
                   || mode == UNIFORM_F16_AT || mode == UNIFORM_BF16_AT) {
            /* u = k * 2**-m, exact in float32; span and shift are float32 values */
            const uint32_t keep = bf16 ? 0xFFu : 0xFFFFu, by = bf16 ? 1 : 6;
            const float unit = bf16 ? 0.0078125f : 0.0009765625f;
            const float span = mode <= UNIT_BF16 ? 1.0f : (float)scale;
            const float low = mode <= UNIT_BF16 ? 0.0f : (float)shift;
            EACH(j) {
                h[j] = half_of((float)((x0[j] & keep) >> by) * unit * span + low, bf16);
            }
        } else {
            normal_block(x0, 0, scale, shift, z);
            if (mode <= NORMAL_BF16) {
                EACH(j) {
                    h[j] = half_of(z[j], bf16);
                }
            } else {
                EACH(j) {
                    z[j] = (float)((double)half_rounded(z[j], bf16) * scale + shift);
                }
                EACH(j) {
                    h[j] = half_of(z[j], bf16);
                }
            }
        }
    }
}

/* Element i of the draw comes from counter start + i, or counters[i] when given. */
static CLONES void threefry(uint32_t k0, uint32_t k1, uint64_t start, const uint64_t *counters,
                            int64_t n, int mode, void *out0, void *out1, double scale,
                            double shift) {
    const size_t size = element_size(mode);
    uint32_t hi[NB], lo[NB];
    union { uint32_t u[NB]; double d[NB]; } last0, last1; /* a last, partial block */
    for (int64_t i = 0; i < n; i += NB) {
        int64_t m = n - i < NB ? n - i : NB;
        char *to0 = (char *)out0 + (size_t)i * size;
        char *to1 = out1 ? (char *)out1 + (size_t)i * size : NULL;
        counter_words(start, counters, i, m, hi, lo);
        /* One call, so one copy of the code, whichever memory it writes. */
        fill_block(k0, k1, hi, lo, mode, scale, shift, m == NB ? (void *)to0 : (void *)&last0,
                   m == NB ? (void *)to1 : (void *)&last1);
        if (m < NB) {
            memcpy(to0, &last0, (size_t)m * size);
            if (to1) {
                memcpy(to1, &last1, (size_t)m * size);
            }
        }
    }
}

/* x mod d for 32-bit x and d >= 1 without a division (integer division does not
   vectorise): with m = floor(2**32 / d) (2**32 - 1 for d = 1), q = (x * m) >> 32 is
   floor(x / d) or one less, so r = x - q * d is in [0, 2d) and one subtraction ends it.
   r fits 32 bits: for d <= 2**31, 2d <= 2**32; above, m = 1 and q = 0, so r = x. */
INLINE uint32_t mod32(uint32_t x, uint32_t d, uint32_t m) {
    uint32_t q = (uint32_t)(((uint64_t)x * m) >> 32);
    uint32_t r = x - q * d;
    return r >= d ? r - d : r;
}

/* jax.random.randint for int32 bounds: higher and lower are the 32 bits of keys
   split(key)[0] and [1]; offset = ((higher % span) * multiplier + lower % span) % span
   in uint32 arithmetic, multiplier = (2**16 % span)**2 % span as JAX computes it. out gets
   NB int64 (wide) or int32 values low + offset.
   The multiplier is 0 for spans above 2**16 and for powers of 2: then offset is
   lower % span and higher is not drawn. Otherwise the span is 3 to 2**16 - 1, nothing
   wraps (both sums stay below span**2 < 2**32), and offset is (higher * multiplier +
   lower) % span as integers, made in double with one reduction instead of three: v below
   2**49 is exact, floor(v / span) is off by at most one (the quotient's error is below
   2**-4), and r = v - q * span is exact, so one correction each way ends it. */
INLINE void randint_block(uint32_t a0, uint32_t a1, uint32_t b0, uint32_t b1,
                          const uint32_t *hi, const uint32_t *lo, uint32_t span,
                          uint32_t multiplier, uint32_t m, int64_t low, int wide, void *out) {
    uint32_t higher[NB], lower[NB], offset[NB];
    generate(b0, b1, hi, lo, lower, NULL);
    if (multiplier) {
        generate(a0, a1, hi, lo, higher, NULL);
        const double d = span, inv = 1.0 / span;
        EACH(j) {
            double v = (double)higher[j] * multiplier + (double)lower[j];
            double r = v - __builtin_floor(v * inv) * d;
            r = r < 0.0 ? r + d : r;
            r = r >= d ? r - d : r;
            offset[j] = (uint32_t)(int32_t)r;
        }
    } else {
        EACH(j) {
            offset[j] = mod32(lower[j], span, m);
        }
    }
    if (wide) {
        EACH(j) {
            ((int64_t *)out)[j] = low + (int64_t)offset[j];
        }
    } else {
        EACH(j) {
            ((int32_t *)out)[j] = (int32_t)(low + (int64_t)offset[j]);
        }
    }
}

static CLONES void randint(uint32_t a0, uint32_t a1, uint32_t b0, uint32_t b1, uint64_t start,
                           const uint64_t *counters, int64_t n, uint32_t span,
                           uint32_t multiplier, int64_t low, int wide, void *out) {
    const uint32_t m = span == 1 ? 0xFFFFFFFFu : (uint32_t)((1ull << 32) / span);
    const size_t size = wide ? sizeof(int64_t) : sizeof(int32_t);
    uint32_t hi[NB], lo[NB];
    int64_t last[NB];
    for (int64_t i = 0; i < n; i += NB) {
        int64_t count = n - i < NB ? n - i : NB;
        char *to = (char *)out + (size_t)i * size;
        counter_words(start, counters, i, count, hi, lo);
        randint_block(a0, a1, b0, b1, hi, lo, span, multiplier, m, low, wide,
                      count == NB ? (void *)to : (void *)last); /* one call, as in threefry */
        if (count < NB) {
            memcpy(to, last, (size_t)count * size);
        }
    }
}

static int key_word(PyObject *arg, uint32_t *word) {
    unsigned long value = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred()) {
        return -1;
    }
    if (value > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_ValueError, "a key word is beyond 32 bits");
        return -1;
    }
    *word = (uint32_t)value;
    return 0;
}

/* fill(k0, k1, start, counters, n, mode, out0, out1, scale, shift): counters, out0 and
   out1 are addresses (ints; 0 for none) of contiguous CPU buffers the caller owns and
   keeps alive: n uint64 counters, n outputs each, of the mode's element type; scale and
   shift (floats) are read by UNIFORM_AT and NORMAL_AT. The GIL is released meanwhile. */
static PyObject *fill(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 10) {
        PyErr_Format(PyExc_TypeError, "fill() takes 10 arguments (%zd given)", nargs);
        return NULL;
    }
    uint32_t k0, k1;
    if (key_word(args[0], &k0) || key_word(args[1], &k1)) {
        return NULL;
    }
    unsigned long long start = PyLong_AsUnsignedLongLong(args[2]);
    void *counters = PyLong_AsVoidPtr(args[3]);
    long long n = PyLong_AsLongLong(args[4]);
    long mode = PyLong_AsLong(args[5]);
    void *out0 = PyLong_AsVoidPtr(args[6]);
    void *out1 = PyLong_AsVoidPtr(args[7]);
    double scale = PyFloat_AsDouble(args[8]);
    double shift = PyFloat_AsDouble(args[9]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (n < 0 || mode < 0 || mode >= MODES
            || (n > 0 && (out0 == NULL || (mode == 1 && out1 == NULL)))) {
        PyErr_SetString(PyExc_ValueError, "fill() got a negative length, a mode other than "
                        "0 to 16, or a missing output buffer");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    threefry(k0, k1, (uint64_t)start, (const uint64_t *)counters, (int64_t)n, (int)mode,
             out0, out1, scale, shift);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* randint(a0, a1, b0, b1, start, counters, n, span, multiplier, low, wide, out): as
   fill, with keys a = split(key)[0] and b = split(key)[1]; out holds n int64 (wide)
   or int32 values low + offset. */
static PyObject *randint_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 12) {
        PyErr_Format(PyExc_TypeError, "randint() takes 12 arguments (%zd given)", nargs);
        return NULL;
    }
    uint32_t a0, a1, b0, b1, span, multiplier;
    if (key_word(args[0], &a0) || key_word(args[1], &a1) || key_word(args[2], &b0)
            || key_word(args[3], &b1) || key_word(args[7], &span)
            || key_word(args[8], &multiplier)) {
        return NULL;
    }
    unsigned long long start = PyLong_AsUnsignedLongLong(args[4]);
    void *counters = PyLong_AsVoidPtr(args[5]);
    long long n = PyLong_AsLongLong(args[6]);
    long long low = PyLong_AsLongLong(args[9]);
    int wide = PyObject_IsTrue(args[10]);
    void *out = PyLong_AsVoidPtr(args[11]);
    if (PyErr_Occurred() || wide < 0) {
        return NULL;
    }
    if (n < 0 || span == 0 || (n > 0 && out == NULL)) {
        PyErr_SetString(PyExc_ValueError, "randint() got a negative length, a span of 0, or a "
                        "missing output buffer");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    randint(a0, a1, b0, b1, (uint64_t)start, (const uint64_t *)counters, (int64_t)n, span,
            multiplier, (int64_t)low, wide, out);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* block(k0, k1, c0, c1): one Threefry-2x32 block, the words (x0, x1) of counter c0:c1 under
   the key (k0, k1) (devrng._portable.threefry.threefry_host: the keys of the draws). */
static PyObject *block(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "block() takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    uint32_t k0, k1, x0, x1;
    if (key_word(args[0], &k0) || key_word(args[1], &k1) || key_word(args[2], &x0)
            || key_word(args[3], &x1)) {
        return NULL;
    }
    const uint32_t k2 = k0 ^ k1 ^ 0x1BD11BDAu;
    x0 += k0;
    x1 += k1;
    ROUNDS(k0, k1, k2)
    return Py_BuildValue("(kk)", (unsigned long)x0, (unsigned long)x1);
}

static void prefix(int64_t *at, int buckets) {
    int64_t sum = 0;
    for (int b = 0; b < buckets; b++) {
        int64_t c = at[b];
        at[b] = sum;
        sum += c;
    }
}

/* Sorts of at least this many pairs (8 MB of packed words, measured: from there on) take
   sort_by_top_byte: three scattering passes over all of them cost more there (measured:
   1.3 times as much at 2**20 pairs, twice at 2**22). */
#define TOP_BYTE_FROM ((int64_t)1 << 20)

/* sort_pairs for n >= TOP_BYTE_FROM pairs: the packed words key << 32 | value
   scattered by the key's top byte into 256 runs of words_tmp (one pass over memory), each
   run then sorted by its key's low 24 bits while it is in cache (three passes of 8 bits,
   through buffer, which holds the largest run) and unpacked into keys and values. Returns
   0, having written nothing, when a value is outside [0, 2**32) or a run would not fit in
   buffer (keys this uneven do not come from random bits): the caller sorts the other way. */
static int sort_by_top_byte(uint32_t *keys, int64_t *values, int64_t n, uint64_t *words_tmp,
                            uint64_t *buffer, int64_t buffer_size) {
    int64_t start[257], at[256];
    uint64_t wide = 0;
    memset(at, 0, sizeof at);
    for (int64_t i = 0; i < n; i++) {
        at[keys[i] >> 24]++;
        wide |= (uint64_t)values[i];
    }
    if (wide >> 32) {
        return 0;
    }
    int64_t sum = 0;
    for (int b = 0; b < 256; b++) {
        if (at[b] > buffer_size) {
            return 0;
        }
        start[b] = sum;
        sum += at[b];
        at[b] = start[b];
    }
    start[256] = n;
    for (int64_t i = 0; i < n; i++) {
        const uint32_t k = keys[i];
        words_tmp[at[k >> 24]++] = (uint64_t)k << 32 | (uint64_t)values[i];
    }
    for (int b = 0; b < 256; b++) {
        const int64_t first = start[b], m = start[b + 1] - first;
        int64_t count[3][256];
        memset(count, 0, sizeof count);
        uint64_t *from = words_tmp + first, *to = buffer;
        for (int64_t i = 0; i < m; i++) {
            const uint32_t k = (uint32_t)(from[i] >> 32);
            count[0][k & 255u]++;
            count[1][(k >> 8) & 255u]++;
            count[2][(k >> 16) & 255u]++;
        }
        for (int d = 0; d < 3; d++) {
            const int shift = 32 + 8 * d;
            int64_t *place = count[d];
            prefix(place, 256);
            for (int64_t i = 0; i < m; i++) {
                to[place[(from[i] >> shift) & 255u]++] = from[i];
            }
            uint64_t *t = from;
            from = to;
            to = t;
        }
        for (int64_t i = 0; i < m; i++) {
            const uint64_t w = from[i];
            keys[first + i] = (uint32_t)(w >> 32);
            values[first + i] = (int64_t)(w & 0xFFFFFFFFu);
        }
    }
    return 1;
}

/* keys[0..n) in their unsigned order, values (int64) moved with them, stable (equal keys
   keep their order), ending back in keys and values. Values in [0, 2**32) (a permutation's
   indices) travel in one word with their key, key << 32 | value: from TOP_BYTE_FROM pairs
   by sort_by_top_byte, and otherwise (or where it declines) by a least-significant-digit
   radix sort in three passes of 11 bits, or four of 8 for fewer than 2**12 (whose counts
   would cost more than their passes; measured on random keys: 11 bits are 10-20% faster
   from 2**12 to 2**18, 8 bits 20% faster at 2**10), the counts of every pass made in the
   pass that packs them. Other values take four passes of 8 bits, keys and values apart. */
static void sort_pairs(uint32_t *keys, int64_t *values, int64_t n, uint32_t *keys_tmp,
                       int64_t *values_tmp) {
    /* (keys_tmp, 4n bytes, holds n / 2 words: the buffer of the runs) */
    if (n >= TOP_BYTE_FROM && sort_by_top_byte(keys, values, n, (uint64_t *)values_tmp,
                                               (uint64_t *)keys_tmp, n / 2)) {
        return;
    }
    int64_t at[4][2048];  /* (64 KB of stack: no state shared between threads) */
    const int digit = n < 4096 ? 8 : 11, passes = (32 + digit - 1) / digit;
    const uint32_t mask = (1u << digit) - 1;
    uint64_t *a = (uint64_t *)values_tmp, *b = (uint64_t *)values;
    uint64_t wide = 0;
    for (int d = 0; d < passes; d++) {  /* (only the buckets a digit has: n may be small) */
        memset(at[d], 0, sizeof(int64_t) << digit);
    }
    for (int64_t i = 0; i < n; i++) {
        const uint64_t v = (uint64_t)values[i];
        wide |= v;
        a[i] = (uint64_t)keys[i] << 32 | (v & 0xFFFFFFFFu);
        for (int d = 0; d < passes; d++) {
            at[d][(keys[i] >> (d * digit)) & mask]++;
        }
    }
    if (wide >> 32 == 0) {
        for (int d = 0; d < passes; d++) {  /* from a into b; then b is a */
            const int shift = 32 + d * digit;
            int64_t *to = at[d];
            prefix(to, 1 << digit);
            for (int64_t i = 0; i < n; i++) {
                b[to[(a[i] >> shift) & mask]++] = a[i];
            }
            uint64_t *t = a;
            a = b;
            b = t;
        }
        for (int64_t i = 0; i < n; i++) {  /* (a may be values: a[i] is read first) */
            const uint64_t w = a[i];
            keys[i] = (uint32_t)(w >> 32);
            values[i] = (int64_t)(w & 0xFFFFFFFFu);
        }
        return;
    }
    for (int shift = 0; shift < 32; shift += 8) {
        int64_t count[256];
        memset(count, 0, sizeof count);
        for (int64_t i = 0; i < n; i++) {
            count[(keys[i] >> shift) & 255u]++;
        }
        prefix(count, 256);
        for (int64_t i = 0; i < n; i++) {
            int64_t to = count[(keys[i] >> shift) & 255u]++;
            keys_tmp[to] = keys[i];
            values_tmp[to] = values[i];
        }
        uint32_t *k = keys;
        int64_t *v = values;
        keys = keys_tmp;
        values = values_tmp;
        keys_tmp = k;
        values_tmp = v;
    }
}

/* sort(keys, values, n, keys_tmp, values_tmp[, indices]): addresses of n uint32 keys, n
   int64 values and scratch of the same sizes; sort_pairs, without the GIL (the permutation's
   stable sorts by random keys, devrng._portable.distributions.randperm). indices true: the
   values are first set to 0, 1, ..., n - 1 (a permutation's first round). */
static PyObject *sort_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5 && nargs != 6) {
        PyErr_Format(PyExc_TypeError, "sort() takes 5 or 6 arguments (%zd given)", nargs);
        return NULL;
    }
    void *keys = PyLong_AsVoidPtr(args[0]), *values = PyLong_AsVoidPtr(args[1]);
    long long n = PyLong_AsLongLong(args[2]);
    void *keys_tmp = PyLong_AsVoidPtr(args[3]), *values_tmp = PyLong_AsVoidPtr(args[4]);
    const int indices = nargs == 6 ? PyObject_IsTrue(args[5]) : 0;
    if (indices < 0 || PyErr_Occurred()) {
        return NULL;
    }
    if (n < 0 || (n > 0 && (!keys || !values || !keys_tmp || !values_tmp))) {
        PyErr_SetString(PyExc_ValueError, "sort() got a negative length or a missing buffer");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    if (indices) {
        for (int64_t i = 0; i < (int64_t)n; i++) {
            ((int64_t *)values)[i] = i;
        }
    }
    sort_pairs(keys, values, (int64_t)n, keys_tmp, values_tmp);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL,
     "fill(k0, k1, start, counters, n, mode, out0, out1, scale, shift): Threefry-2x32 into "
     "CPU buffers."},
    {"randint", (PyCFunction)(void (*)(void))randint_py, METH_FASTCALL,
     "randint(a0, a1, b0, b1, start, counters, n, span, multiplier, low, wide, out): "
     "jax.random.randint for int32 bounds into a CPU buffer."},
    {"block", (PyCFunction)(void (*)(void))block, METH_FASTCALL,
     "block(k0, k1, c0, c1): one Threefry-2x32 block, (x0, x1)."},
    {"sort", (PyCFunction)(void (*)(void))sort_py, METH_FASTCALL,
     "sort(keys, values, n, keys_tmp, values_tmp[, indices]): a stable sort by uint32 keys."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_threefry_kernel",
    "Threefry-2x32 on the CPU as one fused loop (devrng.portable's CPU draws).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__threefry_kernel(void) { return PyModule_Create(&module); }
