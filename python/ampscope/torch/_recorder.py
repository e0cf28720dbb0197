"""The recorder: what an unmodified PyTorch script does, as ampscope trace rows (docs/pytorch.md).

- Ops: a TorchDispatchMode sees every aten op after autocast's casts, with its real dtypes. It is pushed only
  for the steps that are recorded (--sample-every) and popped while the optimizer's step and gradient clipping
  run (unless --record-optimizer). Forward (and with that option, optimizer) ops give one row per aten op (named as torch names them: addmm -> "linear", _softmax ->
  "softmax", add.Tensor -> "add"); views, clones, detaches and casts give none and carry the producer of
  what they were made from (so autocast's casts are folded into the op they feed).
- Backward: one row per autograd node, named after the forward op that made it and attributed to its
  module. Each node is labelled when the op after it runs (its output has a grad_fn by then), and hooks on
  the node emit the row from the gradients it returns.
- Steps end with the optimizer's step (every Optimizer instance's step is wrapped when it is created), or
  with the GradScaler's update() when one is used, or with ampscope.torch.end_step().
- Provenance: a map from each output tensor (by id, checked with a weakref) to its row's seq.
- Statistics with torch reductions on the tensor's device; masks only when a non-finite value exists. Level
  full adds exponent histograms (/histograms); --ops/--modules globs leave ops out (their consumers name them -4).
- Flight recorder (--flight-recorder N, with --sample-every): every step is recorded and its rows held; an
  unsampled step is written only when anomalous, with the held steps before it (Recorder.flight_end).
"""
import atexit
import math
import os
import re
import struct
import sys
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ampscope.torch._channel import PROTOCOL, Channel, num
from ampscope.torch._remedies import Remedies, end_process
from ampscope.torch._twin import BACKWARD_NAMES, Twin

# Input markers (docs/trace-format.md, /ops `inputs`).
NONE, PARAMETER, DATA, FILTERED, SUMMED, OTHER_STEP = -1, -2, -3, -4, -5, -7
LEVELS = ("off", "dtype", "health", "full")
# /histograms bins (probes/trace/schema.h): exponents -64..63, then subnormal, zero, inf, NaN.
HIST_MIN_EXPONENT, HIST_MAX_EXPONENT = -64, 63
HIST_EXPONENT_BINS = HIST_MAX_EXPONENT - HIST_MIN_EXPONENT + 1
HIST_BINS = HIST_EXPONENT_BINS + 4
# What the per-op path does with an aten op, decided once per OpOverload (Recorder.classify).
KIND_FILL, KIND_PASS, KIND_COPY, KIND_OP = 0, 1, 2, 3

DTYPE_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
               torch.int64: "i64", torch.bool: "bool", torch.int32: "i32", torch.int8: "i8", torch.uint8: "u8"}

# aten ops that make no value of their own: their output is the value (or part of it) they were made from.
PASS_OPS = {"view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand",
            "unsqueeze", "squeeze", "slice", "select", "as_strided", "detach", "alias", "split", "split_with_sizes",
            "chunk", "unbind", "contiguous", "clone", "unfold", "lift_fresh", "view_as", "expand_as", "flatten",
            "diagonal", "narrow", "_to_copy", "to", "_to_dtype", "copy", "unsafe_split", "lift_fresh_copy"}
CAST_OPS = {"_to_copy", "to", "_to_dtype", "copy"}
# In-place fills (initialisation, zero_grad): what they leave is data, not an op's value.
FILL_OPS = {"uniform_", "normal_", "zero_", "fill_", "bernoulli_", "random_", "exponential_", "geometric_",
            "cauchy_", "log_normal_", "kaiming_uniform_", "trunc_normal_", "ones_", "zeros_"}

# aten names -> the name a torch user knows (probes/analysis/op_traits.cpp lists the names the report knows).
RENAME = {"addmm": "linear", "mm": "matmul", "bmm": "matmul", "baddbmm": "matmul", "_softmax": "softmax",
          "_log_softmax": "log_softmax", "native_layer_norm": "layer_norm", "nll_loss_forward": "nll_loss",
          "nll_loss2d_forward": "nll_loss", "native_dropout": "dropout", "native_batch_norm": "batch_norm",
          "_native_batch_norm_legit": "batch_norm", "convolution": "conv2d", "_scaled_dot_product_attention":
          "scaled_dot_product_attention", "_scaled_dot_product_flash_attention": "scaled_dot_product_attention",
          "_scaled_dot_product_efficient_attention": "scaled_dot_product_attention",
          "_scaled_dot_product_attention_math": "scaled_dot_product_attention"}
LINEAR_OPS = {"addmm", "mm", "bmm", "matmul", "linear"}
# Backward node names of the engine's own work (no forward op).
LOWER_PRECISION = {"linear", "matmul", "conv2d", "scaled_dot_product_attention"}

_active = None


def active():
    return _active


def _dtype(t):
    name = DTYPE_NAMES.get(t.dtype)  # not .get(d, default): the default's str() ran on every call
    return name if name is not None else str(t.dtype).replace("torch.", "")


def _tensors(value, out):
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensors(v, out)
    return out


_Tensor = torch.Tensor


def _flat(value):
    """The tensors of an op's arguments or result, two levels deep (aten's arguments: tensors, lists of
    tensors): the per-op path's cheaper _tensors (no recursion, no list passed down)."""
    if isinstance(value, _Tensor):
        return [value]
    out = []
    if isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, _Tensor):
                out.append(v)
            elif isinstance(v, (list, tuple)):
                for w in v:
                    if isinstance(w, _Tensor):
                        out.append(w)
    return out


def histogram(x):
    """The exponent histogram of a floating tensor as the probe writes it (/histograms, probes/trace/schema.h):
    bins[e + 64] counts the finite values with floor(log2|x|) = e for e in -64..63 (larger exponents in the
    last), then subnormal (below the dtype's smallest normal, or below 2^-64), zero, inf (either sign), NaN."""
    xd = x.detach().reshape(-1).to(torch.float64)
    bins = [0] * HIST_BINS
    finite = torch.isfinite(xd)
    nan = int(torch.isnan(xd).sum())
    bins[HIST_EXPONENT_BINS + 3] = nan
    bins[HIST_EXPONENT_BINS + 2] = int(xd.numel() - int(finite.sum())) - nan
    a = xd[finite].abs()
    zero = int((a == 0).sum())
    bins[HIST_EXPONENT_BINS + 1] = zero
    normal = a[a >= torch.finfo(x.dtype).tiny]
    subnormal = int(a.numel()) - zero - int(normal.numel())
    # frexp: a = m * 2^k with m in [0.5, 1), so floor(log2 a) = k - 1, exactly (no log rounding).
    e = torch.frexp(normal).exponent.to(torch.int64) - 1
    low = e < HIST_MIN_EXPONENT
    subnormal += int(low.sum())
    e = e[~low].clamp(max=HIST_MAX_EXPONENT) - HIST_MIN_EXPONENT
    counts = torch.bincount(e, minlength=HIST_EXPONENT_BINS).tolist()
    bins[:HIST_EXPONENT_BINS] = counts[:HIST_EXPONENT_BINS]
    bins[HIST_EXPONENT_BINS] = subnormal
    return bins


def _glob_matcher(patterns):
    """fnmatch as the probe matches its --ops/--modules globs (fnmatch(3) without flags: * matches dots too);
    None when there are no patterns (everything matches). Answers are cached per name."""
    if not patterns:
        return None
    import fnmatch
    compiled = [re.compile(fnmatch.translate(p)) for p in patterns]
    cache = {}

    def matches(name):
        hit = cache.get(name)
        if hit is None:
            hit = cache[name] = any(c.match(name) is not None for c in compiled)
        return hit
    return matches


_scratch = {}  # device -> a 1-D f64 buffer health() widens into (grown, never shrunk)


def _widened(x):
    """x's elements as a 1-D f64 tensor in a buffer kept across calls: a fresh multi-megabyte temporary per
    call is a fresh mmap whose every page faults on first touch, which cost more than the reductions themselves
    on a CPU (bench/RESULTS.md). The result is valid until the next call; x itself is never written."""
    n = x.numel()
    buf = _scratch.get(x.device)
    if buf is None or buf.numel() < n:
        buf = _scratch[x.device] = torch.empty(max(n, 1 << 16), dtype=torch.float64, device=x.device)
    out = buf[:n]
    out.copy_(x.reshape(-1))
    return out


def health(x):
    return _health(x)[0]


_TINY = {}  # dtype -> its smallest normal
_scratch32 = {}  # (device, slot) -> a 1-D f32 buffer the f32-accumulated statistics work in (grown, never shrunk)
_LOW = (torch.float32, torch.bfloat16, torch.float16)
# The smallest normal f32, 2^-126: a square below it may have lost bits (or be 0) in f32.
_F32_TINY = 2.0 ** -126
_F32 = struct.Struct("f")  # packing a float to f32 rounds it to nearest (_grad_health's absmax)
_COUNT_EXACT = 1 << 24  # an f32 sum of 0/1 values is exact up to this many (every partial sum an integer <= 2^24)


def _buffer32(x, n, slot=0):
    buf = _scratch32.get((x.device, slot))
    if buf is None or buf.numel() < n:
        buf = _scratch32[(x.device, slot)] = torch.empty(max(n, 1 << 16), dtype=torch.float32, device=x.device)
    return buf[:n]


def _health(x):
    """(health, sum of squares of the finite values): the sum of squares gives a gradient's norm with no second
    pass.

    health: [numel, nan, pos_inf, neg_inf, zero, subnormal, min, max, absmax, mean, rms] of a floating tensor, the
    moments over the finite values (NaN when there are none). Counts and extremes are exact. For an f32, bf16 or
    f16 tensor the mean's sum and the sum of squares are accumulated in f32 (torch's own reduction), within the
    bound docs/pytorch.md derives ("Statistics"): |error| <= gamma_(n-1) * sum|x_i| for the sum, gamma_n * sum x_i^2
    + n * 2^-149 for the sum of squares (gamma_k = k u / (1 - k u), u = 2^-24), n the number of finite values (a
    tensor holding NaN or inf: _health_nonfinite32); f64 tensors and ones whose f32 sums overflow take the f64 path
    (_health64, _health_nonfinite)."""
    x = x.detach()
    n = x.numel()
    if n == 0:
        nan = float("nan")
        return [0, 0, 0, 0, 0, 0, nan, nan, nan, nan, nan], 0.0
    tiny = _TINY.get(x.dtype)
    if tiny is None:
        tiny = _TINY[x.dtype] = torch.finfo(x.dtype).tiny
    if x.dtype not in _LOW:
        return _health64(x, n, tiny)
    return _health32(x, n, tiny)


def _health32(x, n, tiny):
    """_health of an f32, bf16 or f16 tensor: sums accumulated in f32, no f64 copy (half the bytes of the f64 path:
    bench/RESULTS.md, the 2026-11-29 03:54 entry).

    Cost: bf16 and f16 are widened (exactly) into a reused f32 buffer; then its sum, aminmax, the squares (in place
    for a widened tensor, into the buffer for an f32 one: a bf16 or f16 square is exact in f32), their sum and
    their smallest value, brought to the host together. A smallest square below max(tiny^2, 2^-126) is the only
    sign a zero or subnormal may exist (every zero or subnormal squares below it; an f32 square under 2^-126 may
    also come from a normal value): only then are they counted (_small_counts32)."""
    buf = _buffer32(x, n)
    if x.dtype == torch.float32:
        xf = x.reshape(-1)
        sq = torch.mul(xf, xf, out=buf)
    else:
        xf = buf
        xf.copy_(x.reshape(-1))
        sq = None
    total_t = xf.sum()
    lo_t, hi_t = torch.aminmax(xf)  # NaN propagates: a non-finite extreme is the only sign of NaN or inf
    if sq is None:
        sq = xf.mul_(xf)  # the buffer holds the squares from here on
    total, lo, hi, q, smallest = torch.stack([total_t, lo_t, hi_t, sq.sum(), sq.amin()]).tolist()
    if not (math.isfinite(lo) and math.isfinite(hi)):
        h = _health_nonfinite32(x, n, tiny, lo, hi)
        return h if h is not None else _health_nonfinite(x, n, tiny, lo, hi)
    if not (math.isfinite(total) and math.isfinite(q)):
        return _health64(x, n, tiny)  # finite values whose f32 sum or squares overflow: the f64 path, exact
    zero = subnormal = 0
    if smallest < max(tiny * tiny, _F32_TINY):
        zero, below = _small_counts32(x, n, tiny)
        subnormal = below - zero
    return [n, 0, 0, 0, zero, subnormal, lo, hi, max(abs(lo), abs(hi)), total / n, math.sqrt(q / n)], q


def _grad_health(g):
    """(nan, pos_inf, neg_inf, zero, absmax, sum of squares) of a gradient: what its /grads row and the step's norm
    read, with the values _health gives (a gradient row records no mean, min, max or subnormal count).

    For a finite f32, bf16 or f16 gradient, the squares into the reused f32 buffer (those of _health32: the same
    buffer, the same sum) and their sum, smallest and largest value: no pass for the mean's sum, and `amax` of the
    squares in place of `aminmax` (NaN and inf carry into the sum of squares, which then says the gradient is not
    finite). absmax = the square root of the largest square rounded to f32: exact wherever that square is a normal
    f32 (a bf16 or f16 square is exact in f32; an f32 one is rounded once, and in binary floating point
    sqrt(fl(x^2)) == |x| with correctly rounded operations; the f64 square root rounded to f32 is that f32 square
    root: 53 >= 2 * 24 + 2 bits, so the double rounding is innocuous). Anything else (NaN, inf, squares that
    overflow, a largest square below 2^-126, f64) takes _health."""
    x = g.detach()
    n = x.numel()
    if n == 0 or x.dtype not in _LOW:
        h, q = _health(x)
        return h[1], h[2], h[3], h[4], h[8], q
    buf = _buffer32(x, n)
    if x.dtype == torch.float32:
        sq = torch.mul(x.reshape(-1), x.reshape(-1), out=buf)
    else:
        sq = buf.copy_(x.reshape(-1)).mul_(buf)
    q, smallest, largest = torch.stack([sq.sum(), sq.amin(), sq.amax()]).tolist()
    if not (math.isfinite(q) and _F32_TINY <= largest < math.inf):
        h, q = _health(x)
        return h[1], h[2], h[3], h[4], h[8], q
    tiny = _TINY.get(x.dtype)
    if tiny is None:
        tiny = _TINY[x.dtype] = torch.finfo(x.dtype).tiny
    zero = 0
    if smallest < max(tiny * tiny, _F32_TINY):
        zero = _small_counts32(x, n, tiny)[0]
    return 0, 0, 0, zero, _F32.unpack(_F32.pack(math.sqrt(largest)))[0], q


def _nonfinite_row(n, counts_t, has_pos, has_neg, m, zero, subnormal, lo_f, hi_f, total, sq_sum):
    """The row (and sum of squares) of _health_nonfinite32 and _health_nonfinite from what they measured: m finite
    values of n; counts_t the NaN, +inf and -inf counts when they were counted (NaN or both infinities present),
    else None: then the n - m non-finite places are all of the one kind the aminmax showed."""
    bad = n - m
    if counts_t is not None:
        nan_c, pinf, ninf = counts_t.tolist()
    else:
        nan_c, pinf, ninf = 0, (bad if has_pos else 0), (bad if has_neg else 0)
    if m == 0:
        nan = float("nan")
        return [n, nan_c, pinf, ninf, 0, 0, nan, nan, nan, nan, nan], 0.0
    return [n, nan_c, pinf, ninf, zero, subnormal, lo_f, hi_f, max(abs(lo_f), abs(hi_f)), total / m,
            math.sqrt(sq_sum / m)], sq_sum


def _health_nonfinite32(x, n, tiny, lo, hi):
    """_health of an f32, bf16 or f16 tensor holding NaN or inf (the masked attention scores, -inf above the
    diagonal): the sums over the finite values accumulated in f32, within the bound of _health32 (nansum adds zeros
    at the non-finite places: exact additions, so m finite values still make at most m - 1 rounded additions).
    None when an f32 sum overflows (the f64 path, _health_nonfinite, then). lo, hi: x's aminmax.

    In a reused f32 buffer holding a copy of x (its in-place fills must not reach x). nan_to_num_ makes every
    non-finite place +inf, so amin gives the smallest finite value and, on |x|, the smallest magnitude (which says
    whether zeros or subnormals may exist); when the maximum is needed (NaN or +inf present), a second nan_to_num_
    makes them -inf for amax. add_(xf, alpha=0) then turns every non-finite place into NaN (inf + 0 * inf), which
    nansum leaves out of the sum, the sum of squares and the count of finite places (nansum of x * 0 + 1). On this
    CPU nan_to_num_ is a slow kernel (0.11 ms on 131K f32 values, an arithmetic pass 0.005 to 0.012 ms) and
    count_nonzero and comparisons into booleans too: one nan_to_num_ (two with the maximum), the kinds of non-finite
    value from the aminmax as in _health_nonfinite, the zeros and subnormals by _small_counts32's arithmetic only
    when the smallest magnitude is below tiny."""
    inf = math.inf
    has_nan = math.isnan(lo) or math.isnan(hi)
    has_neg, has_pos = lo == -inf, hi == inf
    xf = _buffer32(x, n)
    xf.copy_(x.reshape(-1))
    counts_t = None
    if has_nan or (has_neg and has_pos):
        counts_t = torch.stack([torch.isnan(xf).sum(), torch.isposinf(xf).sum(), torch.isneginf(xf).sum()])
    b1 = _buffer32(x, n, 1)
    parts = [xf.nan_to_num_(nan=inf, posinf=inf, neginf=inf).amin(), torch.abs(xf, out=b1).amin()]
    if has_nan or has_pos:
        parts.append(xf.nan_to_num_(posinf=-inf).amax())  # every non-finite place is -inf now (no NaN is left)
    xf.add_(xf, alpha=0.0)  # inf + 0 * inf: NaN at every non-finite place
    count_dtype = torch.float32 if n <= _COUNT_EXACT else torch.float64
    parts += [torch.nansum(xf), torch.nansum(torch.mul(xf, xf, out=b1)),
              torch.nansum(torch.mul(xf, 0.0, out=b1).add_(1.0), dtype=count_dtype)]
    values = torch.stack([p.to(torch.float64) for p in parts]).tolist()
    lo_f, smallest = values[0], values[1]
    hi_f = values[2] if has_nan or has_pos else hi
    total, sq_sum, m = values[-3:]
    if not (math.isfinite(total) and math.isfinite(sq_sum)):
        return None  # finite values whose f32 sum or squares overflow
    m = int(m)
    zero = subnormal = 0
    if m > 0 and smallest < tiny:
        # v = min(|x|, tiny) / tiny: 0 for a zero, in (0, 1) for a subnormal, exactly 1 for a normal value (1/tiny is
        # a power of two), NaN at the non-finite places: nansum of ceil(v) counts the nonzero finite values, of
        # floor(v) the normal ones.
        v = xf.abs_().clamp_(max=tiny).mul_(1.0 / tiny)
        nonzero, normal = torch.stack([torch.nansum(torch.ceil(v, out=b1), dtype=count_dtype).double(),
                                       torch.nansum(v.floor_(), dtype=count_dtype).double()]).tolist()
        zero = m - int(nonzero)
        subnormal = (m - int(normal)) - zero
    return _nonfinite_row(n, counts_t, has_pos, has_neg, m, zero, subnormal, lo_f, hi_f, total, sq_sum)


def _small_counts32(x, n, tiny):
    """(zeros, values below the smallest normal) of a finite f32, bf16 or f16 tensor, by arithmetic in f32 (no
    comparison into a boolean tensor, no count_nonzero: both slow kernels on this CPU, bench/RESULTS.md).
    v = min(|x|, tiny) / tiny is 0 for a zero, in (0, 1) for a subnormal and exactly 1 for a normal value (1/tiny is
    a power of two and every product is representable: exact), so the sum of ceil(v) counts the nonzero values and
    the sum of floor(v) the normal ones (sums of 0/1 in f32: exact up to 2^24 values, in f64 beyond)."""
    a = _buffer32(x, n)
    if x.dtype == torch.float32:
        torch.abs(x.reshape(-1), out=a)
    else:
        a.copy_(x.reshape(-1)).abs_()  # torch 1.13's abs writes no f32 result from a bf16 or f16 input
    v = a.clamp_(max=tiny).mul_(1.0 / tiny)
    up = torch.ceil(v, out=_buffer32(x, n, 1))
    dtype = torch.float32 if n <= _COUNT_EXACT else torch.float64
    nonzero, normal = torch.stack([up.sum(dtype=dtype).double(), v.floor_().sum(dtype=dtype).double()]).tolist()
    return n - int(nonzero), n - int(normal)


def _health64(x, n, tiny):
    """_health in f64: an f64 tensor, or an f32, bf16 or f16 one whose f32 sums overflowed (values near the
    range's top).

    Cost: one copy into a reused f64 buffer, then reductions on it (sum, the sum of squares taken by squaring the
    buffer in place, whose smallest value tells whether a zero or subnormal exists) and aminmax on x, their
    results brought to the host together (one synchronisation on a GPU, one conversion on a CPU). Only
    arithmetic passes and reductions on f64, which torch vectorises: on this CPU its comparisons into boolean
    tensors (`==`, `<`, isnan) ran 4 to 10 times slower than a pass of arithmetic (bench/RESULTS.md, "ampscope
    record's cost"). The zero and subnormal counts are taken only when the smallest magnitude is below the dtype's
    smallest normal (_small_counts); a tensor whose sum is not finite takes _health_nonfinite."""
    xd = _widened(x)
    total_t = xd.sum()
    # The extremes are values of x's own dtype: exact on x, half the bytes of f64 (torch 1.13's CPU has no f16
    # aminmax: the buffer then, before it is squared; ops run in order on one device).
    lo_t, hi_t = torch.aminmax(xd if x.dtype == torch.float16 and x.device.type == "cpu" else x)
    if x.dtype == torch.float64:  # tiny * tiny underflows in f64: the smallest magnitude itself
        small_t, bound = xd.abs().amin(), tiny
    else:
        small_t, bound = None, tiny * tiny
    sq_t = xd.mul_(xd)  # the buffer holds the squares from here on
    if small_t is None:
        small_t = sq_t.amin()  # a square below tiny^2 (exact in f64 for f32, f16, bf16) is a zero or subnormal
    # not torch.dot for the sum of squares: BLAS threads fight over the cores and it ran 10x slower
    total, lo, hi, sq, smallest = torch.stack([total_t, lo_t.to(torch.float64), hi_t.to(torch.float64), sq_t.sum(),
                                               small_t]).tolist()
    if not math.isfinite(total):
        return _health_nonfinite(x, n, tiny, lo, hi)
    zero = subnormal = 0
    if smallest < bound:
        if x.dtype != torch.float64:
            zero, below = _small_counts(sq_t, bound, False)
        else:
            xf = x.reshape(-1)
            zero, below = torch.stack([(xf == 0).sum(), (xf.abs() < tiny).sum()]).tolist()
        subnormal = below - zero
    return [n, 0, 0, 0, zero, subnormal, lo, hi, max(abs(lo), abs(hi)), total / n, math.sqrt(sq / n)], sq


def _small_counts(sq, bound, with_nan):
    """(zeros, values below the smallest normal) among the finite places of sq, the squares of an f32, bf16 or f16
    tensor in f64 (exact: x^2 == 0 iff x == 0, x^2 < tiny^2 iff |x| < tiny), NaN at its non-finite places when
    with_nan; also the number of finite places when with_nan. sq is overwritten.

    By arithmetic, not comparisons (each a boolean temporary and a slow kernel on this CPU): count_nonzero gives
    the zeros (NaN counts as nonzero); then clamp(sq, max=bound) / bound is 0 for a zero, in (0, 1) for a
    subnormal's square and exactly 1 for a normal's (bound = tiny^2 is a power of two: the division is exact), so
    the sum of its floor counts the normal values (nansum leaves the NaN out)."""
    n = sq.numel()
    nonzero_t = torch.count_nonzero(sq)
    t = sq.clamp_(max=bound).mul_(1.0 / bound).floor_()
    if not with_nan:
        nonzero, normal = torch.stack([nonzero_t.to(torch.float64), t.sum()]).tolist()
        return n - int(nonzero), n - int(normal)
    normal_t = torch.nansum(t)
    finite_t = torch.nansum(t.mul_(0.0).add_(1.0))  # 1 at each finite place, NaN elsewhere
    nonzero, normal, finite = (int(v) for v in torch.stack([nonzero_t.to(torch.float64), normal_t, finite_t]).tolist())
    bad = n - finite
    return finite - (nonzero - bad), finite - normal, finite


def _health_nonfinite(x, n, tiny, lo, hi):
    """_health of a tensor holding NaN or inf: the counts, the moments over the finite values. lo, hi: x's aminmax
    (NaN when x holds a NaN).

    In the reused buffer with no boolean indexing and no f64 temporary. nan_to_num_ overwrites the non-finite
    values in place by +inf for the minimum, then (when the maximum is needed) by -inf for the maximum;
    add_(xd, alpha=0) turns every non-finite place into NaN (inf + 0 * inf), which nansum leaves out of the sums.
    Indexing with a mask made a fresh copy of the finite values per call (a fresh mmap whose pages fault on first
    touch): the two masked attention scores a step (-inf above the diagonal) took 8 to 17 ms each that way;
    masked_fill_ with a mask took more passes; comparisons into boolean tensors are slow kernels on this CPU
    (bench/RESULTS.md). The kinds of non-finite value come from the aminmax: with no NaN, -inf exists iff the
    minimum is -inf and +inf iff the maximum is +inf, and when only one kind is present its count is the number
    of non-finite places, which _small_counts gives with the zeros; isnan/isposinf/isneginf are taken only when
    NaN or both infinities are present."""
    xd = _widened(x)
    if x.dtype == torch.float64:
        return _health_nonfinite_f64(x, xd, n, tiny)
    inf = math.inf
    has_nan = math.isnan(lo) or math.isnan(hi)
    has_neg, has_pos = lo == -inf, hi == inf
    counts_t = None
    if has_nan or (has_neg and has_pos):
        counts_t = torch.stack([torch.isnan(xd).sum(), torch.isposinf(xd).sum(), torch.isneginf(xd).sum()])
    lo_t = xd.nan_to_num_(nan=inf, posinf=inf, neginf=inf).amin()  # every non-finite place is +inf
    hi_t = None
    if has_nan or has_pos:
        hi_t = xd.nan_to_num_(posinf=-inf).amax()  # every non-finite place is -inf now (no NaN is left)
    total_t = torch.nansum(xd.add_(xd, alpha=0.0))  # inf + 0 * inf: NaN at every non-finite place
    sq = xd.mul_(xd)
    sq_t = torch.nansum(sq)
    extremes = torch.stack([total_t, lo_t, sq_t] + ([hi_t] if hi_t is not None else [])).tolist()
    total, lo_f, sq_sum = extremes[0], extremes[1], extremes[2]
    hi_f = extremes[3] if hi_t is not None else hi
    zero, below, m = _small_counts(sq, tiny * tiny, True)
    return _nonfinite_row(n, counts_t, has_pos, has_neg, m, zero, below - zero, lo_f, hi_f, total, sq_sum)


def _health_nonfinite_f64(x, xd, n, tiny):
    """_health_nonfinite of an f64 tensor (a rare dtype for a row): tiny * tiny underflows in f64, so the zeros
    and subnormals are counted on x, and the NaN/inf by comparisons."""
    inf = math.inf
    xf = x.reshape(-1)
    zero_t, below_t = (xf == 0).sum(), (xf.abs() < tiny).sum()
    nan_t, pinf_t, ninf_t = torch.isnan(x).sum(), (x == inf).sum(), (x == -inf).sum()
    # Each nan_to_num_ reads its extreme before the next one overwrites the non-finite places (ops run in order).
    lo_t = xd.nan_to_num_(nan=inf, posinf=inf, neginf=inf).amin()
    hi_t = xd.nan_to_num_(posinf=-inf).amax()
    total_t = xd.nan_to_num_(neginf=0.0).sum()
    sq = xd.mul_(xd)
    nan_c, pinf, ninf, zero, below = torch.stack([nan_t, pinf_t, ninf_t, zero_t, below_t]).tolist()
    bad = nan_c + pinf + ninf
    m = n - bad
    if m == 0:
        nan = float("nan")
        return [n, nan_c, pinf, ninf, 0, 0, nan, nan, nan, nan, nan], 0.0
    total, lo, hi, sq_sum = torch.stack([total_t, lo_t, hi_t, sq.sum()]).tolist()
    return [n, nan_c, pinf, ninf, zero, below - zero, lo, hi, max(abs(lo), abs(hi)), total / m,
            math.sqrt(sq_sum / m)], sq_sum


# What a row's output held, for the judgement of the ops that read it (Recorder.rows_nonfinite).
ROW_FINITE, ROW_BAD, ROW_MASK = 0, 1, 2


def _counted(op, phase, h):
    """The NaN and inf of a row's health that are anomalies: a mask's fill writes -inf on purpose (masked_fill,
    attention's causal mask; the probe's OpFlag::mask_neg_inf, probes/probe.cpp judge_nonfinite), so a forward
    masked_fill's -inf do not count; its NaN and +inf do (they came in through the tensor it masked)."""
    neg = 0 if op == "masked_fill" and phase == "forward" else h[3]
    return h[1] + h[2] + neg


def _counts_text(h):
    parts = []
    for count, what in ((h[1], "NaN"), (h[2], "+inf"), (h[3], "-inf")):
        if count:
            parts.append("%d %s" % (count, what))
    return ", ".join(parts)


def _feeds_parameter(node):
    """True when a gradient sent to `node` ends in a parameter's .grad: through casts and views (autocast's
    cast of a weight, a transpose) to an AccumulateGrad."""
    for _ in range(8):
        if node is None:
            return False
        if type(node).__name__ == "AccumulateGrad":  # its name() is torch::autograd::AccumulateGrad
            return True
        if node.metadata.get("ampscope", "row") is not None or len(node.next_functions) != 1:
            return False
        node = node.next_functions[0][0]
    return False


def _flows_on(node):
    """For each gradient the node returns: whether it flows on to another op (not only into a parameter's .grad).
    Taken when the node is labelled (its inputs' nodes are labelled by then), so its hook need not hold it."""
    return tuple(nxt is not None and not _feeds_parameter(nxt) for nxt, _ in node.next_functions)


class _NodeView:
    """What the twin reads of a node in its backward_row: its metadata."""
    __slots__ = ("metadata",)

    def __init__(self, metadata):
        self.metadata = metadata


class _Mode(TorchDispatchMode):
    def __init__(self, recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        r = self.recorder
        if not r.busy and r.pid == os.getpid():
            r.busy = True
            try:
                r.on_op(func, args, out, kwargs)
            except Exception as e:  # the script goes on; the trace says it lost rows
                r.failed(e)
            finally:
                r.busy = False
        return out


class Recorder:
    def __init__(self, channel, options):
        self.channel = channel
        self.every = max(1, int(options.get("sample_every", 1)))
        self.level = options.get("probe", "health")
        if self.level not in LEVELS:
            raise ValueError("ampscope.torch: unknown probe level '%s' (known levels: %s)" % (
                self.level, ", ".join(LEVELS)))
        # --ops / --modules (probes/probe.h ProbeOptions): an op is recorded when its name matches one op glob
        # and its module one module glob; module globs also select /grads by the parameter's module.
        self.op_globs = list(options.get("ops", []))
        self.module_globs = list(options.get("modules", []))
        self.op_matches = _glob_matcher(self.op_globs)
        self.module_matches = _glob_matcher(self.module_globs)
        # --record-optimizer: the optimizer's (and gradient clipping's) aten ops are rows of the optimizer
        # phase; without it the dispatch mode is popped while they run (bench/RESULTS.md: they were 290 of
        # the 358 rows of a transformer's step, and about a third of its recording cost).
        self.record_optimizer = bool(options.get("record_optimizer", False))
        # --flight-recorder N (probes/probe.h, as `ampscope train` keeps it when sampling): with --sample-every,
        # every step is recorded, its rows held in memory; an unsampled step is written only if it had an anomaly
        # (a non-finite op output or gradient, an overflow the GradScaler found, a skipped step), and then with
        # the held steps before it (N steps in all, itself included). 0: off (unsampled steps run unrecorded).
        self.flight_steps = max(0, int(options.get("flight_recorder", 0)))
        self.flight = self.flight_steps > 0 and self.every > 1
        self.held = []  # this unsampled step's rows (flight recorder)
        self.kept = []  # earlier unsampled steps' rows, oldest first: (step, rows), at most flight_steps - 1
        self.step_anomalous = False
        self.op_info = {}  # OpOverload -> (aten name, kind, the name a torch user knows)
        self.mode = None
        self.mode_on = False
        self.model_name = options.get("model", "")
        # What `ampscope record` knows of the run and the recorder cannot (the command as it was typed, the
        # folder it ran in, the environment variables it keeps): stored in the trace's config for `ampscope fix`.
        self.run_context = {k: options[k] for k in ("command", "cwd", "env") if k in options}
        self.remedies = Remedies(options.get("remedies"))
        # --twin: the f32 twin of the forward ops (_twin.py); None without it.
        self.twin = Twin(self) if options.get("twin") else None
        self.pid = os.getpid()
        self.busy = False
        self.step = 0
        self.seq = 0
        self.phase = "forward"
        self.rows_nonfinite = {}  # seq -> ROW_FINITE, ROW_BAD, or ROW_MASK: only a mask fill's -inf (this step)
        self.prov = {}  # id(tensor) -> (step, seq or marker, weakref)
        self.module_stack = []
        self.module_names = weakref.WeakKeyDictionary()
        self.param_names = {}
        self.root_with_params = False
        self.pending_nodes = []
        self.backward_depth = 0
        self.loss = None
        self.scaler = None  # (scaler, info dict) while a GradScaler's step is in progress
        self.optimizer_ran = False
        self.step_started = time.perf_counter()
        self.began = False
        self.precision = "fp32"
        self.device = None
        self.errors = 0
        self.ended = False
        self.rows_this_step = 0
        self.forward_bad = False
        self.module_types = []
        self.notes = set()
        self.noted_kinds = set()

    # ---------------------------------------------------------------- tensors and provenance
    def recording(self):
        """Whether this step's ops and gradients are recorded: a sampled step, or any step with the flight
        recorder (its rows are then held until the step's end decides whether they are written)."""
        return self.level != "off" and (self.flight or self.step % self.every == 0)

    def flight_end(self, scaler_anomaly):
        """The flight recorder at a step's end: the held rows are written when the step is sampled or anomalous,
        an anomalous step's after those of the kept unwritten steps before it (the lead-up); an unwritten step is
        kept, the oldest dropped beyond flight_steps - 1. A written step drops the kept ones: they would reach
        the trace out of step order."""
        held, self.held = self.held, []
        anomalous = self.step_anomalous or scaler_anomaly
        if anomalous:
            for _, rows in self.kept:
                for r in rows:
                    self.channel.add(r)
        if anomalous or self.step % self.every == 0:
            self.kept = []
            for r in held:
                self.channel.add(r)
            return
        self.kept.append((self.step, held))
        if len(self.kept) > self.flight_steps - 1:
            del self.kept[0]

    def sampled(self):
        return self.level != "off" and self.step % self.every == 0

    def add_row(self, record):
        """An op, gradient or histogram row or an origin event: written with the step when it is sampled, else
        held by the flight recorder."""
        if self.flight:  # the step's end decides (flight_end)
            self.held.append(record)
        else:
            self.channel.add(record)

    # The dispatch mode is on only while ops are recorded: on an unsampled step (and at level off) the script
    # runs with no Python between its ops; what its tensors were made from is then not known (they read as data).
    def set_mode(self, on):
        if on == self.mode_on or self.mode is None:
            return
        if on:
            self.mode.__enter__()
            self.mode_on = True
        elif self._mode_on_top():
            self.mode.__exit__(None, None, None)
            self.mode_on = False

    def pause(self):
        """Pops the dispatch mode while the recorder itself computes outside the mode's handler (a backward node's
        hook, the gradients' statistics): its reductions would otherwise each pass through the mode (the handler
        pops it for itself; hooks run without that). Returns whether to resume()."""
        if self.mode_on and self._mode_on_top():
            self.mode.__exit__(None, None, None)
            self.mode_on = False
            return True
        return False

    def resume(self, paused):
        if paused:
            self.mode.__enter__()
            self.mode_on = True

    def _mode_on_top(self):
        try:
            from torch.utils._python_dispatch import _get_current_dispatch_mode
            return _get_current_dispatch_mode() is self.mode
        except ImportError:
            return True

    def unrecorded(self, fn, args, kwargs):
        """Runs the optimizer's step (or gradient clipping) in phase optimizer: without --record-optimizer, with
        the dispatch mode popped, so its element-wise ops make no rows and cost nothing."""
        saved = self.phase
        self.phase = "optimizer"
        was_on = self.mode_on
        if was_on and not self.record_optimizer:
            self.set_mode(False)
        try:
            return fn(*args, **kwargs)
        finally:
            if was_on and not self.mode_on:
                self.set_mode(True)
            self.phase = saved

    def remember(self, t, seq):
        key = id(t)
        prov = self.prov

        def forget(ref, key=key):
            e = prov.get(key)
            if e is not None and e[2] is ref:
                del prov[key]

        self.prov[key] = (self.step, seq, weakref.ref(t, forget))

    def source(self, t):
        e = self.prov.get(id(t))
        if e is not None and e[2]() is t:
            if e[1] < 0 and e[1] != FILTERED:
                return e[1]
            return e[1] if e[0] == self.step else OTHER_STEP
        if t.is_leaf and t.requires_grad:
            return PARAMETER
        return DATA

    def input_finite(self, t, src, nan_only=False):
        """Whether an input counts as finite when judging whether an op made its output's NaN/inf. An input holding
        only the -inf of a mask's fill counts as finite only for an output with NaN and no inf: a fully masked
        row through softmax (0 / 0) is made by that op; an op passing the -inf on (-inf out) is not its origin
        (as the probe's JudgedInput::mask, probes/probe.cpp)."""
        if src >= 0:
            state = self.rows_nonfinite.get(src, ROW_FINITE)
            return state == ROW_FINITE or (state == ROW_MASK and nan_only)
        if not t.is_floating_point():
            return True
        return bool(torch.isfinite(t).all())

    # ---------------------------------------------------------------- ops
    def classify(self, func):
        name = func.overloadpacket.__name__
        if name in FILL_OPS:
            kind = KIND_FILL
        elif name == "copy_":
            kind = KIND_COPY
        elif name in PASS_OPS:
            kind = KIND_PASS
        else:
            kind = KIND_OP
        user_name = RENAME.get(name, name.rstrip("_") if name.endswith("_") and not name.startswith("_") else name)
        info = self.op_info[func] = (name, kind, user_name)
        return info

    def on_op(self, func, args, out, kwargs=None):
        info = self.op_info.get(func)
        if info is None:
            info = self.classify(func)
        name, kind, user_name = info
        if self.pending_nodes:
            self.label_nodes()
        outs = _flat(out)
        if not outs:
            return
        phase = self.phase
        if phase == "backward":
            # The nodes' rows come from their hooks (the mode is popped during backward: this is reached only when
            # another mode sat above it); the engine's sums are told apart in grad_source().
            return
        if kind == KIND_FILL:
            for o in outs:
                self.prov.pop(id(o), None)
            return
        ins = _flat(args)
        if kind == KIND_PASS or (kind == KIND_COPY and len(ins) >= 2):
            src = ins[1] if kind == KIND_COPY else (ins[0] if ins else None)
            if src is None:
                return
            e = self.prov.get(id(src))
            if e is not None and e[2]() is src:
                step, seq = e[0], e[1]
            else:  # a parameter's cast or view is still the parameter; data's is data
                step, seq = self.step, self.source(src)
            for o in outs:
                self.prov[id(o)] = (step, seq, weakref.ref(o))
            if phase == "forward":
                self.pending_nodes.append((weakref.ref(outs[0]), None))
                if self.twin is not None and self.sampled():
                    self.twin.on_pass(func, name, args, kwargs, ins, outs, CAST_OPS)
            return
        o = outs[0]
        if not o.is_floating_point():
            return  # masks, indices: data, not rows
        for t in ins:
            if t.is_floating_point():
                break
        else:
            return  # created tensors: data, not rows
        module = self.module_stack[-1] if self.module_stack else ""
        if name in LINEAR_OPS and self.module_stack and self.module_types[-1] == "Linear":
            user_name = "linear"
        if phase == "optimizer" and name in ("add", "add_", "sub", "sub_"):
            user_name = name.rstrip("_")
        if (self.op_matches is not None and not self.op_matches(user_name)) or (
                self.module_matches is not None and not self.module_matches(module)):
            for t in outs:  # --ops/--modules left it out: its consumers name it -4
                self.remember(t, FILTERED)
            if phase == "forward":
                self.pending_nodes.append((weakref.ref(o), (user_name, module)))
            return
        if name == "addmm" and len(ins) == 3:
            ins = [ins[1], ins[2], ins[0]]  # as F.linear takes them: input, weight, bias
        seq = self.next_seq()
        sources = [self.source(t) for t in ins[:4]]
        h = health(o) if self.level != "dtype" else [o.numel()] + [0] * 10
        counted = _counted(user_name, phase, h)
        nan_only = h[1] > 0 and counted == h[1]
        origin = counted > 0 and all(self.input_finite(t, s, nan_only)
                                     for t, s in zip(ins, sources + [DATA] * len(ins)))
        in_dtypes = ",".join(_dtype(t) for t in ins if t.is_floating_point())
        reason = ""
        if user_name in LOWER_PRECISION and o.dtype in (torch.float16, torch.bfloat16) and (
                torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()):
            reason = "%s is on the lower_precision_fp list: runs in %s" % (user_name, _dtype(o))
        self.emit_op(seq, user_name, module, in_dtypes, _dtype(o), list(o.shape), reason, h, origin, sources)
        if self.level == "full":
            self.add_row(["hist", self.step, seq, "output", histogram(o)])
        self.note_dtype(o)
        for t in outs:
            self.remember(t, seq)
        if phase == "forward":
            self.pending_nodes.append((weakref.ref(o), (user_name, module)))
            if self.twin is not None and self.sampled():
                self.twin.on_op(func, name, args, kwargs, ins, out, self.step, seq, user_name, module)

    def prov_prune(self):
        """After a step: the entries of views and casts (kept without a weakref callback, the per-op path's
        cheaper form) whose tensor is gone are dropped once the map grows, so it does not grow with the run."""
        if len(self.prov) > 4096:
            self.prov = {k: e for k, e in self.prov.items() if e[2]() is not None}

    def next_seq(self):
        s = self.seq
        self.seq += 1
        return s

    def note_dtype(self, o):
        if self.device is None:
            self.device = str(o.device)
        if o.dtype == torch.float16:
            self.precision = "fp16"
        elif o.dtype == torch.bfloat16 and self.precision == "fp32":
            self.precision = "bf16"

    def emit_op(self, seq, op, module, in_dtypes, out_dtype, shape, reason, h, origin, sources):
        # A mask's fill writes -inf on purpose (the probe's rule, OpFlag::mask_neg_inf): not an anomaly, and not
        # a non-finite forward pass that would make the step's backward NaN/inf propagations (forward_bad).
        counted = _counted(op, self.phase, h)
        self.rows_nonfinite[seq] = ROW_BAD if counted else (ROW_MASK if h[3] else ROW_FINITE)
        if counted:
            self.step_anomalous = True
            if self.phase == "forward":
                self.forward_bad = True
        inputs = (sources + [NONE] * 4)[:4]
        # str of the shape's list of ints: "[8, 64, 256]", as ", ".join once wrote it, with no generator per row.
        self.add_row(["op", self.step, seq, self.phase, op, module, in_dtypes, out_dtype,
                          str(shape), reason, h[0], h[1], h[2], h[3], h[4], h[5],
                          num(h[6]), num(h[7]), num(h[8]), num(h[9]), num(h[10]), 0, 0, origin, inputs])
        self.rows_this_step += 1
        if origin:
            what = "%s in the output of %s" % (_counts_text(h), op)
            self.add_row(["event", self.step, seq, "origin", op, module, what + "; " + (
                "the incoming gradient is finite" if self.phase == "backward" else "inputs finite")])

    # ---------------------------------------------------------------- backward nodes
    def label_nodes(self):
        pending, self.pending_nodes = self.pending_nodes, []
        for ref, label in pending:
            t = ref()
            node = None if t is None else t.grad_fn
            if node is None:
                continue
            meta = node.metadata
            if "ampscope" in meta:
                continue
            meta["ampscope"] = label
            if label is None:  # a view's or a cast's node: it only carries provenance (_pass_hook)
                node.register_hook(self._pass_hook(meta))
                continue
            node.register_hook(self._node_hook(label, meta, _flows_on(node)))
            if self.twin is not None and self.sampled():
                self.twin.attach(t, node)

    def label_function(self, cls, args, outputs):
        """A custom autograd.Function's outputs: its backward node (a Python BackwardCFunction) is labelled with
        the Function's name and the module it ran in, so its backward gets one row, as a built-in op's node
        does. Its forward's aten ops were rows of their own already. Activation checkpointing (reentrant: a
        Function too) gets its row, named `checkpoint`, and a note: the segment's ops are recomputed inside
        backward and their gradients are not recorded one by one."""
        # Before the pending nodes: an output that is its forward's last aten op's own tensor would otherwise be
        # labelled after that op.
        module = self.module_stack[-1] if self.module_stack else ""
        checkpoint = _is_checkpoint_function(cls)
        if checkpoint and args and isinstance(args[0], torch.nn.Module):
            module = self.module_names.get(args[0], module)  # checkpoint(block, x): the block's path
        name = "checkpoint" if checkpoint else cls.__name__
        label = (name, module)
        for t in outputs:
            node = t.grad_fn
            if node is None or "ampscope" in node.metadata:
                continue
            node.metadata["ampscope"] = label
            node.register_hook(self._node_hook(label, node.metadata, _flows_on(node)))
        if self.pending_nodes:
            self.label_nodes()
        if checkpoint:
            self.note_once("checkpoint", module, "checkpoint", "activation checkpointing (torch.utils.checkpoint) "
                           "of %s: its backward is one row, `checkpoint`; the ops it recomputes in backward and "
                           "their gradients are not recorded one by one" % (
                               "'%s'" % module if module else "the model's own forward"))

    def note_once(self, key, module, op, text):
        """A hole the recorder knows of: an /events row `unrecorded` (once per kind and module) and a line on
        stderr (once per kind), never silence."""
        if (key, module) in self.notes:
            return
        self.notes.add((key, module))
        self.channel.add(["event", self.step, -1, "unrecorded", op, module, text])
        if key not in self.noted_kinds:
            self.noted_kinds.add(key)
            sys.stderr.write("ampscope record: note: %s\n" % text)

    def grad_source(self, g, meta):
        """The producer of a gradient a node received: the row (or marker) its producing node's hook remembered,
        else the engine made it: the seed of a backward's root (data) or the sum of what several consumers sent
        back (SUMMED)."""
        e = self.prov.get(id(g))
        if e is not None and e[2]() is g:
            if e[1] < 0 and e[1] != FILTERED:
                return e[1]
            return e[1] if e[0] == self.step else OTHER_STEP
        return DATA if meta.get("ampscope_root") else SUMMED

    def _node_hook(self, label, meta, flows):
        # The hook holds the node's metadata dict, never the node: a hook that refers to its own node makes a cycle
        # (node -> its hooks -> the hook -> node) that Python's collector can break by emptying the hooks' dict,
        # after which the node's hook silently never runs (seen: backward rows lost at random).
        def hook(grad_inputs, grad_outputs):
            if self.busy or self.pid != os.getpid():
                return
            self.busy = True
            paused = self.pause()
            try:
                self.on_node(label, meta, flows, grad_inputs, grad_outputs)
            except Exception as e:
                self.failed(e)
            finally:
                self.resume(paused)
                self.busy = False
        return hook

    def _pass_hook(self, meta):
        """The hook of a view's or a cast's node (about 100 a step on a transformer, against 34 rows): the gradients
        it returns carry the producer of the first gradient it received. It runs no torch op, so it needs neither the
        busy flag's protection nor the dispatch mode popped, nor the node's edges (_flows_on): 0.5 us a call against
        1.9 us for on_node's general path with _flows_on (bench/RESULTS.md, 2026-11-29). The engine's call of a Python
        hook and its registration cost 2 to 3 us a node more (0.2 to 0.3 ms a step for 100 views), all that
        provenance from the graph's edges instead of these hooks could save."""
        Tensor, ref = _Tensor, weakref.ref

        def hook(grad_inputs, grad_outputs):
            if self.busy or self.pid != os.getpid():
                return
            try:
                src = DATA
                for g in grad_outputs:
                    if isinstance(g, Tensor):
                        src = self.grad_source(g, meta)
                        break
                step = self.step
                for g in grad_inputs:
                    if isinstance(g, Tensor):
                        self.prov[id(g)] = (step, src, ref(g))
            except Exception as e:
                self.failed(e)
        return hook

    def on_node(self, label, meta, flows, grad_inputs, grad_outputs):
        gins = [g for g in grad_outputs if isinstance(g, torch.Tensor)]
        gouts = [g for g in grad_inputs if isinstance(g, torch.Tensor)]
        if not gouts:
            return
        # The row describes the gradient that flows on to another op (a linear's input gradient, not its
        # bias's or weight's, which go to AccumulateGrad): the first such, else the first gradient.
        primary = None
        for g, flows_on in zip(grad_inputs, flows):
            if flows_on and isinstance(g, torch.Tensor):
                primary = g
                break
        sources = [self.grad_source(g, meta) for g in gins[:4]]
        if not self.recording():
            return
        op, module = label
        if (self.op_matches is not None and not self.op_matches(op)) or (
                self.module_matches is not None and not self.module_matches(module)):
            for g in gouts:  # --ops/--modules left it out: its consumers name it -4
                self.remember(g, FILTERED)
            return
        o = primary if primary is not None else gouts[0]
        seq = self.next_seq()
        h = health(o) if self.level != "dtype" else [o.numel()] + [0] * 10
        bad = h[1] + h[2] + h[3] > 0
        # A node also reads what its forward op saved: after a non-finite forward value, a non-finite gradient
        # follows from it (as the runtime's probe judges), not a new origin.
        origin = bad and not self.forward_bad and all(
            self.input_finite(t, s) for t, s in zip(gins, sources + [DATA] * len(gins)))
        self.emit_op(seq, op, module, ",".join(_dtype(g) for g in gins), _dtype(o), list(o.shape), "", h, origin,
                     sources)
        if self.level == "full":
            self.add_row(["hist", self.step, seq, "output", histogram(o)])
        if self.twin is not None and self.sampled():
            self.twin.backward_row(_NodeView(meta), grad_inputs, grad_outputs, self.step, seq, op, module)
        for g in gouts:
            self.remember(g, seq)

    # ---------------------------------------------------------------- modules
    def module_pre(self, module, inputs):
        if self.busy or self.pid != os.getpid():
            return
        if self.pending_nodes:
            self.label_nodes()
        path = self.module_names.get(module)
        if path is None:
            if self.module_stack:
                path = self.module_stack[-1] + ("." if self.module_stack[-1] else "") + type(module).__name__
            else:
                path = self.name_root(module)
        self.module_stack.append(path)
        self.module_types.append(type(module).__name__)
        return self.remedies.module_enter(path, inputs)  # --autocast-fp32: f32 inputs, autocast off inside

    def module_post(self, module, inputs, output):
        if self.busy or self.pid != os.getpid():
            return
        if self.pending_nodes:
            self.label_nodes()
        if self.module_stack:
            self.module_stack.pop()
            self.module_types.pop()
            self.remedies.module_exit()

    def name_root(self, module):
        # The first module with parameters called from outside every module is the model: its children's
        # paths are the names of named_modules() ("blocks.0.attn"). Other outermost modules (a loss module,
        # a second model) are named after their class.
        has_params = any(True for _ in module.parameters())
        if has_params and not self.root_with_params:
            self.root_with_params = True
            for name, m in module.named_modules():
                self.module_names[m] = name
            for name, p in module.named_parameters():
                self.param_names[id(p)] = name
            return ""
        name = type(module).__name__
        for sub_name, m in module.named_modules():
            self.module_names.setdefault(m, name + ("." + sub_name if sub_name else ""))
        return name

    # ---------------------------------------------------------------- backward, optimizer, scaler
    def wrap_backward(self, fn, is_grad):
        recorder = self

        def wrapper(*args, **kwargs):
            if recorder.pid != os.getpid() or recorder.busy:
                return fn(*args, **kwargs)
            if recorder.pending_nodes:
                recorder.label_nodes()
            tensors = args[0] if args else kwargs.get("outputs" if is_grad else "tensors")
            first = _tensors(tensors, [])
            if first and not is_grad and first[0].numel() == 1:
                recorder.loss = first[0].detach()
            # The backward ops need no dispatch mode: each labelled node's hook writes its row. Popping the mode
            # for the backward pass spares every backward aten op the trip through Python (bench/RESULTS.md).
            for t in first:  # the seed the engine makes for a root is data (grad_source)
                if t.grad_fn is not None:
                    t.grad_fn.metadata["ampscope_root"] = True
            saved = recorder.phase
            recorder.phase = "backward"
            recorder.backward_depth += 1
            paused = recorder.pause()
            try:
                return fn(*args, **kwargs)
            finally:
                recorder.resume(paused)
                recorder.backward_depth -= 1
                recorder.phase = saved
        return wrapper

    def wrap_optimizer(self, optimizer):
        original = optimizer.step
        recorder = self

        def step(*args, **kwargs):
            if recorder.pid != os.getpid():
                return original(*args, **kwargs)
            recorder.optimizer_ran = True
            # Gradients as the step uses them: after the GradScaler's unscale_, or the plain ones.
            recorder.grad_rows(optimizer, True)
            try:
                return recorder.unrecorded(original, args, kwargs)
            finally:
                if recorder.scaler is None:
                    recorder.end_step(optimizer, None)
        step.__ampscope_wrapped__ = True
        optimizer.step = step

    def grad_rows(self, optimizer, unscaled):
        self.busy = True
        paused = self.pause()
        try:
            named = []
            for gi, group in enumerate(optimizer.param_groups):
                for pi, p in enumerate(group["params"]):
                    if p.grad is not None:
                        named.append((self.param_names.get(id(p), "group %d, parameter %d" % (gi, pi)), p.grad.detach()))
            if not named:
                self.grad_norm = 0.0
                return
            if not self.recording() or self.level == "dtype":
                # One host synchronisation for all the norms (the step's grad_norm needs only them). Each from the
                # sum of squares of the gradient widened into the reused f64 buffer: vector_norm(dtype=f64) took
                # 1.8 ms on a 512 x 1024 tensor on this CPU against 0.15 ms (bench/RESULTS.md). NaN and inf carry
                # through the squares and the sum as through the norm.
                norms = torch.stack([_widened(g).square_().sum().to("cpu") for _, g in named]).sqrt_().tolist()
            else:
                # The norms from the rows' statistics (their sums of squares): no second pass.
                stats = [_grad_health(g) for _, g in named]
                norms = [math.nan if h[0] else math.inf if h[1] + h[2] else math.sqrt(h[5]) for h in stats]
            self.grad_norm = math.sqrt(sum(n * n for n in norms))
            if not self.recording():  # rows only on sampled steps
                return
            for i, ((name, g), norm) in enumerate(zip(named, norms)):
                if self.module_matches is not None and not self.module_matches(name.rsplit(".", 1)[0] if "." in name else ""):
                    continue
                h = stats[i] if self.level != "dtype" else (0, 0, 0, 0, 0)
                if h[0] + h[1] + h[2]:
                    self.step_anomalous = True
                self.add_row(["grad", self.step, name, _dtype(g), h[0], h[1], h[2], h[3], num(h[4]), num(norm),
                                  unscaled])
                if self.level == "full" and unscaled:
                    self.add_row(["hist", self.step, -1, name, histogram(g)])
        finally:
            self.resume(paused)
            self.busy = False

    def wrap_scaler(self, scaler):
        step_fn, update_fn, scale_fn = scaler.step, scaler.update, scaler.scale
        recorder = self
        set_up = []

        def scale(*args, **kwargs):
            # --init-scale, --growth-interval: at the first scale(), after every __init__ of a subclass has run
            # and before the scale is made (GradScaler makes it lazily from _init_scale at that call).
            if not set_up and recorder.pid == os.getpid():
                set_up.append(True)
                recorder.remedies.on_scaler(scaler)
            return scale_fn(*args, **kwargs)

        def step(optimizer, *args, **kwargs):
            if recorder.pid != os.getpid():
                return step_fn(optimizer, *args, **kwargs)
            recorder.optimizer_ran = False
            recorder.scaler = {"scale": float(scaler.get_scale()), "optimizer": optimizer}
            saved = recorder.phase
            recorder.phase = "scaler"
            try:
                return step_fn(optimizer, *args, **kwargs)
            finally:
                recorder.phase = saved
                state = getattr(scaler, "_per_optimizer_states", {}).get(id(optimizer), {})
                found = state.get("found_inf_per_device", {})
                recorder.scaler["found_inf"] = sum(float(v) for v in found.values()) > 0
                recorder.scaler["skipped"] = not recorder.optimizer_ran

        def update(*args, **kwargs):
            if recorder.pid != os.getpid() or recorder.scaler is None:
                return update_fn(*args, **kwargs)
            saved = recorder.phase
            recorder.phase = "scaler"
            try:
                return update_fn(*args, **kwargs)
            finally:
                recorder.phase = saved
                info = recorder.scaler
                info["scale_after"] = float(scaler.get_scale())
                tracker = getattr(scaler, "_get_growth_tracker", None)
                info["growth_tracker"] = int(tracker()) if tracker else 0
                recorder.scaler = None
                recorder.end_step(info["optimizer"], info)

        scaler.step, scaler.update, scaler.scale = step, update, scale

    # ---------------------------------------------------------------- steps
    def end_step(self, optimizer, scaler_info):
        if self.pid != os.getpid():
            return
        self.busy = True
        try:
            if self.pending_nodes:
                self.label_nodes()
            lr = float(optimizer.param_groups[0].get("lr", 0.0)) if optimizer is not None else 0.0
            scale = scaler_info["scale"] if scaler_info else 1.0
            loss = float(self.loss) / scale if self.loss is not None else float("nan")
            now = time.perf_counter()
            skipped = bool(scaler_info["skipped"]) if scaler_info else False
            found_inf = bool(scaler_info["found_inf"]) if scaler_info else False
            scale_after = scaler_info["scale_after"] if scaler_info else 1.0
            if self.flight:
                self.flight_end(found_inf or skipped)
            self.channel.add(["step", self.step, num(loss), num(scale), num(scale_after), found_inf, skipped,
                              scaler_info["growth_tracker"] if scaler_info else 0, num(getattr(self, "grad_norm", 0.0)),
                              num(lr), (now - self.step_started) * 1000.0])
            if scaler_info:
                if skipped:
                    self.channel.add(["event", self.step, -1, "skipped_step", "", "", "%s skipped its step: its "
                                      "gradients held inf or NaN at scale %.6g" % (type(optimizer).__name__, scale)])
                if scale_after < scale:
                    self.channel.add(["event", self.step, -1, "scale_backoff", "", "", "scale %.6g -> %.6g: the "
                                      "gradients held inf or NaN" % (scale, scale_after)])
                elif scale_after > scale:
                    self.channel.add(["event", self.step, -1, "scale_growth", "", "", "scale %.6g -> %.6g: growth "
                                      "after a run of steps without inf or NaN" % (scale, scale_after)])
            if not self.began:
                self.send_begin()
            self.channel.add(["end_step", self.step])
            # The rows of the step are written before its end_step record, in one write.
            if not self.began:
                self.began = True
            self.channel.flush()
            self.step += 1
            self.seq = 0
            self.prov_prune()
            self.set_mode(self.recording() and not self.ended)
            if self.twin is not None:
                self.twin.end_step()
            self.rows_nonfinite = {}
            self.step_anomalous = False
            self.forward_bad = False
            self.loss = None
            self.grad_norm = 0.0
            self.rows_this_step = 0
            self.step_started = time.perf_counter()
        finally:
            self.busy = False
        if not self.ended and self.remedies.stop_now(self.step - 1):  # --stop-after: the step's end is written
            self.finish()
            end_process()

    def send_begin(self):
        import json
        config = {"recorder": "ampscope.torch", "torch": torch.__version__, "python": sys.version.split()[0],
                  "argv": sys.argv, "sample_every": self.every, "probe": self.level,
                  "record_optimizer": self.record_optimizer, "flight_recorder": self.flight_steps if self.flight else 0}
        config.update(self.run_context)
        if self.twin is not None:
            config["twin"] = {"every": self.every, "backward": sorted(BACKWARD_NAMES)}
        if self.remedies.any():
            config["remedies"] = {"requested": self.remedies.requested(), "applied": dict(self.remedies.applied)}
        # A rank of a torch.distributed run: `ampscope record` then writes OUT's STEM.rankN.h5 (as train --ddp).
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            config["rank"], config["world_size"] = int(dist.get_rank()), int(dist.get_world_size())
        probe = {"level": self.level, "ops": self.op_globs, "modules": self.module_globs, "every": self.every,
                 "flight_recorder": self.flight,
                 "recorder_steps": self.flight_steps if self.flight else 0, "outside_steps": False, "autocast_overrides": [],
                 "record_optimizer": self.record_optimizer}
        begin = ["begin", PROTOCOL, self.precision, self.device or "cpu", self.model_name or os.path.basename(
            sys.argv[0] if sys.argv and sys.argv[0] else "python"), int(torch.initial_seed()) & 0x7FFFFFFFFFFFFFFF,
            json.dumps(config), json.dumps(probe)]
        self.channel.pending.insert(0, __import__("json").dumps(begin, separators=(",", ":")))

    def failed(self, error):
        self.errors += 1
        if self.errors == 1:
            sys.stderr.write("ampscope record: warning: the recorder failed on an op and left it out (%s: %s)\n"
                             % (type(error).__name__, error))

    def finish(self):
        # Ops after the last optimizer step (or a script with none) make one last step, so nothing is lost
        # silently.
        if self.ended or self.pid != os.getpid():
            return
        self.ended = True
        if self.rows_this_step > 0 or (self.channel.pending and not self.began):
            self.end_step(None, None)
        self.channel.add(["close"])
        self.channel.flush()


def _is_checkpoint_function(cls):
    checkpoint = sys.modules.get("torch.utils.checkpoint")
    return checkpoint is not None and cls is getattr(checkpoint, "CheckpointFunction", None)


def _wrap_function_apply():
    """Every custom torch.autograd.Function's apply (a classmethod of the C base class, inherited by each
    subclass): its outputs' backward node is labelled after the call."""
    base = torch._C._FunctionBase.__dict__.get("apply")
    if base is None or not hasattr(base, "__get__"):
        return False

    def apply(cls, *args, **kwargs):
        out = base.__get__(None, cls)(*args, **kwargs)
        r = _active
        if r is not None and r.mode_on and not r.busy and r.pid == os.getpid() and r.phase == "forward" and \
                torch.is_grad_enabled():
            r.busy = True
            try:
                r.label_function(cls, args, [t for t in _tensors(out, []) if t.grad_fn is not None])
            except Exception as e:
                r.failed(e)
            finally:
                r.busy = False
        return out

    torch.autograd.Function.apply = classmethod(apply)
    return True


def _wrap_compile():
    """torch.compile (torch 2.x): a compiled graph's ops run in generated kernels the dispatch mode does not
    see. While recording, torch.compile returns what it was given, so the model runs eagerly and is recorded
    op by op; a note says so."""
    original = getattr(torch, "compile", None)
    if original is None:
        return

    def compile(model=None, *args, **kwargs):
        r = _active
        if r is None or r.pid != os.getpid():
            return original(model, *args, **kwargs)
        r.note_once("compile", "", "torch.compile", "torch.compile is left out while recording: the model runs "
                    "eagerly so that each op is recorded (step times are not those of the compiled model)")
        if model is None:  # @torch.compile(mode=...): a decorator
            return lambda fn: fn
        return model

    torch.compile = compile


def _wrap_clipping():
    """Gradient clipping (torch.nn.utils.clip_grad_norm_, clip_grad_value_) belongs to the optimizer's work: its
    ops are recorded in phase optimizer with --record-optimizer and left out with the optimizer's without it
    (they would otherwise be forward rows outside every module). Both names are replaced, so a script's
    `from torch.nn.utils import clip_grad_norm_` (after the recorder started) gets the wrapper."""
    import torch.nn.utils
    import torch.nn.utils.clip_grad as clip_grad

    for name in ("clip_grad_norm_", "clip_grad_value_"):
        original = getattr(clip_grad, name, None)
        if original is None:
            continue

        def clip(*args, __original=original, **kwargs):
            r = _active
            if r is None or r.busy or r.pid != os.getpid():
                return __original(*args, **kwargs)
            return r.unrecorded(__original, args, kwargs)

        clip.__name__ = name
        clip.__doc__ = original.__doc__
        setattr(clip_grad, name, clip)
        if getattr(torch.nn.utils, name, None) is original:
            setattr(torch.nn.utils, name, clip)


def _wrap_optimizer_init():
    original = torch.optim.Optimizer.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if _active is not None:
            _active.remedies.on_optimizer(self)
            _active.wrap_optimizer(self)

    torch.optim.Optimizer.__init__ = __init__


def _scaler_classes():
    classes = []
    for path in ("torch.cuda.amp", "torch.amp"):
        try:
            mod = __import__(path, fromlist=["GradScaler"])
            cls = getattr(mod, "GradScaler", None)
            if cls is not None and cls not in classes:
                classes.append(cls)
        except ImportError:
            pass
    return classes


def _wrap_scaler_init():
    for cls in _scaler_classes():
        original = cls.__init__

        def __init__(self, *args, __original=original, **kwargs):
            __original(self, *args, **kwargs)
            if _active is not None and not getattr(self, "_ampscope_wrapped", False):
                self._ampscope_wrapped = True
                _active.wrap_scaler(self)

        cls.__init__ = __init__


_wrapped_classes = False


def start(fd, options, whole_run=True):
    """Starts recording into fd. whole_run: for the process's life (ampscope record -- ...), else until stop()
    (ampscope.torch.record())."""
    global _active, _wrapped_classes
    if _active is not None:
        raise RuntimeError("ampscope.torch: this process is already being recorded\n"
                           "hint: one recording at a time (end the `with ampscope.torch.record(...)` block first)")
    recorder = Recorder(Channel(fd), options)
    recorder.module_types = []
    _active = recorder
    recorder.hooks = [torch.nn.modules.module.register_module_forward_pre_hook(recorder.module_pre),
                      torch.nn.modules.module.register_module_forward_hook(recorder.module_post)]
    recorder.saved_autograd = (torch.autograd.backward, torch.autograd.grad)
    torch.autograd.backward = recorder.wrap_backward(torch.autograd.backward, False)
    torch.autograd.grad = recorder.wrap_backward(torch.autograd.grad, True)
    if not _wrapped_classes:  # the class wrappers look up _active: installed once per process
        _wrapped_classes = True
        _wrap_optimizer_init()
        _wrap_scaler_init()
        _wrap_function_apply()
        _wrap_compile()
        _wrap_clipping()
    recorder.remedies.install()
    recorder.mode = _Mode(recorder)
    recorder.set_mode(recorder.recording())
    if whole_run:
        atexit.register(recorder.finish)
    return recorder


def stop(recorder, clean=True):
    """Ends a recording started with whole_run=False: the last step is sent, the run closed, and every hook the
    recorder placed stops acting (wrapped optimizers and nodes of graphs still alive check the recorder's pid,
    set to none here)."""
    global _active
    try:
        if clean:
            recorder.finish()
        # else: no close record: the trace keeps its finished steps and complete = 0, as after a crash
    finally:
        recorder.set_mode(False)
        for h in recorder.hooks:
            h.remove()
        torch.autograd.backward, torch.autograd.grad = recorder.saved_autograd
        recorder.pid = -1
        _active = None
