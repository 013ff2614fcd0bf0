"""A benchmark result as a PNG chart (matplotlib, ``pip install 'tectofs[bench]'``).

On top, the targets (met in green, NOT met in red); below, one panel of horizontal bars per
kind of figure: throughput (GB/s or ops/s) and, on an axis of its own, latencies in seconds,
never drawn as a throughput of 0. Baselines (no tectofs) are grey, tectofs blue, latencies
orange, with a legend.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tectofs.benchmarks.report import Target, numeric, show, targets_of, verdict

MiB = 1 << 20
BASELINE_COLOUR, TECTOFS_COLOUR, LATENCY_COLOUR = "#9a9a9a", "#4C72B0", "#DD8452"
MET_COLOUR, UNMET_COLOUR = "#2ca02c", "#d62728"


@dataclass(frozen=True)
class Panel:
    """One axis of bars: ``labels[i]`` measured ``values[i]`` in ``unit``."""

    title: str
    unit: str
    labels: list[str]
    values: list[float]
    colour: Callable[[str], str]  # a bar's colour, from its label
    legend: list[tuple[str, str]]  # (text, colour), shown for the colours drawn


def is_baseline(label: str) -> bool:
    """A row measured without tectofs: a local file or directory, DCP or torch.save on local disk."""
    text = label.lower()
    return "local" in text or text.startswith("baseline")


def draw_chart(result: Mapping[str, Any], path: str, title: str) -> str | None:
    """A PNG of the result; returns the path, or None when matplotlib is missing or there is
    nothing to draw. See ``chart_figure``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart (pip install 'tectofs[bench]')", file=sys.stderr)
        return None
    figure = chart_figure(plt, result, title)
    if figure is None:
        return None
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def chart_figure(plt: Any, result: Mapping[str, Any], title: str) -> Any:
    """The figure ``draw_chart`` saves (None: nothing to draw): the targets on top, then one
    :class:`Panel` per kind of figure."""
    if result.get("benchmark") == "tree":
        return _tree_figure(plt, result, title)
    if result.get("benchmark") == "fuse_bindings":
        return _bindings_figure(plt, result, title)
    burst = result.get("benchmark") == "burst"
    panels = _burst_panels(result) if burst else _row_panels(result)
    if not panels:
        return None
    targets = targets_of(result)
    heights = [0.28 * len(targets) + 0.3] if targets else []
    heights += [0.42 * max(len(p.labels), 2) + 1.0 for p in panels]
    figure = plt.figure(figsize=(10, sum(heights) + 0.9), layout="constrained")
    grid = figure.add_gridspec(len(heights), 1, height_ratios=heights)
    row = 0
    if targets:
        _targets_axis(figure.add_subplot(grid[0]), targets)
        row = 1
    for i, panel in enumerate(panels):
        axis = figure.add_subplot(grid[row + i])
        colours = [panel.colour(label) for label in panel.labels]
        bars = axis.barh(panel.labels, panel.values, color=colours)
        axis.invert_yaxis()
        axis.bar_label(bars, fmt="%.3g", padding=3)
        axis.set_xlabel(panel.unit)
        axis.set_title(panel.title, fontsize=9, loc="left")
        axis.margins(x=0.15)
        legend = [(label, colour) for label, colour in panel.legend if colour in colours]
        axis.legend(handles=_legend_handles(legend), fontsize=8, loc="lower right")
    if burst:
        title += (f": {result.get('ranks')} ranks x {(result.get('shard_bytes') or 0) / MiB:g} MiB, "
                  f"errors {result.get('error_count', 0)}")
    ratios = result.get("ratios") or {}
    subtitle = "; ".join(f"{k}: {v}" for k, v in list(ratios.items())[:4])
    figure.suptitle(title + (f"\n{subtitle}" if subtitle else ""), fontsize=9)
    return figure


def _legend_handles(entries: list[tuple[str, str]]) -> list[Any]:
    from matplotlib.patches import Patch

    return [Patch(color=colour, label=label) for label, colour in entries]


def _targets_axis(axis: Any, targets: list[Target]) -> None:
    axis.axis("off")
    step = 1.0 / max(1, len(targets))
    for i, t in enumerate(targets):
        measured = "" if t.get("measured") is None else f": {show(t['measured'])}"
        text = f"target {t['name']}{measured} (needs {t['target']}): {verdict(t['met'])}"
        axis.text(0.0, 1.0 - (i + 0.5) * step, text, va="center", fontsize=9,
                  color=MET_COLOUR if t["met"] else UNMET_COLOUR, fontweight="normal" if t["met"] else "bold")


def _row_panels(result: Mapping[str, Any]) -> list[Panel]:
    """Rows split by what they measured: a rate (GB/s, ops/s) or only a time (seconds)."""
    rows = result.get("rows") or (result.get("metadata") or {}).get("rows") or []
    if not rows:
        return []
    keys = list(rows[0])
    label_key = next((k for k in keys if isinstance(rows[0][k], str)), keys[0])
    rate_key = next((k for k in keys if "/s" in k and any(numeric(r.get(k)) is not None for r in rows)), None)
    time_key = next((k for k in keys if (k.endswith("_s") or k.endswith(" s")) and
                     any(numeric(r.get(k)) is not None for r in rows)), None)
    rates: list[tuple[str, float]] = []
    times: list[tuple[str, float]] = []
    for r in rows:
        rate = None if rate_key is None else numeric(r.get(rate_key))
        seconds = None if time_key is None else numeric(r.get(time_key))
        if rate is not None:
            rates.append((str(r[label_key]), rate))
        elif seconds is not None:
            times.append((str(r[label_key]), seconds))

    def colour(label: str) -> str:
        return BASELINE_COLOUR if is_baseline(label) else TECTOFS_COLOUR

    panels = []
    if rates:
        unit = f"{rate_key} (GB = 10^9 bytes)" if "GB/s" in str(rate_key) else str(rate_key)
        panels.append(Panel("throughput (higher is better)", unit, [n for n, _ in rates], [v for _, v in rates],
                            colour, [("baseline (no tectofs)", BASELINE_COLOUR), ("tectofs", TECTOFS_COLOUR)]))
    if times:
        panels.append(Panel("latency (lower is better)", f"seconds ({time_key})", [n for n, _ in times],
                            [v for _, v in times],
                            lambda label: BASELINE_COLOUR if is_baseline(label) else LATENCY_COLOUR,
                            [("baseline (no tectofs)", BASELINE_COLOUR), ("tectofs latency", LATENCY_COLOUR)]))
    return panels


def _burst_panels(result: Mapping[str, Any]) -> list[Panel]:
    base = result.get("baseline") or {}
    phases = result.get("phases") or {}
    save, load = phases.get("save") or {}, phases.get("load") or {}
    ranks = result.get("ranks")
    measured = [("1 client write (baseline)", base.get("write_GBps")), ("1 client read (baseline)", base.get("read_GBps")),
                (f"{ranks} ranks save", save.get("aggregate_GBps")), (f"{ranks} ranks load", load.get("aggregate_GBps"))]
    rates = [(n, v) for n, v in ((n, numeric(v)) for n, v in measured) if v is not None]
    times = []
    for name, series in (("save", save.get("latency_s")), ("close/commit", save.get("close_latency_s")),
                         ("commit RPC", save.get("rpc_commit_s")), ("load", load.get("latency_s"))):
        for q in ("p50", "p99", "max"):
            value = numeric((series or {}).get(q))
            if value is not None:
                times.append((f"{name} {q}", value))
    panels = []
    if rates:
        panels.append(Panel("aggregate throughput vs. one large client (higher is better)",
                            "GB/s (10^9 bytes/s, aggregate)", [n for n, _ in rates], [v for _, v in rates],
                            lambda label: BASELINE_COLOUR if "baseline" in label else TECTOFS_COLOUR,
                            [("baseline: one client, one large file", BASELINE_COLOUR),
                             ("burst of ranks", TECTOFS_COLOUR)]))
    if times:
        panels.append(Panel(f"per-rank latency, {ranks} ranks (save, load: from the barrier; lower is better)",
                            "seconds", [n for n, _ in times], [v for _, v in times],
                            lambda label: LATENCY_COLOUR, [("tectofs latency", LATENCY_COLOUR)]))
    return panels


SYSTEM_COLOURS = {"local": BASELINE_COLOUR, "tectofs": TECTOFS_COLOUR, "juicefs": "#55A868", "seaweedfs": "#C44E52"}
VARIANT_COLOURS = ("#8FAADC", "#2E4A7D", "#B8C9E8", "#1B2F52")  # tectofs-VARIANT systems, other blues, in turn


def system_colours(systems: list[str]) -> dict[str, str]:
    """A colour per system of a tree result: its own for those of ``SYSTEM_COLOURS``, the
    next of ``VARIANT_COLOURS`` (round again if need be) for any other (a tectofs variant)."""
    variants = itertools.cycle(VARIANT_COLOURS)
    return {name: SYSTEM_COLOURS.get(name) or next(variants) for name in systems}


def _tree_figure(plt: Any, result: Mapping[str, Any], title: str) -> Any:
    """``tectofs bench tree``: per step, one bar per system (seconds, log scale); beside it, the
    metadata rates per system; the targets in the title."""
    rows = result.get("rows") or []
    meta_rows = (result.get("metadata") or {}).get("rows") or []
    systems = [n for n in dict.fromkeys(r["system"] for r in rows)
               if any(r["system"] == n and numeric(r.get("median s")) for r in rows)]
    if not systems:
        return None
    colours = system_colours(systems)
    steps = list(dict.fromkeys(r["step"] for r in rows))
    ops = list(dict.fromkeys(r["op"] for r in meta_rows))
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 0.5 * len(steps) * len(systems) / 2 + 2.5),
                                         layout="constrained", gridspec_kw={"width_ratios": [3, 2]})
    for axis, rows_, key, value_key, labels in ((left, rows, "step", "median s", steps),
                                                 (right, meta_rows, "op", "ops/s (median)", ops)):
        height = 0.8 / len(systems)
        for i, name in enumerate(systems):
            values = {r[key]: numeric(r.get(value_key)) for r in rows_ if r["system"] == name}
            positions = [n + i * height for n in range(len(labels))]
            bars = axis.barh(positions, [values.get(label) or 0.0 for label in labels], height=height,
                             color=colours[name], label=name)
            axis.bar_label(bars, labels=[_figure(values.get(label)) for label in labels], padding=2, fontsize=7)
        axis.set_yticks([n + 0.4 - height / 2 for n in range(len(labels))], labels)
        axis.invert_yaxis()
        axis.set_xscale("log")
        axis.margins(x=0.2)
    left.set_xlabel("seconds, median (log scale; lower is better)")
    left.set_title("tree steps", fontsize=9, loc="left")
    right.set_xlabel("operations per second, median (log scale; higher is better)")
    right.set_title(f"{result.get('files')} empty files, one process", fontsize=9, loc="left")
    left.legend(fontsize=8, loc="lower right")
    targets = targets_of(result)
    lines = [f"{title}: {result.get('tree_files', 0):,} files, {(result.get('tree_bytes') or 0) / 1e6:.0f} MB, "
             f"median of {result.get('rounds')} round(s), cold = {result.get('cold')}"]
    lines += [f"target {t['name']}: {show(t.get('measured'))} (needs {t['target']}): {verdict(t['met'])}"
              for t in targets]
    figure.suptitle("\n".join(lines), fontsize=9)
    return figure


def _figure(value: float | None) -> str:
    """A bar's label: 4 significant digits, whole numbers with thousands separators from 1,000."""
    return "-" if value is None else f"{value:,.0f}" if value >= 1000 else f"{value:.4g}"


def _bindings_figure(plt: Any, result: Mapping[str, Any], title: str) -> Any:
    """``tectofs bench fuse-bindings``: a panel per step, a bar per binding (its median, labelled
    with its speed relative to the baseline), the baseline grey."""
    rows = result.get("rows") or []
    names = [n for n in result.get("bindings") or {} if any(r["binding"] == n and numeric(r.get("median"))
                                                            for r in rows)]
    if not names:
        return None
    steps = list(result.get("steps") or dict.fromkeys(r["step"] for r in rows))
    baseline = result.get("baseline")
    columns = 3
    figure, axes = plt.subplots((len(steps) + columns - 1) // columns, columns, squeeze=False,
                                figsize=(13, 0.35 * len(names) * ((len(steps) + columns - 1) // columns) + 2.5),
                                layout="constrained")
    for axis, step in zip(axes.flat, steps):
        by = {r["binding"]: r for r in rows if r["step"] == step}
        values = [numeric(by[n].get("median")) if n in by else None for n in names]
        bars = axis.barh(names, [v or 0.0 for v in values],
                         color=[BASELINE_COLOUR if n == baseline else TECTOFS_COLOUR for n in names])
        axis.invert_yaxis()
        speed = {n: numeric(by[n].get(f"speed vs {baseline}")) if n in by else None for n in names}
        axis.bar_label(bars, labels=[_figure(v) + ("" if n == baseline or speed[n] is None else f" ({speed[n]:.2g}x)")
                                     for n, v in zip(names, values)], padding=2, fontsize=7)
        unit = str(next((r["unit"] for r in by.values()), ""))
        axis.set_title(f"{step} ({'lower' if unit == 's' else 'higher'} is better)", fontsize=9, loc="left")
        axis.set_xlabel(unit)
        axis.margins(x=0.35)
        axis.tick_params(axis="y", labelsize=8)
    for axis in list(axes.flat)[len(steps):]:
        axis.axis("off")
    figure.suptitle(f"{title}: medians of {result.get('rounds')} round(s); (Nx): speed relative to {baseline}, "
                    f"> 1 faster\n{result.get('files')} creates and stats, {result.get('listing_entries')} entries "
                    f"listed, {(result.get('size_bytes') or 0) / (1 << 20):g} MiB written and read, "
                    f"{result.get('tree_files')} files untarred", fontsize=9)
    return figure
