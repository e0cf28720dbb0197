"""The f32 twin of a recorded PyTorch run (`ampscope record --twin`, docs/pytorch.md "Where precision went").

The twin of our runtime (probes/twin.h) done on the aten ops the recorder sees: every recorded forward op
whose output is f16 or bf16 is computed again in f32
  local        on the op's own inputs widened exactly to f32 (what this op's own rounding costs);
  accumulated  on the twin's inputs: for an input made by a twinned op of this step, that op's twin value;
               for an input autocast cast down (an aten _to_copy the recorder saw), the twin value of the
               tensor it was cast from, or that tensor widened; otherwise the input widened.
An f32 op with an input the twin follows is computed again on the twin's inputs (accumulated error only),
so the twin follows values through f32 ops. Views and casts of a value the twin follows are made from its
twin value by the same aten call (a cast keeps the twin's f32), so a transposed view is followed too (the
runtime's twin takes such an input as it is, widened; followed is false there).

Each twinned op gives one /precision row (probes/trace/schema.h PrecisionRow) with the numbers of compare()
below: the definitions of probes/twin.h, element for element (relative error with its floor, ulps, flips,
bits, the histogram), computed in f64 with torch ops. The mean's sum is torch's f64 sum (pairwise), not the
runtime's element-order sum: the two agree to within f64 rounding of the sum, not bit for bit.

Backward (local error): the nodes of BACKWARD_OPS whose gradients are f16/bf16 get a row: the op's f32 graph,
rebuilt in the node's hook on its inputs widened, differentiated for the incoming gradient widened; each gradient
compared in its own dtype, the largest max and mean kept, counts summed (probes/twin.cpp twin_backward). For the
ops whose backward reads only their inputs (linear, matmul, mul, add, sub, div, gelu, silu, relu) that is the
node's backward run on its saved tensors widened, as the runtime's twin defines it. For the ops whose backward
reads their output or the forward's statistics (softmax, log_softmax, layer_norm's mean and rstd, tanh, sigmoid,
exp, sqrt, rsqrt) the f32 graph recomputes those from the inputs widened: the reference is the f32 forward and
backward on the node's inputs, so the row also counts what the f16/bf16 output the node saved costs its
gradient (the runtime's twin widens the saved output instead and does not count that).

Not covered (each named once in /events `unrecorded` and on stderr, never silent): ops that draw random
numbers (dropout), in-place ops (their input is their output by the time the recorder sees it), ops whose
body fails when run again in f32, and the backward of nodes of other ops (not in BACKWARD_OPS).
"""
import math

import torch

# dtype -> (significand bits p, emin, largest finite)
_FORMAT = {
    "f16": (11, -14, 65504.0),
    "bf16": (8, -126, 3.3895313892515355e38),
    "f32": (24, -126, 3.4028234663852886e38),
    "f64": (53, -1022, 1.7976931348623157e308),
}
ERROR_BINS = 26  # trace::kErrorBins
SATURATING = {"sigmoid", "tanh"}
ADDITIVE = {"add", "sub", "rsub"}
REDUCTION = {"sum", "mean"}
# Ops whose node gets a backward row (aten names): the f32 graph built on the inputs widened is differentiated in
# the node's hook. The first group's backward reads only the inputs, so that is the node's own backward on its
# saved tensors widened; the second's reads the output or the forward's statistics, which the f32 graph
# recomputes from the inputs (see the module's comment).
BACKWARD_OPS = {"addmm", "mm", "bmm", "matmul", "linear", "mul", "add", "sub", "div", "gelu", "silu", "relu",
                "_softmax", "_log_softmax", "native_layer_norm", "tanh", "sigmoid", "exp", "sqrt", "rsqrt"}
BACKWARD_NAMES = {"linear", "matmul", "mul", "add", "sub", "div", "gelu", "silu", "relu",  # as rows name them
                  "softmax", "log_softmax", "layer_norm", "tanh", "sigmoid", "exp", "sqrt", "rsqrt"}
RANDOM_OPS = {"native_dropout", "dropout", "bernoulli", "rand_like", "randn_like", "multinomial", "rrelu_with_noise"}
LOW = (torch.float16, torch.bfloat16)


def dtype_key(dtype):
    return {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64"}[dtype]


class Stats:
    __slots__ = ("counted", "max_rel", "mean_rel", "max_ulp", "flips", "bits", "error_bins", "exact")

    def __init__(self, p):
        self.counted = 0
        self.max_rel = self.mean_rel = self.max_ulp = 0.0
        self.flips = 0
        self.bits = float(p)
        self.error_bins = [0] * ERROR_BINS
        self.exact = 0


def compare(value, reference, dtype, op=""):
    """The errors of `value` against `reference` (same number of elements), judged in `dtype` ("f16", "bf16",
    "f32"), as probes/twin.h compare() defines them (per element, y the value and r the reference in f64).

    Cost: about fifteen passes over the f64 copies in the common case (every element finite, no flips); the
    masks for non-finite elements and flips are made only when a scalar check says there are some."""
    p, emin, top = _FORMAT[dtype]
    y = value.detach().reshape(-1).to(torch.float64)
    r = reference.detach().reshape(-1).to(torch.float64)
    s = Stats(p)
    if r.numel() == 0:
        return s
    ar = r.abs()
    ay = y.abs()
    r_top, y_top = float(ar.max()), float(ay.max())  # max propagates NaN: finite means every element is
    if not (math.isfinite(r_top) and math.isfinite(y_top)):
        fin_r = torch.isfinite(r)
        if not bool(fin_r.any()):
            return s
        r_top = float(ar[fin_r].max())
        s.flips += int((fin_r & ~torch.isfinite(y)).sum())  # y not finite where r is: flips, left out
        keep = fin_r & torch.isfinite(y)
        y, r, ar, ay = y[keep], r[keep], ar[keep], ay[keep]
        y_top = float(ay.max()) if ay.numel() else 0.0
    n = y.numel()
    s.counted = n
    if n == 0:
        return s
    floor = max(math.ldexp(1.0, emin), math.ldexp(r_top, -p))
    flip = None
    if int(torch.count_nonzero(y == 0)):
        flip = (y == 0) & (r != 0)
    if y_top == top:
        f = (ay == top) & (ar < top)
        flip = f if flip is None else flip | f
    if op in SATURATING:
        f = (ay == 1) & (ar != 1)
        flip = f if flip is None else flip | f
    err = (y - r).abs_()
    rel = err / torch.clamp(ar, min=floor)
    # A flip always has rel > 0 (y differs from r there), so the exact elements are those with rel == 0.
    s.exact = int(torch.count_nonzero(rel == 0))
    graded_mask = rel > 0
    if flip is not None:
        n_flip = int(flip.sum())
        s.flips += n_flip
        if n_flip:
            graded_mask &= ~flip
    graded = rel[graded_mask]
    if graded.numel():
        bucket = torch.clamp(torch.floor(-torch.log2(graded)), 0, ERROR_BINS - 1).to(torch.int64)
        s.error_bins = [int(c) for c in torch.bincount(bucket, minlength=ERROR_BINS)]
    s.max_rel = float(rel.max())
    # ulp_D(r) = 2^(max(floor(log2|r|), emin) - (p - 1)). |r| clamped at 2^emin is a normal double whose exponent
    # field is that max + 1023 (for 0 and values below 2^emin too); 1 / ulp is the power of two whose exponent
    # field is 2046 + (p - 1) minus it, exactly.
    field = torch.clamp(ar, min=math.ldexp(1.0, emin)).view(torch.int64) >> 52
    inverse_ulp = ((2046 + (p - 1) - field) << 52).view(torch.float64)
    s.max_ulp = float((err * inverse_ulp).max())
    s.mean_rel = float(rel.sum()) / n
    s.bits = float(p) if s.max_rel == 0 else min(max(-math.log2(s.max_rel), 0.0), float(p)) + 0.0
    return s


def _map(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    return value


def _first(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for v in value:
            t = _first(v)
            if t is not None:
                return t
    return None


# The autocast regions the script is in (torch.autocast and its CPU/CUDA subclasses entered and not yet left):
# one flag per region, enabled or not. Inside __torch_dispatch__ torch reports autocast as disabled (the Python
# key runs below it), so the regions are tracked where they are entered (install_region_tracking).
_regions = []
_tracking = False


def install_region_tracking():
    global _tracking
    if _tracking:
        return
    _tracking = True
    cls = torch.amp.autocast_mode.autocast
    enter, leave = cls.__enter__, cls.__exit__

    def __enter__(self):
        _regions.append(bool(getattr(self, "_enabled", True)))
        return enter(self)

    def __exit__(self, *exc):
        if _regions:
            _regions.pop()
        return leave(self, *exc)

    cls.__enter__, cls.__exit__ = __enter__, __exit__


def _autocast_on():
    """In an enabled autocast region: a cast down from f32 there is taken as autocast's (a cast the script
    writes itself inside the region is taken so too)."""
    return bool(_regions) and _regions[-1]


def _tensors_of(value, out=None):
    out = [] if out is None else out
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensors_of(v, out)
    return out


def _widen(t):
    return t.float() if t.dtype in LOW else t


class _Quiet:
    """Autocast off (a recomputation is not cast down again) and no autograd graph (grad=True: with one)."""

    def __init__(self, grad=False):
        self.grad = grad

    def __enter__(self):
        self.no_grad = torch.enable_grad() if self.grad else torch.no_grad()
        self.no_grad.__enter__()
        self.cpu = torch.is_autocast_cpu_enabled()
        self.cuda = torch.is_autocast_enabled()
        torch.set_autocast_cpu_enabled(False)
        torch.set_autocast_enabled(False)

    def __exit__(self, *exc):
        torch.set_autocast_cpu_enabled(self.cpu)
        torch.set_autocast_enabled(self.cuda)
        self.no_grad.__exit__(*exc)
        return False


class Twin:
    """The twin's values of one step, by output tensor (id, checked with a weakref), and its rows."""

    def __init__(self, recorder):
        self.recorder = recorder
        install_region_tracking()
        self.values = {}  # id(tensor) -> (weakref, f32 twin value, Stats of the tensor against it or None)
        self.graphs = []  # (weakref to an op's output, (func, its inputs widened, kwargs, requires_grad flags))
        self.rows = 0

    def end_step(self):
        self.values = {}
        self.graphs = []  # outputs that never got a node (no graph was made from them); labelled ones keep theirs

    def _lookup(self, t):
        e = self.values.get(id(t))
        if e is not None and e[0]() is t:
            return e
        return None

    def _keep(self, t, value, stats):
        import weakref

        key = id(t)
        values = self.values

        def forget(ref, key=key):
            e = values.get(key)
            if e is not None and e[0] is ref:
                del values[key]

        self.values[key] = (weakref.ref(t, forget), value, stats)

    # ------------------------------------------------------------ views and casts
    def on_pass(self, func, name, args, kwargs, ins, outs, cast_ops):
        """A view or cast of a value: its twin value is the same call on the twin value of what it was made
        from (a cast keeps the twin's f32); an autocast cast of an untwinned f32 tensor remembers that tensor."""
        src = ins[1] if name == "copy_" else (ins[0] if ins else None)
        if src is None or not outs or not outs[0].is_floating_point():
            return
        e = self._lookup(src)
        if name in cast_ops or name == "copy_":
            if e is not None:
                value = e[1]
            elif src.is_floating_point() and src.dtype not in LOW and outs[0].dtype in LOW and _autocast_on():
                # autocast's cast down: the twin reads the value before it. A cast the script wrote itself
                # outside autocast (x.to(torch.bfloat16), model.to(...)) is the script's data, as in the
                # runtime's twin.
                value = src.detach().float()
            else:
                return
            if value.shape == outs[0].shape:
                self._keep(outs[0], value, None)
            return
        if e is None:
            return
        twin_src = e[1]
        try:
            with _Quiet():
                made = func(*_map(args, lambda t: twin_src if t is src else t), **_map(kwargs or {}, lambda t: t))
        except Exception:
            return
        made_list = made if isinstance(made, (list, tuple)) else [made]
        for o, v in zip(outs, made_list):
            if isinstance(v, torch.Tensor) and v.shape == o.shape:
                self._keep(o, v, None)

    # ------------------------------------------------------------ ops
    def on_op(self, func, name, args, kwargs, ins, out, step, seq, op, module):
        o = _first(out)
        if o is None or not o.is_floating_point():
            return
        low = o.dtype in LOW
        twin_ins = {}
        follows = False
        followed = True
        for t in ins:
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                continue
            e = self._lookup(t)
            if e is not None:
                if e[1].shape != t.shape:
                    followed = False  # taken as it is, widened
                    continue
                twin_ins[id(t)] = (t, e[1], e[2])
                follows = True
        if not low and not follows:
            return  # an f32 op on values f32 computed
        if name in RANDOM_OPS or (name.endswith("_") and not name.startswith("_")):
            self.recorder.note_once("twin_" + name, module, op, "the twin does not compute %s again (%s): no "
                                    "/precision row for it" % (op, "it draws random numbers" if name in RANDOM_OPS
                                                               else "an in-place op"))
            return
        kwargs = kwargs or {}
        # The backward twin (ops of BACKWARD_OPS): the op's inputs widened are kept for its node (label_nodes ->
        # attach -> backward_row), where the f32 graph is built (autograd does not record below the dispatcher's
        # autograd layer, where this runs).
        if low and name in BACKWARD_OPS and torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in ins):
            flags = [t.requires_grad for t in _tensors_of(args)]
            self._pending_graph(o, (func, _map(args, lambda t: _widen(t).detach()), kwargs, flags))
        try:
            with _Quiet():
                local = _first(func(*_map(args, _widen), **kwargs)) if low else None
                if low and not follows:
                    acc = local
                else:
                    def twin_of(t):
                        e = twin_ins.get(id(t))
                        return e[1] if e is not None else _widen(t)
                    acc = _first(func(*_map(args, twin_of), **kwargs)).float()
        except Exception as err:  # the run goes on as without the twin
            self.recorder.note_once("twin_fail_" + name, module, op, "the twin could not compute %s again in f32 "
                                    "(%s: %s): no /precision row for it" % (op, type(err).__name__, err))
            return
        out_dtype = dtype_key(o.dtype)
        row_local = None
        if low:
            row_local = compare(o, local, out_dtype, op)
        a = row_local if (low and not follows) else compare(o, acc, out_dtype, op)
        in_max = in_mean = 0.0
        for t, v, st in twin_ins.values():
            if st is None:
                if t.numel() != v.numel():
                    continue
                st = compare(t, v, dtype_key(t.dtype)) if t.dtype in LOW or t.dtype == torch.float32 else None
            if st is None:
                continue
            in_max = max(in_max, st.max_rel)
            in_mean = max(in_mean, st.mean_rel)
        cond = self._cond(name, op, args, twin_ins, acc, out_dtype)
        self._keep(o, acc, a)
        self.rows += 1
        r = row_local
        self.recorder.channel.add([
            "precision", step, seq, op, module, out_dtype, o.numel(), low,
            _n(r.max_rel if r else 0), _n(r.mean_rel if r else 0), _n(r.max_ulp if r else 0),
            _n(a.max_rel), _n(a.mean_rel), _n(a.max_ulp), _n(in_max), _n(in_mean), a.flips, _n(a.bits), _n(cond),
            followed, a.error_bins, a.exact, "forward"])

    # ------------------------------------------------------------ the backward twin
    def _pending_graph(self, o, graph):
        import weakref

        self.graphs.append((weakref.ref(o), graph))

    def attach(self, t, node):
        """The recorder labelled node, t's grad_fn: a graph made for t goes with the node (node.metadata)."""
        if not self.graphs:
            return
        kept = []
        for ref, graph in self.graphs:
            if ref() is t:
                node.metadata["ampscope_twin"] = graph
            elif ref() is not None:
                kept.append((ref, graph))
        self.graphs = kept

    def backward_row(self, node, grad_inputs, grad_outputs, step, seq, op, module):
        """One /precision row (phase backward) for a node of BACKWARD_OPS whose gradients are f16/bf16: each
        gradient against the gradient of the op's f32 twin graph (built on the op's own inputs widened) for the
        incoming gradient widened, in its own dtype; the largest max and mean, counts summed (probes/twin.h)."""
        graph = node.metadata.pop("ampscope_twin", None)
        grads = list(grad_inputs)
        low = [g for g in grads if isinstance(g, torch.Tensor) and g.dtype in LOW]
        if not low:
            return
        if graph is None:
            self.recorder.note_once("twin_bwd_" + op, module, op, "--twin: the backward of %s is not computed again "
                                    "(the twin of a PyTorch run computes the backward only of the nodes of %s): no "
                                    "backward /precision row for it" % (
                                        op, ", ".join(sorted(BACKWARD_NAMES))))
            return
        func, wide_args, kwargs, flags = graph
        all_leaves = []

        def leaf(t):
            x = t.detach().requires_grad_(flags[len(all_leaves)] and t.is_floating_point())
            all_leaves.append(x)
            return x

        incoming = [g for g in grad_outputs if isinstance(g, torch.Tensor)]
        try:
            with _Quiet(grad=True):
                local = _first(func(*_map(wide_args, leaf), **kwargs))
            # The node's gradients are its op's tensor inputs', in order (a wrapped number's among them: None).
            # A Python number the op took (x * 4) has a gradient slot of its own, None, after the tensors'.
            leaves = all_leaves
            while len(grads) > len(leaves) and grads[-1] is None:
                grads.pop()
            if len(leaves) != len(grads) or len(incoming) != 1 or not local.requires_grad:
                raise ValueError("%d gradients for %d tensor inputs" % (len(grads), len(leaves)))
            wanted = [x for x, g in zip(leaves, grads) if isinstance(g, torch.Tensor) and x.requires_grad]
            with _Quiet(grad=True):
                refs = torch.autograd.grad(local, wanted, incoming[0].float(), allow_unused=True)
        except Exception as err:
            self.recorder.note_once("twin_bwd_" + op, module, op, "the twin could not compute the backward of %s "
                                    "again in f32 (%s: %s): no backward /precision row for it" % (
                                        op, type(err).__name__, err))
            return
        ref_of = {id(x): r for x, r in zip(wanted, refs)}
        merged = None
        dtype = None
        numel = 0
        for x, g in zip(leaves, grads):
            r = ref_of.get(id(x))
            if not isinstance(g, torch.Tensor) or r is None or r.numel() != g.numel():
                continue
            d = dtype_key(g.dtype)
            if dtype is None or _FORMAT[d][0] < _FORMAT[dtype][0]:
                dtype = d
            st = compare(g, r, d)
            numel += g.numel()
            if merged is None:
                merged = st
                continue
            merged.counted += st.counted
            merged.mean_rel = max(merged.mean_rel, st.mean_rel)
            merged.max_rel = max(merged.max_rel, st.max_rel)
            merged.max_ulp = max(merged.max_ulp, st.max_ulp)
            merged.flips += st.flips
            merged.exact += st.exact
            merged.error_bins = [a + b for a, b in zip(merged.error_bins, st.error_bins)]
        if merged is None:
            return
        p = _FORMAT[dtype][0]
        bits = float(p) if merged.max_rel == 0 else min(max(-math.log2(merged.max_rel), 0.0), float(p)) + 0.0
        self.rows += 1
        self.recorder.channel.add([
            "precision", step, seq, op, module, dtype, numel, True, _n(merged.max_rel), _n(merged.mean_rel),
            _n(merged.max_ulp), 0.0, 0.0, 0.0, 0.0, 0.0, merged.flips, _n(bits), "nan", True, merged.error_bins,
            merged.exact, "backward"])

    def _cond(self, name, op, args, twin_ins, acc, out_dtype):
        """Condition numbers from the twin's values (probes/twin.h): add, sub, rsub: max (|a| + |b|) /
        max(|acc|, floor); sum, mean: sum|x| / max(|sum x|, floor); floor: the output dtype's smallest normal."""
        _, emin, _ = _FORMAT[out_dtype]
        floor = math.ldexp(1.0, emin)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]

        def twin(t):
            e = twin_ins.get(id(t))
            return (e[1] if e is not None and e[1].shape == t.shape else t).detach().to(torch.float64)

        accd = acc.to(torch.float64)
        den = torch.clamp(accd.abs(), min=floor)
        with _Quiet():
            if op in ADDITIVE and len(tensors) == 2:
                num_ = twin(tensors[0]).abs() + twin(tensors[1]).abs()
            elif op in ADDITIVE and len(tensors) == 1:
                x = twin(tensors[0])
                num_ = x.abs() + ((accd + x).abs() if op == "rsub" else (accd - x).abs())
            elif op in REDUCTION and len(tensors) == 1:
                x = twin(tensors[0])
                kwargs_free = [a for a in args[1:]]
                num_ = getattr(torch, op)(x.abs(), *kwargs_free) if kwargs_free else getattr(torch, op)(x.abs())
            else:
                return float("nan")
            return float((num_.expand_as(den) / den).max()) if den.numel() else float("nan")


def _n(x):
    from ampscope.torch._channel import num

    return num(x)
