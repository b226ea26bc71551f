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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

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
#define BLOCK(c0, c1) \
    uint32_t x0 = (c0) + k0, x1 = (c1) + k1; \
    ROUND(13) ROUND(15) ROUND(26) ROUND(6) x0 += k1; x1 += k2 + 1u; \
    ROUND(17) ROUND(29) ROUND(16) ROUND(24) x0 += k2; x1 += k0 + 2u; \
    ROUND(13) ROUND(15) ROUND(26) ROUND(6) x0 += k0; x1 += k1 + 3u; \
    ROUND(17) ROUND(29) ROUND(16) ROUND(24) x0 += k1; x1 += k2 + 4u; \
    ROUND(13) ROUND(15) ROUND(26) ROUND(6) x0 += k2; x1 += k0 + 5u;
/* Counter i is start + i, or counters[i] when given. mode 0: out0 = x0 ^ x1 (32 random
   bits); mode 1: out0 = x0, out1 = x1 (64); mode 2: out0 = the float32 in [0, 1) that
   jax.random.uniform makes from x0 ^ x1. One loop per case, so that each vectorises. */
#define LOOP(COUNTER, STORE) \
    for (int64_t i = 0; i < n; i++) { \
        uint64_t c = COUNTER; \
        BLOCK((uint32_t)(c >> 32), (uint32_t)c) \
        STORE \
    }
#define STORE_BITS out0[i] = x0 ^ x1;
#define STORE_WORDS out0[i] = x0; out1[i] = x1;
#define STORE_UNIFORM { union { uint32_t u; float f; } v; \
    v.u = ((x0 ^ x1) >> 9) | 0x3F800000u; ((float *)out0)[i] = v.f - 1.0f; }

static CLONES void threefry(uint32_t k0, uint32_t k1, uint64_t start, const uint64_t *counters,
                            int64_t n, int mode, uint32_t *out0, uint32_t *out1) {
    const uint32_t k2 = k0 ^ k1 ^ 0x1BD11BDAu;
    if (counters) {
        if (mode == 0) LOOP(counters[i], STORE_BITS)
        else if (mode == 1) LOOP(counters[i], STORE_WORDS)
        else LOOP(counters[i], STORE_UNIFORM)
    } else {
        if (mode == 0) LOOP(start + (uint64_t)i, STORE_BITS)
        else if (mode == 1) LOOP(start + (uint64_t)i, STORE_WORDS)
        else LOOP(start + (uint64_t)i, STORE_UNIFORM)
    }
}

/* fill(k0, k1, start, counters, n, mode, out0, out1): counters, out0 and out1 are
   addresses (ints; 0 for none) of contiguous CPU buffers the caller owns and keeps
   alive: n uint64 counters, n 32-bit outputs each. The GIL is released meanwhile. */
static PyObject *fill(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "fill() takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    unsigned long k0 = PyLong_AsUnsignedLong(args[0]);
    unsigned long k1 = PyLong_AsUnsignedLong(args[1]);
    unsigned long long start = PyLong_AsUnsignedLongLong(args[2]);
    void *counters = PyLong_AsVoidPtr(args[3]);
    long long n = PyLong_AsLongLong(args[4]);
    long mode = PyLong_AsLong(args[5]);
    void *out0 = PyLong_AsVoidPtr(args[6]);
    void *out1 = PyLong_AsVoidPtr(args[7]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (k0 > 0xFFFFFFFFul || k1 > 0xFFFFFFFFul || n < 0 || mode < 0 || mode > 2
            || (n > 0 && (out0 == NULL || (mode == 1 && out1 == NULL)))) {
        PyErr_SetString(PyExc_ValueError, "fill() got a key word beyond 32 bits, a negative "
                        "length, a mode other than 0, 1, 2, or a missing output buffer");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    threefry((uint32_t)k0, (uint32_t)k1, (uint64_t)start, (const uint64_t *)counters,
             (int64_t)n, (int)mode, (uint32_t *)out0, (uint32_t *)out1);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL,
     "fill(k0, k1, start, counters, n, mode, out0, out1): Threefry-2x32 into CPU buffers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_threefry_kernel",
    "Threefry-2x32 on the CPU as one fused loop (devrng.portable's CPU draws).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__threefry_kernel(void) { return PyModule_Create(&module); }
