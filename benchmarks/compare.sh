#!/usr/bin/env bash
# Compares server configurations side by side, honestly: interleaved rounds, medians, CPU per
# request, every server verified before it is measured. See benchmarks/README.md.
#
#   ./benchmarks/compare.sh [--quick] [--out DIR] [--server-cpus 1] [--client-cpus 0] [...]
#   ./benchmarks/compare.sh --help      (all options)
#
# This script builds once (the TechEmpower sample in Release, the C ceiling server, the C open-loop
# load generator and the C WebSocket load generator), then hands over to benchmarks/lib/compare.py, which runs the
# measurements and writes report.md, results.json, results.csv and PNG charts.
set -euo pipefail
# Relative paths given on the command line (--out, --config-file) stay relative to the caller.
export COMPARE_CALLER_DIR="$PWD"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export DOTNET_CLI_TELEMETRY_OPTOUT=1 DOTNET_NOLOGO=1 DOTNET_SKIP_FIRST_TIME_EXPERIENCE=1
export PYTHONDONTWRITEBYTECODE=1

# Debian's /usr/bin/python3 has matplotlib (python3-matplotlib) for the charts; a python3 earlier
# on PATH (pyenv) may not. Anything else the runner needs is in the standard library.
python=python3
if [[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import matplotlib' > /dev/null 2>&1; then
    python=/usr/bin/python3
fi

build=1
for arg in "$@"; do
    case "$arg" in
        -h|--help) exec "$python" benchmarks/lib/compare.py --help ;;
        --no-build) build=0 ;;
    esac
done

for tool in dotnet gcc wrk taskset; do
    if ! command -v "$tool" > /dev/null 2>&1; then
        echo "compare: $tool is not installed (.ci/run lists the packages)" >&2
        exit 1
    fi
done

mkdir -p artifacts/benchmarks/bin
if (( build )); then
    echo "compare: building samples/TechEmpower (Release)"
    # No MSBuild or compiler server may outlive this script.
    dotnet build -c Release samples/TechEmpower -nologo -v quiet -clp:ErrorsOnly --disable-build-servers
fi
echo "compare: building benchmarks/ceiling, benchmarks/loadgen and benchmarks/wsload (gcc -O2)"
gcc -O2 -Wall -Wextra -pthread -o artifacts/benchmarks/bin/ceiling benchmarks/ceiling/ceiling.c
# loadgen and wsload speak TLS with OpenSSL (-S): Debian's libssl-dev.
if [[ ! -f /usr/include/openssl/ssl.h ]]; then
    echo "compare: OpenSSL's headers are missing (apt-get install libssl-dev; .ci/run lists the packages)" >&2
    exit 1
fi
gcc -O2 -Wall -Wextra -o artifacts/benchmarks/bin/loadgen benchmarks/loadgen/loadgen.c -lssl -lcrypto
gcc -O2 -Wall -Wextra -o artifacts/benchmarks/bin/wsload benchmarks/wsload/wsload.c -lssl -lcrypto

# The report quotes the command line as it was typed.
COMPARE_INVOCATION=./benchmarks/compare.sh exec "$python" benchmarks/lib/compare.py "$@"
