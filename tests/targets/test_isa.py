"""Instruction-set tiers: detection from /proc/cpuinfo, forcing a lower tier, refusing one the CPU
lacks, the option, and the tier in the cached target, the compiler flags and the kernel cache key."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import vfuse
from vfuse.codegen.cpp.toolchain import Toolchain, cache_key, find_toolchain, flags_for
from vfuse.context import Options
from vfuse.errors import VfuseOptionError
from vfuse.targets import Target, cpu, get_target
from vfuse.targets.isa import ARM, X86, CpuIsa, Isa, IsaExtra, detect_isa

_BASE = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht nx"
_V3 = "pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand lahf_lm abm bmi1 avx2 bmi2"
_V4 = "avx512f avx512dq avx512cd avx512bw avx512vl"
CPUINFO = {
    "zen3": f"processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7763 64-Core Processor\n"
    f"flags\t\t: {_BASE} {_V3} sse4a misalignsse sha_ni clzero vaes vpclmulqdq\n\nprocessor\t: 1\n",
    "zen4": f"processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654\n"
    f"flags\t\t: {_BASE} {_V3} {_V4} avx512ifma avx512_bf16 avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg\n",
    "sapphire_rapids": f"processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    f"flags\t\t: {_BASE} {_V3} {_V4} avx_vnni avx512_bf16 avx512vbmi avx512_vnni amx_bf16 avx512_fp16 amx_tile "
    "amx_int8\n",
    "neoverse_n1": "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics "
    "fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n",
    "sandy_bridge": f"processor\t: 0\nmodel name\t: Intel(R) Xeon(R) CPU E5-2670\nflags\t\t: {_BASE} pni ssse3 cx16 "
    "sse4_1 sse4_2 popcnt aes xsave avx lahf_lm\n",
}
ARCH = {"neoverse_n1": ARM}


def _isa(name: str) -> CpuIsa:
    return detect_isa(cpu.flags_of(cpu.first_block(CPUINFO[name].splitlines())), ARCH.get(name, X86))


@pytest.mark.parametrize(
    ("name", "tier", "extras"),
    [
        ("zen3", Isa.AVX2, set()),
        ("zen4", Isa.AVX512, {IsaExtra.VBMI, IsaExtra.VNNI, IsaExtra.BF16}),
        ("sapphire_rapids", Isa.AVX512, {IsaExtra.VBMI, IsaExtra.VNNI, IsaExtra.BF16, IsaExtra.FP16, IsaExtra.AMX}),
        ("neoverse_n1", Isa.NEON, {IsaExtra.DOTPROD, IsaExtra.FP16}),
        ("sandy_bridge", Isa.GENERIC, set()),  # AVX without AVX2/FMA is below x86-64-v3
    ],
)
def test_tier_and_extensions_are_detected_from_cpuinfo(name: str, tier: Isa, extras: set[IsaExtra]) -> None:
    isa = _isa(name)
    assert (isa.tier, set(isa.extras)) == (tier, extras)


def test_only_the_first_cpu_block_is_read() -> None:
    text = CPUINFO["zen3"] + f"flags\t\t: {_BASE} {_V3} {_V4}\n"
    assert _isa("zen3").tier is Isa.AVX2 and "avx512f" not in cpu.flags_of(cpu.first_block(text.splitlines()))


def test_a_missing_flag_drops_the_tier() -> None:
    flags = cpu.flags_of(cpu.first_block(CPUINFO["zen4"].splitlines()))
    assert detect_isa(flags - {"avx512vl"}, X86).tier is Isa.AVX2
    assert detect_isa(flags - {"fma"}, X86).tier is Isa.GENERIC  # -march=x86-64-v3 emits FMA


def _facts(name: str) -> cpu.CpuFacts:
    flags = cpu.flags_of(cpu.first_block(CPUINFO[name].splitlines()))
    return cpu.CpuFacts(name, 4, flags, 3.0, 32768, 1 << 20, 32 << 20, ARCH.get(name, X86))


def _on(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Pretend to run on the CPU `name`; measurements are stubbed (and counted)."""
    facts, calls = _facts(name), []

    def measure(f: cpu.CpuFacts) -> tuple[Target, list[str]]:
        calls.append(1)
        isa = f.isa
        regs = f.vector_regs
        t = Target("cpu", "cpu", 4, f.simd_lanes, 1, 2, 3, 0, regs, regs, 1e10, 2e10, 1e12, 0, 0, 0, 5e11, 1e-6, 4)
        return replace(t, isa=isa.tier, isa_extras=isa.extras, **cpu.matrix_peaks(1e12, isa.extras)), []

    monkeypatch.setattr(cpu, "detect", lambda: facts)
    monkeypatch.setattr(cpu, "measure", measure)
    monkeypatch.setattr(cpu, "machine_flags", lambda: facts.flags)
    monkeypatch.setattr(cpu, "machine_arch", lambda: facts.arch)
    monkeypatch.delenv("VFUSE_ISA", raising=False)
    return calls


def test_a_lower_tier_is_applied_to_the_cached_measurement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _on(monkeypatch, "sapphire_rapids")
    native = get_target("cpu", tmp_path)
    assert (native.isa, native.simd_lanes, native.regs_per_thread, native.peak_bf16) == (Isa.AVX512, 16, 32, 2e12)
    assert native.isa_description == "avx512 (vbmi, vnni, bf16, fp16, amx)"
    avx2 = get_target("cpu", tmp_path, isa="AVX2")
    assert (avx2.isa, avx2.isa_extras, avx2.simd_lanes, avx2.regs_per_thread) == (Isa.AVX2, frozenset(), 8, 16)
    assert (avx2.peak_f32, avx2.vector_f32, avx2.peak_bf16, avx2.peak_i8) == (5e11, 2.5e11, 5e11, 1e12)
    generic = get_target("cpu", tmp_path, isa=Isa.GENERIC)
    assert (generic.simd_lanes, generic.peak_f32) == (4, 2.5e11)
    assert len(calls) == 1  # measured once, at the CPU's own tier; forced tiers are derived from it
    cached = json.loads((tmp_path / "target_cpu.json").read_text())["target"]
    assert (cached["isa"], cached["isa_extras"]) == ("avx512", ["amx", "bf16", "fp16", "vbmi", "vnni"])
    assert get_target("cpu", tmp_path, isa="auto") == native and get_target("h100", isa="avx2").isa is None


@pytest.mark.parametrize(
    ("name", "isa", "message"),
    [
        ("zen3", "avx512", r"isa='avx512' is not available on this CPU \(its tier is avx2\): it lacks the flags "
         r"avx512f avx512bw avx512cd avx512dq avx512vl; .*SIGILL"),
        ("sandy_bridge", "avx2", r"its tier is generic\): it lacks the flags avx2 bmi1 bmi2 f16c fma abm movbe;"),
        ("zen4", "neon", r"it lacks the flags asimd of an aarch64 CPU \(this one is x86_64\)"),
        ("neoverse_n1", "avx2", r"its tier is neon \(fp16, dotprod\)\): it lacks the flags .* of an x86_64 CPU"),
    ],
)  # fmt: skip
def test_a_tier_the_cpu_lacks_is_refused_naming_the_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, isa: str, message: str
) -> None:
    calls = _on(monkeypatch, name)
    with pytest.raises(VfuseOptionError, match=message):
        get_target("cpu", tmp_path, isa=isa)
    with pytest.raises(VfuseOptionError, match=message):
        Options(isa=isa)
    assert not calls  # refused before measuring anything


def test_isa_option_is_validated_and_normalized(monkeypatch: pytest.MonkeyPatch) -> None:
    _on(monkeypatch, "zen4")
    assert Options(isa="AVX2").isa == "avx2" and Options().isa == "auto" and Options(isa="Auto").isa == "auto"
    accepted = r"accepted: 'auto', 'generic', 'avx2', 'avx512', 'neon'"
    for bad in ("sse4", 512, None):
        with pytest.raises(VfuseOptionError, match=rf"option isa={bad!r} is not accepted; {accepted}"):
            Options(isa=bad)
    monkeypatch.setenv("VFUSE_ISA", "avx2")
    assert Options.from_env().isa == "avx2" and Options.from_env(isa="generic").isa == "generic"
    monkeypatch.setenv("VFUSE_ISA", "neon")
    with pytest.raises(VfuseOptionError, match=r"isa='neon' .* \(set by the environment variable VFUSE_ISA\)"):
        Options.from_env()
    with pytest.raises(VfuseOptionError, match=r"isa='neon'"):
        vfuse.backend()


def test_vfuse_isa_applies_where_no_tier_is_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tools and tests that build with default options (isa="auto") follow VFUSE_ISA too."""
    _on(monkeypatch, "zen4")
    monkeypatch.setenv("VFUSE_ISA", "AVX2")
    assert get_target("cpu", tmp_path).isa is Isa.AVX2 and get_target("cpu", tmp_path, isa="auto").isa is Isa.AVX2
    assert get_target("cpu", tmp_path, isa="generic").isa is Isa.GENERIC  # an explicit tier wins
    assert "-march=x86-64-v3" in find_toolchain().flags and "-march=native" in find_toolchain(isa=Isa.AVX512).flags
    monkeypatch.setenv("VFUSE_ISA", "neon")
    with pytest.raises(VfuseOptionError, match=r"isa='neon' \(set by the environment variable VFUSE_ISA\) is not"):
        get_target("cpu", tmp_path)
    monkeypatch.setenv("VFUSE_ISA", "sse")
    with pytest.raises(VfuseOptionError, match=r"isa='sse' is not accepted.* \(set by the environment variable"):
        find_toolchain()


def test_flags_and_cache_key_differ_per_tier() -> None:
    march = {t: flags_for(CpuIsa(t, frozenset(), X86)) for t in (Isa.GENERIC, Isa.AVX2, Isa.AVX512)}
    assert {"-march=x86-64", "-mno-mmx"} <= set(march[Isa.GENERIC]) and "-march=x86-64-v3" in march[Isa.AVX2]
    assert "-march=native" in march[Isa.AVX512] and "-march=native" not in march[Isa.AVX2]
    assert "-march=armv8-a" in flags_for(CpuIsa(Isa.GENERIC, frozenset(), ARM))
    keys = {cache_key("int x;", Toolchain("g++", "12", flags)) for flags in march.values()}
    assert len(keys) == 3


def test_the_programs_tier_reaches_the_compiler(tmp_path: Path) -> None:
    """The library a compile at a forced tier loads is the one built with that tier's flags (not the
    CPU's own tier's, on any CPU above generic), and the program dump names the tier."""
    fn = vfuse.compile(lambda x: torch.tanh(x) * 3, (torch.randn(7, 5),), isa="generic", cache_dir=tmp_path / "c",
                       dump_dir=tmp_path / "d", backend="cpp")  # fmt: skip
    x = torch.randn(7, 5)
    torch.testing.assert_close(fn(x), torch.tanh(x) * 3)
    source = fn.compiled.executor.source
    key = cache_key(source, find_toolchain(isa=Isa.GENERIC))
    assert [p.name for p in (tmp_path / "c").glob("vf_*.so")] == [f"vf_{key}.so"]
    (program,) = (tmp_path / "d").rglob("05_program.txt")
    assert program.read_text().splitlines()[0] == "program (generic, vectors of 4 fp32 lanes) {"
