"""A profiled report (`vfuse.explain(..., profile=N)`, `FusionReport.with_measured`): each kernel
carries its measured time in the rows, the text, the JSON and the HTML, where the time links to
the kernel's details (both times and its generated C++), checked in headless Chromium."""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
from tests.report.test_html_browser import HEADLESS, find_browser

import vfuse
from vfuse.report import FusionReport


def _model(x: torch.Tensor, w: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), w)
    return torch.sort(torch.nn.functional.gelu(y @ m) + 1, -1).values  # sort: a torch step


@pytest.fixture(scope="module")
def profiled() -> FusionReport:
    xs = torch.randn(67, 131), torch.randn(131), torch.randn(131, 29)
    return vfuse.explain(_model, *xs, profile=2)


def test_rows_text_and_json_carry_measured_times(profiled: FusionReport) -> None:
    assert [k.runs.value for k in profiled.kernels] == ["native", "template", "torch"]
    assert all(k.measured_s is not None and k.measured_s > 0 for k in profiled.kernels)
    assert profiled.time_measured_s == pytest.approx(sum(k.measured_s or 0 for k in profiled.kernels))
    text = profiled.to_text()
    assert "measured time" in text and re.search(r"\bmeasured\b.*\bbytes\b", text)
    data = profiled.to_json()
    assert [k["measured_s"] for k in data["kernels"]] == [k.measured_s for k in profiled.kernels]
    assert all(0 < (k.best_s or 0) <= (k.measured_s or 0) for k in profiled.kernels)
    assert [k["best_s"] for k in data["kernels"]] == [k.best_s for k in profiled.kernels]
    unprofiled = vfuse.explain(_model, torch.randn(67, 131), torch.randn(131), torch.randn(131, 29))
    assert not unprofiled.profiled and "measured" not in unprofiled.to_text()


def test_with_measured_refuses_another_graphs_kernels(profiled: FusionReport) -> None:
    times = {k.name: 1e-6 for k in profiled.kernels}
    assert profiled.with_measured(times).time_measured_s == pytest.approx(len(times) * 1e-6)
    assert all(k.best_s is None for k in profiled.with_measured(times).kernels)  # a mapping has no fastest run
    with pytest.raises(ValueError, match="k9"):
        profiled.with_measured({**times, "k9": 1.0})


PROBE = """
<script>
(function () {
  var out = {};
  out.links = Array.from(document.querySelectorAll("#kernels a.measured")).map(function (a) {
    return [a.getAttribute("href"), a.textContent];
  });
  out.panel = document.getElementById("panel").textContent;
  document.getElementById("show-src").click();
  out.src = document.getElementById("src").hidden ? "" : document.getElementById("src").textContent;
  var pre = document.createElement("pre");
  pre.id = "probe-out";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>
"""


def test_html_links_measured_time_to_kernel_source(profiled: FusionReport, tmp_path: Path) -> None:
    page = profiled.to_html()
    assert "not profiled" not in page.split("<script")[0]
    browser = find_browser()
    if browser is None:
        pytest.skip("no Chromium found (apt-get install chromium) to render the HTML report")
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    gemm = profiled.kernels[1]
    cmd = [browser, *HEADLESS, f"--user-data-dir={tmp_path / 'dom'}", "--dump-dom"]
    run = subprocess.run(
        [*cmd, probe.resolve().as_uri() + f"#kernel={gemm.id}"], capture_output=True, text=True, timeout=60
    )
    found = re.search(r'<pre id="probe-out">(.*?)</pre>', run.stdout, re.DOTALL)
    assert found, f"the probe did not run: {run.stderr[-2000:]}"
    out = json.loads(html.unescape(found.group(1)))
    from vfuse.report.units import fmt_time

    assert out["links"] == [[f"#kernel={k.id}", fmt_time(k.measured_s)] for k in profiled.kernels]
    assert f"measured {fmt_time(gemm.measured_s)}" in out["panel"] and "predicted / measured" in out["panel"]
    assert f"void {gemm.name}(" in out["src"]  # the kernel's own generated C++
