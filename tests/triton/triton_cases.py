"""Graphs the Triton tests run beyond the shared kernel families (tests/kernel_families.py):
looped rows, NaN in max/argmax, full reductions, fp16, views and odd shapes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import vfuse


def _with_nans() -> torch.Tensor:
    x = torch.randn(5, 10)
    x[1, 3] = x[2, 5] = x[2, 7] = float("nan")
    x[3, :] = 2.0  # ties: the first index wins
    x[4, :] = float("-inf")
    return x


EXTRA: dict[str, tuple[Callable, tuple[torch.Tensor, ...]]] = {
    # rows past the persistent limit (8192): every pass loops over the row in chunks
    "softmax_looped": (lambda x: torch.softmax(x, -1), (torch.randn(3, 9001),)),
    "layernorm_looped": (lambda x: F.layer_norm(x, (8200,)), (torch.randn(2, 8200),)),
    "max_argmax_nan": (
        lambda x: (x.amax(-1), x.argmax(-1), x.amin(-1), x.argmin(-1), x.argmax(0)),
        (_with_nans(),),
    ),
    "columns_persistent": (lambda x: (x.mean(0), x.amax(0)), (_with_nans()[:, :7].t().contiguous(),)),
    "argmax_looped": (lambda x: x.argmax(-1), (torch.randn(2, 9000).round(),)),
    "full_reduction": (lambda x: x.sum() + x.abs().amax(), (torch.randn(7, 13),)),
    "mean_var_multiaxis": (lambda x: (x.mean((0, 2)), x.var(1)), (torch.randn(3, 5, 7),)),
    "prod_any_all": (lambda x: (x.prod(-1), (x > 1).any(-1), (x > 0.6).all(-1)), (torch.rand(4, 6) + 0.5,)),
    "pointwise_permute": (lambda x, y: (x.t() + y).relu(), (torch.randn(7, 5), torch.randn(5, 7))),
    "size_one_dims": (lambda x: torch.softmax(x, -1) + x.sum(0), (torch.randn(1, 1, 13),)),
    "cat_clamp": (lambda a, b: torch.cat([a, b], 1).clamp(-0.5, 0.5), (torch.randn(3, 4), torch.randn(3, 5))),
    "f16_tanh": (lambda x: (x.half() * 3).tanh().float(), (torch.randn(50),)),
    "int_bool_outputs": (
        lambda x: ((x > 0).sum(-1), x.to(torch.int32) * 3, x.to(torch.uint8)),
        (torch.rand(4, 6) * 50,),
    ),
    "iota": (lambda x: x + torch.arange(x.shape[-1]), (torch.randn(3, 5),)),
    "linear_gelu": (lambda x, w: F.gelu(x @ w.t()), (torch.randn(5, 12), torch.randn(7, 12))),
}
TOLERANCE = {"f16_tanh": 1e-3}


def compile_triton(fn: Callable, inputs: tuple[torch.Tensor, ...], **options: Any) -> Any:
    return vfuse.compile(fn, inputs, backend="triton", target="h100", **options)


def as_list(x: object) -> list[torch.Tensor]:
    return list(x) if isinstance(x, list | tuple) else [x]  # type: ignore[list-item]
