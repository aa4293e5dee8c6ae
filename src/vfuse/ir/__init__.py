"""vfuse's IR: primitive ops defined once as data, and an immutable typed SSA graph."""

from vfuse.ir.graph import Graph, GraphBuilder, Node
from vfuse.ir.opdefs import all_opdefs, opdef
from vfuse.ir.ops import Attrs, ConstValue, Kind, Op, OpDef
from vfuse.ir.printer import format_graph
from vfuse.ir.types import DType, TensorType, TupleType, Type
from vfuse.ir.verify import IRError, verify

__all__ = [
    "Attrs",
    "ConstValue",
    "DType",
    "Graph",
    "GraphBuilder",
    "IRError",
    "Kind",
    "Node",
    "Op",
    "OpDef",
    "TensorType",
    "TupleType",
    "Type",
    "all_opdefs",
    "format_graph",
    "opdef",
    "verify",
]
