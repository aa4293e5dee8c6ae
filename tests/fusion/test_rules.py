"""The rule enum is the one spelling of every fusion rule: the docs list each with its meaning."""

from __future__ import annotations

from pathlib import Path

from vfuse.fusion.rules import Rule

DOCS = Path(__file__).resolve().parents[2] / "docs" / "report.md"


def test_every_rule_is_documented_with_its_meaning() -> None:
    text = DOCS.read_text()
    missing = [r.value for r in Rule if f"| `{r.value}` | {r.meaning} |" not in text]
    assert not missing, f"docs/report.md lacks these rules (or their meaning changed): {missing}"


def test_rules_print_as_their_names() -> None:
    assert str(Rule.MULTI_PASS_ROW) == "multi-pass-row" == Rule.MULTI_PASS_ROW.value
    assert Rule("two-contractions") is Rule.TWO_CONTRACTIONS
    assert len({r.value for r in Rule}) == len(Rule)
