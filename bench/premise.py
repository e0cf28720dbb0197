#!/usr/bin/env python3
"""The shell benchmarks' premise checks on a trace (issue 37), read with h5py, never from the program's summary.

A benchmark's figures count only when the run it timed is the run its name says; this checks one trace after
timing and exits 1 with `NAME: premise broken: expected X, found Y` when it is not (0 and no output when it is):

  /usr/bin/python3 bench/premise.py NAME TRACE [--steps N] [--precision P] [--rows TABLE[.PHASE]=SPEC]...
                                    [--same-loss TRACE2] [--other-loss TRACE2] [--no-module TABLE=MODULE]...

  --steps N          the trace is complete (attribute `complete` 1) and /steps holds steps 0 .. N-1
  --complete         the trace is complete and /steps holds steps 0 .. N-1 for some N >= 1
  --precision P      the trace's `precision` attribute is P
  --rows T=SPEC      the rows of table T (/ops, /fp8, /blocks, /precision; T.PHASE: only the rows of that phase,
                     e.g. ops.optimizer) lie in the steps SPEC says: `none` (no row), `every` (at least one in every
                     step of /steps), `same` (the same number, at least one, in every step), `mod:K` (the same
                     number, at least one, in each step that is a multiple of K and none in the others),
                     `more:TRACE2` (in every step, more than TRACE2's rows of the same table in that step)
  --same-loss T2     /steps loss equals T2's bit for bit (the same arithmetic ran: the probe level changes nothing)
  --other-loss T2    /steps loss differs from T2's in some step (another arithmetic ran)
  --no-module T=M    no row of table T names module M (the module was kept out, e.g. --fp8-keep-bf16)
  --finite-loss      every /steps loss is finite
"""
import argparse
import collections
import sys

import h5py
import numpy as np


class Broken(Exception):
    pass


def texts(f):
    """Every text of the trace by id (/strings locates each in /string_bytes; docs/trace-format.md)."""
    blob = f["string_bytes"][:].tobytes()
    return [blob[r["offset"]:r["offset"] + r["length"]].decode() for r in f["strings"][:]]


def steps_of(f):
    return [int(s) for s in f["steps"]["step"]]


def rows_per_step(f, table, phase=None):
    if table not in f:
        raise Broken(f"a table /{table}", "none")
    rows = f[table][:]
    if phase is not None:
        names = texts(f)
        rows = rows[np.array([names[i] == phase for i in rows["phase"]], dtype=bool)] if len(rows) else rows
    return collections.Counter(int(s) for s in rows["step"])


def short(counter):
    items = sorted(counter.items())
    text = ", ".join(f"{s}: {n}" for s, n in items[:8])
    return "{" + text + (", ..." if len(items) > 8 else "") + "}"


def check_rows(f, path, arg):
    what, spec = arg.split("=", 1)
    table, _, phase = what.partition(".")
    label = f"/{table}" + (f" rows of phase {phase}" if phase else " rows")
    found = rows_per_step(f, table, phase or None)
    steps = steps_of(f)
    if spec == "none":
        if found:
            raise Broken(f"no {label}", f"{sum(found.values())} in steps {short(found)}")
    elif spec in ("every", "same"):
        missing = [s for s in steps if found.get(s, 0) == 0]
        if missing or not steps:
            raise Broken(f"{label} in every one of the {len(steps)} steps", f"none in steps {missing[:8]}")
        if spec == "same" and len(set(found[s] for s in steps)) != 1:
            raise Broken(f"the same number of {label} in every step", f"{short(found)} (step: rows)")
    elif spec.startswith("mod:"):
        k = int(spec[4:])
        want = [s for s in steps if s % k == 0]
        if sorted(found) != want or len(set(found.values())) != 1:
            raise Broken(f"the same number of {label} in steps {want[:8]} (multiples of {k}) only",
                         f"{short(found)} (step: rows)")
    elif spec.startswith("more:"):
        other = rows_per_step(h5py.File(spec[5:], "r"), table, phase or None)
        fewer = [s for s in steps if found.get(s, 0) <= other.get(s, 0)]
        if fewer or not steps:
            raise Broken(f"more {label} in every step than {spec[5:]}",
                         f"{short(found)} against {short(other)} (step: rows)")
    else:
        raise SystemExit(f"premise.py: unknown row spec '{spec}'\nhint: none, every, same, mod:K or more:TRACE")


def losses(path):
    with h5py.File(path, "r") as f:
        return f["steps"]["loss"][:]


def check(args):
    with h5py.File(args.trace, "r") as f:
        if args.steps is not None:
            complete = int(f.attrs.get("complete", 0))
            steps = steps_of(f)
            if complete != 1 or steps != list(range(args.steps)):
                raise Broken(f"a complete trace with steps 0..{args.steps - 1}",
                             f"complete={complete}, {len(steps)} steps {steps[:5]}{'...' if len(steps) > 5 else ''}")
        if args.complete:
            complete = int(f.attrs.get("complete", 0))
            steps = steps_of(f)
            if complete != 1 or not steps or steps != list(range(len(steps))):
                raise Broken("a complete trace with steps 0..N-1", f"complete={complete}, steps {steps[:8]}")
        if args.precision is not None:
            p = f.attrs.get("precision", b"")
            p = p.decode() if isinstance(p, bytes) else str(p)
            if p != args.precision:
                raise Broken(f"precision {args.precision}", f"precision {p}")
        for arg in args.rows:
            check_rows(f, args.trace, arg)
        for arg in args.no_module:
            table, module = arg.split("=", 1)
            names = texts(f)
            n = sum(1 for i in f[table]["module"] if names[i] == module)
            if n:
                raise Broken(f"no /{table} rows of module {module}", f"{n}")
    mine = losses(args.trace)
    if args.same_loss is not None:
        theirs = losses(args.same_loss)
        if mine.shape != theirs.shape or mine.tobytes() != theirs.tobytes():
            raise Broken(f"the losses of {args.same_loss} bit for bit", f"{mine[:4]} against {theirs[:4]}")
    if args.other_loss is not None:
        theirs = losses(args.other_loss)
        if mine.shape == theirs.shape and mine.tobytes() == theirs.tobytes():
            raise Broken(f"losses other than {args.other_loss}'s (another arithmetic)", f"the same losses {mine[:4]}")
    if args.finite_loss and not np.all(np.isfinite(mine)):
        raise Broken("a finite loss in every step", f"losses {mine[:8]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name")
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--complete", action="store_true")
    ap.add_argument("--precision")
    ap.add_argument("--rows", action="append", default=[])
    ap.add_argument("--same-loss")
    ap.add_argument("--other-loss")
    ap.add_argument("--no-module", action="append", default=[])
    ap.add_argument("--finite-loss", action="store_true", help="every /steps loss is finite")
    args = ap.parse_args()
    try:
        check(args)
    except Broken as e:
        expected, found = e.args
        print(f"{args.name}: premise broken: expected {expected}, found {found} (in {args.trace})", file=sys.stderr)
        sys.exit(1)
    except (OSError, KeyError) as e:
        print(f"{args.name}: premise broken: expected a readable trace {args.trace}, found {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
