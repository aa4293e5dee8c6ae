"""The report as one self-contained HTML page: a kernel graph laid out by Graphviz, kernel and
decision tables, each kernel's generated C++.

Everything is inline (CSS from `template.html`, JS from `report.js`, data as JSON) so the file
opens offline and can be attached to an issue. Python lays the graph out (`layout.py`) and draws
it (`svg.py`); the script expands kernels in place, searches, filters the decisions and shows
the details of what is selected.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from typing import TYPE_CHECKING, Any

from vfuse.fusion.plan import Decision
from vfuse.report.colours import kernel_fill, kernel_stroke
from vfuse.report.data import decision_data
from vfuse.report.layout import layout_all
from vfuse.report.rows import BASELINE, RunKind
from vfuse.report.source import kernel_sources
from vfuse.report.svg import graph_svg, inner_spec, kernel_spec
from vfuse.report.units import fmt_bytes, fmt_names, fmt_ratio, fmt_time, op_label

if TYPE_CHECKING:
    from vfuse.report.model import FusionReport, KernelRow

NOT_PROFILED = "not profiled: vfuse.explain(..., profile=N), g.profile(...) or `vfuse profile` measure each kernel"
SOURCE_LIMIT = 40_000  # characters of one kernel's C++ embedded in the page


def render_html(report: FusionReport) -> str:
    kernels, *inners = layout_all([kernel_spec(report), *(inner_spec(report, k) for k in report.kernels)])
    parts = {
        "title": html.escape(f"vfuse fusion report ({report.target}{', ' + report.isa if report.isa else ''})"),
        "summary": _summary_html(report),
        "notes": _notes_html(report, kernels.engine),
        "svg": graph_svg(report, kernels, inners),
        "kernels": _kernel_table_html(report),
        "rules": _rule_options(report.decisions),
        "decisions": _decision_table_html(report),
        "data": _json_for_script(page_data(report, kernels.engine)),
        "script": _asset("report.js"),
    }
    # One pass, so text inside the inserted parts (names, data) is never taken for a placeholder.
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _asset("template.html"))


def _asset(name: str) -> str:
    return resources.files("vfuse.report").joinpath(name).read_text(encoding="utf-8")


def _summary_html(report: FusionReport) -> str:
    speed = fmt_ratio(report.time_unfused_s, report.time_fused_s)
    fallbacks = ", ".join(f"{k} x{v}" for k, v in report.fallbacks.items()) or "none"
    split = len(report.split_groups)
    cards = [
        (
            "what runs",
            _count(report.num_kernels, "kernel"),
            f"{_count(report.native_calls, 'native call')}, {_count(report.torch_calls, 'torch call')}",
        ),
        (
            "planned",
            f"{report.num_ops} ops → {report.num_groups} groups",
            f"{_count(split, 'group')} {'runs' if split == 1 else 'run'} as several kernels"
            if split
            else "one kernel per group",
        ),
        (
            "DRAM bytes (predicted)",
            f"{fmt_bytes(report.bytes_unfused)} → {fmt_bytes(report.bytes_fused)}",
            f"lower bound {fmt_bytes(report.bytes_lower_bound)}",
        ),
        (
            "predicted time",
            f"{fmt_time(report.time_unfused_s)} → {fmt_time(report.time_fused_s)}",
            f"{speed} {BASELINE}" if speed else "unfused time not estimated",
        ),
        ("decisions", f"{len(report.accepted)} ✓ / {len(report.rejected)} ✗", "accepted / rejected merges"),
        ("torch fallbacks", str(sum(report.fallbacks.values())), fallbacks),
    ]
    if report.profiled:
        cards.insert(4, ("measured time", fmt_time(report.time_measured_s), "kernels, median of each (profiled)"))
    return "".join(
        f'<div class="card"><div class="k">{html.escape(k)}</div><div class="v">{html.escape(v)}</div>'
        f'<div class="s">{html.escape(s)}</div></div>'
        for k, v, s in cards
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _notes_html(report: FusionReport, engine: str) -> str:
    notes = []
    if engine != "dot":
        notes.append(
            "Graphviz <code>dot</code> was not found (or failed): the graph uses a simple fallback layout whose"
            " edges may cross boxes. Install Graphviz (apt-get install graphviz) for a readable layout."
        )
    if report.note:
        notes.append(f"The reference executor runs this graph: {html.escape(report.note)}.")
    return "".join(f'<p class="note">{n}</p>' for n in notes)


def _kernel_table_html(report: FusionReport) -> str:
    heads = ("#", "kernel", "runs", "pattern", "module", "ops", "predicted", "measured", "bytes", "bound")
    head = "".join(f"<th>{h}</th>" for h in (*heads, "reads", "writes"))
    rows = "".join(_kernel_row_html(report, k) for k in report.kernels)
    return f"<table id='kernels'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _kernel_row_html(report: FusionReport, k: KernelRow) -> str:
    swatch = f'<span class="swatch" style="background:{kernel_fill(k.id)};border-color:{kernel_stroke(k.id)}"></span>'
    runs = k.runs.value + (f" ({k.segment})" if k.segment else "")
    cells = [
        f"<td>{swatch}{k.id}</td>",
        f'<td><a href="#kernel={k.id}" class="code">{html.escape(k.name)}</a></td>',
        f"<td>{html.escape(runs)}</td>",
        f"<td>{html.escape(k.pattern)}</td>",
        f"<td>{html.escape(k.module)}</td>",
        f'<td class="ops">{html.escape(report.op_chain(k))}</td>',
        _num(fmt_time(k.time_s)),
        _measured_html(k),
        _num(fmt_bytes(k.bytes)),
        f"<td>{html.escape(k.bound)}</td>",
        f"<td>{html.escape(fmt_names(k.inputs, 3))}</td>",
        f"<td>{html.escape(fmt_names(k.outputs, 3))}</td>",
    ]
    return f'<tr data-kernel="{k.id}">' + "".join(cells) + "</tr>"


def _measured_html(k: KernelRow) -> str:
    """The measured time, linking to the kernel's details (its source and both times)."""
    if k.measured_s is None:
        return _num("-", NOT_PROFILED)
    ratio = f"predicted / measured = {k.time_s / k.measured_s:.2f}" if k.time_s and k.measured_s else ""
    tip = f' title="{html.escape(ratio)}"' if ratio else ""
    link = f'<a href="#kernel={k.id}" class="measured"{tip}>{html.escape(fmt_time(k.measured_s))}</a>'
    return f'<td class="num">{link}</td>'


def _num(text: str, title: str = "") -> str:
    # Numbers stay on one line and right-aligned so that a column reads as a column.
    tip = f' title="{html.escape(title)}"' if title else ""
    return f'<td class="num"{tip}>{html.escape(text)}</td>'


def _rule_options(decisions: tuple[Decision, ...]) -> str:
    counts: dict[str, int] = {}
    for d in decisions:
        counts[d.rule.value] = counts.get(d.rule.value, 0) + 1
    return "".join(
        f'<option value="{html.escape(r)}">{html.escape(r)} ({n})</option>'
        for r, n in sorted(counts.items(), key=lambda kv: -kv[1])
    )


def _decision_table_html(report: FusionReport) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("#", "verdict", "producer", "consumer", "rule", "gain", "reason"))
    rows = "".join(_decision_row_html(i, d) for i, d in enumerate(report.decisions))
    return f"<table id='decisions'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _decision_row_html(i: int, d: Decision) -> str:
    verdict = ("accepted" if d.accepted else "rejected") + (" (horizontal)" if d.horizontal else "")
    cells = [
        f"<td>{i}</td>",
        f'<td><span class="{"ok" if d.accepted else "no"}">{verdict}</span></td>',
        f"<td>{html.escape(fmt_names(d.producer))}</td>",
        f"<td>{html.escape(fmt_names(d.consumer))}</td>",
        f'<td title="{html.escape(d.rule.meaning)}">{html.escape(d.rule.value)}</td>',
        _num("-" if d.gain_s is None else fmt_time(d.gain_s)),
        f"<td>{html.escape(d.reason)}</td>",
    ]
    words = " ".join((*d.producer, *d.consumer)).lower()
    return (
        f'<tr data-decision="{i}" data-verdict="{"accepted" if d.accepted else "rejected"}"'
        f' data-rule="{html.escape(d.rule.value)}" data-nodes="{html.escape(words)}">' + "".join(cells) + "</tr>"
    )


def page_data(report: FusionReport, engine: str) -> dict[str, Any]:
    code = kernel_sources(report.source, [k.name for k in report.kernels]) if report.source else {}
    return {
        "layout": engine,
        "kernels": [_kernel_data(report, k, code.get(k.name, "")) for k in report.kernels],
        "nodes": {n.name: _node_data(report, n.name) for n in report.graph.nodes},
        "decisions": [_decision_data(d) for d in report.decisions],
        "notProfiled": NOT_PROFILED,
    }


def _kernel_data(report: FusionReport, k: KernelRow, code: str) -> dict[str, Any]:
    if len(code) > SOURCE_LIMIT:
        code = code[:SOURCE_LIMIT] + f"\n// ... cut at {SOURCE_LIMIT} characters: the whole file is 06_kernels.cpp"
    siblings = report.split_groups.get(k.group, ())
    words = (k.name, f"#{k.id}", k.pattern, k.label, *k.modules, *k.nodes, *k.ops)
    return {
        "id": k.id,
        "name": k.name,
        "runs": k.runs.value,
        "segment": k.segment,
        "group": k.group,
        "siblings": [i for i in siblings if i != k.id],
        "label": k.label,
        "pattern": k.pattern,
        "module": k.module,
        "modules": list(k.modules),
        "nodes": list(k.nodes),
        "time": fmt_time(k.time_s),
        "bytes": fmt_bytes(k.bytes),
        "bound": k.bound,
        "reads": list(k.inputs),
        "writes": list(k.outputs),
        "note": k.note,
        "measured": None if k.measured_s is None else fmt_time(k.measured_s),
        "ratio": None if not (k.measured_s and k.time_s) else f"{k.time_s / k.measured_s:.2f}",
        "source": code,
        "native": k.runs is not RunKind.TORCH,
        "search": " ".join(words).lower(),
    }


def _node_data(report: FusionReport, name: str) -> dict[str, Any]:
    n = report.graph[name]
    src = report.sources.get(name)
    return {
        "op": op_label(n),
        "type": str(n.type),
        "bytes": fmt_bytes(n.type.nbytes),
        "kernels": [k.id for k in report.kernels_of(name)],
        "module": src.label if src is not None else "",
        "line": src.line if src is not None else "",
        "output": report.graph.is_output(name),
    }


def _decision_data(d: Decision) -> dict[str, Any]:
    data = decision_data(d)
    data["gain"] = "-" if d.gain_s is None else fmt_time(d.gain_s)
    return data


def _json_for_script(data: dict[str, Any]) -> str:
    # "</" inside a <script> would end it early; "<\/" is the same string to JSON.
    return json.dumps(data, default=str, ensure_ascii=False).replace("</", "<\\/")
