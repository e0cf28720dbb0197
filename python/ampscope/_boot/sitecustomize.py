# Put on PYTHONPATH by `ampscope record` (cli/record_command.cpp) so that the recorder starts inside an
# unmodified script: Python imports `sitecustomize` at start-up. A sitecustomize of the platform's (Debian
# ships one) that this file shadows is imported after ours, so the interpreter behaves as it would without us.
import importlib
import os
import sys


def _chain_platform_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    saved_path, saved_module = list(sys.path), sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved_path
        if saved_module is not None:
            sys.modules["sitecustomize"] = saved_module


_chain_platform_sitecustomize()
if "AMPSCOPE_RECORD_FD" in os.environ:
    from ampscope.torch import _boot

    _boot.start_from_environment()
