#!/usr/bin/env bash
# The repository's test commands. ./test.sh --help says what each runs.
# Every step runs even when one before it failed; the script exits non-zero when anything failed and ends
# with one line: "Summary: N passed, N failed".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

usage() {
    cat << 'EOF'
Usage: ./test.sh [--quick]

./test.sh            The full run, which CI runs (.ci/run) and a pull request needs: about 15-30 minutes.
                       1. builds the solution in Release;
                       2. builds and runs the native C tests (CTest), and cross-builds them for linux-arm64 and
                          runs them under qemu-user where aarch64-linux-gnu-gcc and qemu-aarch64 are on PATH;
                       3. runs every xunit project under tests/ and benchmarks/*.Tests on .NET 10, every
                          transport kind;
                       4. runs the transport suite and the TechEmpower suite again on the .NET 11 runtime
                          (tests/dotnet11/layout.sh lays it out from NuGet's runtime packs), on what can differ
                          there: Kestrel's Sockets transport (the reference), the transport's default
                          configuration and io_uring. Without the packs (no NuGet) this is skipped with a line
                          saying so, except under CI=true, where it fails;
                       5. runs the package consumer check (tests/consumer/run.sh), on .NET 10 and .NET 11.
./test.sh --quick    For checking a change as you make it: under 5 minutes on 2 cores, build included.
                       1. builds the solution in Release;
                       2. builds and runs the native C tests (CTest, this machine's architecture only);
                       3. runs the unit tests (TechEmpower.Tests' Units, TraceAnalyzer.Tests) and the transport
                          suite on the default configuration only (KTL_TEST_TRANSPORTS=Default), on .NET 10.
./test.sh --help     Shows this.

Results (.trx, ctest logs) go to artifacts/test-results. KTL_REQUIRE_ARM64=1 makes a missing cross compiler or
qemu-aarch64 a failure instead of a skip (CI sets it).
EOF
}

quick=0
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "test.sh: unknown argument '$arg'." >&2; usage >&2; exit 2 ;;
    esac
done

export DOTNET_CLI_TELEMETRY_OPTOUT=1 DOTNET_NOLOGO=1 DOTNET_SKIP_FIRST_TIME_EXPERIENCE=1
# The suites' own selectors (RuntimeUnderTestTests, TransportKind.cs): set per run below, never inherited.
unset KTL_TEST_TRANSPORTS KTL_EXPECT_RUNTIME

SOLUTION=Kestrel.Transport.Linux.slnx
RESULTS_DIR=artifacts/test-results
NATIVE_BUILD_DIR=artifacts/native/obj/ctest
NATIVE_ARM64_BUILD_DIR=artifacts/native/obj/ctest-arm64
DOTNET11_RUNSETTINGS=artifacts/dotnet11/dotnet11.runsettings

passed=0
failed=0
failures=()
started=$SECONDS

section() { printf '\n==== %s ==== (at %dm%02ds)\n' "$*" $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)); }
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

# Runs one ctest build directory's tests, counts them, and records a failure. $1: label, $2: log, rest: the
# commands (configure, build, test) as one shell string, run with bash -c.
run_ctest() {
    local label="$1" log="$2" commands="$3" ok counts native_failed native_total
    rm -f "$log"
    if bash -c "set -o pipefail; $commands" 2>&1 | tee "$log"; then ok=1; else ok=0; fi
    # CTest closes with "100% tests passed, 0 tests failed out of 12".
    counts="$(sed -n 's/.*tests passed, \([0-9][0-9]*\) tests failed out of \([0-9][0-9]*\).*/\1 \2/p' "$log" 2> /dev/null | tail -n 1)"
    if [[ -n "$counts" ]]; then
        read -r native_failed native_total <<< "$counts"
        passed=$((passed + native_total - native_failed))
        failed=$((failed + native_failed))
        (( native_failed == 0 )) || record_failure "$label ($native_failed failed)"
    fi
    if (( ok == 0 )) && [[ -z "$counts" || "${native_failed:-0}" -eq 0 ]]; then
        failed=$((failed + 1))
        record_failure "$label (did not build or run)"
    fi
}

# Runs one xunit project with dotnet test --no-build and counts its results from the .trx.
# $1: the project; $2: the results' name (the .trx and the summary's label); rest: more dotnet test arguments.
run_xunit() {
    local project="$1" name="$2" trx="$RESULTS_DIR/$2.trx" log="$RESULTS_DIR/$2.log" status=0 project_passed=0 project_failed=0
    local counters runtime aborted
    shift 2
    rm -f "$trx"
    timeout --kill-after=30s 30m dotnet test "$project" -c Release --no-build \
        --results-directory "$RESULTS_DIR" --logger "trx;LogFileName=$name.trx" "$@" 2>&1 | tee "$log" || status=$?

    if [[ -f "$trx" ]]; then
        counters="$(grep -o '<Counters [^>]*>' "$trx" | head -n 1)"
        project_passed="$(sed -n 's/.* passed="\([0-9]*\)".*/\1/p' <<< "$counters")"
        project_failed="$(sed -n 's/.* failed="\([0-9]*\)".*/\1/p' <<< "$counters")"
        project_passed="${project_passed:-0}"
        project_failed="${project_failed:-0}"

        # What the suite ran on: its RuntimeUnderTestTests write it (runtime, Kestrel.Core, transport kinds).
        runtime="$(python3 - "$trx" << 'PY'
import sys, xml.etree.ElementTree as ET
ns = {"t": "http://microsoft.com/schemas/VisualStudio/TeamTest/2010"}
for result in ET.parse(sys.argv[1]).getroot().iterfind(".//t:UnitTestResult", ns):
    if ".RuntimeUnderTestTests." in (result.get("testName") or ""):
        print(result.get("outcome"))
        for line in (result.findtext("t:Output/t:StdOut", "", ns) or "").splitlines():
            if line.strip():
                print("  " + line.strip())
PY
)"
        if [[ -n "$runtime" ]]; then
            echo "test.sh: $name ran on:"
            tail -n +2 <<< "$runtime"
        fi
        # A run that must be on another runtime must have proven it: the check ran and passed.
        if [[ -n "${KTL_EXPECT_RUNTIME:-}" && "$(head -n 1 <<< "$runtime")" != "Passed" ]]; then
            failed=$((failed + 1))
            record_failure "$name (RuntimeUnderTestTests did not pass: the run is not proven to be on .NET $KTL_EXPECT_RUNTIME)"
        fi
    fi
    passed=$((passed + project_passed))
    failed=$((failed + project_failed))
    if (( project_failed > 0 )); then
        record_failure "$name ($project_failed failed)"
        # Name each failed test, with the start of its message and the first test-code frame of its
        # stack, in the summary: the end of a CI log is the part that is always kept.
        while IFS= read -r line; do
            record_failure "  $line"
        done < <(python3 - "$trx" << 'PY'
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
    fi
    # A test host that crashed (say out of memory) leaves the tests after the crash unrun and unreported, failed
    # ones or not: that is a failure of its own. So is a hang, and a build problem with no failed test to show.
    aborted="$(grep -m 1 -E 'The active test run was aborted|Test Run Aborted' "$log" || true)"
    if [[ -n "$aborted" ]]; then
        failed=$((failed + 1))
        record_failure "$name (the run was aborted, so tests after that point did not run: $aborted)"
    elif (( status == 124 || status == 137 )); then
        failed=$((failed + 1))
        record_failure "$name (dotnet test did not finish within 30 minutes)"
    elif (( status != 0 && project_failed == 0 )); then
        failed=$((failed + 1))
        record_failure "$name (dotnet test exited with $status)"
    fi
}

is_test_project() {
    local is_test
    is_test="$(dotnet msbuild "$1" -nologo -getProperty:IsTestProject -p:Configuration=Release 2> /dev/null || true)"
    [[ "$(tr -d '[:space:]' <<< "$is_test")" == "true" ]]
}

# ---- 1. build ------------------------------------------------------------------------------------
section "dotnet build $SOLUTION -c Release"
timeout 40m dotnet build "$SOLUTION" -c Release -nologo

mkdir -p "$RESULTS_DIR"

# ---- 2. native tests -----------------------------------------------------------------------------
section "native tests (ctest)"
run_ctest "native ctest" "$RESULTS_DIR/ctest.log" \
    "timeout 10m cmake -S src/Native -B '$NATIVE_BUILD_DIR' -DCMAKE_BUILD_TYPE=Release \
        && timeout 15m cmake --build '$NATIVE_BUILD_DIR' -j2 \
        && timeout 15m ctest --test-dir '$NATIVE_BUILD_DIR' --output-on-failure"

# ---- quick: the unit tests and the transport suite's default configuration ------------------------
if (( quick )); then
    section "dotnet test tests/TechEmpower.Tests (Units only)"
    run_xunit tests/TechEmpower.Tests TechEmpower.Tests.Units --filter "FullyQualifiedName~TechEmpower.Tests.Units."
    section "dotnet test benchmarks/TraceAnalyzer.Tests"
    run_xunit benchmarks/TraceAnalyzer.Tests TraceAnalyzer.Tests
    # Default: the kind whose options are LinuxTransportOptions' defaults (Transports.DefaultKind).
    section "dotnet test tests/Kestrel.Transport.Linux.Tests (the default configuration only)"
    KTL_TEST_TRANSPORTS=Default run_xunit tests/Kestrel.Transport.Linux.Tests Kestrel.Transport.Linux.Tests.default

    echo
    echo "test.sh --quick: not run here: the linux-arm64 C tests, the other transport kinds, the reliability and"
    echo "TechEmpower suites, the .NET 11 runs and the package consumer check (./test.sh runs them all)."
fi

# ---- 2b. native tests for linux-arm64 under qemu-user --------------------------------------------
# Cross-built with aarch64-linux-gnu-gcc and run by ctest through qemu-aarch64. qemu-user does not
# implement Linux AIO (io_setup fails with ENOSYS), so the AIO suites run with
# KTL_TEST_ALLOW_NO_AIO=1 here and check the synchronous fallback; the x64 run above insists on AIO.
# Nor does it pass SO_ZEROCOPY on (setsockopt fails), so KTL_TEST_ALLOW_NO_ZEROCOPY=1 lets the
# zero-copy send test say so and stop; the x64 run insists on it too. Nor does it implement io_uring
# (io_uring_setup fails with ENOSYS), so KTL_TEST_ALLOW_NO_URING=1 makes the ring suites check that
# clean failure, which is what the transport falls back on; the x64 run insists on a working ring.
if (( ! quick )); then
    section "native tests for linux-arm64 (ctest under qemu-aarch64)"
    if command -v aarch64-linux-gnu-gcc > /dev/null 2>&1 && command -v qemu-aarch64 > /dev/null 2>&1; then
        run_ctest "native ctest linux-arm64" "$RESULTS_DIR/ctest-arm64.log" \
            "timeout 10m cmake -S src/Native -B '$NATIVE_ARM64_BUILD_DIR' -DCMAKE_BUILD_TYPE=Release \
                -DCMAKE_TOOLCHAIN_FILE='$PWD/src/Native/toolchains/aarch64-linux-gnu.cmake' \
                '-DCMAKE_CROSSCOMPILING_EMULATOR=qemu-aarch64;-L;/usr/aarch64-linux-gnu' \
                && timeout 15m cmake --build '$NATIVE_ARM64_BUILD_DIR' -j2 \
                && KTL_TEST_ALLOW_NO_AIO=1 KTL_TEST_ALLOW_NO_ZEROCOPY=1 KTL_TEST_ALLOW_NO_URING=1 \
                    timeout 15m ctest --test-dir '$NATIVE_ARM64_BUILD_DIR' --output-on-failure"
    elif [[ "${KTL_REQUIRE_ARM64:-0}" == "1" ]]; then
        echo "test.sh: KTL_REQUIRE_ARM64=1 but aarch64-linux-gnu-gcc or qemu-aarch64 is missing (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)."
        failed=$((failed + 1))
        record_failure "native ctest linux-arm64 (cross compiler or qemu-aarch64 missing)"
    else
        echo "test.sh: SKIPPED the linux-arm64 native tests: aarch64-linux-gnu-gcc or qemu-aarch64 is not on PATH (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)."
    fi
fi

# ---- 3. xunit suites on .NET 10 ------------------------------------------------------------------
if (( ! quick )); then
    for project in "${test_projects[@]}"; do
        if ! is_test_project "$project"; then
            echo "test.sh: $project is not a test project; skipped."
            continue
        fi
        section "dotnet test $project"
        run_xunit "$project" "$(basename "$project" .csproj)"
    done
fi

# ---- 4. the transport and TechEmpower suites on .NET 11 ------------------------------------------
# The suites are built for net10.0 (the SDK here is 10.0.x); they run on .NET 11 through vstest's
# RunConfiguration.DotNetHostPath: the test host starts from the layout's dotnet, with DOTNET_ROOT pointing at the
# layout (which holds only 11.0.0) and DOTNET_ROLL_FORWARD=LatestMajor. DOTNET_HOST_PATH, which SampleLocation starts
# the TechEmpower sample with, points there too, so the sample runs on .NET 11 as well. KTL_EXPECT_RUNTIME=11 makes
# RuntimeUnderTestTests prove both (Environment.Version, Kestrel.Core's version and the files the sample maps).
dotnet11_root=""
if (( ! quick )); then
    section ".NET 11 runtime (tests/dotnet11/layout.sh)"
    layout_log="$RESULTS_DIR/dotnet11-layout.log"
    if dotnet11_root="$(timeout 15m tests/dotnet11/layout.sh 2> "$layout_log")"; then
        cat "$layout_log"
        DOTNET_ROOT="$dotnet11_root" "$dotnet11_root/dotnet" --list-runtimes | sed 's/^/test.sh: .NET 11 layout: /'
        cat > "$DOTNET11_RUNSETTINGS" << XML
<?xml version="1.0" encoding="utf-8"?>
<!-- Written by test.sh: runs a net10.0 test project's test host (and, through DOTNET_HOST_PATH, the TechEmpower sample)
     on the .NET 11 runtime laid out by tests/dotnet11/layout.sh. By hand: dotnet test PROJECT -c Release -s THIS_FILE. -->
<RunSettings>
  <RunConfiguration>
    <DotNetHostPath>$dotnet11_root/dotnet</DotNetHostPath>
    <EnvironmentVariables>
      <DOTNET_ROOT>$dotnet11_root</DOTNET_ROOT>
      <DOTNET_ROLL_FORWARD>LatestMajor</DOTNET_ROLL_FORWARD>
      <DOTNET_HOST_PATH>$dotnet11_root/dotnet</DOTNET_HOST_PATH>
      <KTL_EXPECT_RUNTIME>11</KTL_EXPECT_RUNTIME>
    </EnvironmentVariables>
  </RunConfiguration>
</RunSettings>
XML
    else
        dotnet11_root=""
        reason="$(grep -m 1 -E 'error|: only' "$layout_log" || tail -n 1 "$layout_log")"
        if [[ "${CI:-}" == "true" ]]; then
            cat "$layout_log"
            echo "test.sh: CI=true, and tests/dotnet11/layout.sh could not lay out the .NET 11 runtime (above)."
            failed=$((failed + 1))
            record_failure ".NET 11 runs (tests/dotnet11/layout.sh failed: $reason)"
        else
            echo "test.sh: SKIPPED the .NET 11 runs: tests/dotnet11/layout.sh could not lay out the 11.0.0 runtime ($reason; log: $layout_log)."
        fi
    fi
fi
if [[ -n "$dotnet11_root" ]]; then
    # What can differ on .NET 11 is the runtime and Kestrel under us: the default configuration (Adaptive on epoll),
    # the way back (ThreadPool scheduling, LinuxNative) and io_uring as a user who asks for it gets it (Adaptive), with
    # Sockets, which proves each expectation first. Default follows LinuxTransportOptions' defaults (TransportKind.cs).
    section "dotnet test tests/Kestrel.Transport.Linux.Tests on .NET 11 (Sockets, default configuration, ThreadPool, io_uring)"
    KTL_TEST_TRANSPORTS=Sockets,Default,LinuxNative,LinuxIoUringAdaptive KTL_EXPECT_RUNTIME=11 \
        run_xunit tests/Kestrel.Transport.Linux.Tests Kestrel.Transport.Linux.Tests.net11 --settings "$DOTNET11_RUNSETTINGS"

    # The TechEmpower suite's endpoint classes are named by configuration (Endpoints/Transports.cs): Linux_<mode>
    # starts the sample with the transport's defaults (Adaptive), Linux_io_uring_<mode> with --io io_uring, Sockets_<mode> on
    # Sockets. Those run here; the other configurations stay on the .NET 10 run. Everything outside Endpoints runs.
    endpoints=TechEmpower.Tests.Endpoints
    te_filter="FullyQualifiedName!~$endpoints."
    for class in Linux_middleware Linux_platform Linux_h2c Linux_io_uring_middleware Linux_io_uring_platform Linux_io_uring_h2c \
        Sockets_middleware Sockets_platform Sockets_h2c; do
        te_filter+="|FullyQualifiedName~$endpoints.$class."
    done
    section "dotnet test tests/TechEmpower.Tests on .NET 11 (Sockets, default configuration, io_uring)"
    KTL_EXPECT_RUNTIME=11 \
        run_xunit tests/TechEmpower.Tests TechEmpower.Tests.net11 --settings "$DOTNET11_RUNSETTINGS" --filter "$te_filter"
fi

# ---- 5. package consumer check -------------------------------------------------------------------
if (( ! quick )); then
    section "package consumer check (tests/consumer/run.sh)"
    if timeout --kill-after=30s 30m tests/consumer/run.sh; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        record_failure "package consumer check"
    fi
fi

# ---- summary -------------------------------------------------------------------------------------
echo
if (( ${#failures[@]} > 0 )); then
    for failure in "${failures[@]}"; do
        echo "FAILED: $failure"
    done
fi
echo "test.sh$( (( quick )) && echo " --quick"): $(((SECONDS - started) / 60))m$(printf '%02d' $(((SECONDS - started) % 60)))s"
echo "Summary: $passed passed, $failed failed"
(( failed == 0 && ${#failures[@]} == 0 ))
