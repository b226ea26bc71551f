/* devrng._threefry_kernel: Threefry-2x32 (20 rounds) on the CPU as one fused loop.
 *
 * Built when devrng is installed (setup.py, an optional extension: without a C
 * compiler the install goes on and CPU draws use tensor ops instead), so it sits in
 * site-packages and is trusted like the rest of the package: nothing is compiled or
 * loaded from a cache at run time. Plain C and Python's C API only, no libtorch.
 *
 * The arithmetic is add, xor and rotate on 32-bit words, all wrapping mod 2**32, so
 * the result is the same bits whatever the compiler vectorises. x0 and x1 start as
 * the counter words plus the key; 20 rounds in five groups of four with a key
 * injection after each group (the schedule JAX uses).
 *
 * The float transforms (normal, exponential) repeat devrng._threefry's tensor ops one
 * IEEE operation at a time, each rounded to float32 as torch's eager CPU kernels round
 * it: the same bits on every CPU, provided the compiler neither fuses a multiply and
 * an add nor reorders (no -ffast-math). setup.py passes -ffp-contract=off (GCC, clang)
 * or /fp:precise (MSVC); the pragmas below say the same in the source, and a compiler
 * that cannot be held to it stops the build here.
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
#include <math.h>

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

#define ROTL(x, r) (((x) << (r)) | ((x) >> (32 - (r))))
#define ROUND(r) x0 += x1; x1 = ROTL(x1, r); x1 ^= x0;
#define BLOCK(k0, k1, k2, c0, c1) \
    uint32_t x0 = (c0) + k0, x1 = (c1) + k1; \
    ROUND(13) ROUND(15) ROUND(26) ROUND(6) x0 += k1; x1 += k2 + 1u; \
    ROUND(17) ROUND(29) ROUND(16) ROUND(24) x0 += k2; x1 += k0 + 2u; \
    ROUND(13) ROUND(15) ROUND(26) ROUND(6) x0 += k0; x1 += k1 + 3u; \
    ROUND(17) ROUND(29) ROUND(16) ROUND(24) x0 += k1; x1 += k2 + 4u; \
    ROUND(13) ROUND(15) ROUND(26) ROUND(6) x0 += k2; x1 += k0 + 5u;

typedef union { uint32_t u; float f; } f32bits;

/* jax.random.uniform's float32: the top 23 bits as the mantissa of [1, 2), minus 1. */
static inline float unit32(uint32_t bits) {
    f32bits v;
    v.u = (bits >> 9) | 0x3F800000u;
    return v.f - 1.0f;
}

/* devrng._threefry.log32: frexp, m moved into [sqrt(1/2), sqrt(2)), and
   log(m) = 2 atanh(s) as an odd series in s = (m - 1) / (m + 1). t is a positive
   normal float32 here. The constants are the Python doubles rounded to float32, as
   torch rounds a Python scalar to the tensor's dtype. */
static inline float log32(float t) {
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

/* devrng._threefry.erfinv32 (Giles' single-precision method). */
static inline float erfinv32(float x) {
    float w = -log32((1.0f - x) * (1.0f + x));
    float c = w - 2.5f;
    float central = 2.81022636e-08f;
    central = central * c + 3.43273939e-07f;
    central = central * c + -3.5233877e-06f;
    central = central * c + -4.39150654e-06f;
    central = central * c + 2.1858087e-04f;
    central = central * c + -1.25372503e-03f;
    central = central * c + -4.17768164e-03f;
    central = central * c + 2.46640727e-01f;
    central = central * c + 1.50140941e00f;
    float t = __builtin_sqrtf(w) - 3.0f;
    float tail = -2.00214257e-04f;
    tail = tail * t + 1.00950558e-04f;
    tail = tail * t + 1.34934322e-03f;
    tail = tail * t + -3.67342844e-03f;
    tail = tail * t + 5.73950773e-03f;
    tail = tail * t + -7.6224613e-03f;
    tail = tail * t + 9.43887047e-03f;
    tail = tail * t + 1.00167406e00f;
    tail = tail * t + 2.83297682e00f;
    return (w < 5.0f ? central : tail) * x;
}

/* devrng._threefry.normal in float32: sqrt(2) * erfinv(u), u = jax.random.uniform on
   [nextafter(-1, 0), 1): u * 2 + lo rounded once (the tensor ops round the exact float64
   value; the float32 sum of the exact 2u and lo rounds the same), clamped at lo. */
static inline float normal32(uint32_t bits) {
    const float lo = -0.99999994039535522f; /* -1 + 2**-24 */
    float u = unit32(bits) * 2.0f + lo;
    u = u < lo ? lo : u;
    return erfinv32(u) * 1.41421353816986084f; /* sqrt(2) rounded to float32 */
}

/* devrng._threefry.affine for float32: x * scale + shift in float64 (the product of a
   float32 and a float64 the tensor ops make there, then the sum), rounded once to float32. */
static inline float affine32(float x, double scale, double shift) {
    return (float)((double)x * scale + shift);
}

/* Counter i is start + i, or counters[i] when given. One loop per case, so that each
   vectorises. Modes (out0/out1 element types in brackets):
   0 BITS        out0 = x0 ^ x1 (32 random bits) [uint32]
   1 WORDS       out0 = x0, out1 = x1 (64) [uint32, uint32]
   2 UNIFORM     out0 = jax.random.uniform's float32 from x0 ^ x1 [float]
   3 UNIFORM64   out0 = jax.random.uniform's float64 from x0:x1 [double]
   4 NORMAL      out0 = devrng's float32 normal from x0 ^ x1 [float]
   5 EXPONENTIAL out0 = -log(1 - u), u the float32 uniform [float]
   6 UNIFORM_AT  out0 = max(shift, affine32(u, scale, shift)): uniform on [shift,
                 shift + scale) [float]
   7 NORMAL_AT   out0 = affine32(z, scale, shift), z the float32 normal [float] */
#define LOOP(COUNTER, STORE) \
    for (int64_t i = 0; i < n; i++) { \
        uint64_t c = COUNTER; \
        BLOCK(k0, k1, k2, (uint32_t)(c >> 32), (uint32_t)c) \
        STORE \
    }
#define STORE_BITS ((uint32_t *)out0)[i] = x0 ^ x1;
#define STORE_WORDS ((uint32_t *)out0)[i] = x0; ((uint32_t *)out1)[i] = x1;
#define STORE_UNIFORM ((float *)out0)[i] = unit32(x0 ^ x1);
#define STORE_UNIFORM64 { union { uint64_t u; double d; } v; \
    v.u = ((((uint64_t)x0 << 32) | x1) >> 12) | 0x3FF0000000000000u; ((double *)out0)[i] = v.d - 1.0; }
#define STORE_NORMAL ((float *)out0)[i] = normal32(x0 ^ x1);
#define STORE_EXPONENTIAL ((float *)out0)[i] = -log32(1.0f - unit32(x0 ^ x1));
#define STORE_UNIFORM_AT { float r = affine32(unit32(x0 ^ x1), scale, shift); \
    ((float *)out0)[i] = r < low ? low : r; }
#define STORE_NORMAL_AT ((float *)out0)[i] = affine32(normal32(x0 ^ x1), scale, shift);
#define BOTH(STORE) \
    if (counters) LOOP(counters[i], STORE) else LOOP(start + (uint64_t)i, STORE)
#define MODES 8

static CLONES void threefry(uint32_t k0, uint32_t k1, uint64_t start, const uint64_t *counters,
                            int64_t n, int mode, void *out0, void *out1, double scale,
                            double shift) {
    const uint32_t k2 = k0 ^ k1 ^ 0x1BD11BDAu;
    const float low = (float)shift; /* the clamp of UNIFORM_AT: shift is a float32 value */
    switch (mode) {
    case 0: BOTH(STORE_BITS) break;
    case 1: BOTH(STORE_WORDS) break;
    case 2: BOTH(STORE_UNIFORM) break;
    case 3: BOTH(STORE_UNIFORM64) break;
    case 4: BOTH(STORE_NORMAL) break;
    case 5: BOTH(STORE_EXPONENTIAL) break;
    case 6: BOTH(STORE_UNIFORM_AT) break;
    default: BOTH(STORE_NORMAL_AT) break;
    }
}

/* x mod d for 32-bit x and d >= 1 without a division (integer division does not
   vectorise): with m = floor(2**32 / d) (2**32 - 1 for d = 1), q = (x * m) >> 32 is
   floor(x / d) or one less, so r = x - q * d is in [0, 2d) and one subtraction ends it.
   r fits 32 bits: for d <= 2**31, 2d <= 2**32; above, m = 1 and q = 0, so r = x. */
static inline uint32_t mod32(uint32_t x, uint32_t d, uint32_t m) {
    uint32_t q = (uint32_t)(((uint64_t)x * m) >> 32);
    uint32_t r = x - q * d;
    return r >= d ? r - d : r;
}

/* jax.random.randint for int32 bounds: higher and lower are the 32 bits of keys
   split(key)[0] and [1]; offset = ((higher % span) * multiplier + lower % span) % span
   in uint32 arithmetic, multiplier = (2**16 % span)**2 % span as JAX computes it. */
#define RANDINT_LOOP(COUNTER, TYPE) \
    for (int64_t i = 0; i < n; i++) { \
        uint64_t c = COUNTER; \
        uint32_t higher, lower; \
        { BLOCK(a0, a1, a2, (uint32_t)(c >> 32), (uint32_t)c) higher = x0 ^ x1; } \
        { BLOCK(b0, b1, b2, (uint32_t)(c >> 32), (uint32_t)c) lower = x0 ^ x1; } \
        uint32_t product = mod32(higher, span, m) * multiplier; \
        uint32_t offset = mod32(product + mod32(lower, span, m), span, m); \
        ((TYPE *)out)[i] = (TYPE)(low + (int64_t)offset); \
    }

static CLONES void randint(uint32_t a0, uint32_t a1, uint32_t b0, uint32_t b1, uint64_t start,
                           const uint64_t *counters, int64_t n, uint32_t span,
                           uint32_t multiplier, int64_t low, int wide, void *out) {
    const uint32_t a2 = a0 ^ a1 ^ 0x1BD11BDAu, b2 = b0 ^ b1 ^ 0x1BD11BDAu;
    const uint32_t m = span == 1 ? 0xFFFFFFFFu : (uint32_t)((1ull << 32) / span);
    if (wide) {
        if (counters) RANDINT_LOOP(counters[i], int64_t)
        else RANDINT_LOOP(start + (uint64_t)i, int64_t)
    } else {
        if (counters) RANDINT_LOOP(counters[i], int32_t)
        else RANDINT_LOOP(start + (uint64_t)i, int32_t)
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
                        "0 to 7, or a missing output buffer");
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

static PyMethodDef methods[] = {
    {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL,
     "fill(k0, k1, start, counters, n, mode, out0, out1, scale, shift): Threefry-2x32 into "
     "CPU buffers."},
    {"randint", (PyCFunction)(void (*)(void))randint_py, METH_FASTCALL,
     "randint(a0, a1, b0, b1, start, counters, n, span, multiplier, low, wide, out): "
     "jax.random.randint for int32 bounds into a CPU buffer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_threefry_kernel",
    "Threefry-2x32 on the CPU as one fused loop (devrng.portable's CPU draws).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__threefry_kernel(void) { return PyModule_Create(&module); }
