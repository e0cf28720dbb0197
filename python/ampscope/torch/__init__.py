"""ampscope's PyTorch recorder. `ampscope record --out run.h5 -- python3 train.py` starts it inside an
unmodified script (docs/pytorch.md); a script run that way can also use this module:

    import ampscope.torch as amp
    if amp.recording():
        amp.end_step()   # a step boundary of one's own (a loop without torch.optim, or several optimizers)

or record part of a plain `python3 train.py` run itself (the `ampscope` program writes the trace: it is
started as `ampscope record --attach`, reading the rows on a pipe):

    with amp.record("run.h5", optimizers=[opt]):
        for batch in data: ...
"""
import contextlib
import os
import shutil
import subprocess


def recording():
    """True when this process is being recorded by `ampscope record`."""
    from ampscope.torch import _recorder

    return _recorder.active() is not None


def end_step():
    """Ends the current step: its rows and a /steps row are written and flushed (a crash after this keeps
    them). Steps also end by themselves after each optimizer step (or GradScaler update)."""
    from ampscope.torch import _recorder

    r = _recorder.active()
    if r is None:
        raise RuntimeError("ampscope.torch.end_step(): this process is not being recorded\n"
                           "hint: run the script with `ampscope record --out run.h5 -- python3 SCRIPT`")
    r.end_step(None, None)


@contextlib.contextmanager
def record(out, *, probe="health", sample_every=1, ops=(), modules=(), record_optimizer=False, optimizers=(),
           twin=False, ampscope=None, flight_recorder=0):
    """Records what runs inside the `with` block into the trace `out`, as `ampscope record` records a whole
    script (the keywords are its options: --probe, --sample-every, --ops, --modules, --record-optimizer,
    --flight-recorder). Steps
    end at each step() of an optimizer created inside the block or passed in `optimizers`
    (an optimizer made before the block is not seen otherwise), at a GradScaler's update(), or at
    end_step(). twin=True: the f32 twin's /precision rows, as `ampscope record --twin` writes them (an autocast
    region entered before the block is not seen as one). `ampscope`: the program's path (default: $AMPSCOPE, else `ampscope` on PATH). The block's ops
    after the last step make a last step. An exception leaving the block leaves the trace with its finished
    steps and complete = 0. Raises RuntimeError when the program cannot be found or fails to write the
    trace (its own message is on stderr)."""
    from ampscope.torch import _recorder

    exe = ampscope or os.environ.get("AMPSCOPE") or shutil.which("ampscope")
    if not exe:
        raise RuntimeError("ampscope.torch.record(): cannot find the ampscope program\n"
                           "hint: put it on PATH, set AMPSCOPE=/path/to/ampscope, or pass ampscope=...")
    argv = [exe, "record", "--out", os.fspath(out), "--attach", "--probe", probe, "--sample-every",
            str(int(sample_every))]
    for glob in ops:
        argv += ["--ops", glob]
    for glob in modules:
        argv += ["--modules", glob]
    if record_optimizer:
        argv.append("--record-optimizer")
    if flight_recorder:
        argv += ["--flight-recorder", str(int(flight_recorder))]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE)
    try:
        options = {"probe": probe, "sample_every": int(sample_every), "ops": list(ops), "modules": list(modules),
                   "record_optimizer": bool(record_optimizer), "flight_recorder": int(flight_recorder)}
        if twin:
            options["twin"] = True
        r = _recorder.start(child.stdin.fileno(), options, whole_run=False)
    except BaseException:
        child.stdin.close()
        child.wait()
        raise
    for opt in optimizers:
        r.wrap_optimizer(opt)
    clean = False
    try:
        yield
        clean = True
    finally:
        _recorder.stop(r, clean)
        child.stdin.close()
        status = child.wait()
    if status != 0:
        raise RuntimeError("ampscope.torch.record(): `ampscope record --attach` exited with status %d: the trace "
                           "%s may be missing or incomplete (its message is above)" % (status, out))
