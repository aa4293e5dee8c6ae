"""Every rule a fusion decision names: its stable name (printed in plans, reports and docs) and
what it means in one line. The planner, kernel forms, summaries, legality and the report all use
these members, never strings, so a rule is spelled once."""

from __future__ import annotations

import enum


class Rule(str, enum.Enum):
    """A fusion rule; the value is its printed name, `meaning` says what it allows or forbids."""

    meaning: str

    def __new__(cls, name: str, meaning: str) -> Rule:
        member = str.__new__(cls, name)
        member._value_ = name
        member.meaning = meaning
        return member

    def __str__(self) -> str:
        return self.value

    # allowing: by the kinds of the producer and the consumer
    ELEMENTWISE_INTO_ANY = "elementwise-into-any", "a pointwise producer is recomputed inline in any consumer"
    VIEW_INDEX_MAP = "view-index-map", "a layout op becomes an index map inside its consumer; nothing is copied"
    PROLOGUE_INTO_REDUCTION = "prologue-into-reduction", "pointwise work feeding a reduction runs in its row loop"
    EPILOGUE_AFTER_REDUCTION = "epilogue-after-reduction", "pointwise work on a reduction's result runs in its kernel"
    MULTI_PASS_ROW = "multi-pass-row", "reductions over the same rows share one row kernel (passes over a cached row)"
    EPILOGUE_AFTER_CONTRACTION = "epilogue-after-contraction", "pointwise work on a GEMM/conv/attention output tile"
    PROLOGUE_INTO_CONTRACTION = "prologue-into-contraction", "a cheap operand transform runs while packing"
    RECOMPUTE_INTO_CONSUMERS = "recompute-into-consumers", "a cheap producer is recomputed in each of its consumers"
    HORIZONTAL = "horizontal", "independent pointwise kernels of one dtype (e.g. every parameter's update) run as one"
    COLUMN_SUM_EPILOGUE = "column-sum-epilogue", "a bias gradient (sum of a GEMM output's rows) is added up in its tile"
    # forbidding: kernel forms
    TWO_CONTRACTIONS = "two-contractions", "at most one GEMM/conv/attention per kernel"
    CONTRACTION_WITH_REDUCTION = "contraction-with-reduction", "a contraction kernel takes only a pointwise epilogue"
    CONTRACTION_EPILOGUE_KIND = "contraction-epilogue-kind", "only pointwise ops join a contraction's epilogue"
    REDUCE_AXES_DIFFER = "reduce-axes-differ", "reductions in one kernel must reduce the same axes"
    REDUCE_SHAPES_DIFFER = "reduce-shapes-differ", "reductions in one kernel must read inputs of one shape"
    ROW_SPACE_MISMATCH = "row-space-mismatch", "every value of a row kernel is in its row space or reduced"
    EPILOGUE_SPACE_MISMATCH = "epilogue-space-mismatch", "every epilogue value is in the contraction's output space"
    PROLOGUE_TOO_EXPENSIVE = "prologue-too-expensive", "only cheap operand transforms run while packing"
    VIEW_NOT_EXPRESSIBLE = "view-not-expressible", "the layout op has no index map in this kernel's iteration space"
    POINTWISE_OUTPUTS_DIFFER = "pointwise-outputs-differ", "outputs of one pointwise kernel have one size"
    OPAQUE_ALONE = "opaque-alone", "a torch fallback runs alone (with its get_items)"
    # forbidding: the kernel graph and resource budgets
    WOULD_CREATE_CYCLE = "would-create-cycle", "the merge would make two kernels depend on each other"
    KERNEL_SIZE_CAP = "kernel-size-cap", "a kernel has at most the budget's number of nodes"
    REGISTER_BUDGET = "register-budget", "live values per point exceed the GPU's registers per thread"
    CACHE_BUDGET = "cache-budget", "a row's working set exceeds the L2 share of one core"
    SMEM_BUDGET = "smem-budget", "a row's working set exceeds the shared memory of one SM"
    ONCHIP_SPILLS = "onchip-spills", "the kernel compiled for the target's SM spills registers: its group is split"
    ONCHIP_SHARED = "onchip-shared", "the compiled kernel needs more shared memory than one SM has: its group is split"
    ONCHIP_FITS = "onchip-fits", "the kernel compiled for the target's SM: registers, spills and shared memory fit"
    # forbidding: the cost model and recomputation
    UNPROFITABLE = "unprofitable", "the cost model predicts the merged kernel is not faster"
    RECOMPUTE_UNPROFITABLE = "recompute-unprofitable", "recomputing in every consumer is predicted slower"
    RECOMPUTE_TOO_EXPENSIVE = "recompute-too-expensive", "only cheap pointwise producers are recomputed"
    RECOMPUTE_GRAPH_OUTPUT = "recompute-graph-output", "a graph output is written by exactly one kernel"
    LIBRARY_CONTRACTION = (
        "library-contraction",
        "the cost model predicts torch's GEMM/conv/SDPA beats the template: it runs in torch, its epilogue fused after",
    )
    LIBRARY_POINTWISE = (
        "library-pointwise",
        "the cost model predicts torch's vectorized op beats a loop of scalar libm calls: it runs in torch, alone",
    )
