/* Edge coverage for the fuzzer (tests/fuzz_native.py): linked into the sanitized build of the
 * native extension only (launch/sanitize.sh), never into the installed one.
 *
 * The extension's own files are compiled with -fsanitize-coverage=trace-pc, so gcc calls
 * __sanitizer_cov_trace_pc() at every basic block; this file (compiled without it) counts the
 * (previous block, this block) edges in a hashed map, AFL-style. harness_fuzz_collect(), called
 * through ctypes after each native call, turns the counts into features (edge x hit-count
 * bucket), returns how many were never seen before and clears the counts: an input that gives
 * new features goes into the fuzzer's corpus. */
#include <stdint.h>
#include <string.h>

#define MAP_BITS 16
#define MAP_SIZE (1u << MAP_BITS)

static uint8_t counts[MAP_SIZE];
static uint8_t seen[MAP_SIZE]; /* per edge: a bit per hit-count bucket already met */
static uintptr_t previous;

/* Hidden: the extension's calls bind here, not to any definition in the preloaded sanitizer runtime. */
__attribute__((visibility("hidden"))) void __sanitizer_cov_trace_pc(void) {
    uintptr_t pc = (uintptr_t)__builtin_return_address(0);
    uintptr_t here = (pc ^ (pc >> MAP_BITS)) * 0x9E3779B1u;
    here >>= 7;
    uint8_t *c = &counts[(here ^ previous) & (MAP_SIZE - 1)];
    if (*c != 255) (*c)++;
    previous = here >> 1;
}

static int bucket(uint8_t n) {
    return n == 1 ? 0 : n == 2 ? 1 : n == 3 ? 2 : n < 8 ? 3 : n < 16 ? 4 : n < 32 ? 5 : n < 128 ? 6 : 7;
}

/* The features of the calls since the last collect that were never seen before; clears the counts. */
int harness_fuzz_collect(void) {
    int fresh = 0;
    for (uint32_t i = 0; i < MAP_SIZE; i += 8) {
        uint64_t word;
        memcpy(&word, counts + i, 8);
        if (!word) continue;
        for (uint32_t j = i; j < i + 8; j++) {
            if (!counts[j]) continue;
            uint8_t bit = (uint8_t)(1u << bucket(counts[j]));
            if (!(seen[j] & bit)) {
                seen[j] |= bit;
                fresh++;
            }
            counts[j] = 0;
        }
    }
    previous = 0;
    return fresh;
}

/* How many features have been seen in all (the fuzzer's report). */
int harness_fuzz_features(void) {
    int total = 0;
    for (uint32_t i = 0; i < MAP_SIZE; i++) total += __builtin_popcount(seen[i]);
    return total;
}
