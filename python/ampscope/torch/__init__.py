"""ampscope's PyTorch recorder. `ampscope record --out run.h5 -- python3 train.py` starts it inside an
unmodified script (docs/pytorch.md); a script run that way can also use this module:

    import ampscope.torch as amp
    if amp.recording():
        amp.end_step()   # a step boundary of one's own (a loop without torch.optim, or several optimizers)
"""


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
