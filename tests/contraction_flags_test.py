#!/usr/bin/env python3
"""Every CUDA source of the build is compiled with -fmad=false and every C++ source with
-ffp-contract=off (the backends round a * b + c twice, as docs/cuda.md promises): read from the build's
compile_commands.json, so a target that resets its options, or a .cu file added with its own flags,
fails here rather than on a GPU as a last-bit parity difference.

usage: contraction_flags_test.py BUILD_DIR [--expect-cuda]"""
import json
import os
import shlex
import sys


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    build = sys.argv[1]
    expect_cuda = "--expect-cuda" in sys.argv[2:]
    path = os.path.join(build, "compile_commands.json")
    try:
        with open(path) as f:
            commands = json.load(f)
    except OSError as e:
        print(f"contraction_flags_test: cannot read {path}: {e}\nhint: configure with CMAKE_EXPORT_COMPILE_COMMANDS ON")
        return 1
    bad, cuda, cxx = [], 0, 0
    for entry in commands:
        source = entry["file"]
        words = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
        if source.endswith(".cu"):
            cuda += 1
            if "-fmad=false" not in words:
                bad.append(f"{source}: no -fmad=false")
            if any(w in ("-fmad=true", "--use_fast_math", "-use_fast_math") for w in words):
                bad.append(f"{source}: contraction or fast math turned back on")
        elif source.endswith((".cpp", ".cc")):
            cxx += 1
            if "-ffp-contract=off" not in words:
                bad.append(f"{source}: no -ffp-contract=off")
            if "-ffast-math" in words or "-ffp-contract=fast" in words:
                bad.append(f"{source}: -ffast-math or -ffp-contract=fast")
    if expect_cuda and cuda == 0:
        bad.append("no .cu file in compile_commands.json although the build has CUDA")
    for line in bad:
        print("contraction_flags_test:", line)
    print(f"contraction_flags_test: {cuda} CUDA and {cxx} C++ compile commands checked, {len(bad)} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
