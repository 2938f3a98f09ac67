#!/usr/bin/env bash
# Package consumer check: packs Kestrel.Transport.Linux, checks what the .nupkg and .snupkg hold, then
# builds and runs a minimal web app OUTSIDE the repository that takes the package from
# artifacts/packages, and proves its requests are served by the Linux transport (epoll fds and one
# SO_REUSEPORT listener per loop thread), on .NET 10 and then on the .NET 11 runtime (tests/dotnet11/layout.sh).
#
# The pack is a release pack (both RIDs' native assets, each with io_uring, or the pack fails: see
# src/Native/Native.targets) wherever the machine can make one: with the aarch64 cross compiler on PATH,
# or with KTL_REQUIRE_ARM64=1 (CI), which insists. Elsewhere it is a local partial pack
# (-p:KtlLocalPartialPack=true), said so with a SKIPPED line.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PACKAGE_ID="Kestrel.Transport.Linux"
PACKAGE_DIR="$REPO_ROOT/artifacts/packages"
THREADS=2                      # Kestrel__LinuxTransport__ThreadCount for the consumer app
START_TIMEOUT=60               # seconds for the app to answer its first request
STOP_TIMEOUT=30                # seconds for the app to exit after SIGTERM

log() { printf 'consumer: %s\n' "$*"; }
fail() { printf 'consumer: FAIL: %s\n' "$*" >&2; exit 1; }

for tool in dotnet unzip curl ss timeout cmp; do
    command -v "$tool" > /dev/null || fail "'$tool' is not installed (.ci/run installs it)."
done

WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/ktl-consumer.XXXXXX")"
APP_PID=""
APP_LOG="$WORK_DIR/app.log"

cleanup() {
    local status=$?
    if [[ -n "$APP_PID" ]] && kill -0 "$APP_PID" 2> /dev/null; then
        kill -KILL "$APP_PID" 2> /dev/null || true
        wait "$APP_PID" 2> /dev/null || true
    fi
    if [[ $status -ne 0 && -s "$APP_LOG" ]]; then
        echo "---- consumer app output ----" >&2
        tail -n 100 "$APP_LOG" >&2 || true
        echo "-----------------------------" >&2
    fi
    if [[ "${KEEP_CONSUMER_WORK:-0}" == "1" ]]; then
        log "kept $WORK_DIR"
    else
        rm -rf "$WORK_DIR"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- 1. pack -------------------------------------------------------------------------------------
release=0
if command -v aarch64-linux-gnu-gcc > /dev/null 2>&1 || [[ "${KTL_REQUIRE_ARM64:-0}" == "1" ]]; then
    release=1
fi

if (( release )); then
    # The gate first: a release pack that lacks an asset must fail, and name it.
    log "a release pack without the linux-arm64 asset must fail (-p:KtlNativeArm64Enabled=false)"
    refused_log="$WORK_DIR/refused-pack.log"
    if (cd "$REPO_ROOT" && timeout 20m dotnet pack src/Transport.Linux -c Release -o "$WORK_DIR/refused" \
        -p:KtlNativeArm64Enabled=false > "$refused_log" 2>&1); then
        fail "a release pack without runtimes/linux-arm64/native/libktl_native.so succeeded."
    fi
    grep -q "runtimes/linux-arm64/native/libktl_native.so is missing" "$refused_log" \
        || fail "the refused pack did not name the missing asset:"$'\n'"$(tail -n 20 "$refused_log")"
    log "it failed, naming runtimes/linux-arm64/native/libktl_native.so"
    pack_switch=()
else
    log "SKIPPED the release pack: aarch64-linux-gnu-gcc is not on PATH, so this is a local partial pack (-p:KtlLocalPartialPack=true) without runtimes/linux-arm64/native/libktl_native.so (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross liburing-dev:arm64)."
    pack_switch=(-p:KtlLocalPartialPack=true)
fi

mkdir -p "$PACKAGE_DIR"
rm -f "$PACKAGE_DIR/$PACKAGE_ID".[0-9]*.nupkg "$PACKAGE_DIR/$PACKAGE_ID".[0-9]*.snupkg
log "dotnet pack src/Transport.Linux -c Release -o artifacts/packages ${pack_switch[*]}"
(cd "$REPO_ROOT" && timeout 20m dotnet pack src/Transport.Linux -c Release -o artifacts/packages "${pack_switch[@]}")

shopt -s nullglob
packages=("$PACKAGE_DIR/$PACKAGE_ID".[0-9]*.nupkg)
shopt -u nullglob
[[ ${#packages[@]} -eq 1 ]] || fail "expected one $PACKAGE_ID package in $PACKAGE_DIR, found ${#packages[@]}."
NUPKG="${packages[0]}"
VERSION="$(basename "$NUPKG" .nupkg)"
VERSION="${VERSION#"$PACKAGE_ID".}"
log "package $(basename "$NUPKG") (version $VERSION)"

# ---- 2. package contents -------------------------------------------------------------------------
SNUPKG="${NUPKG%.nupkg}.snupkg"
[[ -f "$SNUPKG" ]] || fail "no symbols package $(basename "$SNUPKG") beside $(basename "$NUPKG")."
log "unzip -l $(basename "$NUPKG")"
unzip -l "$NUPKG"
log "unzip -l $(basename "$SNUPKG")"
unzip -l "$SNUPKG"

# A partial pack has the host's asset only; a release pack has both.
native_pairs=("linux-x64:X86-64")
if (( release )); then
    native_pairs+=("linux-arm64:AArch64")
fi

contents="$(unzip -Z1 "$NUPKG")"
required=("lib/net10.0/$PACKAGE_ID.dll" "README.md" "LICENSE" "THIRD-PARTY-NOTICES")
for pair in "${native_pairs[@]}"; do
    required+=("runtimes/${pair%%:*}/native/libktl_native.so")
done
for entry in "${required[@]}"; do
    grep -Fxq "$entry" <<< "$contents" || fail "$(basename "$NUPKG") does not hold $entry. It holds:"$'\n'"$contents"
    log "package holds $entry"
done

# The package ships its own short README, not the repository's, and the repository's licence and notices.
unzip -p "$NUPKG" README.md | cmp -s - "$REPO_ROOT/src/Transport.Linux/README.md" \
    || fail "the package's README.md is not src/Transport.Linux/README.md."
log "package README.md is src/Transport.Linux/README.md"
for file in LICENSE THIRD-PARTY-NOTICES; do
    unzip -p "$NUPKG" "$file" | cmp -s - "$REPO_ROOT/$file" || fail "the package's $file is not the repository's."
done
grep -q "^liburing" "$REPO_ROOT/THIRD-PARTY-NOTICES" || fail "THIRD-PARTY-NOTICES does not name liburing."
log "package LICENSE and THIRD-PARTY-NOTICES are the repository's"

# The version is set in one place (the project's VersionPrefix); the install lines of both READMEs name it.
for readme in README.md src/Transport.Linux/README.md; do
    grep -Fq "Include=\"$PACKAGE_ID\" Version=\"$VERSION\"" "$REPO_ROOT/$readme" \
        || fail "$readme does not install version $VERSION (Include=\"$PACKAGE_ID\" Version=\"$VERSION\")."
done
log "both READMEs install version $VERSION"

# Each native asset is built for the architecture its runtimes/<rid>/ folder names.
command -v readelf > /dev/null || fail "'readelf' is not installed (binutils; .ci/run installs it with gcc)."
for pair in "${native_pairs[@]}"; do
    rid="${pair%%:*}"
    machine="${pair#*:}"
    entry="runtimes/$rid/native/libktl_native.so"
    asset="$WORK_DIR/$rid-libktl_native.so"
    unzip -p "$NUPKG" "$entry" > "$asset"
    header="$(readelf -h "$asset")" || fail "readelf cannot read $entry."
    grep -Eq "^[[:space:]]*Machine:.*[[:space:]]$machine\$" <<< "$header" \
        || fail "$entry is not built for $machine (readelf: $(grep -E 'Class:|Machine:' <<< "$header" | tr -s ' ' | tr '\n' ';'))."
    # Read whole before grep: grep -q stops early, and readelf's SIGPIPE would fail the pipeline (pipefail).
    symbols="$(readelf -sW "$asset")" || fail "readelf cannot read the symbols of $entry."
    grep -qw io_uring_queue_init_params <<< "$symbols" || fail "$entry has no io_uring engine (liburing is not linked in)."
    # liburing is linked in, not exported: an app's own liburing must not resolve to the copy inside.
    exported="$(readelf --dyn-syms -W "$asset")" || fail "readelf cannot read the dynamic symbols of $entry."
    ! grep -E '\bGLOBAL\b.*\bio_uring_[a-z_]+$' <<< "$exported" > /dev/null \
        || fail "$entry exports liburing's symbols ($(grep -oE 'io_uring_[a-z_]+$' <<< "$exported" | head -n 3 | tr '\n' ' ')...)."
    log "$entry is $machine, with its io_uring engine"
done

# On Alpine (musl) the package has no asset of its own. Where the .NET host takes the linux-x64 one, it must load in
# a musl process and work; where it does not take it, the transport runs its managed engine (the test suites'
# LinuxManaged kind). The first half is checked here with musl-gcc (Debian's musl-tools; .ci/run installs it).
if command -v musl-gcc > /dev/null 2>&1; then
    cat > "$WORK_DIR/musl-load.c" <<'C'
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv)
{
    void *library = dlopen(argv[1], RTLD_NOW);
    if (library == NULL) {
        printf("dlopen failed: %s\n", dlerror());
        return 1;
    }
    int (*abi)(void) = (int (*)(void))dlsym(library, "ktl_abi_version");
    int (*ring)(void) = (int (*)(void))dlsym(library, "ktl_ring_supported");
    if (abi == NULL || ring == NULL) {
        printf("missing symbols\n");
        return 1;
    }
    printf("abi %d, io_uring engine %d\n", abi(), ring());
    return 0;
}
C
    musl-gcc -o "$WORK_DIR/musl-load" "$WORK_DIR/musl-load.c" || fail "musl-gcc could not build the load check."
    musl_said="$("$WORK_DIR/musl-load" "$WORK_DIR/linux-x64-libktl_native.so" 2>&1)" \
        || fail "runtimes/linux-x64/native/libktl_native.so does not load in a musl process: $musl_said"
    log "runtimes/linux-x64/native/libktl_native.so loads in a musl process ($musl_said)"
elif [[ "${KTL_REQUIRE_ARM64:-0}" == "1" ]]; then
    fail "musl-gcc is missing (apt-get install musl-tools; .ci/run installs it)."
else
    log "SKIPPED the musl load check: musl-gcc is not on PATH (apt-get install musl-tools)."
fi

# ---- 2b. symbols ---------------------------------------------------------------------------------
# The portable PDB is in the .snupkg. Its SourceLink map (the SDK's own) points a debugger at the packed
# commit on the repository's host; the SDK writes one only when the origin remote is on a host it knows.
PDB_ENTRY="lib/net10.0/$PACKAGE_ID.pdb"
grep -Fxq "$PDB_ENTRY" <<< "$(unzip -Z1 "$SNUPKG")" || fail "$(basename "$SNUPKG") does not hold $PDB_ENTRY."
unzip -p "$SNUPKG" "$PDB_ENTRY" > "$WORK_DIR/packed.pdb"
commit="$(git -C "$REPO_ROOT" rev-parse HEAD)"
origin="$(git -C "$REPO_ROOT" remote get-url origin 2> /dev/null || true)"
if [[ "$origin" =~ ^(https://|git@)github\.com[:/] ]]; then
    grep -aq "raw.githubusercontent.com/[^\"]*/$commit/" "$WORK_DIR/packed.pdb" \
        || fail "the packed PDB has no SourceLink map to commit $commit of $origin."
    log "the packed PDB's SourceLink map points at commit $commit of $origin"
else
    # This clone's origin is not on GitHub (a local clone, as CI's is), so its PDB has no map: prove the same
    # project writes one where it is, in a throwaway clone with a stand-in GitHub origin (managed build only).
    log "origin is '${origin:-none}', not GitHub: proving SourceLink in a throwaway clone with a GitHub origin"
    git clone -q --no-hardlinks --no-checkout "$REPO_ROOT" "$WORK_DIR/sourcelink"
    git -C "$WORK_DIR/sourcelink" checkout -q "$commit"
    git -C "$WORK_DIR/sourcelink" remote set-url origin https://github.com/example/Kestrel.Transport.Linux.git
    (cd "$WORK_DIR/sourcelink" && timeout 10m dotnet build src/Transport.Linux -c Release -nologo -p:KtlNativeEnabled=false \
        > "$WORK_DIR/sourcelink.log" 2>&1) || fail "the throwaway clone did not build:"$'\n'"$(tail -n 20 "$WORK_DIR/sourcelink.log")"
    grep -aq "raw.githubusercontent.com/example/Kestrel.Transport.Linux/$commit/" \
        "$WORK_DIR/sourcelink/src/Transport.Linux/bin/Release/net10.0/$PACKAGE_ID.pdb" \
        || fail "with a GitHub origin the PDB has no SourceLink map to commit $commit."
    log "with a GitHub origin the PDB's SourceLink map points at commit $commit"
fi

# ---- 3. a consumer app outside the repository ---------------------------------------------------
APP_DIR="$WORK_DIR/app"
mkdir -p "$APP_DIR"

# Stop MSBuild and NuGet from picking up anything above the temp folder.
printf '<Project />\n' > "$WORK_DIR/Directory.Build.props"
printf '<Project />\n' > "$WORK_DIR/Directory.Build.targets"
printf '<Project />\n' > "$WORK_DIR/Directory.Packages.props"

# The local folder comes first; the machine's own sources follow (no <clear />).
cat > "$APP_DIR/NuGet.config" <<XML
<?xml version="1.0" encoding="utf-8"?>
<configuration>
  <packageSources>
    <add key="ktl-local-packages" value="$PACKAGE_DIR" />
  </packageSources>
</configuration>
XML

cat > "$APP_DIR/Consumer.csproj" <<XML
<Project Sdk="Microsoft.NET.Sdk.Web">
  <PropertyGroup>
    <TargetFramework>net10.0</TargetFramework>
    <Nullable>enable</Nullable>
    <ImplicitUsings>enable</ImplicitUsings>
    <AssemblyName>Consumer</AssemblyName>
  </PropertyGroup>
  <ItemGroup>
    <PackageReference Include="$PACKAGE_ID" Version="[$VERSION]" />
  </ItemGroup>
</Project>
XML

cat > "$APP_DIR/Program.cs" <<'CS'
var builder = WebApplication.CreateBuilder(args);
builder.WebHost.UseLinuxTransport();
var app = builder.Build();
app.MapGet("/", () => "consumer ok");
app.Run();
CS

# A packages folder of its own, so a stale copy of the package in ~/.nuget/packages is never used.
PACKAGES_CACHE="$WORK_DIR/packages"
log "restore and build in $APP_DIR"
timeout 10m dotnet restore "$APP_DIR/Consumer.csproj" --packages "$PACKAGES_CACHE"
timeout 10m dotnet build "$APP_DIR/Consumer.csproj" -c Release --no-restore -nologo

restored="$PACKAGES_CACHE/${PACKAGE_ID,,}/${VERSION,,}/${PACKAGE_ID,,}.${VERSION,,}.nupkg"
[[ -f "$restored" ]] || fail "restore did not put $PACKAGE_ID $VERSION in $PACKAGES_CACHE."
cmp -s "$restored" "$NUPKG" || fail "the restored $PACKAGE_ID package is not the one just packed."
log "restored package is the one just packed"

APP_DLL="$APP_DIR/bin/Release/net10.0/Consumer.dll"
[[ -f "$APP_DLL" ]] || fail "build produced no $APP_DLL."
[[ -f "$(dirname "$APP_DLL")/runtimes/linux-x64/native/libktl_native.so" ]] \
    || fail "the build output lacks runtimes/linux-x64/native/libktl_native.so."

# ---- 4. run it, on .NET 10 and then on .NET 11 ---------------------------------------------------
listeners_on() { ss -Hltnp "sport = :$1" 2> /dev/null || true; }

pick_port() {
    local port _
    for _ in $(seq 1 50); do
        port=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
        if [[ -z "$(ss -Htan "( sport = :$port or dport = :$port )" 2> /dev/null)" ]]; then
            echo "$port"
            return 0
        fi
    done
    return 1
}

# The directory Kestrel.Core is mapped from in process $1, as the kernel names it.
kestrel_core_of() {
    awk '$6 ~ /\/Microsoft\.AspNetCore\.Server\.Kestrel\.Core\.dll$/ { print $6; exit }' "/proc/$1/maps" 2> /dev/null | xargs -r dirname
}

# Starts the app with the command given ($@, the app's path last), proves that the Linux transport serves it, and
# stops it. $RUNTIME names the run in the log.
serve_and_check() {
    local port url body deadline epolls fd listeners count serving app_status
    port="$(pick_port)" || fail "found no free port."
    url="http://127.0.0.1:$port"
    : > "$APP_LOG"
    log "$RUNTIME: starting the app on $url with Kestrel__LinuxTransport__ThreadCount=$THREADS"
    ASPNETCORE_URLS="$url" \
    ASPNETCORE_ENVIRONMENT=Production \
    Kestrel__LinuxTransport__ThreadCount="$THREADS" \
        "$@" > "$APP_LOG" 2>&1 < /dev/null &
    APP_PID=$!

    body=""
    deadline=$((SECONDS + START_TIMEOUT))
    while (( SECONDS < deadline )); do
        kill -0 "$APP_PID" 2> /dev/null || fail "$RUNTIME: the app exited before answering."
        if body="$(curl -sS --max-time 5 "$url/" 2> /dev/null)"; then
            break
        fi
        body=""
        sleep 0.5
    done
    [[ -n "$body" ]] || fail "$RUNTIME: no answer from $url within ${START_TIMEOUT}s."
    [[ "$body" == "consumer ok" ]] || fail "$RUNTIME: unexpected body from $url/: '$body'."
    log "$RUNTIME: GET $url/ -> '$body'"

    # A few more requests on fresh connections, so more than one loop has had a chance to serve one.
    for _ in 1 2 3 4 5 6; do
        body="$(curl -sS --max-time 5 "$url/")" || fail "$RUNTIME: a later request to $url/ failed."
        [[ "$body" == "consumer ok" ]] || fail "$RUNTIME: unexpected body from a later request: '$body'."
    done

    # ---- 5. prove the Linux transport served it ----------------------------------------------------
    # Every loop thread owns an epoll instance ...
    epolls=0
    for fd in /proc/"$APP_PID"/fd/*; do
        if [[ "$(readlink "$fd" 2> /dev/null || true)" == "anon_inode:[eventpoll]" ]]; then
            epolls=$((epolls + 1))
        fi
    done
    (( epolls >= THREADS )) || fail "$RUNTIME: the app has $epolls epoll fds; a Linux transport with $THREADS threads has at least $THREADS."
    log "$RUNTIME: the app holds $epolls epoll fds (>= $THREADS loop threads)"

    # ... and its own SO_REUSEPORT listener per endpoint. The Sockets transport would show exactly one.
    listeners="$(listeners_on "$port")"
    count="$(grep -c "pid=$APP_PID," <<< "$listeners" || true)"
    if [[ "$count" -ne "$THREADS" ]]; then
        fail "$RUNTIME: expected $THREADS listening sockets on port $port owned by pid $APP_PID, found $count:"$'\n'"$listeners"
    fi
    log "$RUNTIME: port $port has $count listening sockets owned by the app (one per loop thread)"

    # ... and says so at the default log level, in one line naming the endpoint, the loops and the engine.
    serving="Kestrel.Transport.Linux is serving 127.0.0.1:$port on $THREADS event loops: epoll, native engine, Adaptive scheduling."
    grep -Fq "$serving" "$APP_LOG" || fail "$RUNTIME: the app's log lacks the start-up line '$serving'."
    log "$RUNTIME: the app logged '$serving'"

    # Which ASP.NET Core served it: the caller checks this against the runtime it asked for.
    APP_KESTREL="$(kestrel_core_of "$APP_PID")"
    [[ -n "$APP_KESTREL" ]] || fail "$RUNTIME: the app's /proc/$APP_PID/maps shows no Microsoft.AspNetCore.Server.Kestrel.Core.dll."
    log "$RUNTIME: the app maps Kestrel.Core from $APP_KESTREL"

    # ---- 6. stop it --------------------------------------------------------------------------------
    kill -TERM "$APP_PID"
    deadline=$((SECONDS + STOP_TIMEOUT))
    while kill -0 "$APP_PID" 2> /dev/null && (( SECONDS < deadline )); do
        sleep 0.2
    done
    if kill -0 "$APP_PID" 2> /dev/null; then
        fail "$RUNTIME: the app did not exit within ${STOP_TIMEOUT}s of SIGTERM."
    fi
    app_status=0
    wait "$APP_PID" || app_status=$?
    APP_PID=""
    [[ $app_status -eq 0 ]] || fail "$RUNTIME: the app exited with status $app_status after SIGTERM."
    if grep -Eq "Unhandled exception|^fail: " "$APP_LOG"; then
        fail "$RUNTIME: the app logged an error."
    fi
    log "$RUNTIME: the app stopped cleanly on SIGTERM"
}

RUNTIME=".NET 10"
serve_and_check dotnet "$APP_DLL"
[[ "$APP_KESTREL" == */shared/Microsoft.AspNetCore.App/10.* ]] || fail ".NET 10: Kestrel.Core came from $APP_KESTREL, not from an ASP.NET Core 10."

# ---- 7. the same build on .NET 11 ----------------------------------------------------------------
# Teams will run this net10.0 package under ASP.NET Core 11. tests/dotnet11/layout.sh lays out the 11.0.0 shared
# runtime from NuGet's runtime packs; with it as DOTNET_ROOT and DOTNET_ROLL_FORWARD=LatestMajor the same Consumer.dll
# runs there, and its /proc/PID/maps must show Kestrel.Core from the layout's Microsoft.AspNetCore.App/11.0.0. Without
# the packs (no NuGet) this is skipped with a line saying so, except under CI=true, where it fails.
DOTNET11_LOG="$WORK_DIR/dotnet11-layout.log"
if DOTNET11_ROOT="$(timeout 15m "$REPO_ROOT/tests/dotnet11/layout.sh" 2> "$DOTNET11_LOG")"; then
    RUNTIME=".NET 11"
    DOTNET_ROOT="$DOTNET11_ROOT" DOTNET_ROLL_FORWARD=LatestMajor serve_and_check "$DOTNET11_ROOT/dotnet" "$APP_DLL"
    [[ "$APP_KESTREL" == "$(readlink -f "$DOTNET11_ROOT")/shared/Microsoft.AspNetCore.App/11.0.0" ]] \
        || fail ".NET 11: Kestrel.Core came from $APP_KESTREL, not from $DOTNET11_ROOT/shared/Microsoft.AspNetCore.App/11.0.0."
    log ".NET 11: the app ran on ASP.NET Core 11.0.0 from the layout"
elif [[ "${CI:-}" == "true" ]]; then
    cat "$DOTNET11_LOG" >&2
    fail "CI=true, and tests/dotnet11/layout.sh could not lay out the .NET 11 runtime (above)."
else
    log "SKIPPED the .NET 11 run: tests/dotnet11/layout.sh could not lay out the 11.0.0 runtime ($(grep -m 1 -E 'error|: only' "$DOTNET11_LOG" || tail -n 1 "$DOTNET11_LOG"))."
fi
log "1 passed, 0 failed"
