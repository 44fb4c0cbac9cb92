#!/usr/bin/env bash
# Installs the built project into a temporary prefix and builds a consumer project against it
# with find_package(ffnlab), then runs it: the install(EXPORT) promise, checked.
set -euo pipefail
build_dir=$1
src_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > /dev/null
mkdir -p "$work/consumer"
cp "$src_dir/CMakeLists.txt.in" "$work/consumer/CMakeLists.txt"
cp "$src_dir/main.cpp" "$work/consumer/main.cpp"
cmake -S "$work/consumer" -B "$work/consumer/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" > /dev/null
cmake --build "$work/consumer/build" > /dev/null
out=$("$work/consumer/build/consumer")
# SwiGLU, D 16, F 32, no bias: 3·16·32 = 1536 parameters; 3 rows of output.
[ "$out" = "1536 3" ] || { echo "consumer printed '$out', expected '1536 3'"; exit 1; }
echo "find_package(ffnlab) consumer built and ran"
