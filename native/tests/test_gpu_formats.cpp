// The GPU modules' format readers (native/runtime/gpu/gpu_blocks.cuh: qfmt<format>::load, what every f32 product of
// a quantized weight reads on the device) run on the host and held to the core's dequantization: each value a
// lane's group gives is eb_dequantize_chunk's value at the column the group names, bit for bit, every column of a
// block given exactly once, for blocks at every alignment a row places them at (a 16-byte-aligned row, as device
// allocations are, and rows at odd addresses). No GPU is needed: the readers are plain arithmetic on loaded words.
// The i-quants' blocks are random and extreme (their largest magnitudes, both signs, f16 d at 65504 and subnormal),
// and the chunks their q8 products read (iq_q8_chunk: signed quants, scales, deltas, d) are held to eb_iq_quants /
// eb_iq1_quants, their scales and d too.
//
//   test_gpu_formats        exit status 0 when every format's reader agrees
#include <cstdio>
#include <cstdlib>
#include <initializer_list>

#include "gpu_host_shim.h"

extern "C" {
#include "eb_formats.h"
#include "eb_test_blocks.h"
}

#define DOT_TILE 4
#include "../runtime/gpu/gpu_blocks.cuh"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static unsigned next_u32() { // xorshift64*
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (unsigned)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static int failures = 0;

static bool all_finite(const float *v, int n) {
    for (int i = 0; i < n; i++)
        if (!std::isfinite(v[i])) return false;
    return true;
}

// An i-quant block at its extreme quants (eb_test_blocks.h), its f16 d by k: 65504, the smallest subnormal, or its own.
template <int DT> static void extreme_block(unsigned char *b, int k) {
    (void)eb_test_extreme_iq(b, DT);
    if (k % 3 != 2) eb_test_iq_set_d(b, DT, k % 3 == 0 ? 0x7bff : 0x0001);
}

// The chunks an i-quant's q8 products read (iq_q8_chunk: iq_chunk's or iq1_chunk's, and d) against the core's
// eb_iq_quants, eb_iq_scale, eb_iq1_quants, eb_iq1_scale and eb_iq1_d, for every chunk of a block.
template <int DT> static void check_chunks(const unsigned char *b, const char *name) {
    for (int j = 0; j < 8; j++) {
        int8_t want[32];
        int delta[4] = {1, 1, 1, 1}, ws[2], s[2];
        unsigned q[8], neg;
        float d = iq_q8_chunk(b, DT, j, q, &neg, s), wd;
        if (gpu_iq1(DT)) {
            eb_iq1_quants(b, DT, j, want, delta);
            for (int h = 0; h < 2; h++) ws[h] = eb_iq1_scale(b, DT, j, h);
            wd = eb_iq1_d(b, DT);
        } else {
            eb_iq_quants(b, DT, j, want);
            for (int h = 0; h < 2; h++) ws[h] = eb_iq_scale(b, DT, j, h);
            wd = eb_f16_to_f32(eb_load_u16(b));
        }
        bool same = s[0] == ws[0] && s[1] == ws[1] && __float_as_uint(d) == __float_as_uint(wd);
        for (int i = 0; i < 32; i++) same = same && (int8_t)(q[i / 4] >> (8 * (i % 4))) == want[i];
        for (int l = 0; l < 4; l++) same = same && ((neg >> l) & 1 ? -1 : 1) == delta[l];
        if (!same && failures < 20) {
            printf("FAIL %s: chunk %d's quants, scales, deltas or d are not the core's\n", name, j);
            failures++;
        }
    }
}

// Blocks of format DT: random bytes (and all-zero, all-one bytes; the i-quants' also extreme blocks), redrawn where a
// scale decodes to inf or NaN.
template <int DT> static void check(const char *name) {
    using F = qfmt<DT>;
    const int blocks = 6, cols = blocks * F::VALS;
    if (gpu_row_bytes(DT, cols) != (unsigned long long)eb_row_bytes(DT, cols)) {
        printf("FAIL %s: gpu_row_bytes %llu, the core's %lld\n", name, gpu_row_bytes(DT, cols),
               (long long)eb_row_bytes(DT, cols));
        failures++;
    }
    int checked = 0;
    for (int base : {0, 1, 2, 3, 4, 8}) {
        // exactly what the row needs, rounded up to the 16 bytes a device allocation has at least: a reader that
        // loads a word none of whose bytes it wants past that is caught by the address sanitizer
        size_t bytes = ((size_t)base + (size_t)blocks * F::BYTES + 15) & ~(size_t)15;
        unsigned char *mem = (unsigned char *)aligned_alloc(16, bytes), *row = mem + base;
        float *ref = (float *)malloc(sizeof(float) * cols);
        int *seen = (int *)malloc(sizeof(int) * cols);
        for (int trial = 0; trial < 40; trial++) {
            do {
                for (size_t i = 0; i < (size_t)blocks * F::BYTES; i++)
                    row[i] = trial == 0 ? 0 : trial == 1 ? 0xff : (unsigned char)next_u32();
                if (gpu_iq(DT) || gpu_iq1(DT))
                    for (int blk = 0; trial >= 2 && trial < 8 && blk < blocks; blk++) // every other block extreme
                        if ((blk + trial) & 1) extreme_block<DT>(row + (size_t)blk * F::BYTES, blk / 2 + trial);
                for (int c = 0; c < cols / EB_CHUNK; c++) eb_dequantize_chunk(row, DT, c, ref + EB_CHUNK * c);
                if (trial < 2 && !all_finite(ref, cols)) trial = 2; // all-one bytes: an inf scale in most formats
            } while (!all_finite(ref, cols));
            if constexpr (gpu_iq(DT) || gpu_iq1(DT))
                for (int blk = 0; blk < blocks; blk++) check_chunks<DT>(row + (size_t)blk * F::BYTES, name);
            memset(seen, 0, sizeof(int) * cols);
            for (int blk = 0; blk < blocks; blk++)
                for (int g = 0; g < F::GROUPS; g++) {
                    float v[F::RUNS * F::RUN];
                    int col[F::RUNS];
                    F::load(row + (size_t)blk * F::BYTES, g, base == 0, v, col);
                    for (int r = 0; r < F::RUNS; r++)
                        for (int i = 0; i < F::RUN; i++) {
                            int c = blk * F::VALS + col[r] + i;
                            if (col[r] < 0 || col[r] + i >= F::VALS) {
                                printf("FAIL %s: group %d names column %d of a %d-value block\n", name, g, col[r] + i,
                                       F::VALS);
                                failures++;
                                continue;
                            }
                            seen[c]++;
                            if (__float_as_uint(v[r * F::RUN + i]) != __float_as_uint(ref[c]) && failures < 20) {
                                printf("FAIL %s: row at +%d, block %d, column %d: %.9g, the core's %.9g\n", name, base,
                                       blk, col[r] + i, v[r * F::RUN + i], ref[c]);
                                failures++;
                            }
                        }
                }
            for (int c = 0; c < cols; c++)
                if (seen[c] != 1 && failures < 20) {
                    printf("FAIL %s: column %d of block %d read %d times\n", name, c % F::VALS, c / F::VALS, seen[c]);
                    failures++;
                }
            checked++;
        }
        free(seen);
        free(ref);
        free(mem);
    }
    printf("%-8s %d rows of %d blocks\n", name, checked, blocks);
}

static const char *format_name(int dtype) {
    switch (dtype) {
#define NAME(name, code, block, block_bytes, ggml_type, quantized, q8_block, scale_rows, scale_cols) \
    case code: return #name;
        EB_FORMATS(NAME)
#undef NAME
    default: return "?";
    }
}

template <int DT> static void check_reader(qfmt<DT> *) { check<DT>(format_name(DT)); }

int main(void) {
#define CHECK(F) check_reader((F *)nullptr)
    // every format the GPU modules read quantized (GPU_FORMATS less the float ones), through the cases they run
    int formats = 0;
    for (int dt = 0; dt < 32; dt++) {
        if (!(GPU_FORMATS & (1u << dt)) || !quantized(dt)) continue;
        switch (dt) { QUANT_CASES(CHECK) }
        formats++;
    }
#undef CHECK
    printf("%d formats, %s\n", formats, failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
