"""Epilogues: per-element C++ applied to each output tile while it is still in L1.

An Epilogue is a list of C++ statements that transform `float v` (the finished accumulator)
in place, plus the extra arguments they read. The kernel renders them inside an `omp simd`
loop over one tile row, with these integer (`long`) names in scope:

    GEMM  (render_gemm):   b = flat batch index, i = row of C[b], j = column of C[b],
                           o = offset of the element from C (so residual[o] matches C's layout)
    conv  (render_conv2d): n = image, c = output channel, p = oh * OW + ow, oh, ow,
                           o = offset of the element from the NCHW output pointer

Statements should use the prelude's vg_exp / vg_erf / vg_tanh / vg_gelu_erf / vg_gelu_tanh / vg_sigmoid instead of std::
math, so the loop vectorizes without -ffast-math. Extra arguments come after the output pointer
in the kernel signature, in the order given here.

The output need not be fp32 (GEMM only): with `out_ctype` e.g. "int8_t", the kernel's C is
that type and `store` (an expression, e.g. the variable holding the epilogue's final cast) is
what each element receives; partial sums over K blocks then live in an fp32 workspace.

With `colsum` (GEMM, fp32 C only) the kernel also writes the column sums of that per-element
expression over all rows and batch entries to the argument named `colsum_out` (N floats): a
bias gradient `sum(dH, 0)` made from the tile while it is in registers instead of a re-read of
dH (driver.py: per-MR-row-sliver partials, then one reduce in a fixed order).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EpilogueArg:
    """One extra kernel argument, e.g. EpilogueArg("bias", "const float*") or ("alpha", "float")."""

    name: str
    ctype: str

    def decl(self) -> str:
        restrict = " __restrict" if self.ctype.endswith("*") else ""
        return f"{self.ctype}{restrict} {self.name}"


@dataclass(frozen=True, slots=True)
class Epilogue:
    """Statements on `float v`; `args` are the pointers/scalars they read (see module doc);
    `store` is the value written to C (of type `out_ctype`)."""

    name: str = "none"
    args: tuple[EpilogueArg, ...] = ()
    body: tuple[str, ...] = ()
    store: str = "v"
    out_ctype: str = "float"
    colsum: str = ""  # per-element C++ expression whose column sums go to `colsum_out` ("": none)
    colsum_out: str = ""  # the name of a `float*` argument among `args`

    def params(self) -> str:
        """The arguments as a C++ parameter list fragment with a leading comma (or empty)."""
        return "".join(f", {a.decl()}" for a in self.args)

    def names(self) -> str:
        """The argument names as a call fragment with a leading comma (or empty)."""
        return "".join(f", {a.name}" for a in self.args)

    def code(self, indent: str) -> str:
        return "".join(f"{indent}{s}\n" for s in self.body)

    def then(self, other: Epilogue) -> Epilogue:
        """This epilogue followed by `other` (argument names must not clash)."""
        clash = {a.name for a in self.args} & {a.name for a in other.args}
        if clash:
            raise ValueError(f"epilogue arguments clash: {sorted(clash)}")
        name, args, body = f"{self.name}+{other.name}", self.args + other.args, self.body + other.body
        colsum, out = (other.colsum, other.colsum_out) if other.colsum else (self.colsum, self.colsum_out)
        return Epilogue(name, args, body, other.store, other.out_ctype, colsum, out)


_BIAS = EpilogueArg("bias", "const float*")
_GELU_ERF = "v = vg_gelu_erf(v);"
_GELU_TANH = "v = vg_gelu_tanh(v);"


def none() -> Epilogue:
    return Epilogue()


def bias(index: str = "j") -> Epilogue:
    """v += bias[index]; index "j" for nn.Linear, "c" for a conv's per-channel bias."""
    return Epilogue("bias", (_BIAS,), (f"v += bias[{index}];",))


def bias_gelu_erf(index: str = "j") -> Epilogue:
    return Epilogue("bias_gelu_erf", (_BIAS,), (f"v += bias[{index}];", _GELU_ERF))


def bias_gelu_tanh(index: str = "j") -> Epilogue:
    return Epilogue("bias_gelu_tanh", (_BIAS,), (f"v += bias[{index}];", _GELU_TANH))


def bias_relu(index: str = "j") -> Epilogue:
    return Epilogue("bias_relu", (_BIAS,), (f"v += bias[{index}];", "v = v > 0.0f ? v : 0.0f;"))


def bias_silu(index: str = "j") -> Epilogue:
    return Epilogue("bias_silu", (_BIAS,), (f"v += bias[{index}];", "v = v * vg_sigmoid(v);"))


def residual_add(index: str = "o") -> Epilogue:
    """v += residual[index]; the default "o" reads a residual laid out exactly like the output."""
    return Epilogue("residual", (EpilogueArg("residual", "const float*"),), (f"v += residual[{index}];",))


def scale(constant: float) -> Epilogue:
    """v *= constant, baked into the source (e.g. attention's 1/sqrt(d))."""
    return Epilogue("scale", (), (f"v *= {float(constant)!r}f;",))


def scale_shift_relu(index: str = "c", relu: bool = True) -> Epilogue:
    """Inference BatchNorm folded to per-channel v * scale + shift, then optional ReLU."""
    args = (EpilogueArg("bn_scale", "const float*"), EpilogueArg("bn_shift", "const float*"))
    body = (f"v = v * bn_scale[{index}] + bn_shift[{index}];",)
    if relu:
        body += ("v = v > 0.0f ? v : 0.0f;",)
    return Epilogue("scale_shift_relu" if relu else "scale_shift", args, body)


def scale_shift_silu(index: str = "c") -> Epilogue:
    return scale_shift_relu(index, relu=False).then(Epilogue("silu", (), ("v = v * vg_sigmoid(v);",)))
