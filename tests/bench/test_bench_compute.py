"""The compute-bound workloads and what they need from the harness: per-workload tolerances
and frozen weights (vfuse freeze=True, Inductor freezing scoped to its own compile)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F

import vfuse
from vfuse.bench import contenders, workloads, workloads_compute
from vfuse.bench.checks import FLOAT_RTOL, compare
from vfuse.bench.runner import _prepare

COMPUTE = (
    "linear_gelu",
    "linear_gelu_smallk",
    "qlinear",
    "conv_bn_relu",
    "attention",
    "causal_attention",
    "gpt2_block",
)
UNFROZEN = ("attention",)  # no weights; causal_attention's tril buffer is frozen into a constant mask


def test_compute_workloads_are_registered_with_loose_rtol_and_frozen_weights() -> None:
    for name in COMPUTE:
        w = workloads.WORKLOADS[name]
        assert w.rtol == 1e-4 and w.atol == workloads.FLOAT_ATOL
        # Freezing means something only where there are weights: attention has none.
        assert w.frozen is (name not in UNFROZEN)
    assert workloads.WORKLOADS["ln_gelu"].rtol == FLOAT_RTOL and not workloads.WORKLOADS["ln_gelu"].frozen


def test_compare_uses_the_given_relative_tolerance() -> None:
    x = torch.linspace(1, 2, 100)
    assert not compare(x, x * (1 + 5e-5)).ok
    loose = compare(x, x * (1 + 5e-5), rtol=1e-4)
    assert loose.ok and "rtol 0.0001" in loose.detail


def test_quick_shapes_and_full_shapes_follow_the_issue() -> None:
    # Full sizes through the factories' arguments, without allocating the full inputs.
    _, (x,) = workloads_compute.build_linear_gelu_smallk(True)
    assert x.shape[1] == 64
    block, (h,) = workloads_compute.build_gpt2_block(True)
    assert isinstance(block, workloads_compute.Gpt2Block) and block.heads == 12 and h.shape[-1] == 768
    conv, _ = workloads_compute.build_conv_bn_relu(True)
    assert not conv.training and not torch.equal(conv.bn.running_var, torch.ones(64))


def test_gpt2_block_attention_is_causal() -> None:
    # Changing a later token must not change an earlier position's output.
    block, (x,) = workloads_compute.build_gpt2_block(True)
    y = x.clone()
    y[:, -1] += 1.0
    with torch.no_grad():
        a, b = block(x), block(y)
    torch.testing.assert_close(a[:, :-1], b[:, :-1], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_attention_workload_matches_sdpa() -> None:
    module, (q, k, v) = workloads_compute.build_attention(True)
    torch.testing.assert_close(module(q, k, v), F.scaled_dot_product_attention(q, k, v), rtol=1e-4, atol=1e-5)


def test_causal_attention_workload_matches_sdpa_and_is_one_native_kernel() -> None:
    module, (q, k, v) = workloads_compute.build_causal_attention(True)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(module(q, k, v), want, rtol=1e-4, atol=1e-5)
    compiled = vfuse.compile(module, (q, k, v), freeze=True)
    torch.testing.assert_close(compiled(q, k, v), want, rtol=1e-4, atol=1e-5)
    assert compiled.stats.kernels == 1 and compiled.stats.torch_calls == 0


@pytest.mark.parametrize("allow_fallback", [False, True])
def test_vfuse_freezes_only_frozen_workloads(monkeypatch: pytest.MonkeyPatch, allow_fallback: bool) -> None:
    seen: list[dict[str, Any]] = []
    real = vfuse.backend
    monkeypatch.setattr(vfuse, "backend", lambda **kw: seen.append(kw) or real(**kw))
    (chosen,) = [c for c in contenders.select(["vfuse"], allow_fallback) if c.name == "vfuse"]
    module = torch.nn.Linear(4, 4)
    chosen.prepare_for(False)(module)
    chosen.prepare_for(True)(module)
    strict = None if allow_fallback else True
    assert seen == [{"strict": strict, "freeze": False}, {"strict": strict, "freeze": True}]


def test_eager_ignores_frozen() -> None:
    eager = contenders.CONTENDERS["eager"]
    assert eager.prepare_for(True) is eager.prepare


def test_inductor_freezing_applies_to_its_compile_and_does_not_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._inductor.freezing as freezing

    calls: list[int] = []
    real_freeze = freezing.freeze

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real_freeze(*args, **kwargs)

    monkeypatch.setattr(freezing, "freeze", spy)
    assert inductor_config.freezing is False
    torch._dynamo.reset()
    frozen_wl = workloads.WORKLOADS["linear_gelu_smallk"]
    instance = frozen_wl.build(True)
    with torch.no_grad():
        expected = instance.module(*instance.inputs)
        prep = _prepare(contenders.CONTENDERS["inductor"], frozen_wl, instance, expected)
    assert prep.error is None and prep.check is not None and prep.check.ok, prep.error or prep.check
    assert calls, "Inductor compiled without freezing"
    assert inductor_config.freezing is False, "freezing leaked into the global Inductor config"
    torch._dynamo.reset()
