"""CUDA Graphs for compiled graphs on CUDA tensors: warm up, capture once per input-shape key, replay.

`GraphRunner` holds the policy; every CUDA call it needs (a private memory pool, capture,
synchronize) goes through a `GraphDriver`, so the policy is tested on CPU with a fake driver
(tests/triton/test_cudagraphs.py) and runs on a GPU with `CudaDriver` (torch.cuda.CUDAGraph).

Per call, for an input-shape key:
- first call: warm-up, uncaptured (Triton compiles its kernels, cuBLAS makes its handles:
  neither may happen during a capture);
- second call: capture. Inputs that are parameters (`torch.nn.Parameter`), and inputs found at
  the warm-up's address (a buffer the caller reuses: *held*), are captured at their own address;
  every other input gets a static buffer it is copied into. Outputs are static
  buffers too. Host-side work (drawing the RNG seeds) is not captured: the seeds live in a device
  tensor that the host writes before each replay, so dropout differs per call as in eager;
- later calls: copy inputs into their buffers, write the seeds, replay. A parameter found at
  another address (the user replaced it) recaptures the key; so does a held input, which is
  copied from then on.
Outputs: with `static_outputs=False` each call returns copies of the static output buffers
(fresh tensors the next call never overwrites, as on the CPU); with `static_outputs=True` the
buffers themselves (the next call overwrites them, as on the CPU).
A program that cannot be captured (a torch fallback, a fault record read after each segment:
both may synchronize or run host code) runs uncaptured; `blocker` says why.

Capturing is not free: each replay copies the inputs that are not parameters into their static
buffers and (without `static_outputs`) clones the outputs, each a launch of its own and a pass
over the bytes. `ReplayCost` weighs that against the launches a replay saves, from the cost
model's figures (the target's launch time and bandwidth, the plan's predicted device time): a
one-kernel program, or one whose inputs are large next to its launch savings, runs uncaptured
(measured on an H200: a 128 MiB elementwise graph ran 103 us launched, 299 us replayed with its
copies); the reason is in `GraphStats.declined`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from vfuse.ir import Graph, Kind, Op
from vfuse.schedule import Program, TorchStep

# Ops a torch step may run inside a capture: device-only work with no host synchronization
# (cuBLAS / cuDNN contractions after their warm-up, views and layout copies).
CAPTURABLE_KINDS = (Kind.CONTRACTION, Kind.REDUCE, Kind.INJECTIVE, Kind.BROADCAST, Kind.ELEMENTWISE)
# Torch steps that would bake a host value into the graph (the seed is an int drawn on the host;
# sources such as iota and full are made on the host by the reference executor).
HOST_VALUE_OPS = (Op.RNG_SEED, Op.RAND)


@dataclass(frozen=True)
class ReplayCost:
    """The figures that decide whether replaying a captured graph beats launching it: one call's
    launches (kernels and torch steps) and predicted device time, the host time of one launch,
    and the device's bandwidth (a copy reads and writes each byte)."""

    launches: int
    device_s: float
    launch_s: float
    bandwidth: float

    def verdict(self, copied_bytes: int, copies: int, cloned_bytes: int, clones: int) -> str:
        """'' when a replay (its copies, clones and one graph launch) is predicted faster than
        the launches it replaces; else why not, with both figures."""
        plain = max(self.launches * self.launch_s, self.device_s)
        moved = 2 * (copied_bytes + cloned_bytes) / self.bandwidth
        replay = max((copies + clones + 1) * self.launch_s, self.device_s + moved)
        if replay < plain:
            return ""
        return (
            f"a replay would copy {(copied_bytes + cloned_bytes) / 2**20:.2f} MiB in {copies + clones} copies "
            f"(predicted {replay * 1e6:.1f} us) to replace {self.launches} launch(es) ({plain * 1e6:.1f} us)"
        )


class Replayable(Protocol):
    def replay(self) -> None: ...


class GraphDriver(Protocol):
    """The CUDA calls graph capture needs (torch.cuda in `CudaDriver`, a recorder in tests)."""

    def new_pool(self) -> Any: ...

    def capture(self, body: Callable[[], None], pool: Any) -> Replayable: ...

    def synchronize(self) -> None: ...


class CudaDriver:
    """torch.cuda's graphs: capture on torch's side stream into a private memory pool."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def new_pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def capture(self, body: Callable[[], None], pool: Any) -> Replayable:
        graph = torch.cuda.CUDAGraph()
        self.synchronize()  # the warm-up's work must be done before capture starts
        with torch.cuda.device(self.device), torch.cuda.graph(graph, pool=pool):
            body()
        return graph

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


class _Rerun:
    def __init__(self, body: Callable[[], None]) -> None:
        self.body = body

    def replay(self) -> None:
        self.body()


class ReplayDriver:
    """A host stand-in for CUDA graphs: a replay reruns the captured work on the captured
    tensors. For CPU-only runs of the graph path (`vfuse bench --device cpu --smoke`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def new_pool(self) -> Any:
        return None

    def capture(self, body: Callable[[], None], pool: Any) -> Replayable:
        body()
        return _Rerun(body)

    def synchronize(self) -> None:
        pass


def capture_blocker(graph: Graph, program: Program, faults: int) -> str:
    """Why `program` cannot be captured into a CUDA graph ('' when it can)."""
    if faults:
        return "its kernels record faults (gathers, integer division) that the host reads after each segment"
    for step in program.steps:
        if not isinstance(step, TorchStep):
            continue
        for name in step.nodes:
            node = graph[name]
            if node.op in HOST_VALUE_OPS or node.kind not in CAPTURABLE_KINDS:
                what = node.attrs.get("call", node.op.value) if node.op is Op.OPAQUE else node.op.value
                return f"torch runs %{name} ({what}), which may synchronize or use host values"
    return ""


@dataclass
class GraphStats:
    """What the runner did; `blocker` is why calls run uncaptured ('' when they are captured)."""

    warmups: int = 0
    captures: int = 0
    replays: int = 0
    uncaptured: int = 0
    blocker: str = ""
    declined: str = ""  # the cost model's reason for the last input-shape key left uncaptured
    copies: int = 0  # inputs copied into static buffers at replays (held and parameter inputs are not)

    def describe(self) -> str:
        if self.blocker:
            return f"not captured: {self.blocker}"
        if self.declined and not self.captures:
            return f"not captured (cost model): {self.declined}"
        return (
            f"{self.captures} captured, {self.replays} replays ({self.copies} input copies), "
            f"{self.warmups} warm-up calls"
        )


@dataclass
class Captured:
    """One input-shape key's graph and its static memory."""

    graph: Replayable
    inputs: list[torch.Tensor]  # what the graph reads: static buffers, or the inputs themselves
    copied: tuple[int, ...]  # inputs copied into their static buffer each call
    # inputs read at their own address (parameters; tensors the caller passes again): index ->
    # the address captured; another address recaptures
    pinned: dict[int, int]
    outputs: list[torch.Tensor]
    held: tuple[int, ...] = ()  # `pinned`'s inputs and addresses, as the replay checks them
    addresses: list[int] = field(default_factory=list)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)  # the kernels' output buffers


class Body(Protocol):
    """The executor's work, split at what must stay outside a capture."""

    def seed(self) -> None:
        """Draw this call's RNG seeds on the host and write them into the device seed tensor."""

    def output_buffers(self) -> dict[str, torch.Tensor]:
        """A new buffer for each output the kernels write."""
        ...

    def launch(self, inputs: Sequence[torch.Tensor], outputs: dict[str, torch.Tensor] | None) -> list[torch.Tensor]:
        """Every kernel and torch step on `inputs`, writing into `outputs` (allocated when
        None); the graph's results."""
        ...


Key = tuple[tuple[tuple[int, ...], torch.dtype, tuple[int, ...]], ...]


@dataclass
class _Seen:
    """A warmed-up key: its outputs' count and bytes, and the addresses of its inputs then."""

    outputs: int
    out_bytes: int
    addresses: tuple[int, ...]


@dataclass
class GraphRunner:
    """Warm-up, capture and replay per input-shape key (module docstring). An input that is not a
    parameter but that the caller passes again at the same address (the warm-up's tensor at the
    capture call: a reused input buffer) is *held*: read at its own address like a parameter, so
    a replay copies nothing for it; once it comes at another address the key is captured again
    with that input copied, for good (the cost model asked again with the copy)."""

    body: Body
    driver: GraphDriver
    static_outputs: bool = False
    blocker: str = ""
    cost: ReplayCost | None = None  # None: capture every key (tests of the mechanics)
    stats: GraphStats = field(default_factory=GraphStats)
    _seen: dict[Key, _Seen] = field(default_factory=dict)
    _declined: set[Key] = field(default_factory=set)
    _graphs: dict[Key, Captured] = field(default_factory=dict)
    _moved: dict[Key, set[int]] = field(default_factory=dict)  # inputs no longer held (copied)
    _pool: Any = None

    def __post_init__(self) -> None:
        self.stats.blocker = self.blocker
        # A body without RNG seeds has nothing to draw per call (the executor says so).
        self._draws = bool(getattr(self.body, "draws_seeds", True))

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        key = tuple([(t.shape, t.dtype, t.stride()) for t in inputs])  # a list comprehension: ~1 us less
        cap = self._graphs.get(key)
        # The replay: as little host work as the graph allows (the bar is ~10 us per call).
        if (
            cap is not None
            and not self.blocker
            and (not cap.held or [inputs[i].data_ptr() for i in cap.held] == cap.addresses)
        ):
            for i in cap.copied:
                cap.inputs[i].copy_(inputs[i])
            self.stats.copies += len(cap.copied)
            if self._draws:
                self.body.seed()
            cap.graph.replay()
            self.stats.replays += 1
            if self.static_outputs:
                return list(cap.outputs)
            return [o.clone() if isinstance(o, torch.Tensor) else o for o in cap.outputs]
        return self._slow(key, inputs, cap)

    def _slow(self, key: Key, inputs: Sequence[torch.Tensor], cap: Captured | None) -> list[torch.Tensor]:
        """Everything but a replay: uncaptured calls, the warm-up, (re)captures."""
        if self.blocker:
            self.stats.uncaptured += 1
            return self._eager(inputs)
        seen = self._seen.get(key)
        if seen is None:  # warm-up: compile kernels and make library handles uncaptured
            self.stats.warmups += 1
            out = self._eager(inputs)
            addresses = tuple(t.data_ptr() for t in inputs)
            self._seen[key] = _Seen(len(out), sum(_nbytes(t) for t in out), addresses)
            return out
        if cap is not None:  # a pinned input moved: a held one is copied from now on
            moved = self._moved.setdefault(key, set())
            moved.update(i for i, p in cap.pinned.items() if inputs[i].data_ptr() != p and not _is_param(inputs[i]))
            del self._graphs[key]
        if key in self._declined or self._decline(key, inputs):
            self.stats.uncaptured += 1
            return self._eager(inputs)
        try:
            self._graphs[key] = self._capture(key, inputs, cap.buffers if cap is not None else None)
        except Exception as e:  # e.g. an op that cannot be captured: run uncaptured from now on
            self.blocker = self.stats.blocker = f"capture failed: {type(e).__name__}: {e}"
            self.stats.uncaptured += 1
            return self._eager(inputs)
        return self(inputs)

    def _held(self, key: Key, inputs: Sequence[torch.Tensor]) -> set[int]:
        """Inputs read at their own address: parameters, and tensors found at the warm-up's address."""
        seen, moved = self._seen[key], self._moved.get(key, set())
        return {
            i for i, t in enumerate(inputs) if _is_param(t) or (i not in moved and t.data_ptr() == seen.addresses[i])
        }

    def _decline(self, key: Key, inputs: Sequence[torch.Tensor]) -> bool:
        """Whether the cost model keeps `key` uncaptured (recorded with its reason)."""
        if self.cost is None:
            return False
        held = self._held(key, inputs)
        copied = [t for i, t in enumerate(inputs) if i not in held]
        seen = self._seen[key]
        clones, cloned = (0, 0) if self.static_outputs else (seen.outputs, seen.out_bytes)
        why = self.cost.verdict(sum(_nbytes(t) for t in copied), len(copied), cloned, clones)
        if why:
            self._declined.add(key)
            self.stats.declined = why
        return bool(why)

    def _eager(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        self.body.seed()
        return self.body.launch(inputs, None)

    def _capture(
        self, key: Key, inputs: Sequence[torch.Tensor], buffers: dict[str, torch.Tensor] | None = None
    ) -> Captured:
        """`key`'s graph on `inputs`; `buffers`: the output buffers of the graph it replaces
        (a recapture writes where the last one did: static outputs stay put)."""
        held = self._held(key, inputs)
        pinned = {i: inputs[i].data_ptr() for i in sorted(held)}
        static = [t if i in pinned else torch.empty_like(t) for i, t in enumerate(inputs)]
        copied = tuple(i for i in range(len(inputs)) if i not in pinned)
        for i in copied:
            static[i].copy_(inputs[i])
        outputs = buffers if buffers is not None else self.body.output_buffers()
        # Once more uncaptured on the static buffers (with the last call's seeds: one draw per
        # call, as uncaptured), so kernels specialized for their alignment compile now, not
        # during the capture.
        self.body.launch(static, outputs)
        if self._pool is None:
            self._pool = self.driver.new_pool()
        results: list[list[torch.Tensor]] = []
        graph = self.driver.capture(lambda: results.append(self.body.launch(static, outputs)), self._pool)
        self.stats.captures += 1
        return Captured(graph, static, copied, pinned, results[0], tuple(pinned), list(pinned.values()), outputs)


def _is_param(t: object) -> bool:
    return isinstance(t, torch.nn.Parameter)


def _nbytes(t: object) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
