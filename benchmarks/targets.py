"""The open issues' targets against the measured figures, for docs/BENCHMARKS.md.

``benchmarks/targets.toml`` lists each target: its issue, what it asks (``goal``, an operator and
a number), and where it is measured (a result page and the rows that measure it). The figure is
read from those rows, never typed in: a row's value, or a number its note carries (``pattern``, a
regular expression with one group; with two, the first over the second, e.g. kdalab's error over
fla's), the worst of several (``reduce``: min or max). A missed target must say why (``why``).
``report.py`` renders the table at the top of the page, and refuses a target whose page, rows or
pattern are gone, so the table cannot outlive the figures it reads.
"""

from __future__ import annotations

import fnmatch
import operator
import re
import tomllib
from pathlib import Path

TARGETS = Path(__file__).resolve().parent / "targets.toml"
OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}
KEYS = {"issue": int, "what": str, "goal": str, "page": str, "rows": list, "pattern": str,
        "reduce": str, "unit": str, "why": str}
REQUIRED = ("issue", "what", "goal", "page", "rows")


def load_targets(path: Path = TARGETS) -> list[dict]:
    """The targets of ``path``, their keys and goals checked (ValueError naming the target),
    each with its goal parsed (``op``, ``bound``)."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    targets = data.get("target", [])
    problems = []
    for i, t in enumerate(targets):
        where = f"{path.name}: target {i + 1} ({t.get('what', '?')})"
        problems += [f"{where}: {k} is missing" for k in REQUIRED if k not in t]
        problems += [f"{where}: unknown key {k!r}" for k in t if k not in KEYS]
        problems += [f"{where}: {k} must be {KEYS[k].__name__}" for k in t
                     if k in KEYS and not isinstance(t[k], KEYS[k])]
        if isinstance(t.get("goal"), str) and _goal(t["goal"]) is None:
            problems.append(f"{where}: goal {t['goal']!r} is not '<op> <number>' "
                            f"(op one of {', '.join(OPS)})")
        if t.get("reduce", "min") not in ("min", "max"):
            problems.append(f"{where}: reduce must be min or max")
        if isinstance(t.get("rows"), list) and not (
                t["rows"] and all(isinstance(g, str) for g in t["rows"])):
            problems.append(f"{where}: rows must be a non-empty list of globs")
        if isinstance(t.get("pattern"), str):
            try:
                groups = re.compile(t["pattern"]).groups
            except re.error as exc:
                problems.append(f"{where}: pattern {t['pattern']!r}: {exc}")
            else:
                if groups not in (1, 2):
                    problems.append(f"{where}: pattern {t['pattern']!r} has {groups} groups "
                                    "(one: the figure; two: a ratio)")
    if problems:
        raise ValueError("\n".join(problems))
    return [dict(t, **dict(zip(("op", "bound"), _goal(t["goal"])))) for t in targets]


def _goal(goal: str) -> tuple[str, float] | None:
    m = re.fullmatch(r"\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*", goal)
    if m is None:
        return None
    try:
        return m.group(1), float(m.group(2))
    except ValueError:
        return None


def measure(t: dict, pages: dict[str, dict]) -> tuple[float, str, str]:
    """(figure, unit, the row it came from, with the text the pattern matched) for target ``t``
    from the result pages (by name); ValueError where the page, a row or the pattern's number is
    not there."""
    page = pages.get(t["page"])
    if page is None:
        raise ValueError(f"target {t['what']!r}: no result page {t['page']!r}")
    rows = [r for r in page["rows"] if any(fnmatch.fnmatchcase(r["target"], g) for g in t["rows"])]
    if not rows:
        raise ValueError(f"target {t['what']!r}: no row of {t['page']} matches {t['rows']}")
    found = []  # (figure, row)
    for r in rows:
        if "pattern" not in t:
            found.append((float(r["value"]), r))
            continue
        for m in re.finditer(t["pattern"], r.get("note", "")):
            nums = [float(x) for x in m.groups()]
            found.append((nums[0] / nums[1] if len(nums) == 2 else nums[0],
                          dict(r, target=f"{r['target']} (\"{m.group(0).strip()}\")")))
    if not found:
        raise ValueError(f"target {t['what']!r}: pattern {t['pattern']!r} finds no number in "
                         f"the notes of {t['page']}'s rows {t['rows']}")
    if len(found) > 1 and "reduce" not in t:
        raise ValueError(f"target {t['what']!r}: {len(found)} figures and no reduce")
    figure, row = (min if t.get("reduce", "min") == "min" else max)(found, key=lambda f: f[0])
    return figure, t.get("unit", row["unit"]), row["target"]


def evaluate(targets: list[dict], results: list[dict]) -> list[dict]:
    """Each target with its figure, the row it came from and whether it is met; ValueError for
    a missed target without a reason."""
    pages = {b["benchmark"]: b for b in results}
    out, problems = [], []
    for t in targets:
        try:
            figure, unit, row = measure(t, pages)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        met = OPS[t["op"]](figure, t["bound"])
        if not met and not t.get("why"):
            problems.append(f"target {t['what']!r}: missed ({figure:.4g} {unit}, goal "
                            f"{t['goal']}) and no why")
        out.append(dict(t, figure=figure, unit=unit, row=row, met=met))
    if problems:
        raise ValueError("\n".join(problems))
    return out
