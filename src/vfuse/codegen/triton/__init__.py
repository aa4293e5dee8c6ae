"""The Triton backend: renders a schedule `Program` (scheduled for a GPU target) as a Triton module.

Importing this package does not import triton: rendering is plain text; `module.load_module`,
`offline` and the runtime import triton when they run.
"""

from vfuse.codegen.triton.offline import Resources, pressure
from vfuse.codegen.triton.ops import TritonUnsupported
from vfuse.codegen.triton.render import Launch, TritonProgram, render

__all__ = ["Launch", "Resources", "TritonProgram", "TritonUnsupported", "pressure", "render"]
