#!/bin/sh
# Installs what tests/test_targets.py and tests/test_tools.py need to run modules for other
# targets on an x86-64 machine, or says why it cannot (those tests then skip, saying so):
#   qemu-user, libc6-arm64-cross, libstdc++6-arm64-cross   aarch64 modules under qemu-aarch64
#   mesa-vulkan-drivers, libvulkan1                          Vulkan modules on lavapipe (a CPU Vulkan driver)
#   IREE's aarch64 iree-run-module and iree-benchmark-module (pock-tune run --benchmark-module),
#   from the iree-base-runtime wheel of the installed version, unpacked into .cache/iree-aarch64/VERSION/
# Idempotent and quick once everything is there. Never fails: `make test` runs it on fresh machines.
#
# Usage: tools/setup_device_deps.sh PYTHON     (the venv's python; default .venv/bin/python)
set -u
PY=${1:-.venv/bin/python}
say() { echo "setup_device_deps: $*"; }

if [ "$(uname -m)" != x86_64 ]; then
    say "not an x86-64 machine; nothing to install (the aarch64 and Vulkan tests say what they need)"
    exit 0
fi

missing=""
command -v qemu-aarch64 >/dev/null 2>&1 || missing="$missing qemu-user"
[ -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ] || missing="$missing libc6-arm64-cross"
[ -e /usr/aarch64-linux-gnu/lib/libstdc++.so.6 ] || missing="$missing libstdc++6-arm64-cross"
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || missing="$missing mesa-vulkan-drivers"
ls /usr/lib/*/libvulkan.so.1 >/dev/null 2>&1 || missing="$missing libvulkan1"
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing$missing"
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
                apt-get install -y -qq --no-install-recommends $missing >/dev/null; }; then
            say "apt-get could not install$missing; the tests that need them will be skipped"
        fi
    else
        say "missing$missing (installing needs root and apt-get); the tests that need them will be skipped"
    fi
fi

version=$("$PY" -c 'import importlib.metadata as m; print(m.version("iree-base-runtime"))') || {
    say "cannot read the iree-base-runtime version with $PY; the aarch64 tests will be skipped"
    exit 0
}
cache=.cache/iree-aarch64/$version
[ -x "$cache/iree-run-module" ] && [ -x "$cache/iree-benchmark-module" ] && exit 0
say "fetching the aarch64 iree-run-module and iree-benchmark-module of iree-base-runtime $version into $cache"
mkdir -p "$cache"
if ! "$PY" -m pip download --quiet --only-binary=:all: --platform manylinux_2_28_aarch64 \
        --python-version "$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" --no-deps \
        "iree-base-runtime==$version" -d "$cache/wheel"; then
    say "pip could not download the aarch64 iree-base-runtime wheel; the aarch64 tests will be skipped"
    exit 0
fi
"$PY" - "$cache" <<'EOF'
import glob, os, sys, zipfile

cache = sys.argv[1]
(wheel,) = glob.glob(os.path.join(cache, "wheel", "*.whl"))
for tool in ("iree-run-module", "iree-benchmark-module"):
    part = os.path.join(cache, tool + ".part")
    with zipfile.ZipFile(wheel) as z, open(part, "wb") as out:
        out.write(z.read("iree/_runtime_libs/" + tool))
    os.chmod(part, 0o755)
    os.replace(part, os.path.join(cache, tool))
EOF
rm -rf "$cache/wheel"
