# What the record tests (record_test.py, fix_test.py, twin_test.py, pydiff_test.py) share: the skip when this
# Python lacks a module, the command-line arguments, the check counter and the summary with its exit status.
# ctest runs each test as `/usr/bin/python3 tests/record/X.py ARGS`, so this folder is on sys.path.
import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")
PYTHON = sys.executable
failures = []
_count = 0


def require(*names):
    """The modules named, imported in order; exit 77 (ctest's SKIP_RETURN_CODE) when one is missing."""
    try:
        return [importlib.import_module(n) for n in names]
    except ImportError as e:
        print("SKIP: %s" % e)
        sys.exit(77)


def arguments(*names):
    """The command-line arguments, one per name; a usage line and exit 2 when their number differs."""
    if len(sys.argv) != len(names) + 1:
        print("usage: %s %s" % (os.path.basename(sys.argv[0]), " ".join(names)), file=sys.stderr)
        sys.exit(2)
    return sys.argv[1:] if len(names) > 1 else sys.argv[1]


def check(cond, what):
    global _count
    _count += 1
    if not cond:
        failures.append(what)
        print("FAIL: " + what)


def finish():
    """The summary line; exit 1 when a check failed, else 0."""
    print("%d checks, %d failed" % (_count, len(failures)))
    sys.exit(1 if failures else 0)
