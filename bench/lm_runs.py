"""One training run of issue 4's reference configuration, by `ffnlab train` or by PyTorch
(bench/torch_train.py), for the drivers bench_train.py (throughput) and lm_seeds.py (validation
over seeds). Standard library only; PyTorch runs in the interpreter given as `python`."""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
D_FF = {"relu": 512, "swiglu": 344}  # the widths: equal parameter counts
FORTUNES = "/usr/share/games/fortunes"


def add_common_args(ap):
    """The options both drivers share."""
    ap.add_argument("--ffnlab", default=os.path.join(HERE, "..", "build", "release", "ffnlab"))
    ap.add_argument("--python", default="/usr/bin/python3", help="interpreter with torch")
    ap.add_argument("--variants", nargs="+", default=["relu", "swiglu"], choices=sorted(D_FF))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default=FORTUNES)


def require(paths):
    """Exits with one line when a binary or interpreter is missing."""
    for path, what in paths:
        if not os.access(path, os.X_OK):
            sys.exit(f"{os.path.basename(sys.argv[0])}: {what} {path} not found (build first; "
                     "scripts/install-deps.sh installs PyTorch)")


def ffnlab(a, variant, steps, seed, dtype, out, evaluate):
    """Trains with `ffnlab train`; returns (validation bits/byte at the end, median tokens/s).
    Without `evaluate` only 2,048 validation tokens are read and the bits/byte are rough."""
    cmd = [a.ffnlab, "train", "--variant", variant, "--d-ff", str(D_FF[variant]),
           "--steps", str(steps), "--seed", str(seed), "--threads", str(a.threads),
           "--dtype", dtype, "--eval-every", "0", "--sample", "0", "--data", a.data,
           "--out", out]
    if not evaluate:
        cmd += ["--eval-tokens", "2048"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    return s["evaluations"][-1]["bits_per_byte"], s["median_tokens_per_second"]


def torch(a, variant, steps, seed, evaluate):
    """Trains with bench/torch_train.py; returns (validation bits/byte or None, median tokens/s)."""
    cmd = [a.python, os.path.join(HERE, "torch_train.py"), "--variant", variant,
           "--d-ff", str(D_FF[variant]), "--steps", str(steps), "--seed", str(seed),
           "--threads", str(a.threads), "--data", a.data]
    if not evaluate:
        cmd.append("--skip-eval")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    m = re.search(r"median (\d+) tokens/s(?:, validation ([\d.]+) bits/byte)?", out)
    if not m or (evaluate and m.group(2) is None):
        sys.exit(f"no result in PyTorch's output:\n{out}")
    return (float(m.group(2)) if m.group(2) else None), float(m.group(1))
