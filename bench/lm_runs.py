"""One training run of the reference configuration (or of a larger model), by `ffnlab
train` or by PyTorch (bench/torch_train.py), for the drivers bench_train.py (throughput and peak
memory) and lm_seeds.py (validation over seeds). Standard library only; PyTorch runs in the
interpreter given as `python`."""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FORTUNES = "/usr/share/games/fortunes"
# The model sizes: the reference configuration, and a 4x larger one where the
# products dominate. d_ff per variant gives ReLU and SwiGLU equal parameter counts.
SIZES = {
    "default": dict(d_model=128, layers=4, heads=4, seq=128, batch=16,
                    d_ff={"relu": 512, "swiglu": 344}),
    "large": dict(d_model=512, layers=8, heads=8, seq=256, batch=16,
                  d_ff={"relu": 2048, "swiglu": 1368}),
}
D_FF = SIZES["default"]["d_ff"]


def add_common_args(ap):
    """The options both drivers share."""
    ap.add_argument("--ffnlab", default=os.path.join(HERE, "..", "build", "release", "ffnlab"))
    ap.add_argument("--python", default="/usr/bin/python3", help="interpreter with torch")
    ap.add_argument("--variants", nargs="+", default=["relu", "swiglu"], choices=sorted(D_FF))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default=FORTUNES)
    ap.add_argument("--size", default="default", choices=sorted(SIZES),
                    help="default: 4 layers, d_model 128, seq 128; large: 8 layers, d_model 512, "
                         "seq 256 (batch 16 both)")


def model_args(a, variant):
    """The model and batch flags both sides take."""
    m = SIZES[getattr(a, "size", "default")]
    return ["--d-model", str(m["d_model"]), "--layers", str(m["layers"]), "--heads",
            str(m["heads"]), "--seq", str(m["seq"]), "--batch", str(m["batch"]), "--d-ff",
            str(m["d_ff"][variant])]


def run_measured(cmd, capture):
    """Runs cmd to completion; returns (stdout or None, the child's peak resident set in MiB)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                            text=True)
    out = proc.stdout.read() if capture else None
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:3])} ... failed with status {proc.returncode}")
    return out, usage.ru_maxrss / 1024.0  # ru_maxrss is in KiB on Linux


def require(paths):
    """Exits with one line when a binary or interpreter is missing."""
    for path, what in paths:
        if not os.access(path, os.X_OK):
            sys.exit(f"{os.path.basename(sys.argv[0])}: {what} {path} not found (build first; "
                     "scripts/install-deps.sh installs PyTorch)")


def ffnlab(a, variant, steps, seed, dtype, out, evaluate):
    """Trains with `ffnlab train`; returns (validation bits/byte at the end, median tokens/s,
    peak RSS in MiB). Without `evaluate` only 2,048 validation tokens are read and the
    bits/byte are rough."""
    cmd = [a.ffnlab, "train", "--variant", variant] + model_args(a, variant) + [
           "--steps", str(steps), "--seed", str(seed), "--threads", str(a.threads),
           "--dtype", dtype, "--eval-every", "0", "--sample", "0", "--data", a.data,
           "--out", out, "--force"]  # `out` is a scratch folder each run starts over in
    if not evaluate:
        cmd += ["--eval-tokens", "2048"]
    _, rss = run_measured(cmd, capture=False)
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    return s["evaluations"][-1]["bits_per_byte"], s["median_tokens_per_second"], rss


def native_bf16():
    """Whether this CPU multiplies bf16 natively (where it does not, PyTorch's bf16 autocast has
    no fast kernel and takes many times f32's time)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def torch(a, variant, steps, seed, evaluate, dtype="f32"):
    """Trains with bench/torch_train.py (bf16: under autocast); returns (validation bits/byte or
    None, median tokens/s, peak RSS in MiB)."""
    cmd = [a.python, os.path.join(HERE, "torch_train.py"), "--variant", variant] + model_args(
        a, variant) + ["--steps", str(steps), "--seed", str(seed), "--threads", str(a.threads),
                       "--data", a.data, "--dtype", dtype]
    if not evaluate:
        cmd.append("--skip-eval")
    out, rss = run_measured(cmd, capture=True)
    m = re.search(r"median (\d+) tokens/s(?:, validation ([\d.]+) bits/byte)?", out)
    if not m or (evaluate and m.group(2) is None):
        sys.exit(f"no result in PyTorch's output:\n{out}")
    return (float(m.group(2)) if m.group(2) else None), float(m.group(1)), rss
