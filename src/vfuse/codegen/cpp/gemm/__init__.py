"""CPU GEMM and conv2d kernels with a fused pointwise epilogue, as C++ source generators.

    render_gemm(GemmSpec(...), epilogue) -> str      C[b] = epilogue(A[b] @ B[b])
    render_conv2d(ConvSpec(...), epilogue) -> str    out = epilogue(conv2d(x, w))

See docs/gemm.md for the design, the measured figures and how to call these from the TU.
"""

from vfuse.codegen.cpp.gemm import epilogue as epilogues
from vfuse.codegen.cpp.gemm.blocking import Blocking, choose_blocking
from vfuse.codegen.cpp.gemm.conv import ConvSpec, render_conv2d
from vfuse.codegen.cpp.gemm.epilogue import Epilogue, EpilogueArg
from vfuse.codegen.cpp.gemm.gemm import GemmSpec, render_gemm

__all__ = [
    "Blocking",
    "ConvSpec",
    "Epilogue",
    "EpilogueArg",
    "GemmSpec",
    "choose_blocking",
    "epilogues",
    "render_conv2d",
    "render_gemm",
]
