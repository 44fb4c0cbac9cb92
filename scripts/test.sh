#!/usr/bin/env bash
# Every test on a fresh Debian machine: installs everything (install-deps.sh test), builds with
# g++ (the release preset) and runs CTest, then builds with clang 14 under AddressSanitizer +
# UBSan (the asan preset: the library, program and tests instrumented, every UBSan report fatal,
# each libFuzzer target run briefly over its starting corpus) and runs CTest again. Golden cases are
# written by PyTorch once per build (a build step), not per test. README.md gives the times.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh test
cmake --preset release
cmake --build --preset release
ctest --preset release
cmake --preset asan
cmake --build --preset asan
ctest --preset asan
