"""The cost model's figures on small kernels whose right answer is known."""

from __future__ import annotations

import dataclasses

import pytest
from tests.fusion.fusion_patterns import FIXED_CPU, _input, elementwise_chain, layer_norm

from vfuse.fusion import estimate, lower_bound_bytes
from vfuse.fusion.cost import GAMMA, default_outputs, pressure_of
from vfuse.fusion.forms import classify
from vfuse.ir import DType, GraphBuilder, Op, verify
from vfuse.targets import get_target

N = 1 << 20


def test_bytes_count_inputs_once_and_outputs_once() -> None:
    g = elementwise_chain(N)
    assert estimate(["add"], g, FIXED_CPU).bytes == 3 * 4 * N
    fused = estimate(["add", "relu", "mul"], g, FIXED_CPU)
    assert fused.bytes == 4 * 4 * N == lower_bound_bytes(g)
    assert fused.flops == 3 * N


def test_broadcast_input_counts_its_own_size() -> None:
    b = GraphBuilder()
    x, bias = _input(b, 0, (1024, 768)), _input(b, 1, (768,))
    g = verify(b.build([b.add(Op.ADD, (x, bias), name="add")]))
    assert estimate(["add"], g, FIXED_CPU).bytes == 4 * (2 * 1024 * 768 + 768)


def test_broadcast_node_inside_a_kernel_is_recomputed_per_point() -> None:
    b = GraphBuilder()
    x, v = _input(b, 0, (1024, 768)), _input(b, 1, (768,))
    r = b.add(Op.RSQRT, (v,), name="rsqrt")  # 4 flops per element of (768,)
    g = verify(b.build([b.add(Op.MUL, (x, r), name="mul")]))
    assert estimate(["rsqrt"], g, FIXED_CPU).flops == 4 * 768
    assert estimate(["rsqrt", "mul"], g, FIXED_CPU).flops == (4 + 1) * 1024 * 768


def test_time_is_launch_plus_overlapped_roofline() -> None:
    g = elementwise_chain(N)
    c = estimate(["add", "relu", "mul"], g, FIXED_CPU)
    assert c.memory_s == pytest.approx(c.bytes / FIXED_CPU.dram_bw)
    assert c.compute_s == pytest.approx(c.flops / FIXED_CPU.vector_f32)
    body = c.compute_s + c.memory_s - GAMMA["cpu"] * min(c.compute_s, c.memory_s)
    assert c.parallelism >= 1 and c.pressure < 1
    assert c.time_s == pytest.approx(FIXED_CPU.launch_s + body)


def test_memory_bound_versus_compute_bound() -> None:
    b = GraphBuilder()
    a, w = _input(b, 0, (1024, 1024)), _input(b, 1, (1024, 1024))
    g = verify(b.build([b.add(Op.MATMUL, (a, w), name="mm")]))
    assert estimate(["mm"], g, FIXED_CPU).bound == "compute"
    assert estimate(["add"], elementwise_chain(N), FIXED_CPU).bound == "memory"


def test_more_bandwidth_is_faster_for_memory_bound_kernels() -> None:
    g = elementwise_chain(N)
    h100, h200 = get_target("h100"), get_target("h200")
    assert estimate(["add"], g, h200).time_s < estimate(["add"], g, h100).time_s


def test_too_few_rows_raise_time() -> None:
    """Same bytes and flops; one row per kernel leaves a core idle on a 2-core CPU."""
    b = GraphBuilder()
    x = _input(b, 0, (N,))
    g1 = verify(b.build([b.add(Op.SUM, (x,), name="s", axes=(0,), keepdim=False)]))
    b2 = GraphBuilder()
    x2 = _input(b2, 0, (1024, N // 1024))
    g2 = verify(b2.build([b2.add(Op.SUM, (x2,), name="s", axes=(1,), keepdim=False)]))
    one, many = estimate(["s"], g1, FIXED_CPU), estimate(["s"], g2, FIXED_CPU)
    assert one.parallelism == pytest.approx(0.5) and many.parallelism >= 1
    assert one.time_s > 1.5 * (many.time_s - FIXED_CPU.launch_s)


def test_register_spill_raises_time_on_gpu() -> None:
    h100 = get_target("h100")
    b = GraphBuilder()
    x = _input(b, 0, (N,))
    ys = [b.add(Op.ADD, (x, _input(b, 1 + i, (N,))), name=f"y{i}") for i in range(130)]
    acc = ys[0]
    for i, y in enumerate(ys[1:]):
        acc = b.add(Op.MUL, (acc, y), name=f"m{i}")
    g = verify(b.build([acc]))
    nodes = [n.name for n in g.compute_nodes]
    cost = estimate(nodes, g, h100)
    assert cost.pressure > 1
    no_spill = estimate(nodes, g, dataclasses.replace(h100, regs_per_sm=65536 * 4, regs_per_thread=1024))
    assert no_spill.pressure < 1 and cost.time_s > no_spill.time_s


def test_row_kernel_working_set_counts_values_kept_across_passes() -> None:
    g = layer_norm(rows=64, d=512)
    nodes = list(g.compute_nodes)
    p = pressure_of(nodes, classify(nodes, default_outputs(nodes, g), g), g, FIXED_CPU)
    # passes: mean, variance, normalize; x (read by passes 1-2) and the centred value (made in
    # pass 2, read in pass 3) stay on chip: 2 values * 512 elements * 4 bytes per row
    assert (p.passes, p.working_set, p.ws_budget) == (3, 2 * 512 * 4, FIXED_CPU.l2_bytes)
    wide = layer_norm(rows=4, d=1 << 17)
    nodes = list(wide.compute_nodes)
    assert pressure_of(nodes, classify(nodes, default_outputs(nodes, wide), wide), wide, FIXED_CPU).ratio == 1.0


def test_illegal_node_set_is_an_error() -> None:
    b = GraphBuilder()
    x, w = _input(b, 0, (64, 64)), _input(b, 1, (64, 64))
    m1 = b.add(Op.MATMUL, (x, w), name="m1")
    g = verify(b.build([b.add(Op.MATMUL, (m1, w), name="m2")]))
    with pytest.raises(ValueError, match="two-contractions"):
        estimate(["m1", "m2"], g, FIXED_CPU)


def test_scatter_add_is_priced_at_the_vector_rate_not_the_matrix_peak() -> None:
    # A scatter-add only adds: pricing its flops at the matrix unit's rate made it look free.
    b = GraphBuilder()
    values, index = _input(b, 0, (1, 4096, 256)), _input(b, 1, (1, 4096), DType.I64)
    g = verify(b.build([b.add(Op.SCATTER_ADD, (values, index), rows=512, skip=None, wrap=False, taps=1, dim=0)]))
    target = dataclasses.replace(FIXED_CPU, peak_f32=100 * FIXED_CPU.vector_f32)
    node = g.nodes[-1].name
    assert estimate([node], g, target).compute_s == pytest.approx(4096 * 256 / target.vector_f32)
