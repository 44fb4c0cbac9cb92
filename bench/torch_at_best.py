"""PyTorch at its best on a CPU, for every comparison ffnlab makes with it.

Two things in an environment can make PyTorch slower than it is:
- OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE), which some machines set because older OpenBLAS
  builds misbehave on new CPUs, force OpenBLAS's kernels for another CPU (Haswell's AVX2 ones on
  an AVX-512 machine);
- glibc's malloc, and jemalloc as it comes, return PyTorch's large temporaries to the system
  after every call, so each call page-faults and zeroes fresh memory; PyTorch's CPU guidance is
  a caching allocator.

reexec_at_best() (call it before importing torch) starts the script again, once, with both
OpenBLAS variables removed, jemalloc preloaded and told to keep large blocks (Debian's
libjemalloc2; glibc's tunables mmap_max=0 and a huge trim_threshold where it is missing, which
keep freed memory the same way), large blocks advised for transparent huge pages, and
OMP_WAIT_POLICY=PASSIVE. runtime(torch) says what PyTorch then runs with, in one line.
A script that runs ffnlab in the same process (bench_python.py, torch_train.py --from-ffnlab)
gives ffnlab the same environment: both sides of its comparison run with it.
"""
import glob
import os
import sys

_MARK = "FFNLAB_TORCH_AT_BEST"
_TUNABLES = ("glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736:"
             "glibc.malloc.hugetlb=1")
# jemalloc 5.3 gives allocations of 8 MiB and more an arena of their own that returns them to the
# system as soon as they are freed, so a layer's large temporaries fault in again on every call
# (ReLU 512->2048 over 6400 tokens, forward+backward, 2 threads on a Zen 3 EPYC: 75,000 minor
# faults and 689 ms a call, against none and 597 ms with these settings). This keeps them, as a
# caching allocator should; release_memory() still purges between layers.
# And thp:always has jemalloc advise its memory for transparent huge pages (where the system
# leaves them to madvise), as ffnlab's large tensors are: the multi-branch gated FFN 512->2048x4
# over 6400 tokens, forward+backward, ran at 2722 ms a call against 2920 ms without (median of 5
# alternating rounds, each 0.99-1.17x; the other dense variants within 1 %; same machine).
_JEMALLOC_KEEP = "oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1,thp:always"


def jemalloc():
    """The path of Debian's libjemalloc.so.2, or None."""
    found = sorted(glob.glob("/usr/lib/*/libjemalloc.so.2") + glob.glob("/usr/lib/libjemalloc.so.2"))
    return found[0] if found else None


def environment(base=None):
    """The environment for a PyTorch process at its best (a copy of `base`, os.environ by
    default)."""
    env = dict(os.environ if base is None else base)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    lib = jemalloc()
    if lib:
        preload = env.get("LD_PRELOAD", "")
        if lib not in preload.split(":"):
            env["LD_PRELOAD"] = f"{lib}:{preload}" if preload else lib
        mine = env.get("MALLOC_CONF", "")
        if _JEMALLOC_KEEP not in mine:
            env["MALLOC_CONF"] = f"{mine},{_JEMALLOC_KEEP}" if mine else _JEMALLOC_KEEP
    else:
        mine = env.get("GLIBC_TUNABLES", "")
        env["GLIBC_TUNABLES"] = f"{mine}:{_TUNABLES}" if mine else _TUNABLES
    env[_MARK] = "1"
    return env


def reexec_at_best():
    """Runs this script again in environment(), unless it already runs in it."""
    if os.environ.get(_MARK) == "1":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable] + sys.argv, environment())


def release_memory():
    """Hands memory Python has freed back to the system now. A caching allocator keeps it (that
    is its point: no page faults on the next call), so a process that moves from one large layer
    to the next would hold both; between layers, not inside a timed call, that is only waste."""
    import ctypes
    import gc
    gc.collect()
    libc = ctypes.CDLL(None)
    if hasattr(libc, "mallctl"):  # jemalloc: purge every arena (MALLCTL_ARENAS_ALL = 4096)
        libc.mallctl(b"arena.4096.purge", None, None, None, ctypes.c_size_t(0))
    elif hasattr(libc, "malloc_trim"):  # glibc, which the tunables told to keep freed memory
        libc.malloc_trim(ctypes.c_size_t(0))


def _allocator():
    try:
        with open("/proc/self/maps") as f:
            if "libjemalloc" in f.read():
                keeps = _JEMALLOC_KEEP in os.environ.get("MALLOC_CONF", "")
                return "jemalloc keeping freed memory, huge pages" if keeps else "jemalloc"
    except OSError:
        pass
    if os.environ.get("GLIBC_TUNABLES", "").endswith(_TUNABLES):
        return "glibc malloc keeping freed memory, huge pages"
    return "glibc malloc (slower: frees to the system)"


def runtime(torch):
    """One line: PyTorch's BLAS and the kernels it chose, oneDNN, the allocator, and whether the
    OpenBLAS variables are unset."""
    blas = "BLAS unknown (python3-threadpoolctl missing)"
    try:
        from threadpoolctl import threadpool_info
        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        if pools:
            p = pools[0]
            blas = (f"{p.get('internal_api', 'BLAS')} {p.get('version') or ''} "
                    f"({p.get('architecture') or 'generic'} kernels)").replace("  ", " ")
    except Exception as e:  # noqa: BLE001 (a description, never a failure)
        blas = f"BLAS unknown ({type(e).__name__})"
    onednn = "oneDNN" if torch.backends.mkldnn.is_available() else "no oneDNN"
    forced = [k for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ]
    openblas_env = ("OPENBLAS_CORETYPE/L2_SIZE unset" if not forced
                    else "forced by " + ", ".join(f"{k}={os.environ[k]}" for k in forced))
    return (f"{blas}, {onednn} (bf16 autocast), {_allocator()}, {openblas_env}, "
            f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")
