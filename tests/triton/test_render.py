"""The Triton renderer without triton: it reads the schedule's data only (no decision module, no
C++ renderer), and the modules it writes call only `tl` builtins that both the interpreter and
the GPU compiler take: no libdevice (triton #8825), no `tl.tanh`, none of triton's `@jit`
standard library (`tl.sum`, `tl.max`, `tl.zeros`, ...: the interpreter runs those only when
TRITON_INTERPRET was set before triton was imported)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from tests.kernel_families import FAMILIES
from tests.triton.triton_cases import EXTRA

import vfuse.codegen.triton
from vfuse.codegen.triton import render
from vfuse.context import Context, Options
from vfuse.entry.aot import to_ir
from vfuse.fusion import plan_fusion
from vfuse.schedule import build
from vfuse.targets import get_target

ALLOWED_TL = {
    "program_id", "arange", "load", "store", "where", "full", "reduce", "maximum", "minimum", "abs", "exp",
    "exp2", "log", "log2", "sqrt_rn", "sin", "cos", "floor", "ceil", "div_rn", "atomic_min", "multiple_of",
    "max_contiguous", "PropagateNan", "float16", "float32", "float64", "bfloat16", "int1", "int8", "uint8",
    "int16", "uint16", "int32", "uint32", "int64", "constexpr",
}  # fmt: skip
SCHEDULE_DATA = {
    "vfuse.schedule.kernel",
    "vfuse.schedule.gpu_types",
    "vfuse.schedule.expr",
    "vfuse.schedule.rowmerge",
    "vfuse.schedule",
}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_renderer_reads_schedule_data_only_and_not_the_cpp_renderer() -> None:
    root = Path(vfuse.codegen.triton.__file__).parent
    for f in sorted(root.glob("*.py")):
        ours = {m for m in _imports(f) if m.startswith("vfuse.schedule")}
        assert ours <= SCHEDULE_DATA, f"{f.name} imports {ours - SCHEDULE_DATA}"
        assert not any(m.startswith("vfuse.codegen.cpp") for m in _imports(f)), f.name


@pytest.mark.parametrize("family", ["layernorm_gelu", "dropout", "embedding", "int_division", "max_argmax_nan"])
def test_generated_modules_call_only_tl_builtins(family: str) -> None:
    fn, args = {**FAMILIES, **EXTRA}[family]
    graph = to_ir(fn, args, Context(Options()))
    h100 = get_target("h100")
    source = render(build(plan_fusion(graph, h100), h100, templates=False)).source
    tree = ast.parse(source)
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "tl"}
    assert used <= ALLOWED_TL, used - ALLOWED_TL
    assert "libdevice" not in source and "triton.jit" not in source
