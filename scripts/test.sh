#!/usr/bin/env bash
# Sets up everything on a fresh Debian machine, builds, and runs every test (CTest) twice: with g++
# (the release build), and with clang 14 under AddressSanitizer + UBSan (the asan preset: the
# library, program and tests instrumented, every UBSan report fatal, and each libFuzzer target
# run briefly over its seed corpus). Golden cases are written by PyTorch once per build (a build
# step), not per test. docs/hardening.md gives the times.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release
cmake --build --preset release
ctest --preset release
cmake --preset asan
cmake --build --preset asan
ctest --preset asan
