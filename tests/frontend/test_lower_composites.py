"""Composite torch functions (decomposed by torch with vfuse's table, or lowered by vfuse)
must reach the IR without any opaque fallback and match eager."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from tests.frontend.lowering_helpers import check


def _x() -> torch.Tensor:
    return torch.randn(2, 4, 3, 5, generator=torch.Generator().manual_seed(4))


COMPOSITES: list[tuple[str, Callable]] = [
    ("elu_selu_celu", lambda x: (F.elu(x), F.selu(x), F.celu(x, 0.5))),
    ("softplus_mish", lambda x: (F.softplus(x, beta=2.0), F.mish(x))),
    ("hard_activations", lambda x: (F.hardsigmoid(x), F.hardswish(x), F.hardshrink(x), F.softshrink(x))),
    ("glu_logsigmoid", lambda x: (F.glu(x, 1), F.logsigmoid(x))),
    ("group_norm", lambda x: (F.group_norm(x, 2), F.group_norm(x, 4, torch.ones(4) * 2, torch.zeros(4) + 1))),
    ("instance_norm", lambda x: F.instance_norm(x)),
    ("normalize", lambda x: (F.normalize(x, dim=1), torch.linalg.vector_norm(x, 2, (1, 2)), x.norm())),
    ("cosine_similarity", lambda x: F.cosine_similarity(x, x * 2 + 1, dim=1)),
    ("losses", lambda x: (F.mse_loss(x, x * 0.5), F.smooth_l1_loss(x, x * 0.5), F.huber_loss(x, -x),
                          F.l1_loss(x, x.abs()))),
    ("pointwise_composites", lambda x: (torch.lerp(x, x * 2, 0.3), torch.addcmul(x, x, x, value=0.5),
                                        torch.addcdiv(x, x, x.abs() + 1), torch.logaddexp(x, -x),
                                        torch.nan_to_num(x / 0), torch.frac(x), torch.xlogy(x.abs(), x.abs()))),
    ("logsumexp_logit", lambda x: (torch.logsumexp(x, (1, 3)), torch.logit(torch.sigmoid(x)))),
    ("pad", lambda x: (F.pad(x, (1, 2)), F.pad(x, (0, 0, 2, 1), value=3.0), F.pad(x, (-1, 1, 1, -2)))),
    ("as_strided", lambda x: (x.as_strided((4, 3), (1, 4)), (x * 2).as_strided((2, 2, 3), (0, 5, 2), 7))),
    ("prelu_sinc", lambda x: (F.prelu(x, torch.full((4,), 0.25)), torch.sinc(x))),
    ("linspace", lambda x: x[0, 0, 0] * torch.linspace(-1, 1, 5)),
    ("einsum_outer", lambda x: torch.einsum("i,j->ij", x[0, 0, 0], x[1, 1, 1])),
    ("var_mean_unbiased", lambda x: torch.var_mean(x, (0, 2), unbiased=False)),
]  # fmt: skip


@pytest.mark.parametrize(("name", "fn"), COMPOSITES, ids=[c[0] for c in COMPOSITES])
def test_composite_lowers_without_fallback(name: str, fn: Callable) -> None:
    check(fn, _x(), atol=1e-5)
