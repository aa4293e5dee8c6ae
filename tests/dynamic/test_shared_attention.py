"""Repeated attention layers compile one template instance (codegen/cpp/attention/render.py
`shared_instance`): a model's layers whose attention differs only in its buffers call one
include-guarded `vf_attn_<hash>`, compiled once per unit, under torch.compile(dynamic=True); a
layer of another kind (causal) has its own; every layer computes its own buffers (eager's
results at primes, 2 and lengths past a tile); the report shows each kernel the instance's
configuration."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import vfuse
from vfuse.codegen.cpp.toolchain import find_toolchain
from vfuse.codegen.cpp.units import split
from vfuse.ir.ops import Op
from vfuse.report.source import kernel_source
from vfuse.schedule.kernel import ContractionKernel

H, D = 2, 16
LENGTHS = (5, 2, 7, 33, 64, 131)
_GUARD = re.compile(r"^#ifndef VF_ATTN_([0-9a-f]{20})$", re.M)


class _Layer(torch.nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.qkv = torch.nn.Linear(H * D, 3 * H * D)
        self.out = torch.nn.Linear(H * D, H * D)
        self.norm = torch.nn.LayerNorm(H * D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, H, D).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.norm(x + self.out(a.transpose(1, 2).reshape(b, t, c)))


class _Model(torch.nn.Module):
    """Three alike encoder layers, then a causal one."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_Layer(False), _Layer(False), _Layer(False), _Layer(True)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_repeated_attention_layers_compile_one_instance(
    rendered: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VFUSE_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = _Model().eval()
    fn = torch.compile(model, backend=vfuse.backend(strict=True), dynamic=True)
    before = torch.get_num_threads()
    try:
        with torch.no_grad():
            for threads, t in [*((1, t) for t in LENGTHS), (3, 67), (3, 13), (2, 3)]:
                torch.set_num_threads(threads)
                x = torch.randn(3, t, H * D)
                torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)
                if threads == 1:  # the program is planned per thread count
                    assert len(rendered) == 1, "compiled once for every length"
    finally:
        torch.set_num_threads(before)
    program, source = rendered[0]
    attention = [k.name for k in program.kernels if isinstance(k, ContractionKernel) and k.op is Op.SDPA]
    assert len(attention) == 4, [(k.name, type(k).__name__) for k in program.kernels]
    instances = set(_GUARD.findall(source))
    assert len(instances) == 2, instances  # the three alike layers' and the causal layer's
    for name in instances:
        assert source.count(f"#define VF_NAME vf_attn_{name}") == source.count(f"#ifndef VF_ATTN_{name}\n")
    names = [k.name for k in program.kernels]
    for k in attention:  # the report: each attention kernel with its instance's configuration
        assert re.search(r"^#define VF_NAME vf_attn_[0-9a-f]{20}$", kernel_source(source, k, names), re.M)
    units = split(source, 2)
    assert units is not None
    compiled = dict.fromkeys(instances, 0)
    for unit in units:  # a unit that calls an instance compiles it once (its guard), one that does not, never
        code = _preprocessed(unit)
        for name in instances:
            defined = len(re.findall(rf"\bvoid vf_attn_{name}\(const float\* (?:q|dout),", code))
            calls = len(re.findall(rf"\bvf_attn_{name}\(", code)) - defined
            assert defined == (1 if calls else 0), (name, defined, calls)
            compiled[name] += defined
    assert all(0 < n <= len(units) for n in compiled.values()), compiled


def _preprocessed(unit: str) -> str:
    cxx = find_toolchain()
    flags = [f for f in cxx.flags if f.startswith(("-std", "-march", "-f")) and f != "-fPIC"]
    done = subprocess.run([cxx.cxx, "-E", "-P", *flags, "-x", "c++", "-"], input=unit, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
