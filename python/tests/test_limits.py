"""Hostile settings from Python: each case runs in a fresh interpreter, so that a crash (the
interpreter killed by a signal) fails the test instead of ending the test session."""
import os
import subprocess
import sys
import textwrap


def run_python(code, **environment):
    """Runs code in a child interpreter with the same module path (and `environment` laid over
    this one's); returns (status, stdout, stderr)."""
    env = dict(os.environ, **environment)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def test_the_chosen_thread_count_holds_in_every_python_thread():
    # OpenMP keeps a count for each thread: set_threads in the main thread must hold for the
    # library's calls in a threading.Thread and an executor's worker too, and leave the count
    # that thread's PyTorch ops use as it was. What a forward ran with is seen in the process's
    # threads: GNU OpenMP gives each thread that starts parallel work a team of its own, of
    # n - 1 more threads.
    status, out, err = run_python("""
        import os, threading, numpy as np, torch, ffnlab
        from concurrent.futures import ThreadPoolExecutor
        ffnlab.set_threads(2)
        layer = ffnlab.FFN(d_model=64, d_ff=256)
        seen = []
        def work():
            torch_before = torch.get_num_threads()
            before = len(os.listdir("/proc/self/task"))
            layer.forward(np.ones((512, 64), np.float32))
            seen.append(len(os.listdir("/proc/self/task")) - before)
            seen.append(ffnlab.get_threads())
            seen.append(torch.get_num_threads() == torch_before)
        done = threading.Event()  # the first thread (and its team) lives on until the end
        t = threading.Thread(target=lambda: (work(), done.wait()))
        t.start()
        while len(seen) < 3:
            pass
        with ThreadPoolExecutor(1) as pool:
            pool.submit(work).result()
        done.set()
        t.join()
        print("threads", ffnlab.get_threads(), seen)
    """, OMP_NUM_THREADS="3")
    assert status == 0, err
    assert "threads 2 [1, 2, True, 1, 2, True]" in out, out


def test_thread_counts_beyond_the_processors_are_refused_and_forward_still_runs():
    status, out, err = run_python("""
        import numpy as np, ffnlab
        for n in (100000, 0, -1, 2**31 - 1):
            try:
                ffnlab.set_threads(n)
                print("accepted", n)
            except ValueError as e:
                assert "threads must be in [1," in str(e), e
        l = ffnlab.FFN(variant="swiglu", d_model=16, d_ff=32)
        y = l.forward(np.ones((8, 16), np.float32))
        print("ok", ffnlab.get_threads(), float(y.sum()) == float(y.sum()))
    """)
    assert status == 0, err  # a negative status is a signal: the interpreter crashed
    assert "accepted" not in out, out
    assert "ok" in out, out


def test_double_backward_through_the_torch_module_is_refused():
    status, out, err = run_python("""
        import torch, ffnlab.torch as ft
        m = ft.FFN(variant="swiglu", d_model=8, d_ff=16)
        x = torch.randn(4, 8, requires_grad=True)
        y = m(x)
        try:
            (g,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
            print("accepted")
        except RuntimeError as e:
            assert "no second derivative" in str(e), e
            print("refused")
        # A plain backward still works after the refusal.
        m(x).sum().backward()
        print("grad", x.grad is not None)
    """)
    assert status == 0, err
    assert "refused" in out and "accepted" not in out, out
    assert "grad True" in out, out


def test_non_finite_config_values_are_refused_by_name():
    import ffnlab
    import pytest
    for value in (float("nan"), float("inf"), 1e300):
        with pytest.raises(ValueError) as e:
            ffnlab.FFN({"kind": "plain", "activation": "swish", "swish_beta": value,
                        "d_model": 4, "d_ff": 8})
        assert "json.exception" not in str(e.value), e.value
        assert "finite" in str(e.value), e.value


def test_the_torch_activation_table_names_only_library_activations():
    import ffnlab
    import ffnlab.torch as ft
    assert set(ft._ACTIVATIONS.values()) <= set(ffnlab.activation_names())
    assert {"relu", "gelu", "silu"} <= set(ffnlab.activation_names())
    assert "swiglu" in ffnlab.variant_names()


def test_a_write_the_system_refuses_is_the_oserror_of_its_errno(tmp_path):
    # A file-size limit makes the checkpoint's write fail with EFBIG, as a full disk would with
    # ENOSPC: an OSError carrying the errno, with ffnlab's message.
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    status, out, err = run_python(f"""
        import errno, resource, signal, ffnlab
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        lm = ffnlab.TransformerLM(d_model=32, layers=1, heads=2, context=16)
        try:
            ffnlab.train(lm, {str(text)!r}, out={str(tmp_path / "run")!r}, steps=1, batch=2,
                         seq=16, progress=False)
        except OSError as e:
            import pickle
            again = pickle.loads(pickle.dumps(e))  # (a worker process hands it on whole)
            assert (type(again), again.errno, str(again)) == (type(e), e.errno, str(e)), again
            print("raised", type(e).__name__, e.errno == errno.EFBIG, e)
    """)
    assert status == 0, err
    # Python's own form: "[Errno 27]" before ffnlab's message
    assert "raised OSError True [Errno 27] [io] " in out, out
    assert "write failed (File too large)" in out, out


def test_memory_that_runs_out_is_a_memory_error_with_ffnlabs_message():
    # An address-space limit 1.5 GiB above what the process maps once its threads run, below the
    # hidden activation [2^20, 1024] (4 GiB): the tensor ffnlab cannot allocate is Python's
    # MemoryError, with the size in its message; the interpreter goes on.
    status, out, err = run_python("""
        import resource, numpy as np, ffnlab
        ffnlab.set_threads(1)
        layer = ffnlab.FFN(d_model=64, d_ff=1024)
        layer.forward(np.ones((64, 64), np.float32))  # the threads, before the limit
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (mapped + (3 << 29), mapped + (3 << 29)))
        x = np.ones((1 << 20, 64), np.float32)
        try:
            layer.forward(x)
        except Exception as e:
            print("raised", type(e).__name__, e)
        print("then", layer.forward(np.ones((4, 64), np.float32)).shape)
    """)
    assert status == 0, err
    assert "raised MemoryError [tensor] out of memory allocating 4294967296 bytes" in out, out
    assert "then (4, 64)" in out, out
