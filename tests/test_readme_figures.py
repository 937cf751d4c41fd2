"""README's "What the simulator shows" quotes only figures that docs/benchmarks.md's
tables hold (issue 19): when benchmarks.md is regenerated, this test says which README
figure went stale (owner: docs)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## What the simulator shows"
# a figure: a decimal number, or a number followed by "x" or "%" (loads, ratios, shares);
# plain integers (seeds, slots, seconds, budgets) describe the regime, not a result
FIGURE = re.compile(r"(?<![\w.:])(\d+(?:\.\d+)?)(x|%)?(?![\w:])")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def readme_figures(text: str) -> list[str]:
    start = text.index(SECTION) + len(SECTION)
    end = text.find("\n## ", start)
    section = text[start:end if end >= 0 else None]
    section = re.sub(r"\[[^\]]*\]\([^)]*\)", "", section)  # links
    section = re.sub(r"`[^`]*`", "", section)  # code: names, not figures
    return [m.group(0) for m in FIGURE.finditer(section) if "." in m.group(1) or m.group(2)]


def table_numbers(text: str) -> set[float]:
    numbers: set[float] = set()
    for line in text.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        for cell in line.strip("|").split("|"):
            for raw in NUMBER.findall(cell):
                numbers.add(round(float(raw.replace(",", "")), 6))
    return numbers


def _value(figure: str) -> float:
    return round(float(figure.rstrip("x%")), 6)


def test_every_figure_the_readme_quotes_is_in_a_benchmarks_table() -> None:
    figures = readme_figures((ROOT / "README.md").read_text())
    tables = table_numbers((ROOT / "docs" / "benchmarks.md").read_text())
    assert len(figures) >= 4, f"the section quotes too few figures to check: {figures}"
    stale = [f for f in figures if _value(f) not in tables]
    assert not stale, f"README figures not in docs/benchmarks.md's tables: {stale}"


def test_the_checker_reads_figures_and_tables_as_meant() -> None:
    text = f"x\n{SECTION}\n\nGMAX earns **1.484x** at load 1.5 over 3 seeds, 2-3% of `p99.9` " \
           "([a](b.md#x-1.2)), mix 1:1:1.\n\n## Next\n1.9x\n"
    assert readme_figures(text) == ["1.484x", "1.5", "3%"]
    assert {1.484, 13466.0, 0.5} <= table_numbers(
        "| a | b |\n|---|---|\n| 1.50 | 13,466 / 0.5 / 1.484, 0.9 |\n")


def test_every_code_fence_in_the_docs_is_closed() -> None:
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        fences = [n for n, line in enumerate(path.read_text().splitlines(), 1)
                  if line.lstrip().startswith("```")]
        assert len(fences) % 2 == 0, f"{path.name}: an unclosed code fence (lines {fences})"
