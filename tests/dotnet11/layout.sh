#!/usr/bin/env bash
# Lays out the .NET 11 shared runtime (Microsoft.NETCore.App and Microsoft.AspNetCore.App 11.0.0) as a
# DOTNET_ROOT, from the two runtime packs NuGet serves, and prints that folder's path on stdout.
#
# The SDK here is 10.0.x, so nothing can target net11.0; but an app built for net10.0 runs on this runtime:
#   root="$(tests/dotnet11/layout.sh)"
#   DOTNET_ROOT="$root" DOTNET_ROLL_FORWARD=LatestMajor "$root/dotnet" app.dll
# A folder that holds only 11.0.0 leaves the host nothing else to roll forward to, so a run that starts is a
# run on .NET 11 (check with "$root/dotnet" --list-runtimes, or Kestrel.Core's path in /proc/PID/maps).
# test.sh runs the test suites on it through vstest's RunConfiguration.DotNetHostPath, in the runsettings file it
# writes beside this layout (artifacts/dotnet11/dotnet11.runsettings); tests/consumer/run.sh runs its app on it.
#
# Idempotent: a finished layout (its .complete marker) is reused. Output: artifacts/dotnet11/root, or $1.
# Needs only the .NET SDK (the packs come through the repository's NuGet.config).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION="${KTL_DOTNET11_VERSION:-11.0.0}"
RID=linux-x64
WORK="$REPO_ROOT/artifacts/dotnet11"
ROOT="${1:-$WORK/root}"

log() { printf 'dotnet11: %s\n' "$*" >&2; }

if [[ -f "$ROOT/.complete" && "$(cat "$ROOT/.complete")" == "$VERSION" ]]; then
    echo "$ROOT"
    exit 0
fi

case "$(uname -m)" in
    x86_64) ;;
    *) log "only linux-x64 runtime packs are laid out here (this machine is $(uname -m))."; exit 1 ;;
esac

# A throwaway project whose only job is to restore the two packs (PackageDownload: no reference, no build).
project_dir="$WORK/restore"
packages="$WORK/packages"
mkdir -p "$project_dir"
cp "$REPO_ROOT/NuGet.config" "$project_dir/NuGet.config"
cat > "$project_dir/restore.csproj" << PROJ
<Project Sdk="Microsoft.NET.Sdk">
  <PropertyGroup>
    <TargetFramework>net10.0</TargetFramework>
    <ManagePackageVersionsCentrally>false</ManagePackageVersionsCentrally>
    <ImportDirectoryBuildProps>false</ImportDirectoryBuildProps>
  </PropertyGroup>
  <ItemGroup>
    <PackageDownload Include="Microsoft.NETCore.App.Runtime.$RID" Version="[$VERSION]" />
    <PackageDownload Include="Microsoft.AspNetCore.App.Runtime.$RID" Version="[$VERSION]" />
  </ItemGroup>
</Project>
PROJ
# The throwaway project lives under artifacts/, below the repository's Directory.*.props: cut it off from them.
printf '<Project />\n' > "$project_dir/Directory.Build.props"
printf '<Project />\n' > "$project_dir/Directory.Build.targets"
printf '<Project />\n' > "$project_dir/Directory.Packages.props"
log "restoring Microsoft.NETCore.App.Runtime.$RID and Microsoft.AspNetCore.App.Runtime.$RID $VERSION"
dotnet restore "$project_dir/restore.csproj" --packages "$packages" -nologo -v quiet >&2

core="$packages/microsoft.netcore.app.runtime.$RID/$VERSION/runtimes/$RID"
asp="$packages/microsoft.aspnetcore.app.runtime.$RID/$VERSION/runtimes/$RID"
for dir in "$core/lib/net11.0" "$core/native" "$asp/lib/net11.0"; do
    [[ -d "$dir" ]] || { log "the restored packs lack $dir"; exit 1; }
done

# The layout the host expects: dotnet, host/fxr/V/libhostfxr.so, shared/<framework>/V/.
rm -rf "$ROOT"
mkdir -p "$ROOT/host/fxr/$VERSION" "$ROOT/shared/Microsoft.NETCore.App/$VERSION" "$ROOT/shared/Microsoft.AspNetCore.App/$VERSION"
host="$(command -v dotnet)"
host="$(readlink -f "$host")"
cp "$host" "$ROOT/dotnet"
cp "$core/native/libhostfxr.so" "$ROOT/host/fxr/$VERSION/"
cp "$core/lib/net11.0/"* "$ROOT/shared/Microsoft.NETCore.App/$VERSION/"
find "$core/native" -maxdepth 1 -type f ! -name libhostfxr.so -exec cp {} "$ROOT/shared/Microsoft.NETCore.App/$VERSION/" \;
cp "$asp/lib/net11.0/"* "$ROOT/shared/Microsoft.AspNetCore.App/$VERSION/"
if [[ -d "$asp/native" ]]; then
    cp "$asp/native/"* "$ROOT/shared/Microsoft.AspNetCore.App/$VERSION/"
fi

# Prove it: the host must list both frameworks at this version and nothing else.
listed="$(DOTNET_ROOT="$ROOT" "$ROOT/dotnet" --list-runtimes)"
for framework in Microsoft.NETCore.App Microsoft.AspNetCore.App; do
    grep -q "^$framework $VERSION " <<< "$listed" || { log "the layout does not list $framework $VERSION:"; log "$listed"; exit 1; }
done
echo "$VERSION" > "$ROOT/.complete"
log "laid out .NET $VERSION at $ROOT"
echo "$ROOT"
