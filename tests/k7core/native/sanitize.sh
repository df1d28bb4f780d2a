#!/usr/bin/env bash
# Build the k7 kernel with AddressSanitizer + UndefinedBehaviorSanitizer into the fuzz driver
# (tests/k7core/native/fuzz_kernel.c) and run it: sanitize.sh [SEED] [ITERATIONS] [OUTDIR].
# Any out-of-bounds access, use after free, signed overflow or other undefined behaviour
# aborts with a report; so does a broken invariant. Needs only gcc.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
native="$here/../../../k7core/_native"
seed="${1:-1}"
iterations="${2:-200000}"
out="${3:-$(mktemp -d)}"
${CC:-gcc} -std=c11 -g -O1 -fno-omit-frame-pointer \
    -fsanitize=address,undefined -fno-sanitize-recover=all \
    -Wall -Wextra -I"$native" \
    "$here/fuzz_kernel.c" "$native/k7.c" -o "$out/fuzz_kernel" -lpthread
ASAN_OPTIONS="abort_on_error=1:detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1" \
    "$out/fuzz_kernel" "$seed" "$iterations"
