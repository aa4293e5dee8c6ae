"""Real models for `vfuse bench --models`: Hugging Face `transformers` architectures built from
configs (random weights, nothing downloaded) at small sizes.

GPT-2-style decoder, LLaMA-style decoder (grouped-query attention, RoPE, SwiGLU, RMSNorm),
BERT-style encoder, ViT and a ResNet-style CNN; 2 layers, hidden 256, batch 2, sequence 128,
64x64 images. At these sizes per-call overhead, weights packed once, GEMMs of a few hundred
on a side and torch fallbacks on the hot path decide the result, not bandwidth.

Each model is wrapped so that it returns one tensor (the last hidden state, or the pooled
features of the CNN): `ModelOutput` dicts are not what the benchmark compares. Weights come
from `torch.manual_seed` (transformers initializes through torch's global RNG) with a fixed
seed, restored afterwards; inputs from a seeded generator. Needs the `bench` extra
(`pip install vfuse[bench]`); transformers is imported only when a model is built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor, nn

from vfuse.bench.workloads import Instance, Workload

_SEED = 0
LAYERS, HIDDEN, HEADS, BATCH, SEQ, IMAGE = 2, 256, 4, 2, 128, 64
VOCAB = 1024
# Quick (tests, CI): one layer, a short sequence, small images; the same architecture.
Q_LAYERS, Q_HIDDEN, Q_HEADS, Q_BATCH, Q_SEQ, Q_IMAGE = 1, 64, 2, 1, 16, 32
# Whole models sum many K-long dot products in series: fp32 reassociation grows with depth.
MODEL_RTOL, MODEL_ATOL = 1e-3, 1e-4


class HiddenState(nn.Module):
    """`model(x).last_hidden_state` (or `pooler_output`) as a plain tensor output."""

    def __init__(self, model: nn.Module, field: str = "last_hidden_state") -> None:
        super().__init__()
        self.model = model
        self.field = field

    def forward(self, x: Tensor) -> Tensor:
        return getattr(self.model(x), self.field)


def _sizes(quick: bool) -> tuple[int, int, int, int, int, int]:
    if quick:
        return Q_LAYERS, Q_HIDDEN, Q_HEADS, Q_BATCH, Q_SEQ, Q_IMAGE
    return LAYERS, HIDDEN, HEADS, BATCH, SEQ, IMAGE


def _seeded(make: Callable[[], nn.Module]) -> nn.Module:
    """Build under a fixed global seed (transformers' init draws from it), restoring the RNG."""
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(_SEED)
        return make().eval()
    finally:
        torch.random.set_rng_state(state)


def _tokens(batch: int, seq: int) -> tuple[Tensor, ...]:
    gen = torch.Generator().manual_seed(_SEED + 1)
    return (torch.randint(0, VOCAB, (batch, seq), generator=gen),)


def _images(batch: int, size: int) -> tuple[Tensor, ...]:
    gen = torch.Generator().manual_seed(_SEED + 1)
    return (torch.randn(batch, 3, size, size, generator=gen),)


def _common(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    # sdpa attention: what a user gets by default; eager attention is the other path worth a
    # workload of its own (gpt2_block). Dropout is off in eval mode either way.
    return {"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads}


def build_gpt2(quick: bool) -> Instance:
    from transformers import GPT2Config, GPT2Model

    layers, hidden, heads, batch, seq, _ = _sizes(quick)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=seq, n_embd=hidden, n_layer=layers, n_head=heads, bos_token_id=0,
        eos_token_id=0, attn_implementation="sdpa",
    )  # fmt: skip
    return Instance(_seeded(lambda: HiddenState(GPT2Model(config))), _tokens(batch, seq))


def build_llama(quick: bool) -> Instance:
    from transformers import LlamaConfig, LlamaModel

    layers, hidden, heads, batch, seq, _ = _sizes(quick)
    config = LlamaConfig(
        vocab_size=VOCAB,
        intermediate_size=hidden * 8 // 3 // 32 * 32,
        num_key_value_heads=heads // 2,
        max_position_embeddings=seq,
        attn_implementation="sdpa",
        **_common(layers, hidden, heads),
    )
    return Instance(_seeded(lambda: HiddenState(LlamaModel(config))), _tokens(batch, seq))


def build_bert(quick: bool) -> Instance:
    from transformers import BertConfig, BertModel

    layers, hidden, heads, batch, seq, _ = _sizes(quick)
    config = BertConfig(
        vocab_size=VOCAB,
        intermediate_size=4 * hidden,
        max_position_embeddings=seq,
        attn_implementation="sdpa",
        **_common(layers, hidden, heads),
    )
    return Instance(_seeded(lambda: HiddenState(BertModel(config, add_pooling_layer=False))), _tokens(batch, seq))


def build_vit(quick: bool) -> Instance:
    from transformers import ViTConfig, ViTModel

    layers, hidden, heads, batch, _, image = _sizes(quick)
    config = ViTConfig(
        image_size=image, patch_size=8, intermediate_size=4 * hidden, attn_implementation="sdpa",
        **_common(layers, hidden, heads),
    )  # fmt: skip
    return Instance(_seeded(lambda: HiddenState(ViTModel(config, add_pooling_layer=False))), _images(batch, image))


def build_resnet(quick: bool) -> Instance:
    from transformers import ResNetConfig, ResNetModel

    _, hidden, _, batch, _, image = _sizes(quick)
    # Two stages of basic blocks, widths up to `hidden`, one block each (2 layers' worth).
    config = ResNetConfig(
        embedding_size=hidden // 4,
        hidden_sizes=[hidden // 2, hidden],
        depths=[1, 1],
        layer_type="basic",
    )
    return Instance(_seeded(lambda: HiddenState(ResNetModel(config), "pooler_output")), _images(batch, image))


def _model(name: str, description: str, build: Callable[[bool], Instance]) -> Workload:
    # Frozen: deployed inference, weights are constants for both compilers (packed once).
    return Workload(name, description, build, rtol=MODEL_RTOL, atol=MODEL_ATOL, frozen=True)


_SIZE = f"{LAYERS} layers, hidden {HIDDEN}, batch {BATCH}"
MODELS: Mapping[str, Workload] = MappingProxyType(
    {
        w.name: w
        for w in (
            _model("hf_gpt2", f"HF GPT2Model, {_SIZE}, seq {SEQ}", build_gpt2),
            _model("hf_llama", f"HF LlamaModel (GQA 4/2 heads, RoPE, SwiGLU), {_SIZE}, seq {SEQ}", build_llama),
            _model("hf_bert", f"HF BertModel encoder, {_SIZE}, seq {SEQ}", build_bert),
            _model("hf_vit", f"HF ViTModel, {_SIZE}, {IMAGE}x{IMAGE} images, patch 8", build_vit),
            _model("hf_resnet", f"HF ResNetModel (basic, 2 stages), batch {BATCH}, {IMAGE}x{IMAGE}", build_resnet),
        )
    }
)


def select(names: list[str] | None) -> list[Workload]:
    """Models by name in the order given (all when names is None or empty)."""
    if not names:
        return list(MODELS.values())
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    return [MODELS[n] for n in names]


def lookup(name: str) -> Workload:
    """A workload or a model by name (compile-time probes take either)."""
    from vfuse.bench.workloads import WORKLOADS

    found = MODELS.get(name) or WORKLOADS.get(name)
    if found is None:
        raise ValueError(f"unknown workload or model {name!r}; known: {', '.join([*WORKLOADS, *MODELS])}")
    return found
