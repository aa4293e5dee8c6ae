"""Gathers at slices of buffers under symbolic sizes: BERT's embeddings (`position_ids[:, :t]`,
token types gathered at those positions) run in vfuse kernels at every length, with the index
check over the slice read, not the whole buffer."""

from __future__ import annotations

import pytest
import torch

import vfuse
from vfuse.schedule.kernel import TorchStep


class Embeddings(torch.nn.Module):
    """HF BertEmbeddings' index arithmetic: a computed index (the gather's) read by a checked
    gather of a computed index (the slice), then word + type + position rows and a LayerNorm."""

    def __init__(self, rows: int = 40, d: int = 24) -> None:
        super().__init__()
        self.register_buffer("position_ids", torch.arange(rows).expand((1, -1)), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(1, rows, dtype=torch.long), persistent=False)
        self.word, self.pos = torch.nn.Embedding(97, d), torch.nn.Embedding(rows, d)
        self.types = torch.nn.Embedding(2, d)
        self.ln = torch.nn.LayerNorm(d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        position_ids = self.position_ids[:, :t]
        types = torch.gather(self.token_type_ids.expand(1, -1), 1, position_ids).expand(b, t)
        return self.ln(self.word(ids) + self.types(types) + self.pos(position_ids))


def _torch_steps(backend: object) -> list[TorchStep]:
    (graph,) = backend.compiled  # type: ignore[attr-defined]
    return [s for s in graph.executor.program.steps if isinstance(s, TorchStep)]


@pytest.mark.parametrize("dynamic", [True, False])
def test_bert_embeddings_gather_at_a_slice_runs_in_kernels(dynamic: bool) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    m, backend = Embeddings().eval(), vfuse.backend()
    c = torch.compile(m, backend=backend, dynamic=dynamic)
    lengths = (13, 29, 40) if dynamic else (13,)
    with torch.no_grad():
        for t in lengths:
            ids = torch.randint(0, 97, (3, t))
            torch.testing.assert_close(c(ids), m(ids), rtol=1e-5, atol=1e-5)
    assert backend.stats["graphs"] == 1 and backend.stats["fallbacks"] == {}
    assert _torch_steps(backend) == []


def test_slice_index_check_covers_only_the_rows_read() -> None:
    """A bad position past the slice is never read (eager does not fail, neither may we); one
    inside it is reported by name."""
    torch._dynamo.reset()
    m, backend = Embeddings().eval(), vfuse.backend()
    c = torch.compile(m, backend=backend, dynamic=True)
    with torch.no_grad():
        c(torch.randint(0, 97, (2, 7)))
        m.position_ids[0, 30] = 1000  # past t = 11: never read
        ids = torch.randint(0, 97, (2, 11))
        torch.testing.assert_close(c(ids), m(ids), rtol=1e-5, atol=1e-5)
        m.position_ids[0, 5] = 1000
        with pytest.raises(Exception, match="index"):
            c(ids)
    assert backend.stats["graphs"] == 1
