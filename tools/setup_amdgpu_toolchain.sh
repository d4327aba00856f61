#!/usr/bin/env bash
# Builds a prefix that compiles HIP device code for gfx942 and gfx950 without ROCm or an AMD GPU:
#   $PREFIX/devlibs   Debian's device bitcode plus the ISA-version stubs Debian lacks (942, 950)
#   $PREFIX/clang20   a HIP clang++ driver around the clang 20 shipped in the ziglang wheel (gfx950 needs
#                     LLVM >= 20; Debian bookworm stops at 19)
# Needs the Debian packages clang-19 llvm-19 libamdhip64-dev rocm-device-libs (tools/setup.sh --dev).
set -euo pipefail
PREFIX=${1:?usage: setup_amdgpu_toolchain.sh PREFIX}
PY=${PY:-python3}
ZIG=$("$PY" -c 'import ziglang, os; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')

mkdir -p "$PREFIX/devlibs"
for f in /usr/lib/x86_64-linux-gnu/amdgcn/bitcode/*.bc; do ln -sf "$f" "$PREFIX/devlibs/"; done
# The ISA-version stub is one constant; it must carry clang's datalayout or the device link warns.
DATALAYOUT=$(echo 'int x;' | clang-19 -x c --target=amdgcn-amd-amdhsa -mcpu=gfx942 -nogpulib -S -emit-llvm -o - - | grep '^target datalayout')
for arch_version in 942:9402 950:9500; do
  printf '%s\ntarget triple = "amdgcn-amd-amdhsa"\n@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr addrspace(4) constant i32 %s, align 4\n' \
    "$DATALAYOUT" "${arch_version#*:}" | llvm-as-19 -o "$PREFIX/devlibs/oclc_isa_version_${arch_version%%:*}.bc"
done

ROOT="$PREFIX/clang20"
mkdir -p "$ROOT/bin" "$ROOT/lib/clang/20/include"
cp -r "$(dirname "$ZIG")/lib/include/." "$ROOT/lib/clang/20/include/"
# zig's resource dir lacks the HIP wrapper headers; take them from clang 19.
cp -rn /usr/lib/llvm-19/lib/clang/19/include/. "$ROOT/lib/clang/20/include/"
ln -sfn /usr/lib/llvm-19/lib/clang/19/lib "$ROOT/lib/clang/20/lib"
if [ -x /usr/lib/llvm-19/bin/clang-offload-bundler ]; then ln -sf /usr/lib/llvm-19/bin/clang-offload-bundler "$ROOT/bin/"; fi
cat > "$ROOT/bin/clang++" <<EOS
#!/bin/sh
exec "$ZIG" clang --driver-mode=g++ --target=x86_64-linux-gnu -resource-dir "$ROOT/lib/clang/20" -B"$ROOT/bin" "\$@"
EOS
# clang's AMDGPU device link runs "lld -flavor gnu"; zig spells it "zig ld.lld".
cat > "$ROOT/bin/lld" <<EOS
#!/bin/sh
if [ "\$1" = "-flavor" ]; then shift 2; fi
exec "$ZIG" ld.lld "\$@"
EOS
chmod +x "$ROOT/bin/clang++" "$ROOT/bin/lld"
echo "amdgpu toolchain ready in $PREFIX"
