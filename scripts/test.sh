#!/usr/bin/env bash
# Sets up everything on a fresh Debian machine, builds, and runs every test (CTest), with g++
# (the release build) and with clang 14 (the clang preset: the library, program and tests, no
# benchmarks). Golden cases are written by PyTorch once per build (a build step), not per test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release
cmake --build --preset release
ctest --preset release
cmake --preset clang
cmake --build --preset clang
ctest --preset clang
