"""The rows' way to the `ampscope record` process, which writes them with the project's C++ trace writer.

One record per line, each a JSON array whose first element names its kind; the layout of each kind is
read by cli/record_command.cpp (keep both in step; kProtocol there). Non-finite doubles travel as the
strings "nan", "inf", "-inf" (JSON has no such numbers). A step's rows are written with one os.write
when the step ends, followed by its ["end_step", step] record: the parent flushes the trace at that
record, so a kill -9 of this process leaves every step whose end_step was written.
"""
import json
import math
import os

PROTOCOL = 1
# One encoder for every record: json.dumps with any option builds a new JSONEncoder per call (about a tenth of the
# per-row cost of `--probe dtype`). Its output is json.dumps(record, separators=(",", ":"), allow_nan=False)'s.
_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def num(x):
    x = float(x)
    if math.isfinite(x):
        return x
    if math.isnan(x):
        return "nan"
    return "inf" if x > 0 else "-inf"


class Channel:
    def __init__(self, fd):
        self.fd = fd
        self.pending = []
        self.broken = False

    def add(self, record):
        self.pending.append(_encode(record))

    def flush(self):
        if not self.pending or self.broken:
            self.pending = []
            return
        data = ("\n".join(self.pending) + "\n").encode("utf-8")
        self.pending = []
        view = memoryview(data)
        try:
            while view:
                n = os.write(self.fd, view)
                view = view[n:]
        except OSError:
            # The ampscope process is gone: the script goes on unrecorded rather than failing.
            self.broken = True
