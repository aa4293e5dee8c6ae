"""Render the HTML report in headless Chromium and check the screenshot shows the graph.

Skipped when no Chromium is installed (Debian: `apt-get install chromium`). The PNG is decoded
with zlib and struct only, so the check adds no image library to the dependencies.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import pytest

from vfuse.fusion.plan import FusionPlan
from vfuse.ir import Graph
from vfuse.report import build_report
from vfuse.report.colours import kernel_fill

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WIDTH, HEIGHT = 1400, 900


def find_browser() -> str | None:
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def screenshot(browser: str, page: Path, png: Path, profile: Path, fragment: str = "") -> None:
    cmd = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={WIDTH},{HEIGHT}",
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


# Chromium takes seconds to start: each page state is shot once and shared by the tests.
@pytest.fixture(scope="module")
def page(graph: Graph, plan: FusionPlan, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "report.html"
    build_report(graph, plan, "h100").to_html(path)
    return path


@pytest.fixture(scope="module")
def before(browser: str, page: Path) -> Colours:
    return shot_colours(browser, page, page.parent / "plain")


@pytest.fixture(scope="module")
def after(browser: str, page: Path) -> Colours:
    return shot_colours(browser, page, page.parent / "selected", "#node=g")


def test_report_renders_in_chromium(before: Colours) -> None:
    background, most = before.most_common(1)[0]
    assert len(before) > 50, "too few colours: blank page?"
    assert most < 0.9 * sum(before.values()), f"page is mostly {background}"
    # The boxes of kernels 0 and 1 are on screen in their colours: the SVG graph was drawn.
    assert near(before, kernel_fill(0)) > 500
    assert near(before, kernel_fill(1)) > 500


def test_selecting_a_node_shows_its_decisions(before: Colours, after: Colours) -> None:
    # "#node=g" makes the script pin %g: its decision cards, with green (accepted) and red
    # (rejected) left borders, appear in the side panel. More of both colours than on the
    # unselected page proves that the inline script ran and read the data block.
    assert near(after, ACCEPTED_GREEN, 10) > near(before, ACCEPTED_GREEN, 10) + 60
    assert near(after, REJECTED_RED, 10) > near(before, REJECTED_RED, 10) + 40
    # ...the rows of those decisions in the table below are highlighted, and %g has the
    # selection outline.
    assert near(after, HIGHLIGHT_ROW, 3) > near(before, HIGHLIGHT_ROW, 3) + 5000
    assert near(before, SELECTED_BLUE, 10) == 0
    assert near(after, SELECTED_BLUE, 10) > 100


# Colours from template.html: --ok, --no, a highlighted table row, the selected node's outline.
ACCEPTED_GREEN, REJECTED_RED, HIGHLIGHT_ROW, SELECTED_BLUE = "#15803d", "#b91c1c", "#fef9c3", "#2563eb"
