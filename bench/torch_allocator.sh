#!/bin/bash
# How much the allocator decides PyTorch's speed: ReLU 512->2048 forward+backward over 6400
# tokens, f32, on THREADS threads (default 2), timed in alternating rounds as ffnlab (ffnlab bench, PyTorch off),
# PyTorch with glibc's malloc as it comes, and PyTorch at its best (jemalloc keeping freed
# memory, as bench/torch_at_best.py sets it). Every run unsets the OpenBLAS variables and the
# caller's allocator settings; PyTorch's wait passively. docs/bench.md quotes its output.
#
#   bash bench/torch_allocator.sh [build/release/ffnlab] [rounds] [threads]
set -euo pipefail
ffnlab=${1:-build/release/ffnlab}
rounds=${2:-3}
threads=${3:-2}
here=$(cd "$(dirname "$0")" && pwd)
jemalloc=$(ls /usr/lib/*/libjemalloc.so.2 2>/dev/null | head -1 || true)
if [ -z "$jemalloc" ]; then
  echo "torch_allocator.sh: Debian's libjemalloc2 is missing (bash scripts/install-deps.sh test)" >&2
  exit 1
fi
log=$(mktemp)
json=$(mktemp)
trap 'rm -f "$log" "$json"' EXIT
request='{"variant":"relu","kind":"plain","act":"relu","d_model":512,"d_ff":2048,"bias":true,
"branches":1,"experts":0,"top_k":0,"normalize":true,"tokens":6400,"pass":"forward_backward",
"dtype":"f32","weights":"f32","budget":3}'
request=$(echo "$request" | tr -d '\n')
torch_seconds() {  # the environment's settings as arguments
  echo "$request" | env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u LD_PRELOAD -u MALLOC_CONF \
    -u GLIBC_TUNABLES FFNLAB_TORCH_AT_BEST=1 OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS="$threads" "$@" \
    /usr/bin/python3 "$here/torch_ffn.py" "$threads" | tail -1 |
    /usr/bin/python3 -c "import json, sys; print(json.load(sys.stdin)['seconds'])"
}
echo "round ffnlab_s torch_glibc_s torch_at_best_s glibc/ffnlab at_best/ffnlab"
for round in $(seq "$rounds"); do
  if ! env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u LD_PRELOAD -u MALLOC_CONF -u GLIBC_TUNABLES \
    OMP_NUM_THREADS="$threads" "$ffnlab" bench --variants relu --dtypes f32 --tokens 6400 --no-decode \
    --routings none --no-torch --budget 3 --rounds 1 --json > "$json" 2> "$log"; then
    cat "$log" >&2
    exit 1
  fi
  f=$(/usr/bin/python3 -c "import json, sys; print(json.load(sys.stdin)['layers'][0]['forward_backward_s'])" \
    < "$json")
  g=$(torch_seconds)
  b=$(torch_seconds LD_PRELOAD="$jemalloc" \
    MALLOC_CONF=oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1,thp:always)
  echo "$round $f $g $b $(/usr/bin/python3 -c "print(f'{$g / $f:.2f} {$b / $f:.2f}')")"
done
