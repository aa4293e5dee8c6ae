"""torch.compile's conventions with backend="vfuse": options= and mode=, and every option value checked."""

from __future__ import annotations

import pytest
import torch

import vfuse
from vfuse.context import Options, option_names
from vfuse.errors import VfuseOptionError


def f(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) * 2 + 1


def test_options_reach_the_backend() -> None:
    torch._dynamo.reset()
    x = torch.randn(5, 3)
    out = torch.compile(f, backend="vfuse", options={"backend": "interp", "target": "H100"})(x)
    torch.testing.assert_close(out, f(x))
    graph = vfuse.last_compiled()
    assert graph.stats.backend == "interp" and graph.plan.target == "h100"


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_inductor_modes_compile_the_same_native_code(mode: str) -> None:
    torch._dynamo.reset()
    x = torch.randn(5, 3)
    torch.testing.assert_close(torch.compile(f, backend="vfuse", mode=mode)(x), f(x))
    graph = vfuse.last_compiled()
    assert graph.stats.backend == "cpp" and graph.stats.kernels == 1


def test_unknown_option_lists_the_known_ones() -> None:
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"unknown vfuse option 'triton\.cudagraphs'; known options: strict, ") as info:
        torch.compile(f, backend="vfuse", options={"triton.cudagraphs": True})(torch.randn(3))
    assert all(name in str(info.value) for name in option_names())


def test_unknown_mode_lists_the_modes() -> None:
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"mode='fastest' is not accepted.*'default', 'reduce-overhead'"):
        torch.compile(f, backend="vfuse", mode="fastest")(torch.randn(3))


def test_a_bad_value_through_torch_compile_names_option_and_value() -> None:
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"option backend='cuda' is not accepted; accepted: 'auto', 'cpp', 'interp'"):
        torch.compile(f, backend="vfuse", options={"backend": "cuda"})(torch.randn(3))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"backend": "cuda"}, r"backend='cuda' is not accepted; accepted: 'auto', 'cpp', 'interp'"),
        ({"target": "B200"}, r"target='B200' is not accepted; accepted: 'cpu', 'a100', 'h100', 'h200'"),
        ({"target": 100}, r"target=100 is not accepted"),
        ({"strict": "yes"}, r"strict='yes' is not accepted; accepted: True or False"),
        ({"freeze": 1}, r"freeze=1 is not accepted; accepted: True or False"),
        ({"dump_dir": 3}, r"dump_dir=3 is not accepted; accepted: a path"),
        ({"cache_dir": ""}, r"cache_dir='' is not accepted; accepted: a path"),
        ({"stric": True}, r"unknown vfuse option 'stric'; known options: strict, raise_codegen_errors"),
    ],
)
def test_vfuse_backend_checks_every_value(options: dict, message: str) -> None:
    with pytest.raises(VfuseOptionError, match=message):
        vfuse.backend(**options)


def test_errors_are_value_and_type_errors() -> None:
    with pytest.raises(ValueError):
        vfuse.backend(target="tpu")
    with pytest.raises(TypeError):
        vfuse.backend(strict="no")


def test_an_unambiguous_spelling_is_normalized() -> None:
    options = vfuse.backend(target="H100", backend="CPP").options
    assert (options.target, options.backend) == ("h100", "cpp")
    assert Options(target="A100").target == "a100"


def test_a_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFUSE_BACKEND", "gpu")
    with pytest.raises(VfuseOptionError, match=r"backend='gpu' .*environment variable VFUSE_BACKEND"):
        vfuse.backend()
    assert vfuse.backend(backend="interp").options.backend == "interp"  # a keyword wins over it


def test_vfuse_compile_checks_options_before_exporting(monkeypatch: pytest.MonkeyPatch) -> None:
    import vfuse.entry.aot

    def no_export(*args: object) -> None:
        raise AssertionError("exported before checking the options")

    monkeypatch.setattr(vfuse.entry.aot, "export", no_export)
    with pytest.raises(VfuseOptionError, match="target='h300'"):
        vfuse.compile(f, [torch.randn(3)], target="h300")
