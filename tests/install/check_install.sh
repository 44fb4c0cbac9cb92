#!/usr/bin/env bash
# Installs the built project into a temporary prefix and builds a consumer project against it
# with find_package(ffnlab), then runs it: the install(EXPORT) promise, checked.
set -euo pipefail
build_dir=$1
src_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
log=$work/log
trap 'status=$?; [ $status -eq 0 ] || cat "$log"; rm -rf "$work"; exit $status' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > "$log" 2>&1
# The scalar references are test oracles, not installed API.
if find "$work/prefix/include/ffnlab" -path '*/ref/*' | grep -q .; then
  echo "reference headers were installed:"; find "$work/prefix/include/ffnlab" -path '*/ref/*'
  exit 1
fi
mkdir -p "$work/consumer"
cp "$src_dir/CMakeLists.txt.in" "$work/consumer/CMakeLists.txt"
cp "$src_dir/main.cpp" "$work/consumer/main.cpp"
cmake -S "$work/consumer" -B "$work/consumer/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_COMPILER="${FFNLAB_CONSUMER_CXX:-c++}" >> "$log" 2>&1
cmake --build "$work/consumer/build" >> "$log" 2>&1
out=$("$work/consumer/build/consumer")
# SwiGLU, D 16, F 32, no bias: 3·16·32 = 1536 parameters; 3 rows of output.
[ "$out" = "1536 3" ] || { echo "consumer printed '$out', expected '1536 3'"; exit 1; }
# The examples in examples/ (what docs/implementation-guide.md shows), against the same install.
examples=$src_dir/../../examples
cmake -S "$examples" -B "$work/examples" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_COMPILER="${FFNLAB_CONSUMER_CXX:-c++}" >> "$log" 2>&1
cmake --build "$work/examples" >> "$log" 2>&1
swiglu=$("$work/examples/swiglu_layer")
case "$swiglu" in
  "swiglu: 33024 parameters (closed form 33024), y [5, 64]"*) ;;
  *) echo "swiglu_layer printed '$swiglu'"; exit 1 ;;
esac
moe=$("$work/examples/moe_layer")
case "$moe" in
  "moe: 64 tokens, top-2 of 8 experts; tokens per expert:"*) ;;
  *) echo "moe_layer printed '$moe'"; exit 1 ;;
esac
# The Python package, when the build has it (FFNLAB_BUILD_PYTHON): importable from the prefix
# by the interpreter it was built for, run from a folder that has no ffnlab of its own.
for pkg in "$work"/prefix/lib/python3*/dist-packages/ffnlab; do
  [ -d "$pkg" ] || continue
  py=$(cd "$work" && PYTHONPATH="$(dirname "$pkg")" "${FFNLAB_PYTHON:-/usr/bin/python3}" -c '
import ffnlab, numpy as np
l = ffnlab.FFN(variant="swiglu", d_model=16, d_ff=32, bias=False)
print(l.num_params, l.forward(np.ones((3, 16), np.float32)).shape, ffnlab.__file__.startswith("'"$work"'"))')
  [ "$py" = "1536 (3, 16) True" ] || { echo "installed Python package printed '$py'"; exit 1; }
  echo "installed Python package imported from $pkg"
done
echo "find_package(ffnlab) consumer and examples/ built and ran"
