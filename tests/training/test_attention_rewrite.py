"""Written-out attention in training graphs becomes SDPA before AOTAutograd (entry/attention_rewrite.py),
so the backward runs vfuse's flash templates (SDPA_LSE / SDPA_BACKWARD) and keeps no N x N tensor.
Gradients match eager within 1e-4 relative; what an SDPA cannot compute exactly is left written out."""

from __future__ import annotations

import math

import pytest
import torch
from tests.models.train_zoo import check_training_step, fix_typical_target
from tests.training.attention_checks import check_attention_grads
from tests.training.test_attention_backward import _attention_steps

import vfuse
from vfuse.bench.workloads_compute import Gpt2Block
from vfuse.ir import Op
from vfuse.schedule.kernel import ContractionKernel


@pytest.fixture(autouse=True)
def _fixed_target(monkeypatch: pytest.MonkeyPatch) -> None:
    fix_typical_target(monkeypatch)


def _causal_tril(q, k, v):
    """Causal through a tril of ones built in the graph: a compile-time constant -> is_causal."""
    n = q.shape[-2]
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _alibi(q, k, v):
    """An additive ALiBi-style bias built in the graph (a constant), scaled after it is added: SDPA
    gets bias * 0.3. Run-time additive masks are left written out (see NEGATIVE)."""
    n = q.shape[-2]
    pos = torch.arange(n, dtype=torch.float32)
    bias = -(pos[:, None] - pos[None, :]).abs() * 0.5
    return torch.softmax((torch.matmul(q, k.transpose(2, 3)) + bias) * 0.3, -1) @ v


def _bool_input(keep):
    def fn(q, k, v):  # a run-time boolean mask (a buffer, an input): SDPA's boolean attn_mask
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        return torch.nn.functional.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v

    return fn


def _hf_finfo_where(q, k, v):
    """HF GPT-2's eager form: / torch.full([], sqrt(d)), where(causal, s, finfo.min), fp32 cast, p=0 dropout."""
    n = q.shape[-2]
    s = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], q.shape[-1] ** 0.5)
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n)
    s = torch.where(causal, s, torch.finfo(torch.float32).min)
    p = torch.nn.functional.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(torch.nn.functional.dropout(p, p=0.0, training=True), v)


def _additive_causal(q, k, v):
    """HF's eager masks: an additive 0 / finfo.min triu built in the graph -> is_causal (no row fully masked)."""
    n = q.shape[-2]
    mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
    return torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.5 + mask, dim=-1) @ v


def _tril_updated_in_place(q, k, v):
    """A constant mask updated in place is not evaluated (no longer causal): a boolean mask."""
    keep = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril()
    keep[3, 4] = True
    return torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~keep, float("-inf")), -1) @ v


def _bmm_3d(q, k, v):
    """Rank-3 bmm (batch x heads flattened): unsqueezed to 4-D for torch's flash path."""
    q, k, v = (t.flatten(0, 1) for t in (q, k, v))
    return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.25, -1), v)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _inputs(b: int, h: int, n: int, d: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g).requires_grad_() for _ in range(3)]


def _native_flash(backend) -> bool:
    steps = _attention_steps(backend)
    kinds = [type(s) for s in steps[Op.SDPA_LSE] + steps[Op.SDPA_BACKWARD]]
    return kinds == [ContractionKernel] * 2 and not any("attention" in op for op in backend.stats["fallbacks"])


CASES = [
    ("causal-tril-L1", _causal_tril, (1, 2, 1, 8), True, "none"),
    ("causal-tril-L7", _causal_tril, (1, 2, 7, 8), True, "none"),
    ("causal-tril-L65", _causal_tril, (1, 3, 65, 16), True, "none"),
    ("additive-alibi-scale-L7", _alibi, (1, 2, 7, 8), False, "additive"),
    ("hf-finfo-where-L65", _hf_finfo_where, (2, 2, 65, 8), True, "none"),
    ("bmm-3d-L7", _bmm_3d, (2, 2, 7, 8), False, "none"),
    ("additive-finfo-causal-L7", _additive_causal, (1, 2, 7, 8), True, "none"),
    ("tril-updated-in-place", _tril_updated_in_place, (1, 2, 7, 8), False, "bool"),
]


@pytest.mark.parametrize(("fn", "shape", "causal", "mask"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_written_out_attention_trains_with_flash_kernels(fn, shape, causal, mask) -> None:
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    check_attention_grads(fn, _inputs(*shape), backend)
    (decision,) = backend.attention
    assert decision.rewritten and (decision.causal, decision.mask) == (causal, mask), decision.text()
    assert decision.flash_s < decision.written_s
    assert _native_flash(backend), (_attention_steps(backend), backend.stats)


def test_run_time_bool_mask_is_sdpa_attn_mask() -> None:
    """A mask read from an input is not a constant: SDPA's boolean mask, not is_causal."""
    torch._dynamo.reset()
    keep = torch.rand(1, 1, 9, 9, generator=torch.Generator().manual_seed(2)) > 0.5
    keep[..., 0] = True  # eager gives NaN for a row that keeps no key
    backend = vfuse.backend(strict=True)
    check_attention_grads(_bool_input(keep), _inputs(1, 2, 9, 8), backend)
    (decision,) = backend.attention
    assert decision.rewritten and (decision.causal, decision.mask) == (False, "bool")
    assert _native_flash(backend)


def test_gpt2_block_parameter_gradients() -> None:
    """The bench's GPT-2 block (causal through a sliced tril buffer): every parameter's gradient over
    two steps within 1e-4 relative of eager, attention forward and backward in the flash templates."""
    torch._dynamo.reset()
    block = Gpt2Block(torch.Generator().manual_seed(0), 32, 2, max_t=9)
    backend = vfuse.backend(strict=True)
    check_training_step(block, [torch.randn(1, 7, 32)], 1e-4, backend)
    assert [(d.rewritten, d.causal) for d in backend.attention] == [(True, True)], backend.attention
    assert _native_flash(backend)


def _memory(n: int) -> tuple[int, int]:
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    q, k, v = _inputs(1, 2, n, 16)
    torch.compile(_causal_tril, backend=backend)(q, k, v).sum().backward()
    assert backend.attention[0].rewritten and _native_flash(backend)
    (bwd,) = (c for c in backend.compiled if any(n.op is Op.SDPA_BACKWARD for n in c.plan.graph.nodes))
    return backend.stats["saved_bytes"], bwd.executor.program.memory.size


def test_memory_is_linear_in_sequence_length() -> None:
    """Saved tensors (q, k, v, out, logsumexp) and the backward's arena grow 4x from N=128 to N=512,
    not 16x: no N x N tensor is kept or made (one 512 x 512 fp32 matrix is 1 MiB)."""
    (saved_s, arena_s), (saved_l, arena_l) = _memory(128), _memory(512)
    assert 3.9 * saved_s <= saved_l <= 4.1 * saved_s, (saved_s, saved_l)
    assert arena_l <= 4.1 * arena_s and arena_l < 512 * 512 * 4, (arena_s, arena_l)


def _returns_probs(q, k, v):
    p = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return p @ v, p


def _two_dropouts(q, k, v):  # one dropout on P becomes vfuse's attention_dropout (test_attention_dropout.py)
    drop = torch.nn.functional.dropout
    return drop(drop(torch.softmax(q @ k.transpose(-2, -1), -1), p=0.2, training=True), p=0.1, training=True) @ v


def _finfo_run_time(keep):
    def fn(q, k, v):
        s = (q @ k.transpose(-2, -1)).masked_fill(~keep, torch.finfo(torch.float32).min)
        return torch.softmax(s, -1) @ v

    return fn


def _finfo_full_row(q, k, v):
    n = q.shape[-2]  # row 2 keeps no key: uniform in eager, 0 in SDPA
    keep = torch.ones(n, n, dtype=torch.bool).tril() & (torch.arange(n) != 2)[:, None]
    return torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~keep, torch.finfo(torch.float32).min), -1) @ v


def _additive_run_time(q, k, v):  # the mask is a data input (a closure): not known at compile time
    return torch.softmax(q @ k.transpose(-2, -1) + _RUN_TIME_MASK, -1) @ v


_RUN_TIME_MASK = torch.randn(7, 7, generator=_gen(6))


def _additive_full_row(q, k, v):
    n = q.shape[-2]  # row 2 masked to finfo.min throughout: the flash backward's lse rounding differs
    mask = torch.zeros(n, n).index_fill(0, torch.tensor([2]), torch.finfo(torch.float32).min)
    return torch.softmax(q @ k.transpose(-2, -1) + mask, -1) @ v


NEGATIVE = [
    ("probabilities-returned", _returns_probs, "used outside the attention"),
    ("two-dropouts", _two_dropouts, "attention dropout"),
    (
        "finfo-min-run-time-mask",
        _finfo_run_time(torch.rand(7, 7, generator=_gen(4)) > 0.3),
        "run-time mask",
    ),
    ("finfo-min-fully-masked-row", _finfo_full_row, "fully masked row"),
    ("additive-fully-masked-row", _additive_full_row, "fully masked row"),
    ("additive-run-time", _additive_run_time, "run-time additive mask"),
]


@pytest.mark.parametrize(("fn", "why"), [c[1:] for c in NEGATIVE], ids=[c[0] for c in NEGATIVE])
def test_not_exactly_sdpa_is_left_written_out(fn, why: str) -> None:
    torch._dynamo.reset()
    backend = vfuse.backend()
    inputs = _inputs(1, 2, 7, 8)
    torch.manual_seed(0)
    got = torch.compile(fn, backend=backend)(*inputs)
    (decision,) = backend.attention
    assert not decision.rewritten and why in decision.reason, decision.text()
    assert not any(_attention_steps(backend).values())
    if fn is not _two_dropouts:  # the others compute eager's values (finfo.min rows uniform)
        want = fn(*inputs)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_inference_graphs_are_left_to_the_ir_pass() -> None:
    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    with torch.no_grad():
        torch.compile(_causal_tril, backend=backend)(*(t.detach() for t in _inputs(1, 2, 7, 8)))
    assert backend.attention == []


class _BufferCausal(torch.nn.Module):
    """Causal through a tril buffer sliced to T (HF GPT-2's eager attention): the buffer is a graph input."""

    def __init__(self, max_t: int, finfo: bool) -> None:
        super().__init__()
        self.register_buffer("causal", torch.ones(max_t, max_t, dtype=torch.bool).tril().view(1, 1, max_t, max_t))
        self.finfo = finfo

    def forward(self, q, k, v):
        t = q.shape[-2]
        s = q @ k.transpose(-2, -1)
        if self.finfo:  # older HF GPT-2: where(bias[..], s, finfo.min), exact as no row is fully masked
            s = torch.where(self.causal[:, :, :t, :t], s.to(s.dtype), torch.finfo(s.dtype).min)
        else:
            s = s.masked_fill(~self.causal[:, :, :t, :t], float("-inf"))
        return torch.softmax(s, -1).type(v.dtype) @ v


@pytest.mark.parametrize("finfo", [False, True], ids=["masked_fill-inf", "where-finfo-min"])
def test_causal_buffer_is_guarded(finfo: bool) -> None:
    """A tril buffer is read at compile time: is_causal under a guard on its value. Updated in place
    (no longer causal) the graph runs eagerly with a warning: eager's values, not the causal ones."""
    torch._dynamo.reset()
    module = _BufferCausal(9, finfo)
    backend = vfuse.backend(strict=True)
    compiled = torch.compile(module, backend=backend)
    inputs = _inputs(1, 2, 7, 8)
    check_attention_grads(compiled, inputs, backend)
    (decision,) = backend.attention
    assert decision.rewritten and decision.causal and "guarded on l_self_buffers_causal_" in decision.reason
    assert _native_flash(backend)
    module.causal[..., 3, 5] = True
    with pytest.warns(UserWarning, match="no longer holds the causal mask"):
        got = compiled(*inputs)
    torch.testing.assert_close(got, module(*inputs), rtol=1e-5, atol=1e-6)
    module.causal[..., 3, 5] = False  # equal again: the rewritten graph (checked by value)
    check_attention_grads(compiled, inputs, backend)


class _HfGpt2(torch.nn.Module):
    """Hugging Face GPT-2 with its eager attention (one layer), a padding mask optional: its hidden state."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2Model

        sizes = {"vocab_size": 64, "n_positions": 16, "n_embd": 32, "n_layer": 1, "n_head": 2}
        no_dropout = {"attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}
        config = GPT2Config(**sizes, **no_dropout, bos_token_id=0, eos_token_id=0, attn_implementation="eager")
        self.model = GPT2Model(config)

    def forward(self, ids, padding=None):
        return self.model(ids, attention_mask=padding).last_hidden_state


@pytest.mark.parametrize("padded", [False, True], ids=["causal", "padding-mask"])
def test_hf_gpt2_eager_attention(padded: bool) -> None:
    """HF's eager attention: its causal mask (additive finfo.min, built in the graph) becomes is_causal.
    With a left-padding mask input the combined mask reads data, and its padded query rows are fully
    masked with finfo.min (uniform in eager, its gradient flowing): left written out. Gradients of every
    parameter within 1e-4 relative of eager either way."""
    pytest.importorskip("transformers")
    torch._dynamo.reset()
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 11))
    padding = torch.ones(2, 11, dtype=torch.long)
    padding[1, :3] = 0  # left padding: every row still keeps a key
    backend = vfuse.backend(strict=True)
    check_training_step(_HfGpt2().train(), [ids, padding] if padded else [ids], 1e-4, backend)
    (decision,) = backend.attention
    if padded:
        assert not decision.rewritten and "run-time additive mask" in decision.reason, decision.text()
    else:
        assert decision.rewritten and decision.causal and _native_flash(backend), decision.text()


def test_one_attention_feeding_the_next() -> None:
    """The first attention's output is the second's q and k: both rewritten, the second reading the first's SDPA."""

    def attend(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.3, -1) @ v

    def two(q, k, v):
        o = attend(q, k, v)
        return attend(o, o, v)

    torch._dynamo.reset()
    backend = vfuse.backend(strict=True)
    check_attention_grads(two, _inputs(1, 2, 7, 8), backend)
    assert [d.rewritten for d in backend.attention] == [True, True], backend.attention
