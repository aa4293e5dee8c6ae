"""The HTML report of a 6-block transformer in headless Chromium: the screenshot shows the graph;
a probe script run in the page after report.js searches for a module, expands a kernel, expands
all, filters the decisions and measures every drawn box (no two overlap).

Skipped when no Chromium is installed (Debian: `apt-get install chromium`). The PNG is decoded
with zlib and struct only, and the probe's findings come back through `--dump-dom`, so the checks
add no browser driver or image library to the dependencies.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import pytest
from tests.report.encoder import example

import vfuse
from vfuse.report import FusionReport
from vfuse.report.colours import kernel_fill

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WIDTH, HEIGHT = 1400, 900


def find_browser() -> str | None:
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


HEADLESS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip


def screenshot(browser: str, page: Path, png: Path, profile: Path, fragment: str = "") -> None:
    cmd = [
        browser, *HEADLESS, f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={WIDTH},{HEIGHT}",
        page.resolve().as_uri() + fragment,
    ]  # fmt: skip
    subprocess.run(cmd, capture_output=True, timeout=60, check=False)


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit non-interlaced RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, "only 8-bit RGB/RGBA, not interlaced"
    return width, height, unfilter(zlib.decompress(idat), width, height, 4 if colour == 6 else 3)


def unfilter(raw: bytes, width: int, height: int, bpp: int) -> list[bytes]:
    stride, rows, prev = width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        ftype, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 0xFF
            elif ftype == 2:
                line[i] = (line[i] + b) & 0xFF
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return rows


def colours(rows: list[bytes], bpp: int) -> Counter[tuple[int, int, int]]:
    """Pixel colour counts on every other pixel of every other row (plenty to judge a page)."""
    return Counter((r[i], r[i + 1], r[i + 2]) for r in rows[::2] for i in range(0, len(r), 2 * bpp))


@pytest.fixture(scope="module")
def browser() -> str:
    path = find_browser()
    if path is None:
        pytest.skip("no Chromium found (apt-get install chromium) to render the HTML report")
    return path


Colours = Counter[tuple[int, int, int]]


def shot_colours(browser: str, page: Path, folder: Path, fragment: str = "") -> Colours:
    folder.mkdir()
    png = folder / "shot.png"
    screenshot(browser, page, png, folder / "profile", fragment)  # a fresh profile: no restored state
    assert png.exists(), "Chromium wrote no screenshot"
    width, height, rows = decode_png(png.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    return colours(rows, len(rows[0]) // width)


def near(counts: Colours, hex_colour: str, tolerance: int = 6) -> int:
    """How many sampled pixels have (about) this colour."""
    want = [int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]
    return sum(n for c, n in counts.items() if sum(abs(x - y) for x, y in zip(c, want, strict=True)) <= tolerance)


# Chromium takes seconds to start: one page, shot once and read once through the DOM.
@pytest.fixture(scope="module")
def encoder_report() -> FusionReport:
    model, x = example(blocks=6)
    return vfuse.explain(model, x, freeze=True)


@pytest.fixture(scope="module")
def page(encoder_report: FusionReport, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "report.html"
    encoder_report.to_html(path)
    return path


def test_report_renders_in_chromium(browser: str, page: Path) -> None:
    shot = shot_colours(browser, page, page.parent / "plain")
    background, most = shot.most_common(1)[0]
    assert len(shot) > 50, "too few colours: blank page?"
    assert most < 0.9 * sum(shot.values()), f"page is mostly {background}"
    # The boxes of the first kernels are on screen in their colours: the SVG graph was drawn.
    assert near(shot, kernel_fill(0)) > 500
    assert near(shot, kernel_fill(1)) > 500


# Run in the page after report.js: search, expand, filter, and measure every drawn box.
PROBE = """
<script>
(function () {
  function rects(sel) {
    return Array.from(document.querySelectorAll(sel)).filter(function (e) {
      return e.getClientRects().length > 0;
    }).map(function (e) { var r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; });
  }
  function overlaps(list) {
    var n = 0;
    for (var i = 0; i < list.length; i++) for (var j = i + 1; j < list.length; j++) {
      var a = list[i], b = list[j];
      if (a[0] < b[2] - 0.5 && b[0] < a[2] - 0.5 && a[1] < b[3] - 0.5 && b[1] < a[3] - 0.5) n++;
    }
    return n;
  }
  function within() {  // overlaps among the node boxes of each open kernel
    return Array.from(document.querySelectorAll(".inner")).reduce(function (n, g) {
      var sel = '.inner[data-id="' + g.dataset.id + '"] .node > rect';
      return n + (g.style.display === "none" ? 0 : overlaps(rects(sel)));
    }, 0);
  }
  var out = {}, boxes = ".kernel > rect, .inner > rect.panel";
  out.kernels = document.querySelectorAll(".kernel").length;
  out.collapsed = overlaps(rects(boxes));
  var search = document.getElementById("search");
  search.value = "layers.3.attn.norm";
  search.dispatchEvent(new Event("input"));
  out.matches = Array.from(document.querySelectorAll(".kernel.match")).map(function (e) { return +e.dataset.id; });
  out.count = document.getElementById("matches").textContent;
  var view = document.getElementById("graphbox").getBoundingClientRect();
  var hit = document.querySelector(".kernel.match").getBoundingClientRect();
  out.inView = hit.top >= view.top && hit.bottom <= view.bottom && hit.left >= view.left && hit.right <= view.right;
  var toggle = document.querySelector('.kernel[data-id="' + out.matches[0] + '"] .toggle');
  toggle.dispatchEvent(new MouseEvent("click", { bubbles: true }));
  out.open = rects('.inner[data-id="' + out.matches[0] + '"] .node').length;
  out.panel = document.getElementById("panel").textContent;
  out.expanded = overlaps(rects(boxes));
  document.getElementById("expand-all").click();
  out.allOpen = rects(".inner > rect.panel").length;
  out.expandedAll = overlaps(rects(boxes));
  out.nodesOverlap = within();
  var verdict = document.getElementById("f-verdict");
  verdict.value = "rejected";
  verdict.dispatchEvent(new Event("change"));
  out.rejectedRows = rects("#decisions tbody tr").length;
  var pre = document.createElement("pre");
  pre.id = "probe-out";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>
"""


@pytest.fixture(scope="module")
def probed(browser: str, page: Path) -> dict:
    probe = page.parent / "probe.html"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    cmd = [browser, *HEADLESS, f"--user-data-dir={page.parent / 'dom'}", f"--window-size={WIDTH},{HEIGHT}"]
    run = subprocess.run([*cmd, "--dump-dom", probe.resolve().as_uri()], capture_output=True, text=True, timeout=60)
    found = re.search(r'<pre id="probe-out">(.*?)</pre>', run.stdout, re.DOTALL)
    assert found, f"the probe did not run: {run.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1)))


def test_six_blocks_are_readable(probed: dict, encoder_report: FusionReport) -> None:
    assert probed["kernels"] == len(encoder_report.kernels) > 60
    assert probed["collapsed"] == 0, "kernel boxes overlap"
    assert probed["expanded"] == 0 and probed["expandedAll"] == 0, "an expanded kernel overlaps other boxes"
    assert probed["allOpen"] == probed["kernels"] and probed["nodesOverlap"] == 0


def test_search_finds_a_module(probed: dict, encoder_report: FusionReport) -> None:
    expected = [k.id for k in encoder_report.kernels if "layers.3.attn.norm" in k.modules]
    assert probed["matches"] == expected and len(expected) >= 1
    assert encoder_report.kernels[expected[0]].pattern == "LayerNorm row kernel"
    assert probed["count"] == f"{len(expected)} kernel{'s' if len(expected) > 1 else ''} match"
    assert probed["inView"], "the graph did not scroll to the match"


def test_a_collapsed_kernel_expands(probed: dict, encoder_report: FusionReport) -> None:
    k = encoder_report.kernels[probed["matches"][0]]
    assert probed["open"] == len(k.nodes) + len(k.inputs)  # its ops and the values it reads, drawn
    assert "LayerNorm row kernel" in probed["panel"] and "layers.3.attn.norm" in probed["panel"]
    assert "generated C++" in probed["panel"]


def test_decisions_filter(probed: dict, encoder_report: FusionReport) -> None:
    assert probed["rejectedRows"] == len(encoder_report.rejected) > 0
