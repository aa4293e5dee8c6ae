"""Run a program's generated C++ on ARM64 here: cross-compiled with aarch64-linux-gnu-g++ and run
under qemu-aarch64, through a small driver that reads the inputs from stdin and writes the outputs
to stdout (raw bytes, in slot order). Only programs of native segments (no torch steps) run this way."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import torch

from vfuse.codegen.cpp.faults import FAULT_BYTES, fault_offset
from vfuse.ir import Graph, Op
from vfuse.schedule import BufKind, Program, TorchStep

CXX = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"
FLAGS = ("-O2", "-std=c++17", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-static")


def missing_tools() -> str | None:
    """Why ARM64 code cannot run here, or None."""
    absent = [t for t in (CXX, QEMU) if shutil.which(t) is None]
    return f"{', '.join(absent)} not installed (Debian: g++-aarch64-linux-gnu, qemu-user)" if absent else None


def _bound(program: Program, graph: Graph) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(slot, value) of every pointer the kernels read (inputs and constants) and write (outputs)."""
    ins = sorted((b.slot, v) for v, b in program.buffers.items() if b.kind is BufKind.INPUT)
    outs = sorted((b.slot, v) for v, b in program.buffers.items() if b.kind is BufKind.OUTPUT)
    return ins, outs


def driver(program: Program, graph: Graph, source: str) -> str:
    """The translation unit plus a main() that binds the slots, runs every segment, prints outputs."""
    assert not any(isinstance(s, TorchStep) for s in program.steps), "torch steps cannot run on the device"
    ins, outs = _bound(program, graph)
    n_slots = max((s for s, _ in (*ins, *outs)), default=-1) + 1
    arena = fault_offset(program) + FAULT_BYTES + 64
    lines = [source, "#include <cstdio>", "#include <cstdlib>", "int main() {"]
    lines.append(f"  static void* bufs[{max(n_slots, 1)}];")
    lines.append(f"  char* arena = (char*)std::aligned_alloc(64, {(arena + 63) // 64 * 64});")
    lines.append(f"  static int64_t seeds[{max(len(program.seeds), 1)}];")
    lines.append(f"  if (std::fread(seeds, 8, {len(program.seeds)}, stdin) != {len(program.seeds)}) return 3;")
    for slot, v in (*ins, *outs):
        size = max(program.buffers[v].type.nbytes, 1)
        lines.append(f"  bufs[{slot}] = std::aligned_alloc(64, {(size + 63) // 64 * 64});")
    for slot, v in ins:
        n = program.buffers[v].type.nbytes
        lines.append(f"  if (std::fread(bufs[{slot}], 1, {n}, stdin) != {n}) return 3;")
    for seg in program.segments:
        lines.append(f"  if (int rc = {seg.name}(bufs, arena, seeds, 2)) return 10 + rc;")
    for slot, v in outs:
        lines.append(f"  std::fwrite(bufs[{slot}], 1, {program.buffers[v].type.nbytes}, stdout);")
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def run_arm64(
    program: Program, graph: Graph, source: str, inputs: Sequence[torch.Tensor], seeds: Sequence[int], work: Path
) -> dict[str, torch.Tensor]:
    """Every output buffer the kernels wrote, by value name, as computed on (emulated) ARM64."""
    cpp, exe = work / "prog.cpp", work / "prog"
    cpp.write_text(driver(program, graph, source))
    subprocess.run([CXX, *FLAGS, str(cpp), "-o", str(exe)], check=True, capture_output=True, text=True)
    ins, outs = _bound(program, graph)
    by_name = {n.name: inputs[n.attrs["index"]] for n in graph.inputs}
    by_name |= {n.name: n.attrs["value"].tensor for n in graph.nodes if n.op is Op.CONSTANT}
    payload = _bytes(torch.tensor(list(seeds), dtype=torch.int64))
    for _, v in ins:
        payload += _bytes(by_name[v])
    res = subprocess.run([QEMU, "-L", SYSROOT, str(exe)], input=payload, capture_output=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"ARM64 run failed with code {res.returncode}: {res.stderr.decode()[-2000:]}")
    out, at = {}, 0
    for _, v in outs:
        t = program.buffers[v].type
        raw = torch.tensor(list(res.stdout[at : at + t.nbytes]), dtype=torch.uint8)
        out[v] = raw.view(t.dtype.torch).reshape(t.shape)
        at += t.nbytes
    return out


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
