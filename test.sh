#!/usr/bin/env bash
# The repository's one test command: ./test.sh
#   1. builds the solution in Release,
#   2. builds and runs the native C tests with CTest, then (with aarch64-linux-gnu-gcc and
#      qemu-aarch64 on PATH) cross-builds them for linux-arm64 and runs them under qemu-user,
#   3. runs every xunit project under tests/ (dotnet test --no-build),
#   4. runs the package consumer check (tests/consumer/run.sh).
# Steps 2-4 all run even when one fails; the script exits non-zero when anything failed and ends
# with one line: "Summary: N passed, N failed".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

export DOTNET_CLI_TELEMETRY_OPTOUT=1 DOTNET_NOLOGO=1 DOTNET_SKIP_FIRST_TIME_EXPERIENCE=1

SOLUTION=Kestrel.Transport.Linux.slnx
RESULTS_DIR=artifacts/test-results
NATIVE_BUILD_DIR=artifacts/native/obj/ctest
NATIVE_ARM64_BUILD_DIR=artifacts/native/obj/ctest-arm64

passed=0
failed=0
failures=()

section() { printf '\n==== %s ====\n' "$*"; }
record_failure() { failures+=("$1"); }

[[ -f "$SOLUTION" ]] || { echo "test.sh: $SOLUTION is missing." >&2; exit 1; }

# Every test project (tests/*/, benchmarks/*.Tests/) must be in the solution, or --no-build below would test stale output.
missing=()
shopt -s nullglob
test_projects=(tests/*/*.csproj benchmarks/*.Tests/*.csproj)
shopt -u nullglob
for project in "${test_projects[@]}"; do
    grep -Fq "Path=\"$project\"" "$SOLUTION" || missing+=("$project")
done
if (( ${#missing[@]} > 0 )); then
    echo "test.sh: not in $SOLUTION: ${missing[*]}" >&2
    echo "test.sh: add each with: dotnet sln $SOLUTION add PATH" >&2
    exit 1
fi

# ---- 1. build ------------------------------------------------------------------------------------
section "dotnet build $SOLUTION -c Release"
timeout 40m dotnet build "$SOLUTION" -c Release -nologo

mkdir -p "$RESULTS_DIR"

# ---- 2. native tests -----------------------------------------------------------------------------
section "native tests (ctest)"
ctest_log="$RESULTS_DIR/ctest.log"
rm -f "$ctest_log"
if timeout 10m cmake -S src/Native -B "$NATIVE_BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
    && timeout 15m cmake --build "$NATIVE_BUILD_DIR" -j2 \
    && timeout 15m ctest --test-dir "$NATIVE_BUILD_DIR" --output-on-failure 2>&1 | tee "$ctest_log"; then
    ctest_ok=1
else
    ctest_ok=0
fi
# CTest closes with "100% tests passed, 0 tests failed out of 12".
counts="$(sed -n 's/.*tests passed, \([0-9][0-9]*\) tests failed out of \([0-9][0-9]*\).*/\1 \2/p' "$ctest_log" 2> /dev/null | tail -n 1)"
if [[ -n "$counts" ]]; then
    read -r native_failed native_total <<< "$counts"
    passed=$((passed + native_total - native_failed))
    failed=$((failed + native_failed))
    (( native_failed == 0 )) || record_failure "native ctest ($native_failed failed)"
fi
if (( ctest_ok == 0 )) && [[ -z "$counts" || "${native_failed:-0}" -eq 0 ]]; then
    failed=$((failed + 1))
    record_failure "native ctest (did not build or run)"
fi

# ---- 2b. native tests for linux-arm64 under qemu-user --------------------------------------------
# Cross-built with aarch64-linux-gnu-gcc and run by ctest through qemu-aarch64. qemu-user does not
# implement Linux AIO (io_setup fails with ENOSYS), so the AIO suites run with
# KTL_TEST_ALLOW_NO_AIO=1 here and check the synchronous fallback; the x64 run above insists on AIO.
# Nor does it pass SO_ZEROCOPY on (setsockopt fails), so KTL_TEST_ALLOW_NO_ZEROCOPY=1 lets the
# zero-copy send test say so and stop; the x64 run insists on it too. Nor does it implement io_uring
# (io_uring_setup fails with ENOSYS), so KTL_TEST_ALLOW_NO_URING=1 makes the ring suites check that
# clean failure, which is what the transport falls back on; the x64 run insists on a working ring.
section "native tests for linux-arm64 (ctest under qemu-aarch64)"
if command -v aarch64-linux-gnu-gcc > /dev/null 2>&1 && command -v qemu-aarch64 > /dev/null 2>&1; then
    arm64_log="$RESULTS_DIR/ctest-arm64.log"
    rm -f "$arm64_log"
    if timeout 10m cmake -S src/Native -B "$NATIVE_ARM64_BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_TOOLCHAIN_FILE="$PWD/src/Native/toolchains/aarch64-linux-gnu.cmake" \
        "-DCMAKE_CROSSCOMPILING_EMULATOR=qemu-aarch64;-L;/usr/aarch64-linux-gnu" \
        && timeout 15m cmake --build "$NATIVE_ARM64_BUILD_DIR" -j2 \
        && KTL_TEST_ALLOW_NO_AIO=1 KTL_TEST_ALLOW_NO_ZEROCOPY=1 KTL_TEST_ALLOW_NO_URING=1 timeout 15m ctest --test-dir "$NATIVE_ARM64_BUILD_DIR" --output-on-failure 2>&1 | tee "$arm64_log"; then
        arm64_ok=1
    else
        arm64_ok=0
    fi
    counts="$(sed -n 's/.*tests passed, \([0-9][0-9]*\) tests failed out of \([0-9][0-9]*\).*/\1 \2/p' "$arm64_log" 2> /dev/null | tail -n 1)"
    if [[ -n "$counts" ]]; then
        read -r arm64_failed arm64_total <<< "$counts"
        passed=$((passed + arm64_total - arm64_failed))
        failed=$((failed + arm64_failed))
        (( arm64_failed == 0 )) || record_failure "native ctest linux-arm64 ($arm64_failed failed)"
    fi
    if (( arm64_ok == 0 )) && [[ -z "$counts" || "${arm64_failed:-0}" -eq 0 ]]; then
        failed=$((failed + 1))
        record_failure "native ctest linux-arm64 (did not build or run)"
    fi
elif [[ "${KTL_REQUIRE_ARM64:-0}" == "1" ]]; then
    echo "test.sh: KTL_REQUIRE_ARM64=1 but aarch64-linux-gnu-gcc or qemu-aarch64 is missing (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)."
    failed=$((failed + 1))
    record_failure "native ctest linux-arm64 (cross compiler or qemu-aarch64 missing)"
else
    echo "test.sh: SKIPPED the linux-arm64 native tests: aarch64-linux-gnu-gcc or qemu-aarch64 is not on PATH (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)."
fi

# ---- 3. xunit suites -----------------------------------------------------------------------------
for project in "${test_projects[@]}"; do
    name="$(basename "$project" .csproj)"
    is_test="$(dotnet msbuild "$project" -nologo -getProperty:IsTestProject -p:Configuration=Release 2> /dev/null || true)"
    if [[ "$(tr -d '[:space:]' <<< "$is_test")" != "true" ]]; then
        echo "test.sh: $project is not a test project; skipped."
        continue
    fi

    section "dotnet test $project"
    trx="$RESULTS_DIR/$name.trx"
    rm -f "$trx"
    if timeout --kill-after=30s 30m dotnet test "$project" -c Release --no-build \
        --results-directory "$RESULTS_DIR" --logger "trx;LogFileName=$name.trx"; then
        test_ok=1
    else
        test_ok=0
    fi

    project_passed=0
    project_failed=0
    if [[ -f "$trx" ]]; then
        counters="$(grep -o '<Counters [^>]*>' "$trx" | head -n 1)"
        project_passed="$(sed -n 's/.* passed="\([0-9]*\)".*/\1/p' <<< "$counters")"
        project_failed="$(sed -n 's/.* failed="\([0-9]*\)".*/\1/p' <<< "$counters")"
        project_passed="${project_passed:-0}"
        project_failed="${project_failed:-0}"
    fi
    passed=$((passed + project_passed))
    failed=$((failed + project_failed))
    if (( project_failed > 0 )); then
        record_failure "$name ($project_failed failed)"
        # Name each failed test, with the start of its message and the first test-code frame of its
        # stack, in the summary: the end of a CI log is the part that is always kept.
        while IFS= read -r line; do
            record_failure "  $line"
        done < <(python3 - "$trx" <<'PY'
import sys, xml.etree.ElementTree as ET
ns = {"t": "http://microsoft.com/schemas/VisualStudio/TeamTest/2010"}
for result in ET.parse(sys.argv[1]).getroot().iterfind(".//t:UnitTestResult[@outcome='Failed']", ns):
    message = [l.strip() for l in (result.findtext("t:Output/t:ErrorInfo/t:Message", "", ns) or "").strip().splitlines() if l.strip()]
    stack = (result.findtext("t:Output/t:ErrorInfo/t:StackTrace", "", ns) or "").splitlines()
    frame = next((l.strip() for l in stack if "/tests/" in l or "/benchmarks/" in l), "")
    text = " | ".join(message[:4])[:600]
    print(result.get("testName"), "--", text + (f" [{frame[-200:]}]" if frame else ""))
PY
)
    elif (( test_ok == 0 )); then
        # A crash, hang or build problem with no failed test to show for it.
        failed=$((failed + 1))
        record_failure "$name (dotnet test exited non-zero)"
    fi
done

# ---- 4. package consumer check -------------------------------------------------------------------
section "package consumer check (tests/consumer/run.sh)"
if timeout --kill-after=30s 30m tests/consumer/run.sh; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    record_failure "package consumer check"
fi

# ---- summary -------------------------------------------------------------------------------------
echo
if (( ${#failures[@]} > 0 )); then
    for failure in "${failures[@]}"; do
        echo "FAILED: $failure"
    done
fi
echo "Summary: $passed passed, $failed failed"
(( failed == 0 && ${#failures[@]} == 0 ))
