#!/usr/bin/env bash
# Installs what pycollector needs on a Debian machine, skipping what is already there.
# Idempotent: `make run` and `make test` call it every time; a second call does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
APT_PACKAGES=(python3-bpfcc bpfcc-tools python3-venv linux-headers-amd64 linux-perf bpftool golang-go)

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

# Reinstall only when the package metadata changed since the last install.
stamp="$VENV/.installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ examples/pycollector-example-exporter/pyproject.toml -nt "$stamp" ]; then
    say "installing pycollector (editable) and its test dependencies into $VENV (log: $VENV/pip.log)"
    {
        "$VENV/bin/python" -m pip install --upgrade pip &&
        "$VENV/bin/python" -m pip install -e '.[test]' &&
        # The example third-party plugin installs like any other distribution: proof that
        # discovery needs no change to pycollector.
        "$VENV/bin/python" -m pip install -e examples/pycollector-example-exporter
    } >"$VENV/pip.log" 2>&1 || { tail -n 30 "$VENV/pip.log" >&2; say "pip install failed"; exit 1; }
    touch "$stamp"
fi
