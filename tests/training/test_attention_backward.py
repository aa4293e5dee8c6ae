"""Attention in training without torch fallbacks: AOTAutograd's CPU flash attention forward (whose
logsumexp the backward reads) and its backward compile to vfuse's flash-attention templates
(SDPA_LSE, SDPA_BACKWARD: ir/defs/attention_grad.py). Gradients of q, k, v match eager within 1e-4
relative (causal or not, odd lengths, head sizes 8 and 64, grouped-query attention, Lq != Lk, masks),
and the backward's memory beyond its inputs and outputs grows linearly with the sequence length."""

from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F
from tests.models.train_zoo import check_training_step
from tests.models.zoo import SdpaBlock
from tests.training.attention_checks import check_attention_grads
from torch._functorch.aot_autograd import aot_module_simplified

import vfuse
from vfuse.codegen.cpp.attention import AttentionSpec, render_flash_attention_backward
from vfuse.codegen.cpp.attention.kernel import default_cache_dir
from vfuse.codegen.cpp.toolchain import find_toolchain, load_library
from vfuse.compiler import plan, schedule, target_of
from vfuse.context import Context, Options
from vfuse.frontend.lower import lower
from vfuse.ir import Op
from vfuse.schedule.kernel import ContractionKernel, TorchStep

# (id, (B, H, HKV, LQ, LK, D), causal, how K/V heads are shared: None, "gqa" (enable_gqa), "repeat")
CASES = [
    ("causal-L1-d8", (1, 2, 2, 1, 1, 8), True, None),
    ("full-L7-d8-B2", (2, 3, 3, 7, 7, 8), False, None),
    ("causal-L65-d64", (1, 2, 2, 65, 65, 64), True, None),
    ("full-L131-d64", (1, 1, 1, 131, 131, 64), False, None),
    ("causal-gqa-L131-d8", (1, 4, 2, 131, 131, 8), True, "gqa"),
    ("full-repeat-kv-L65-d64-B2", (2, 4, 1, 65, 65, 64), False, "repeat"),
    ("causal-Lq7-Lk65-d8", (1, 2, 2, 7, 65, 8), True, None),
    ("full-Lq131-Lk7-d64", (1, 2, 2, 131, 7, 64), False, None),
    ("causal-L33-d20", (2, 2, 2, 33, 33, 20), True, None),  # a head size of partial vectors
]


def _attention(causal: bool, share: str | None, mask: torch.Tensor | None = None):
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if share == "repeat":
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=share == "gqa")

    return fn


def _inputs(shape: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    b, h, hkv, lq, lk, d = shape
    g = torch.Generator().manual_seed(seed)
    sizes = [(b, h, lq, d), (b, hkv, lk, d), (b, hkv, lk, d)]
    return [torch.randn(s, generator=g).requires_grad_() for s in sizes]


def _attention_steps(backend) -> dict[Op, list]:
    """Per training attention op, the steps of the compiled programs that run it."""
    found: dict[Op, list] = {Op.SDPA_LSE: [], Op.SDPA_BACKWARD: []}
    for compiled in backend.compiled:
        graph, program = compiled.plan.graph, compiled.executor.program
        for step in program.steps:
            if isinstance(step, TorchStep):
                found.update({graph[n].op: [*found[graph[n].op], step] for n in step.nodes if graph[n].op in found})
            else:
                for k in step.kernels:
                    if isinstance(k, ContractionKernel) and k.op in found:
                        found[k.op].append(k)
    return found


@pytest.mark.parametrize(("shape", "causal", "share"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_attention_gradients_match_eager_without_fallback(shape, causal, share) -> None:
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    check_attention_grads(_attention(causal, share), _inputs(shape), backend)
    assert backend.stats["graphs"] == 2 and not backend.stats["fallbacks"], backend.stats
    # Structure: one template kernel each for the forward (with its logsumexp) and the backward.
    steps = _attention_steps(backend)
    assert [type(s) for s in steps[Op.SDPA_LSE]] == [ContractionKernel], steps
    assert [type(s) for s in steps[Op.SDPA_BACKWARD]] == [ContractionKernel], steps


@pytest.mark.parametrize("kind", ["additive", "bool"])
def test_masked_attention_gradients(kind: str) -> None:
    """A float mask is added to the scores; a bool mask reaches the kernels as torch's -inf additive mask."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(3)
    lq, lk = 67, 67
    if kind == "additive":
        mask = torch.randn(lq, lk, generator=g)
    else:
        mask = torch.rand(1, 1, lq, lk, generator=g) > 0.4
        mask[..., 0] = True  # every row keeps a key (eager gives NaN rows otherwise)
    backend = vfuse.backend(strict=True)
    check_attention_grads(_attention(False, None, mask), _inputs((2, 2, 2, lq, lk, 8)), backend)
    assert not backend.stats["fallbacks"], backend.stats
    assert [type(s) for s in _attention_steps(backend)[Op.SDPA_BACKWARD]] == [ContractionKernel]


def test_a_row_that_keeps_no_key_has_zero_output_and_gradients() -> None:
    """As eager's CPU flash kernel: the row's output and its q gradient are 0 (its logsumexp is -inf in
    vfuse, 0 in torch; the backward takes P = 0 for either), other rows unaffected."""
    torch._dynamo.reset()
    mask = torch.ones(9, 9, dtype=torch.bool)
    mask[4] = False
    backend = vfuse.backend(strict=True)
    inputs = _inputs((1, 2, 2, 9, 9, 8))
    check_attention_grads(_attention(False, None, mask), inputs, backend)
    out = torch.compile(_attention(False, None, mask), backend=backend)(*inputs)
    (dq,) = torch.autograd.grad(out, inputs[:1], torch.ones_like(out))
    assert not out[:, :, 4].any() and not dq[:, :, 4].any()


def test_llama_style_block_trains_with_native_attention() -> None:
    """RMSNorm, q/k/v from Linears viewed as heads (permutes), causal GQA SDPA, SiLU-gated MLP: two
    training steps match eager (outputs and every parameter's gradient within 1e-4 relative), and both
    attention kernels run natively."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    backend = vfuse.backend(strict=True)
    check_training_step(SdpaBlock(), [torch.randn(2, 37, 64)], 1e-4, backend)
    assert not backend.stats["fallbacks"], backend.stats
    steps = _attention_steps(backend)
    assert [type(s) for s in steps[Op.SDPA_LSE] + steps[Op.SDPA_BACKWARD]] == [ContractionKernel] * 2, steps


def test_attention_dropout_takes_the_flash_templates() -> None:
    """torch's CPU flash kernel has no dropout; vfuse's rewrite (entry/attention_rewrite.py) gives it
    to the templates, which draw the mask from a saved seed (tests/training/test_attention_dropout.py)."""
    torch._dynamo.reset()
    backend = vfuse.backend()
    q, k, v = _inputs((1, 2, 2, 9, 9, 8))
    fn = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.3), backend=backend)
    fn(q, k, v).sum().backward()
    steps = _attention_steps(backend)
    kernels = steps[Op.SDPA_LSE] + steps[Op.SDPA_BACKWARD]
    assert [type(s) for s in kernels] == [ContractionKernel] * 2, steps
    assert all(s.attrs["dropout"] == 0.3 for s in kernels)
    assert not backend.stats["fallbacks"], backend.stats  # the seed's draw is an RNG_SEED


def test_bf16_training_attention_runs_visibly_in_torch() -> None:
    """The templates are fp32: bf16 attention and its backward are counted torch fallbacks, eager's numbers."""
    torch._dynamo.reset()
    backend = vfuse.backend()
    q, k, v = (t.detach().bfloat16().requires_grad_() for t in _inputs((1, 2, 2, 9, 9, 8)))
    fn = _attention(True, None)
    out = torch.compile(fn, backend=backend)(q, k, v)
    got = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    want = torch.autograd.grad(fn(q, k, v), (q, k, v), torch.ones_like(out))
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    flash = "aten._scaled_dot_product_flash_attention_for_cpu"
    assert backend.stats["fallbacks"] == {f"{flash}.default": 1, f"{flash}_backward.default": 1}, backend.stats


def _backward_program(n: int):
    """The scheduled program of the attention backward graph at sequence length n (B1 H2 D64)."""
    captured: list = []

    def grab(gm, example_inputs):
        def keep(g, _):
            captured.append(g)
            return g

        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

    torch._dynamo.reset()
    q, k, v = _inputs((1, 2, 2, n, n, 64))
    torch.compile(_attention(True, None), backend=grab)(q, k, v).sum().backward()
    ctx = Context(Options())
    graph = lower(captured[1], ctx)
    return schedule(plan(graph, ctx, target_of(ctx)), target_of(ctx), ctx)


def test_backward_memory_is_linear_in_sequence_length() -> None:
    """The arena (every intermediate of the backward) grows 4x from N=256 to N=1024, not 16x: no
    N x N score matrix; the template's own per-thread tiles do not depend on N."""
    small, large = _backward_program(256), _backward_program(1024)
    (k_small,), (k_large,) = ([k for k in p.kernels if isinstance(k, ContractionKernel)] for p in (small, large))
    assert k_small.op is Op.SDPA_BACKWARD and k_small.blocks == k_large.blocks
    arena_small, arena_large = small.memory.size, large.memory.size
    assert 3.9 * arena_small <= arena_large <= 4.1 * arena_small, (arena_small, arena_large)
    assert arena_large < 1024 * 1024 * 4  # less than one fp32 1024 x 1024 score matrix of one head
    spec = AttentionSpec("vf_bwd_ws", 64, 64, causal=True, block_q=k_large.blocks[0], block_k=k_large.blocks[1])
    lib = load_library(render_flash_attention_backward(spec), default_cache_dir(), find_toolchain())
    fn = lib.vf_bwd_ws_workspace_bytes
    fn.restype = ctypes.c_int64
    assert fn() == spec.backward_workspace_bytes() < 256 << 10


def test_triton_backend_runs_training_attention_in_torch() -> None:
    """backend="triton" has no template for SDPA_LSE / SDPA_BACKWARD (schedule.contraction.TRITON_IN_TORCH):
    each is a torch step there, the rest of the graph Triton kernels (its interpreter on CPU tensors)."""
    pytest.importorskip("triton", reason="triton is not installed (pip install 'vfuse[gpu]')")
    torch._dynamo.reset()
    backend = vfuse.backend(backend="triton", target="h100")
    check_attention_grads(_attention(True, None), _inputs((1, 2, 2, 5, 5, 8)), backend)
    steps = _attention_steps(backend)
    assert [type(s) for s in steps[Op.SDPA_LSE] + steps[Op.SDPA_BACKWARD]] == [TorchStep, TorchStep], steps
    assert all("no Triton template" in s.reason for s in steps[Op.SDPA_LSE] + steps[Op.SDPA_BACKWARD])


@pytest.mark.parametrize("threads", [1, 4])
def test_fewer_tasks_than_threads_split_the_key_tiles(threads: int) -> None:
    """One (batch, K/V head) task and 4 threads: the task's K tiles run as chunks, each with its own dQ
    part, summed at the end; the gradients are the same as with one thread, within rounding."""
    torch._dynamo.reset()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        backend = vfuse.backend(strict=True)
        check_attention_grads(_attention(True, "gqa"), _inputs((1, 3, 1, 200, 200, 8)), backend)
    finally:
        torch.set_num_threads(before)
    assert [type(s) for s in _attention_steps(backend)[Op.SDPA_BACKWARD]] == [ContractionKernel]


def test_dynamic_lengths_compile_once() -> None:
    """torch.compile(dynamic=True): batch, heads and lengths are the templates' run-time arguments, so one
    forward and one backward program serve every length (no per-shape recompile), gradients as eager's."""
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    fn = _attention(True, None)
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for n in (33, 70, 129):
        inputs = _inputs((1, 2, 2, n, n, 16), seed=n)
        check_attention_grads(fn, inputs, backend, compiled)
    assert backend.stats["graphs"] == 2 and not backend.stats["fallbacks"], backend.stats
    assert all(type(c.executor).__name__ == "SymbolicExecutor" for c in backend.compiled)
