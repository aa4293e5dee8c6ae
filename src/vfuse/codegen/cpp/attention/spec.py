"""What one flash-attention kernel instance is specialised for, and the memory it needs."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from vfuse.codegen.cpp.simd import SIMD_WIDTHS
from vfuse.ir import DType, Graph, Node, Op

_FLOAT = 4  # bytes; the kernel is fp32


class MaskKind(enum.Enum):
    """How the optional mask argument is read (the value is the C++ VF_MASK code)."""

    NONE = 0
    ADDITIVE = 1  # float32, added to the scaled scores
    BOOL = 2  # one byte per element, nonzero keeps the key (torch's boolean attn_mask)


@dataclass(frozen=True)
class AttentionSpec:
    """Compile-time parameters of `render_flash_attention`.

    Head sizes are compile-time so the inner loops have fixed trip counts; sequence lengths,
    batch, heads and the scale are runtime arguments. `epilogue` is a C++ statement applied to
    each output element `o` (a float lvalue) with `b`, `h`, `i` (row), `c` (column) in scope,
    e.g. "o = o * 2.0f;" — the hook a planner uses to fuse a pointwise consumer.
    """

    name: str = "vf_flash_attention"
    head_dim: int = 64
    value_dim: int | None = None  # None: same as head_dim
    causal: bool = False
    mask: MaskKind = MaskKind.NONE
    block_q: int = 64
    block_k: int = 64
    epilogue: str = ""
    lanes: int = 16  # fp32 lanes per vector (the schedule's Target.simd_lanes)
    tile: int = 64  # register tile width: 4 keys x `tile` query rows (schedule/microtile.py)
    lse: bool = False  # forward: each row's logsumexp ([B, H, LQ], for the backward) follows the output
    dropout: float = 0.0  # dropout on P (vfuse's counter RNG); the kernel then takes the seed and stream last

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"kernel name {self.name!r} is not a C identifier")
        if self.lanes not in SIMD_WIDTHS or self.tile % self.lanes or self.tile <= 0:
            raise ValueError(f"lanes must be one of {SIMD_WIDTHS}, tile whole vectors: got {self.lanes}, {self.tile}")
        if self.block_q % self.lanes or self.block_k % 4 or self.block_q <= 0 or self.block_k <= 0:
            raise ValueError(
                f"block_q must be a multiple of the {self.lanes} lanes and block_k of 4, "
                f"got {self.block_q}, {self.block_k}"
            )
        if self.head_dim <= 0 or self.dv <= 0:
            raise ValueError("head sizes must be positive")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout {self.dropout} outside [0, 1)")

    @property
    def tile_cols(self) -> int:
        """The register tile's width in the kernel (its products take a narrower tile for the columns left)."""
        return self.tile

    @property
    def dv(self) -> int:
        return self.head_dim if self.value_dim is None else self.value_dim

    def workspace_bytes(self) -> int:
        """Bytes of the per-thread `Work` struct (the kernel's only allocation), 64-aligned.

        Independent of the sequence lengths: the extra memory of a call is this times the
        number of threads, where unfused attention materializes B*H*Lq*Lk scores.
        """
        bq, bk, d = self.block_q, self.block_k, self.head_dim
        dvp = (self.dv + self.lanes - 1) // self.lanes * self.lanes
        floats = d * bq + bk * bq + bq * dvp + 3 * bq  # qt, st, acc, m / l / alpha
        return (floats * _FLOAT + 63) // 64 * 64

    def backward_workspace_bytes(self) -> int:
        """Bytes of the backward kernel's per-thread `Work` (its only allocation), 64-aligned: the K
        and V tiles transposed, two score tiles, dQ / dK / dV accumulators and a row, independent of N."""
        bq, bk, d, dv = self.block_q, self.block_k, self.head_dim, self.dv
        dp, dvp = ((x + self.lanes - 1) // self.lanes * self.lanes for x in (d, dv))
        floats = d * bk + dv * bk + 2 * bk * bq + bq * dp + bk * dp + bk * dvp + bq
        return (floats * _FLOAT + 63) // 64 * 64


def spec_for_sdpa(graph: Graph, node: Node, name: str) -> AttentionSpec:
    """The kernel an SDPA node needs (its scale, gqa and batch sizes are runtime arguments).

    Raises ValueError for what the kernel does not do: non-fp32 operands.
    """
    if node.op is not Op.SDPA:
        raise ValueError(f"%{node.name} is {node.op.value}, not sdpa")
    q, _, v = (graph[i].tensor_type for i in node.inputs[:3])
    if q.dtype is not DType.F32:
        raise ValueError(f"the flash-attention kernel is fp32 only, %{node.name} is {q.dtype.value}")
    mask = MaskKind.NONE
    if len(node.inputs) == 4:
        mask = MaskKind.BOOL if graph[node.inputs[3]].tensor_type.dtype is DType.BOOL else MaskKind.ADDITIVE
    return AttentionSpec(name=name, head_dim=q.shape[-1], value_dim=v.shape[-1], causal=node.attrs["causal"], mask=mask)
