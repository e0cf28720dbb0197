# tests/tokens/write_numpy.py DIR: token files written by numpy itself, for tests/tokens/numpy_files_test.cpp.
# The ids are listed by hand here and, again by hand, in the test; the C++ reader must read back exactly
# these. Exit status 77 when numpy is missing (the test skips).
import sys

try:
    import numpy as np
    import numpy.lib.format as npy_format
except ImportError:
    sys.exit(77)

out = sys.argv[1]

IDS = {
    "i4": ("<i4", [0, 1, 50256, 65536, 2147483647]),
    "i8": ("<i8", [0, 7, 50257, 128255, 2147483647]),
    "u2": ("<u2", [0, 1, 255, 256, 50256, 65535]),
    "u1": ("|u1", [0, 1, 104, 255]),
}

for name, (dtype, ids) in IDS.items():
    a = np.array(ids, dtype=dtype)
    assert a.dtype.str == dtype, (a.dtype.str, dtype)
    for version in [(1, 0), (2, 0), (3, 0)]:
        with open(f"{out}/{name}_v{version[0]}.npy", "wb") as f:
            npy_format.write_array(f, a, version=version)
    np.save(f"{out}/{name}_save.npy", a)  # np.save picks the version itself (1.0)

# Any shape is read flattened in C order.
np.save(f"{out}/i4_2x3.npy", np.array([[10, 11, 12], [20, 21, 22]], dtype=np.int32))
np.save(f"{out}/i8_2x2x2.npy", np.arange(8, dtype=np.int64).reshape(2, 2, 2) * 3)
# A Fortran-ordered array: refused (fortran_order True in the header).
np.save(f"{out}/fortran.npy", np.asfortranarray(np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)))
# A big-endian one and a float one: refused.
np.save(f"{out}/big_endian.npy", np.array([1, 2, 3], dtype=">i4"))
np.save(f"{out}/float.npy", np.array([1, 2, 3], dtype=np.float32))
# nanoGPT's prepare.py: np.array(ids, dtype=np.uint16).tofile(path).
np.array([0, 1, 255, 256, 50256, 65535], dtype=np.uint16).tofile(f"{out}/nanogpt.bin")
