#!/usr/bin/env bash
# Installs the Debian packages ffnlab needs, by set:
#   run   what `scripts/run.sh` needs: a compiler, CMake, oneDNN and the headers, gnuplot, the corpus
#   test  run, and what the test suite needs: PyTorch (golden cases, the Python module's tests,
#         the notebook), clang (sanitizers, fuzzing), OpenMPI, GoogleTest, Google Benchmark
#   all   the same as test (the default)
# Idempotent: a package already installed is left alone, and nothing is fetched when all are
# present. Times on a fresh machine are in README.md.
set -euo pipefail

set_name="${1:-all}"

run_packages=(
  build-essential cmake ninja-build
  libdnnl-dev                        # oneDNN: every matrix product
  ocl-icd-opencl-dev opencl-headers  # only so that Debian's dnnl CMake config (OCL GPU runtime) resolves
  libcli11-dev nlohmann-json3-dev libfmt-dev
  libboost-dev                       # Boost.Math: Student's t quantiles of the study's intervals
  gnuplot-nox fonts-dejavu-core      # figures (pngcairo) and their font
  fortunes                           # the default text corpus
)
test_packages=(
  ccache pkg-config git
  clang libomp-dev libclang-rt-dev   # the second compiler (the asan preset, libFuzzer targets)
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-torch python3-numpy python3-scipy  # the reference that writes golden cases
  libopenblas0-openmp  # PyTorch products: without it Debian torch uses the reference BLAS (30x slower)
  libjemalloc2 python3-threadpoolctl  # PyTorch at its best in comparisons: a caching allocator; which BLAS kernels it runs
  python3-dev pybind11-dev python3-pytest  # the Python module (FFNLAB_BUILD_PYTHON) and its tests
  libopenmpi-dev openmpi-bin         # training over MPI (FFNLAB_MPI) and its tests
  python3-nbclient python3-nbformat python3-ipykernel python3-matplotlib  # the example notebook
)

case "$set_name" in
  run) packages=("${run_packages[@]}") ;;
  test | all) packages=("${run_packages[@]}" "${test_packages[@]}") ;;
  -h | --help)
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "install-deps: unknown set '$set_name' (expected run, test or all)" >&2
    exit 2
    ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages of the '$set_name' set present"
  exit 0
fi

echo "install-deps ($set_name): installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
