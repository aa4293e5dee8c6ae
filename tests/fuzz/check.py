"""Run a fuzz program through eager, a float64 reference, and vfuse's captures; compare.

The reference is the same program on the same values with every float as float64 (casts to a
float type become casts to float64). A vfuse result passes when its distance to the reference
is within a few times eager's own distance to it (on these inputs, or on four sets of inputs
nudged by a few ulps, whichever is largest), plus a few ulps of the largest value: this scales the tolerance
by how ill-conditioned the program is on these inputs (a LayerNorm of a constant row, where
eager happens to be exact and any other summation order is not; a long sum) without a
hand-written error model per op. Integer and bool
results (which the generator only derives from exactly computed values) must be equal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Callable, Iterator, Sequence

import torch
from hypothesis import HealthCheck, Phase, reject, settings
from tests.fuzz.ops import U, apply
from tests.fuzz.program import Kind, Program, build, loss_weights, make_inputs

import vfuse

# Distance allowed beyond eager's, in units of the output dtype's eps times the largest |value|.
ULPS = {torch.float64: 1e7, torch.float32: 16.0, torch.float16: 4.0, torch.bfloat16: 4.0}
EAGER_FACTOR = 4.0
# Nudged input sets (make_inputs' `perturb`): eager's error on a sum that cancels to ~0 moves by
# several x between input sets; one set let a 2^-23 against eager's 2^-25 fail (a zero gradient),
# two let 1.9e-9 against eager's exact 0 fail (the gradient of sum(softmax(x)) over the softmax's
# dim: eager's sum of the probabilities came out exactly 1 on the first three sets, not the fourth).
NUDGES = (1, 2, 3, 4)
# The fp32 erf GELU's documented absolute error (codegen/cpp/prelude.py vf_gelu_none: 1.0e-6 against
# float64, tests allow 2e-6): in the negative tail, where eager's 1 + erf cancels accurately and the
# value is small (gelu(-2.9) = -0.00265), a single output element is off by 7e-8, 5x eager's error.
GELU_ABS = 2e-6


def fuzz_settings(examples: int) -> settings:
    """`examples` graphs, derandomized (the same programs on every run) and not shrunk (each
    shrinking step compiles again: minutes), unless VFUSE_FUZZ=soak: then VFUSE_FUZZ_EXAMPLES
    random programs per run, failures shrunk (the soak driver prints each run's seed)."""
    common = {"deadline": None, "suppress_health_check": list(HealthCheck), "print_blob": True}
    if os.environ.get("VFUSE_FUZZ") == "soak":
        return settings(max_examples=int(os.environ.get("VFUSE_FUZZ_EXAMPLES", "50")), **common)
    phases = (Phase.explicit, Phase.generate)
    return settings(max_examples=examples, derandomize=True, database=None, phases=phases, **common)


def widen(program: Program) -> Program:
    """The program with casts to a float type turned into casts to float64 (the reference)."""
    steps = tuple(
        dataclasses.replace(s, params=(torch.float64,)) if s.kind is Kind.CAST and s.params[0].is_floating_point else s
        for s in program.steps
    )
    return dataclasses.replace(program, steps=steps)


@contextlib.contextmanager
def float64_default() -> Iterator[None]:
    """Python floats and int->float promotions give float64 (the reference's default dtype)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def quiet(fn: Callable, *args: object) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager's own warnings (var with one element, ...)
        return fn(*args)


def assert_close_to_reference(
    got: torch.Tensor,
    eager: torch.Tensor,
    ref: torch.Tensor,
    what: str,
    nudged: Sequence[torch.Tensor] = (),
    floor: float = 0.0,
    scale: float = 0.0,
) -> None:
    """`got` is as close to `ref` as eager is, on these inputs or nudged ones (module docstring),
    or within `floor` (an approximation's documented absolute error, `approximation_floors`).
    `scale`: the program's values (`cancel_scale`), the ulps' yardstick for a float64 result that cancels
    to noise."""
    assert got.shape == eager.shape, f"{what}: shape {tuple(got.shape)}, eager {tuple(eager.shape)}"
    assert got.dtype == eager.dtype, f"{what}: dtype {got.dtype}, eager {eager.dtype}"
    if not eager.is_floating_point():
        bad = (got != eager).nonzero()
        assert not len(bad), f"{what}: {len(bad)} elements differ from eager, first at {bad[0].tolist()}: " + (
            f"{got[tuple(bad[0])].item()} vs {eager[tuple(bad[0])].item()}"
        )
        return
    g, e, r = got.double(), eager.double(), ref.double()
    # eager's NaN where the float64 reference has an infinity vfuse also gives (fp32 eager's GELU(+inf))
    right = e.isnan() & r.isinf() & (g == r)
    e = torch.where(right, r, e)
    assert torch.equal(g.isnan(), e.isnan()), f"{what}: NaN at other positions than eager ({_first_diff(g, e)})"
    inf = e.isinf()
    assert torch.equal(g.isinf(), inf) and torch.equal(g[inf], e[inf]), f"{what}: inf differs ({_first_diff(g, e)})"
    finite = e.isfinite() & r.isfinite()
    if not finite.any():
        return
    err_got = (g - r)[finite].abs().max().item()
    err_eager = (e - r)[finite].abs().max().item()
    for n in (x.double() for x in nudged if x.shape == eager.shape):
        both = finite & n.isfinite()
        err_eager = max(err_eager, (n - r)[both].abs().max().item() if both.any() else 0.0)
    scale = max(r[finite].abs().max().item(), scale if eager.dtype == torch.float64 else 0.0)
    tol = EAGER_FACTOR * err_eager + ULPS[eager.dtype] * torch.finfo(eager.dtype).eps * scale + floor
    assert err_got <= tol, (
        f"{what}: max |got - ref| = {err_got:.3g} > tolerance {tol:.3g} "
        f"(eager's max |eager - ref| = {err_eager:.3g}, max |ref| = {scale:.3g}; {_first_diff(g, e)})"
    )


def _first_diff(g: torch.Tensor, e: torch.Tensor) -> str:
    diff = (g - e).abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    mismatch = (g.isnan() != e.isnan()) | (g.isinf() != e.isinf())
    at = mismatch.nonzero()[0] if mismatch.any() else (diff == diff.max()).nonzero()[0] if diff.numel() else None
    if at is None:
        return "empty"
    index = tuple(at.tolist())
    return f"worst at {list(index)}: got {g[index].item():.6g}, eager {e[index].item():.6g}"


def reference(program: Program) -> tuple[torch.Tensor, ...]:
    _, inputs = make_inputs(program, double=True)
    with float64_default():
        return quiet(build(widen(program), apply), *inputs)  # type: ignore[return-value]


def vfuse_backend(kind: str) -> object:
    """strict=True: a failure to lower, generate or compile C++ raises instead of falling back."""
    return vfuse.backend(strict=True, backend=kind)


def compiled(fn: Callable, backend: object) -> Callable:
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)


KINDS = ("cpp", "interp")


class EachBackend:
    """A Dynamo backend that compiles each graph Dynamo traced with every vfuse backend (one per
    kind, `.backends`); the graph runs on the one `.kind` names. Dynamo traces a program once for
    all of them (its own tracing, once per backend, was about half of a forward example's time)."""

    def __init__(self) -> None:
        self.backends = {kind: vfuse_backend(kind) for kind in KINDS}
        self.kind = KINDS[0]

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> Callable:
        # Each gets a copy: a training graph's attention rewrite edits the graph in place.
        fns = {kind: b(_copy(gm), example_inputs) for kind, b in self.backends.items()}

        def run(*args: object) -> object:  # Dynamo calls a backend's result with the arguments as they are
            return fns[self.kind](*args)

        return run


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The graph module with its own graph: nodes (and their metadata), attributes, Dynamo's notes."""
    graph, nodes = torch.fx.Graph(), {}
    graph.output(graph.graph_copy(gm.graph, nodes))
    for old, new in nodes.items():  # Dynamo's notes on nodes (`_dynamo_source`, read by AOTAutograd)
        for name, value in vars(old).items():
            if name not in vars(new):
                setattr(new, name, value)
    copy = torch.fx.GraphModule(gm, graph)
    copy.meta.update(gm.meta)
    if hasattr(gm, "_param_name_to_source"):  # read by AOTAutograd
        copy._param_name_to_source = gm._param_name_to_source
    return copy


def check_outputs(
    got: Sequence[torch.Tensor],
    eager: Sequence[torch.Tensor],
    ref: Sequence[torch.Tensor],
    what: str,
    nudged: Sequence[Sequence[torch.Tensor]] = (),
    floors: Sequence[float] = (),
    scale: float = 0.0,
) -> None:
    """`nudged`: per output, eager's results on the nudged input sets (`per_output`); `floors`:
    per output, an absolute tolerance (`approximation_floors`); `scale`: `cancel_scale`."""
    assert len(got) == len(eager), f"{what}: {len(got)} outputs, eager has {len(eager)}"
    for i, (gi, ei, ri) in enumerate(zip(got, eager, ref)):
        floor = floors[i] if i < len(floors) and gi.dtype == torch.float32 else 0.0
        nudges = nudged[i] if i < len(nudged) else ()
        assert_close_to_reference(gi, ei, ri, f"{what}, output {i}", nudges, floor, scale)


def cancel_scale(outputs: Sequence[torch.Tensor]) -> float:
    """The largest finite |value| of a program's float outputs: the yardstick of its float64 gradients'
    ulps. A float64 program's reference is eager's precision, so eager's own error is the only other
    yardstick, and a gradient that cancels to ~0 everywhere (the sum over a softmax's own axis) is
    rounding noise of the terms that cancel: 2.7e-18 in vfuse against eager's 2e-19 (fuzz seed
    3787373881, values O(1)) failed a tolerance scaled by the noise itself."""
    finite = [o[o.isfinite()].abs().max().item() for o in outputs if o.is_floating_point() and o.isfinite().any()]
    return max(finite, default=0.0)


def approximation_floors(program: Program) -> list[float]:
    """Per forward output: GELU_ABS where the output is an erf GELU's value (through views), else 0."""
    floors = []
    for v in program.outputs:
        step = program.steps[v]
        while step.kind is Kind.VIEW and step.srcs:
            step = program.steps[step.srcs[0]]
        floors.append(GELU_ABS if step.kind is Kind.UNARY and step.fn is U.GELU else 0.0)
    return floors


def per_output(runs: Sequence[Sequence[torch.Tensor]]) -> list[tuple[torch.Tensor, ...]]:
    """One run's outputs per nudged input set -> each output's results over the sets."""
    return [tuple(r[i] for r in runs) for i in range(min((len(r) for r in runs), default=0))]


def check_forward(program: Program, export: bool) -> dict[str, object]:
    """Dynamo capture on the C++ and the reference executors (and export when asked) vs eager."""
    fn = build(program, apply)
    _, inputs = make_inputs(program)
    eager = quiet(fn, *inputs)
    ref = reference(program)
    nudged = per_output([quiet(fn, *make_inputs(program, perturb=k)[1]) for k in NUDGES])  # type: ignore[misc]
    floors = approximation_floors(program)
    each = EachBackend()
    run = compiled(fn, each)
    for kind in KINDS:
        each.kind = kind
        got = quiet(run, *inputs)
        check_outputs(got, eager, ref, f"torch.compile(backend=vfuse {kind})", nudged, floors)  # type: ignore[arg-type]
        # A second call on other values must leave the first call's outputs alone (output pool).
        quiet(run, *make_inputs(dataclasses.replace(program, seed=program.seed + 1))[1])
        check_outputs(got, eager, ref, f"vfuse {kind}, first outputs after a second call", nudged, floors)  # type: ignore[arg-type]
    stats: dict[str, object] = {kind: b.stats for kind, b in each.backends.items()}
    if export:
        got = quiet(vfuse.compile(fn, inputs, strict=True, backend="cpp"), *inputs)
        check_outputs(got, eager, ref, "vfuse.compile", nudged, floors)  # type: ignore[arg-type]
    return stats


def _grads(program: Program, fn: Callable, double: bool = False, perturb: int = 0) -> tuple[list, list]:
    leaves, inputs = make_inputs(program, grad=True, double=double, perturb=perturb)
    outs = quiet(fn, *inputs)
    weights = loss_weights(outs, program.seed)  # type: ignore[arg-type]
    terms = [(o * w.to(o.dtype)).sum() for o, w in zip(outs, weights) if o.requires_grad]  # type: ignore[union-attr]
    wrt = [x for x in leaves if x.requires_grad]
    if not terms or not wrt:
        return list(outs), []  # type: ignore[arg-type]
    grads = torch.autograd.grad(sum(terms), wrt, allow_unused=True)
    return [o.detach() for o in outs], [g if g is not None else torch.zeros_like(x) for g, x in zip(grads, wrt)]  # type: ignore[union-attr]


def check_backward(program: Program) -> dict[str, object]:
    """Outputs and the gradients of sum(output * random weights) w.r.t. every float input."""
    fn = build(program, apply)
    try:
        eager_out, eager_grads = _grads(program, fn)
    except RuntimeError:
        reject()  # eager has no backward for it (e.g. through a bool promoted to float): not a test
    runs = [_grads(program, fn, perturb=k) for k in NUDGES]
    nudged_out, nudged_grads = per_output([r[0] for r in runs]), per_output([r[1] for r in runs])
    with float64_default():
        ref_out, ref_grads = _grads(program, build(widen(program), apply), double=True)
    each, scale = EachBackend(), cancel_scale(ref_out)
    run = compiled(fn, each)
    for kind in KINDS:
        each.kind = kind
        out, grads = _grads(program, run)
        check_outputs(out, eager_out, ref_out, f"forward, vfuse {kind}", nudged_out)
        check_outputs(grads, eager_grads, ref_grads, f"gradients, vfuse {kind}", nudged_grads, scale=scale)
    return {kind: b.stats for kind, b in each.backends.items()}
