"""Starts the recorder inside a script run by `ampscope record` (imported by ampscope/_boot/sitecustomize.py)."""
import json
import os
import sys


def start_from_environment():
    fd_text = os.environ.pop("AMPSCOPE_RECORD_FD", None)
    options = json.loads(os.environ.pop("AMPSCOPE_RECORD_OPTIONS", "{}"))
    # Only the process ampscope started records: a subprocess the script starts (a DataLoader worker
    # spawned anew, a tool it runs) sees neither variable, and the pipe is not inherited.
    if fd_text is None:
        return
    fd = int(fd_text)
    os.set_inheritable(fd, False)
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.stderr.write("ampscope record: error: this Python has no torch module: nothing to record\n"
                         "hint: run the script with the interpreter it trains with (the one where `import torch` works)\n")
        os.close(fd)
        return
    from ampscope.torch import _recorder

    _recorder.start(fd, options)
