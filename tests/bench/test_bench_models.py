"""`vfuse bench --models`: Hugging Face models built from configs, compiled by vfuse, against eager."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

import vfuse
from vfuse.bench import command, main, models


def _compiled(module: torch.nn.Module) -> tuple[Any, Any]:
    backend = vfuse.backend(strict=True, freeze=True)
    return torch.compile(module, backend=backend), backend


# The decoders' other shapes reuse the same build and first compile (two compiles of each decoder
# less; until session 18 a test of their own built and compiled the first shape again).
DECODERS = ("hf_gpt2", "hf_llama")


@pytest.mark.parametrize("name", list(models.MODELS))
def test_model_matches_eager(name: str) -> None:
    workload = models.MODELS[name]
    instance = workload.build(True)
    torch._dynamo.reset()
    with torch.no_grad():
        expected = instance.module(*instance.inputs)
        compiled, backend = _compiled(instance.module)
        got = compiled(*instance.inputs)
        again = compiled(*instance.inputs)  # steady call: reused arena and output pool
    assert backend.stats["graphs"] >= 1 and backend.stats["eager_graphs"] == 0
    # No op of these models runs through torch (BERT's gather and ResNet's max pool used to).
    assert not backend.stats["fallbacks"], backend.stats["fallbacks"]
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=workload.rtol, atol=workload.atol)
    torch.testing.assert_close(again, expected, rtol=workload.rtol, atol=workload.atol)
    if name in DECODERS:
        _decoder_other_shapes(instance.module, compiled)


def _decoder_other_shapes(module: torch.nn.Module, compiled: Any) -> None:
    # A prime sequence length and batch 3 after the first shape: a recompile (Dynamo may make
    # the sizes symbolic) must still match eager, causal mask and RoPE included.
    tokens = torch.randint(0, models.VOCAB, (3, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for x in (tokens, tokens[:1, :1]):
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-3, atol=1e-4)


def test_builds_are_deterministic_and_leave_the_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    first, second = models.build_llama(True), models.build_llama(True)
    assert torch.equal(torch.random.get_rng_state(), state)
    with torch.no_grad():
        assert torch.equal(first.module(*first.inputs), second.module(*second.inputs))
    config = first.module.model.config
    assert config.num_key_value_heads < config.num_attention_heads  # grouped-query attention


def test_models_flag_selects_models(tmp_path: Path) -> None:
    args = command.build_parser().parse_args(["--models"])
    assert [w.name for w in command._selected(args)] == list(models.MODELS)
    args = command.build_parser().parse_args(["--workloads", "chain", "--models", "hf_bert,hf_vit"])
    assert [w.name for w in command._selected(args)] == ["chain", "hf_bert", "hf_vit"]
    assert main(["--models", "hf_nope"]) == 2
    assert models.lookup("hf_resnet").frozen and models.lookup("chain").name == "chain"
    out = tmp_path / "bench.json"
    fast = ["--quick", "--threads", "1", "--reps", "2", "--warmup", "1", "--min-sample-ms", "0.2"]
    code = main([*fast, "--models", "hf_resnet", "--contenders", "eager,vfuse", "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == 0 and report["ok"] and report["config"]["workloads"] == ["hf_resnet"]
    (workload,) = report["runs"][0]["workloads"]
    vf = next(c for c in workload["contenders"] if c["name"] == "vfuse")
    assert vf["status"] == "ok" and vf["backend_stats"]["kernels"] > 0


def test_compile_time_probe_takes_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    from vfuse.bench import compile_times

    assert compile_times.main(["vfuse", "hf_resnet", "--quick", "--threads", "1"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 < figures["backend_s"] < figures["first_call_s"] and figures["steady_call_s"] > 0
