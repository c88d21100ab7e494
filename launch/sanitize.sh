#!/usr/bin/env bash
# The native extension (harness/traces/native: _scan.c, _rewrite.c, _nest.c, which parse
# untrusted trace JSON) under AddressSanitizer and UBSan: `make sanitize`.
#
# 1. builds the three C files into a separate extension, build/sanitize/_scan<suffix>, with
#    ASan + UBSan (every finding fatal), -Werror and gcc's trace-pc coverage (tests/fuzz_cov.c
#    counts it for the fuzzer); the installed in-place .so is not touched;
# 2. runs the native tests (tests/test_native_scan.py, test_native_merged.py, test_runup.py) on it;
# 3. fuzzes scan, rewrite and nest with it for FUZZ_SECONDS (default 60) from the seeds in
#    tests/data/fuzz (tests/fuzz_native.py); a crash's input is saved as build/sanitize/crash-*.bin
#    and the script exits non-zero.
# The sanitized module is loaded in place of the installed one through HARNESS_NATIVE_PATH
# (harness/traces/native/__init__.py), into a Python started with the ASan runtime preloaded.
# Environment: VENV (default .venv), FUZZ_SECONDS, FUZZ_SEED (default: a new seed, printed),
# SANITIZE_CC (default gcc: the runtime is its libasan), SANITIZE_SKIP_TESTS=1 (fuzz only);
# PYTEST_ADDOPTS reaches the tests (tests/test_sanitize.py leaves out the two largest traces).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
CC=${SANITIZE_CC:-gcc}
OUT=build/sanitize
FUZZ_SECONDS=${FUZZ_SECONDS:-60}

if [ ! -x "$PY" ]; then
    echo "sanitize: no $PY; run make setup first (or set VENV)" >&2
    exit 2
fi
LIBASAN=$("$CC" -print-file-name=libasan.so)
if [ ! -e "$LIBASAN" ]; then
    echo "sanitize: $CC has no libasan.so (Debian: apt-get install libasan8)" >&2
    exit 2
fi

SRC=harness/traces/native
INCLUDE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
SUFFIX=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
# float-cast-overflow is UB that -fsanitize=undefined leaves out under gcc
SANITIZE=(-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow)
CFLAGS=("${SANITIZE[@]}" -fno-omit-frame-pointer -g -O1 -Wall -Wextra -Werror -fPIC -I"$INCLUDE")
mkdir -p "$OUT/obj"
echo "sanitize: building $OUT/_scan$SUFFIX"
for name in _scan _rewrite _nest; do
    "$CC" "${CFLAGS[@]}" -fsanitize-coverage=trace-pc -c "$SRC/$name.c" -o "$OUT/obj/$name.o"
done
"$CC" -O2 -Wall -Wextra -Werror -fPIC -c tests/fuzz_cov.c -o "$OUT/obj/fuzz_cov.o"
"$CC" -shared "${SANITIZE[@]}" "$OUT"/obj/{_scan,_rewrite,_nest,fuzz_cov}.o -o "$OUT/_scan$SUFFIX"

# Only Python runs with the ASan runtime preloaded (other programs need not tolerate it).
# Python's own allocations are never freed at exit (leaks: off); PyMem goes through malloc, so
# that ASan sees the extension's buffers (and small inputs) exactly, not pooled by pymalloc.
SANITIZED=(env -u HARNESS_NATIVE_SCAN -u HARNESS_NATIVE_OFF
    HARNESS_NATIVE_PATH="$PWD/$OUT/_scan$SUFFIX"
    LD_PRELOAD="$LIBASAN${LD_PRELOAD:+ $LD_PRELOAD}"
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    PYTHONMALLOC=malloc)
"${SANITIZED[@]}" "$PY" -c 'import os; from harness.traces import native
assert native.extension.__file__ == os.environ["HARNESS_NATIVE_PATH"], native.extension.__file__'

if [ "${SANITIZE_SKIP_TESTS:-0}" != 1 ]; then
    echo "sanitize: the native tests on the sanitized build"
    # --capture=sys: a sanitizer's report goes to fd 2 and must not die in pytest's capture file
    "${SANITIZED[@]}" "$PY" -m pytest -q -p no:cacheprovider --capture=sys \
        tests/test_native_scan.py tests/test_native_merged.py tests/test_runup.py
fi
echo "sanitize: fuzzing for ${FUZZ_SECONDS}s"
"${SANITIZED[@]}" "$PY" tests/fuzz_native.py --seconds "$FUZZ_SECONDS" --out "$OUT" ${FUZZ_SEED:+--seed "$FUZZ_SEED"}
echo "sanitize: clean (${SECONDS}s)"
