#!/usr/bin/env bash
# Installs what pycollector needs on a Debian machine, skipping what is already there.
# Idempotent: `make run` and `make test` call it every time; a second call does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
# golang-go: `go tool pprof` reads the pprof exporter's files in tests; chromium: the flame graph
# page is tested headless; systemd: systemd-analyze checks deploy/systemd's unit in tests;
# gcc and python3-dev: the tests' C workloads, and the Python writer's C extension (sdk/python);
# systemtap-sdt-dev: <sys/sdt.h>, the USDT probes and semaphores of the native heap sampler (sdk/native)
# and of the tests' C programs (tests/test_stapsdt.py); heaptrack: the peer of the memory bench (bench/memory.py);
# debuginfod: elfutils' server, which the debuginfod tests fetch debug files from (tests/test_debuginfod.py);
# dnsmasq-base: the DNS server the load_balancing exporter's dns resolver is tested against (tests/test_loadbalancing.py).
APT_PACKAGES=(python3-bpfcc bpfcc-tools python3-venv linux-headers-amd64 linux-perf bpftool golang-go chromium systemd gcc python3-dev systemtap-sdt-dev heaptrack debuginfod dnsmasq-base)
# npm fetches the flame graph renderer; Debian's npm only when no npm is installed at all, so a
# Node.js installed another way is left alone.
command -v npm >/dev/null || APT_PACKAGES+=(npm)
# kubectl's kustomize builds deploy/kubernetes in tests; Debian's (kubernetes-client) only when no
# kubectl is installed at all.
command -v kubectl >/dev/null || APT_PACKAGES+=(kubernetes-client)

say() { printf 'setup: %s\n' "$*" >&2; }

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# BCC compiles the BPF program against kernel headers. When the running kernel has no headers
# package, Debian's generic headers work once the module build links point at them.
modules="/lib/modules/$(uname -r)"
if [ ! -e "$modules/build/include" ]; then
    arch_dir=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
    common_dir=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1)
    if [ -n "$arch_dir" ] && [ -n "$common_dir" ]; then
        as_root mkdir -p "$modules"
        as_root ln -sfn "$arch_dir" "$modules/build"
        as_root ln -sfn "$common_dir" "$modules/source"
        say "no headers for kernel $(uname -r): linked $modules/build -> $arch_dir and source -> $common_dir"
    else
        say "warning: no kernel headers found under /usr/src; the profiling receiver will not compile"
    fi
fi

if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV from /usr/bin/python3 with system site-packages (for Debian's bcc)"
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi

# Reinstall only when the package metadata changed since the last install (sdk/python's sources
# too, and the sampling headers its `native` link reaches in sdk/native; not build outputs).
stamp="$VENV/.installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ examples/pycollector-example-exporter/pyproject.toml -nt "$stamp" ] \
        || [ -n "$(find -L sdk/python -name build -prune -o -newer "$stamp" -type f -print -quit)" ]; then
    say "installing pycollector (editable) and its test dependencies into $VENV (log: $VENV/pip.log)"
    {
        "$VENV/bin/python" -m pip install --upgrade pip &&
        "$VENV/bin/python" -m pip install -e '.[test]' &&
        # The example third-party plugin installs like any other distribution: proof that
        # discovery needs no change to pycollector.
        "$VENV/bin/python" -m pip install -e examples/pycollector-example-exporter &&
        # The Python writer of thread and process contexts, for the tests' instrumented services
        # (built, not editable: it has a C extension).
        "$VENV/bin/python" -m pip install ./sdk/python
    } >"$VENV/pip.log" 2>&1 || { tail -n 30 "$VENV/pip.log" >&2; say "pip install failed"; exit 1; }
    touch "$stamp"
fi

# Tests read OTLP profiles with the official message classes of older profiles.proto layouts:
# opentelemetry-proto 1.42.0 was generated from profiles.proto v1.9.0 and 1.39.0 from v1.7.0.
# The wheels are kept beside the venv and never installed (their classes would replace the
# current ones); the tests load their descriptors into a pool of their own.
layouts="$VENV/proto-layouts"
for version in 1.39.0 1.42.0; do
    if ! ls "$layouts"/opentelemetry_proto-"$version"-*.whl >/dev/null 2>&1; then
        say "fetching opentelemetry-proto $version (older profiles layouts, for the tests)"
        "$VENV/bin/python" -m pip download --quiet --no-deps --only-binary=:all: -d "$layouts" "opentelemetry-proto==$version" >>"$VENV/pip.log" 2>&1 \
            || { tail -n 5 "$VENV/pip.log" >&2; say "pip download failed"; exit 1; }
    fi
done

# Scratch space for the npm fetches below.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The flame graph exporter inlines d3 and d3-flame-graph into its page. `npm pack` fetches the
# pinned releases (checked against the registry's integrity hashes) and only their built files
# are kept, in a folder the exporter reads; the stamp makes a second run a no-op.
D3_VERSION=7.9.0
D3_FLAME_GRAPH_VERSION=5.0.0
vendor=exporters/flamegraph/vendor
wanted="d3@$D3_VERSION d3-flame-graph@$D3_FLAME_GRAPH_VERSION"
if [ "$(cat "$vendor/.packages" 2>/dev/null)" != "$wanted" ]; then
    say "fetching the flame graph renderer with npm: $wanted"
    # shellcheck disable=SC2086  # two package specs
    (cd "$work" && npm pack --silent $wanted >/dev/null 2>npm.log) || { cat "$work/npm.log" >&2; say "npm pack failed"; exit 1; }
    tar -xzf "$work/d3-$D3_VERSION.tgz" -C "$work" package/dist/d3.min.js package/LICENSE
    mkdir -p "$vendor" && mv "$work/package/dist/d3.min.js" "$vendor/" && mv "$work/package/LICENSE" "$vendor/d3.LICENSE"
    tar -xzf "$work/d3-flame-graph-$D3_FLAME_GRAPH_VERSION.tgz" -C "$work" package/dist/d3-flamegraph.umd.min.js package/LICENSE
    mv "$work/package/dist/d3-flamegraph.umd.min.js" "$vendor/" && mv "$work/package/LICENSE" "$vendor/d3-flame-graph.LICENSE"
    echo "$wanted" >"$vendor/.packages"
fi

# Tests open the pprof exporter's files in speedscope, in headless Chromium, as a person would. Its
# built app (pinned, fetched the same way) is kept beside the venv, like the wheels above: the
# tests read it, nothing ships it.
SPEEDSCOPE_VERSION=1.25.0
speedscope="$VENV/speedscope"
if [ "$(cat "$speedscope/.packages" 2>/dev/null)" != "speedscope@$SPEEDSCOPE_VERSION" ]; then
    say "fetching speedscope with npm (the tests open pprof files in it): speedscope@$SPEEDSCOPE_VERSION"
    (cd "$work" && npm pack --silent "speedscope@$SPEEDSCOPE_VERSION" >/dev/null 2>npm.log) || { cat "$work/npm.log" >&2; say "npm pack failed"; exit 1; }
    rm -rf "$work/package" "$speedscope"
    tar -xzf "$work/speedscope-$SPEEDSCOPE_VERSION.tgz" -C "$work" package/dist/release package/LICENSE
    mv "$work/package/dist/release" "$speedscope" && mv "$work/package/LICENSE" "$speedscope/speedscope.LICENSE"
    echo "speedscope@$SPEEDSCOPE_VERSION" >"$speedscope/.packages"
fi
