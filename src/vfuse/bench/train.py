"""`vfuse bench --train`: whole training steps (forward, backward, AdamW(foreach) step) of eager,
Inductor and vfuse: step time and peak memory, after checking loss and gradients against eager.

Each contender trains its own deep copy of the same model from the same weights. Inductor and
vfuse compile the model and the optimizer step (`torch.compile(opt.step)`, vfuse: one horizontally
fused kernel per dtype, fusion/horizontal.py). Dropout is set to 0 so losses compare exactly.
All contenders are built and checked first, then their steps are timed in interleaved rounds
(bench/timing.measure: one step each per round, the order rotated): median and quartiles.

Peak memory (CPU: torch keeps no allocator statistics there) is the same for every contender:
the highest sum of tensor bytes allocated during one step and not yet freed, from torch's
profiler (`profile_memory=True`, every CPU allocation and free in order), plus the bytes the
compiled code keeps between steps (vfuse: each graph's arena and its output pool's buffers;
eager and Inductor allocate per call). Weights, gradients kept across steps and optimizer state
are the same for all and shown apart (`state`). docs/benchmarks.md, "Training".
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from torch import Tensor, nn

from vfuse.bench import models as model_registry
from vfuse.bench.timing import Stats, TimingConfig, measure
from vfuse.bench.workloads_compute import Attention, ConvBnRelu, Gpt2Block, _layernorm, _linear, _randn
from vfuse.runtime.pool import is_idle

CONTENDERS = ("eager", "inductor", "vfuse")
LR = 1e-3
LOSS_RTOL, GRAD_RTOL = 1e-3, 2e-3


class LnGeluMLP(nn.Module):
    def __init__(self, gen: torch.Generator, d: int, hidden: int) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = _layernorm(gen, d), _linear(gen, d, hidden), _linear(gen, hidden, d)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(self.ln(x))))


class CausalSdpa(nn.Module):
    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class SelfAttention(nn.Module):
    """qkv projection, attention written out (softmax(q k^T s) v) or `attn`, output projection."""

    def __init__(self, gen: torch.Generator, d: int, heads: int, attn: nn.Module | None = None) -> None:
        super().__init__()
        self.heads, self.qkv, self.out = heads, _linear(gen, d, 3 * d), _linear(gen, d, d)
        self.attn = attn or Attention()

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return self.out(self.attn(q, k, v).transpose(1, 2).reshape(b, t, d))


Build = Callable[[bool], tuple[nn.Module, tuple[Tensor, ...]]]


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _gpt2(quick: bool) -> tuple[nn.Module, tuple[Tensor, ...]]:
    gen = _gen()
    b, t, d, h = (1, 16, 64, 2) if quick else (4, 128, 256, 4)
    return Gpt2Block(gen, d, h, max_t=t), (_randn(gen, b, t, d),)


def _mlp(quick: bool) -> tuple[nn.Module, tuple[Tensor, ...]]:
    gen = _gen()
    rows, d, hidden = (64, 32, 128) if quick else (2048, 256, 1024)
    return LnGeluMLP(gen, d, hidden), (_randn(gen, rows, d),)


def _conv(quick: bool) -> tuple[nn.Module, tuple[Tensor, ...]]:
    gen = _gen()
    c, shape = (8, (2, 8, 10, 10)) if quick else (32, (8, 32, 28, 28))
    return ConvBnRelu(gen, c), (_randn(gen, *shape),)


def _attention(quick: bool) -> tuple[nn.Module, tuple[Tensor, ...]]:
    gen = _gen()
    b, t, d, h = (1, 16, 32, 2) if quick else (4, 256, 256, 4)
    return SelfAttention(gen, d, h), (_randn(gen, b, t, d),)


def _sdpa_attention(quick: bool) -> tuple[nn.Module, tuple[Tensor, ...]]:
    gen = _gen()
    b, t, d, h = (1, 16, 32, 2) if quick else (4, 256, 256, 4)
    return SelfAttention(gen, d, h, CausalSdpa()), (_randn(gen, b, t, d),)


WORKLOADS: dict[str, tuple[str, Build]] = {
    "gpt2_block": ("pre-LN GPT-2 block, B=4 T=128 d=256 4 heads", _gpt2),
    "ln_gelu_mlp": ("LayerNorm -> Linear -> GELU -> Linear, 2048x256, hidden 1024", _mlp),
    "conv_bn_relu": ("relu(bn(conv3x3(x))), train-mode BN, 8x32x28x28", _conv),
    "attention": ("qkv proj, softmax(q@k^T*s)@v written out, out proj; B=4 T=256 d=256", _attention),
    "sdpa_attention": ("qkv proj, causal F.scaled_dot_product_attention, out proj; B=4 T=256 d=256", _sdpa_attention),
}


def _from_model(name: str) -> Build:
    def build(quick: bool) -> tuple[nn.Module, tuple[Tensor, ...]]:
        inst = model_registry.MODELS[name].build(quick)
        return inst.module, inst.inputs

    return build


@dataclass
class TrainResult:
    workload: str
    contender: str
    step_ms: float = math.nan  # median of the timed steps
    step_ms_min: float = math.nan
    step_ms_q1: float = math.nan  # quartiles of the timed steps (interleaved rounds)
    step_ms_q3: float = math.nan
    step_peak_bytes: int = 0  # allocated during a step and live at once, at most
    retained_bytes: int = 0  # kept by the compiled code between steps (vfuse arenas and pools)
    pooled_grad_bytes: int = 0  # vfuse: gradient buffers its output pool holds through the step
    peak_bytes: int = 0  # step_peak_bytes + retained_bytes + pooled_grad_bytes
    state_bytes: int = 0  # weights, gradients, optimizer state: the same for every contender
    saved_bytes: int | None = None  # vfuse: bytes its partition saves for backward (entry/remat.py)
    loss: float = math.nan
    loss_rel_err: float = math.nan
    grad_rel_err: float = math.nan
    graphs: int | None = None
    eager_graphs: int | None = None
    ok: bool = False
    error: str = ""


@dataclass
class _Trainer:
    model: nn.Module
    inputs: tuple[Tensor, ...]
    opt: torch.optim.Optimizer
    forward: Callable[..., Tensor]
    opt_step: Callable[[], Any]
    backend: Any = None
    losses: list[float] = field(default_factory=list)
    result: TrainResult | None = None  # its first step's check, then its figures

    def step(self) -> Tensor:
        self.opt.zero_grad(set_to_none=True)
        out = self.forward(*self.inputs)
        loss = out.float().square().mean()
        loss.backward()
        self.opt_step()
        return loss.detach()


def _no_dropout(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        for attr in ("attention_dropout", "dropout_prob"):  # HF modules read floats too
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)
    return model.train()


def _trainer(model: nn.Module, inputs: tuple[Tensor, ...], contender: str, strict: bool) -> _Trainer:
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, foreach=True)
    if contender == "eager":
        return _Trainer(model, inputs, opt, model, opt.step)
    if contender == "inductor":
        return _Trainer(model, inputs, opt, torch.compile(model), torch.compile(opt.step))
    import vfuse

    backend = vfuse.backend(strict=strict)
    fwd = torch.compile(model, backend=backend)
    return _Trainer(model, inputs, opt, fwd, torch.compile(opt.step, backend=backend), backend)


def _rel_err(got: Tensor, want: Tensor, floor: float = 1e-30) -> float:
    """Max error relative to the tensor's scale, at least `floor` (a gradient that is zero in exact
    arithmetic, a bias before a norm, is rounding noise of the other gradients' scale)."""
    scale = max(want.abs().max().item(), floor)
    return (got - want).abs().max().item() / scale


def _grads(model: nn.Module) -> list[Tensor | None]:
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def allocation_events(prof: Any) -> list[tuple[int, int, int, tuple[str, ...]]]:
    """(time ns, address, bytes: negative for a free, the ops around it) of every CPU allocation
    event of a finished `torch.profiler.profile(profile_memory=True)`, in time order (a free
    first where one shares an allocation's nanosecond: the address is reused after it)."""
    out: list[tuple[int, int, int, tuple[str, ...]]] = []
    stack = [(n, ()) for n in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        node, chain = stack.pop()
        fields = node.extra_fields
        if type(fields).__name__ == "_ExtraFields_Allocation":
            out.append((node.start_time_ns, fields.ptr, fields.alloc_size, chain))
        else:
            stack += [(c, (*chain, node.name)) for c in node.children]
    out.sort(key=lambda e: (e[0], e[2] > 0))
    return out


def step_peak_bytes(step: Callable[[], Any]) -> int:
    """The most bytes allocated during `step` and live at the same time (torch's CPU allocations).

    Frees count only for blocks allocated in the step, matched by address: torch's CPU allocator
    reports a free with the size it noted at the block's allocation under an earlier profiler
    session, so a block from before the step whose address such a session had used (the previous
    contender's, workload's or step's) would subtract that stale size (hf_vit's Inductor step read
    6.7 MiB after other workloads, 7.32 alone; the step after a profiled one, 1.04)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    live: dict[int, int] = {}
    cur = peak = 0
    for _, ptr, nbytes, _ in allocation_events(prof):
        if nbytes > 0:
            cur += nbytes - live.get(ptr, 0)
            live[ptr] = nbytes
        else:
            cur -= live.pop(ptr, 0)
        peak = max(peak, cur)
    return peak


def retained_bytes(backend: Any) -> int:
    """Bytes vfuse's compiled graphs keep between calls that nothing else holds: arenas (each
    counted once: graphs share one, runtime/arenas.py) and output-pool buffers no tensor reaches
    (a pool buffer that is a parameter's `.grad` now is counted in `state`, as eager's is)."""
    if backend is None:
        return 0
    storages: dict[int, int] = {}
    arenas = [getattr(g.executor, "_arena", None) for g in backend.compiled]
    lender = getattr(backend, "arenas", None)
    for arena in [*arenas, *getattr(lender, "_free", ())]:
        if isinstance(arena, Tensor):
            storages[arena.untyped_storage().data_ptr()] = arena.untyped_storage().nbytes()
    for g in backend.compiled:
        pool = getattr(g.executor, "_pool", None)
        for ring in getattr(pool, "_slots", {}).values():
            for slot in ring:
                if is_idle(slot):
                    storages[slot[3]] = slot[1].nbytes()
    return sum(storages.values())


def pool_pointers(backend: Any) -> set[int]:
    """Data pointers of every output-pool buffer vfuse's compiled graphs hold now."""
    if backend is None:
        return set()
    pools = [getattr(g.executor, "_pool", None) for g in backend.compiled]
    return {slot[3] for pool in pools for ring in getattr(pool, "_slots", {}).values() for slot in ring}


def pooled_grad_bytes(model: nn.Module, before: set[int]) -> int:
    """Bytes of the parameters' gradients that live in pool buffers which existed before the step:
    they were never allocated inside it, so its profile misses them, while eager's and Inductor's
    gradients are allocated inside their steps and counted in their peaks."""
    storages = {}
    for p in model.parameters():
        if p.grad is not None and p.grad.untyped_storage().data_ptr() in before:
            storages[p.grad.untyped_storage().data_ptr()] = p.grad.untyped_storage().nbytes()
    return sum(storages.values())


def _state_bytes(tr: _Trainer) -> int:
    tensors = [*tr.model.parameters(), *(p.grad for p in tr.model.parameters() if p.grad is not None)]
    tensors += [v for s in tr.opt.state.values() for v in s.values() if isinstance(v, Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def _prepare(
    name: str, model: nn.Module, inputs: tuple[Tensor, ...], contender: str, args: argparse.Namespace, ref: dict
) -> _Trainer:
    """Build one contender's trainer (its own copy of `model`) and check its first step, which
    compiles, against eager's: `ref` holds eager's loss and gradients once eager has run."""
    tr = _trainer(model, inputs, contender, strict=not args.allow_fallback)
    loss = tr.step()
    grads = _grads(tr.model)
    if contender == "eager":
        ref.update(loss=loss, grads=grads)
    res = TrainResult(name, contender, loss=loss.item(), loss_rel_err=_rel_err(loss, ref["loss"]))
    pairs = [(g, r) for g, r in zip(grads, ref["grads"], strict=True) if r is not None]
    if any(g is None for g, _ in pairs):
        raise RuntimeError("a parameter has no gradient where eager has one")
    floor = 1e-2 * max((r.abs().max().item() for _, r in pairs if r.numel()), default=0.0)
    res.grad_rel_err = max((_rel_err(g, r, floor) for g, r in pairs), default=0.0)
    res.ok = res.loss_rel_err <= LOSS_RTOL and res.grad_rel_err <= GRAD_RTOL
    tr.result = res
    return tr


def _error(name: str, contender: str, e: BaseException) -> TrainResult:
    return TrainResult(name, contender, error=f"{type(e).__name__}: {e}".splitlines()[0])


def _guarded(tr: _Trainer, failed: dict[str, BaseException]) -> Callable[[], object]:
    """`tr.step`, or after it raised once a no-op: one contender's failure while timing is its row's
    error, not the end of the others' rounds (its times are then dropped)."""

    def step() -> object:
        if tr.result.contender in failed:
            return None
        try:
            return tr.step()
        except Exception as e:  # reported in the row
            failed[tr.result.contender] = e
            return None

    return step


def _finish(tr: _Trainer, stats: Stats) -> TrainResult:
    """The timed figures, then one more step under the profiler for this contender's peak memory."""
    res = tr.result
    res.step_ms, res.step_ms_min = stats.median_s * 1e3, stats.min_s * 1e3
    res.step_ms_q1, res.step_ms_q3 = stats.q1_s * 1e3, stats.q3_s * 1e3
    before = pool_pointers(tr.backend)
    res.step_peak_bytes = step_peak_bytes(tr.step)
    res.retained_bytes = retained_bytes(tr.backend)
    res.pooled_grad_bytes = pooled_grad_bytes(tr.model, before)
    res.peak_bytes = res.step_peak_bytes + res.retained_bytes + res.pooled_grad_bytes
    res.state_bytes = _state_bytes(tr)
    if tr.backend is not None:
        res.saved_bytes = sum(p.saved_bytes for p in tr.backend.remat)
        res.graphs, res.eager_graphs = tr.backend.stats["graphs"], tr.backend.stats["eager_graphs"]
    return res


def _run_workload(
    name: str, build: Build, contenders: list[str], args: argparse.Namespace, console: Console
) -> list[TrainResult]:
    """Every contender built and checked first, then their steps timed in interleaved rounds
    (bench/timing.measure: one step each per round, the order rotated), so that the machine's drift
    hits all of them alike; each contender's peak memory is then profiled in a step of its own."""
    torch._dynamo.reset()  # no guards or cache entries carried over from the previous workload
    model, inputs = build(args.quick)
    model = _no_dropout(model)
    ref: dict = {}
    rows: dict[str, TrainResult] = {}
    trainers: dict[str, _Trainer] = {}
    for contender in contenders:
        console.print(f"training {name}: compile + check {contender}", style="dim")
        try:
            trainers[contender] = _prepare(name, model, inputs, contender, args, ref)
        except Exception as e:  # one contender's failure is a row, not the end of the run
            rows[contender] = _error(name, contender, e)
    failed: dict[str, BaseException] = {}
    fns = {c: _guarded(tr, failed) for c, tr in trainers.items()}
    console.print(f"training {name}: timing {', '.join(fns)} interleaved", style="dim")
    config = TimingConfig(warmup=args.warmup_steps, reps=args.steps, min_sample_s=0.0)  # one step per sample
    stats = measure(fns, config) if fns else {}
    for contender, tr in trainers.items():
        try:
            if contender in failed:
                raise failed[contender]
            rows[contender] = _finish(tr, stats[contender])
        except Exception as e:
            rows[contender] = _error(name, contender, e)
    return [rows[c] for c in contenders]


def selected(args: argparse.Namespace) -> list[tuple[str, Build]]:
    names = args.workloads or ([] if args.models is not None else list(WORKLOADS))
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown training workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    chosen = [(n, WORKLOADS[n][1]) for n in names]
    if args.models is not None:
        chosen += [(m.name, _from_model(m.name)) for m in model_registry.select(args.models)]
    return chosen


def run(args: argparse.Namespace, console: Console) -> list[TrainResult]:
    contenders = args.contenders or list(CONTENDERS)
    if contenders[0] != "eager" or any(c not in CONTENDERS for c in contenders):
        raise ValueError(f"--train contenders: eager first, then any of {', '.join(CONTENDERS[1:])}")
    results = []
    for name, build in selected(args):
        results += _run_workload(name, build, contenders, args, console)
    return results


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f}"


def _ratio(base: TrainResult | None, r: TrainResult) -> str:
    """base's median step time over r's (> 1: r is faster); both from the same interleaved rounds."""
    ok = base is not None and base.step_ms == base.step_ms and r.step_ms == r.step_ms and r.step_ms > 0
    return f"{base.step_ms / r.step_ms:.2f}x" if ok else "-"


COLUMNS = (
    "workload",
    "contender",
    "step ms",
    "IQR",
    "vs eager",
    "vs Inductor",
    "peak MiB",
    "retained",
    "saved",
    "state",
    "grad err",
    "check",
)


def print_results(console: Console, results: list[TrainResult]) -> None:
    table = Table(title="training step (forward + backward + AdamW foreach), CPU")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("workload", "contender", "check") else "right")
    eager = {r.workload: r for r in results if r.contender == "eager"}
    inductor = {r.workload: r for r in results if r.contender == "inductor"}
    for r in results:
        speed, vs_inductor = _ratio(eager.get(r.workload), r), _ratio(inductor.get(r.workload), r)
        check = r.error or ("ok" if r.ok else f"MISMATCH loss {r.loss_rel_err:.1e} grad {r.grad_rel_err:.1e}")
        saved = "-" if r.saved_bytes is None else _mb(r.saved_bytes)
        # The first step's largest gradient error vs eager, relative to each gradient's scale
        # (issue 14's bar for the models: 1e-4; `check` fails past GRAD_RTOL).
        grad = "-" if r.contender == "eager" or r.grad_rel_err != r.grad_rel_err else f"{r.grad_rel_err:.1e}"
        table.add_row(
            r.workload, r.contender, f"{r.step_ms:.2f}", f"{r.step_ms_q3 - r.step_ms_q1:.2f}", speed, vs_inductor,
            _mb(r.peak_bytes), _mb(r.retained_bytes), saved,
            _mb(r.state_bytes), grad, check,
        )  # fmt: skip
    console.print(table)


def main(args: argparse.Namespace) -> int:
    """`vfuse bench --train`: 0 when every contender matched eager, 1 otherwise, 2 on bad usage."""
    args.steps = args.reps if args.reps is not None else (3 if args.quick else 10)
    args.warmup_steps = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    console = Console(width=None if sys.stdout.isatty() else 150)
    if args.list:
        for name, (description, _) in WORKLOADS.items():
            console.print(f"workload   {name:<18} {description}", markup=False, soft_wrap=True)
        console.print("models     --models [names]: " + ", ".join(model_registry.MODELS), markup=False)
        return 0
    threads_before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        results = run(args, console)
    except ValueError as e:
        print(f"vfuse bench: {e}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads_before)
    print_results(console, results)
    ok = all(r.ok for r in results)
    if args.json:
        config = {"train": True, "interleaved": True, "quick": args.quick, "threads": args.threads, "steps": args.steps}
        config |= {"warmup_steps": args.warmup_steps, "lr": LR, "loss_rtol": LOSS_RTOL, "grad_rtol": GRAD_RTOL}
        doc = {"schema": "vfuse-bench-train/1", "config": config, "ok": ok, "results": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        console.print(f"wrote {args.json}")
    return 0 if ok else 1
