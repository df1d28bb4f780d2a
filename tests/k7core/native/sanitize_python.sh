#!/usr/bin/env bash
# Build both compiled kernel modules (k7core._native._k7 through cffi, k7core._native._fast)
# with AddressSanitizer + UndefinedBehaviorSanitizer in a copy of the package and run the
# Python kernel tests against them: sanitize_python.sh [OUTDIR [PYTEST ARGS...]].
# Default tests: the kernel's (tests/k7core/native/test_kernel.py), recovery and format (which
# drive the scanners through the library), and the API, fault, spare and thread tests
# (the fast paths of _fast, the kernel's fault-injection global, the flusher thread),
# a damaged directory (the cursor walk, the SIGBUS guard's zero pages), permissions, and
# shared writers (the lock and recovery paths, in writer processes the tests start and kill:
# they inherit the preload and import the instrumented copy), and the lifetimes of what a
# queue maps (the stress run's threads open, use, drop and close queues, groups, k7async
# channels and topic consumers at random: a use after free is reported here).
# Any sanitizer report, in the test process or a child, fails the run (nonzero exit, the
# reports on stderr). PYTHON picks the
# interpreter (it needs pytest, hypothesis, crc32c, cffi, setuptools); CC the compiler.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
if [ -n "${1:-}" ]; then
    out="$1"
else
    out="$(mktemp -d)" && trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out" && out="$(cd "$out" && pwd)"
shift || true
if [ "$#" -eq 0 ]; then
    set -- tests/k7core/native/test_kernel.py tests/k7core/test_recovery.py tests/k7core/test_format.py \
        tests/k7core/test_api.py tests/k7core/test_faults.py tests/k7core/test_spare.py \
        tests/k7core/test_threads.py tests/k7core/test_damage.py tests/k7core/test_permissions.py \
        tests/k7core/test_shared_writers.py tests/k7core/test_lifetimes.py \
        tests/k7core/test_lifetime_stress.py
fi
python="$(command -v "${PYTHON:-python3}")"
case "$python" in /*) ;; *) python="$PWD/$python" ;; esac  # not resolved: keep the venv
cc="${CC:-gcc}"
# -fno-wrapv undoes the -fwrapv of CPython's own CFLAGS (which extensions inherit), under
# which signed overflow is defined and UBSan would not report it.
flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -O1 -g -fno-wrapv"
asan="$("$cc" -print-file-name=libasan.so)"
case "$asan" in /*) ;; *) echo "no libasan for $cc" >&2; exit 2 ;; esac

# A copy of the sources only: no compiled modules, so nothing uninstrumented can be imported.
src="$out/src"
rm -rf "$src" && mkdir -p "$src"
cp "$repo/setup.py" "$src/"
cp -r "$repo/k7core" "$repo/k7async" "$repo/tests" "$src/"  # k7async too: tests/k7async would shadow an installed one
find "$src" \( -name '*.so' -o -name '__pycache__' -o -name '_k7.c' \) -prune -exec rm -rf {} +

start=$(date +%s)
if ! (cd "$src" && CC="$cc" K7_SANITIZE_FLAGS="$flags" "$python" tests/k7core/native/sanitized_build.py) \
    >"$out/build.log" 2>&1; then
    cat "$out/build.log" >&2
    exit 2
fi
# pyproject.toml only now, for pytest's settings: its metadata needs a newer setuptools
# than a venv may have (pip builds in an isolated environment), and build_ext needs none.
cp "$repo/pyproject.toml" "$src/"
echo "k7-sanitized build $(( $(date +%s) - start ))s"

# ASan must be the first library loaded, so it is preloaded into the (uninstrumented)
# interpreter; CPython leaks by design, so no leak check. PYTHONMALLOC=malloc puts Python's
# own buffers (bytearrays handed to the kernel) in ASan's redzoned heap. CFLAGS/LDFLAGS
# instrument what the tests compile themselves (test_kernel.py's software-CRC wrapper).
start=$(date +%s)
cd "$src"
# Reports go to files ($out/sanitizer.<pid>): a child's would otherwise be lost with its stderr.
rm -f "$out"/sanitizer.*
status=0
env LD_PRELOAD="$asan" \
    ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:print_summary=1:log_path=$out/sanitizer" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$out/sanitizer" \
    PYTHONMALLOC=malloc PYTHONPATH="$src:$src/tests/k7core/native" K7_SANITIZED_ROOT="$src" \
    CC="$cc" CFLAGS="$flags" LDFLAGS="$flags" \
    "$python" -m pytest -q --capture=sys -p no:cacheprovider -p sanitized_plugin "$@" || status=$?
echo "k7-sanitized tests $(( $(date +%s) - start ))s"
if compgen -G "$out/sanitizer.*" >/dev/null; then
    cat "$out"/sanitizer.* >&2
    echo "k7-sanitized: sanitizer reports above" >&2
    exit 1
fi
exit "$status"
