"""What every benchmark result says besides its figures, and how it is printed.

A result (:data:`Result`) is a JSON object: each benchmark has its own rows and ratios, and in
common:

- ``targets``: a list of :class:`Target`, made by :func:`target`; printed as met / NOT met
  (:func:`print_targets`), never as "ok";
- the run's provenance, :class:`RunInfo` (:func:`run_info`): the commit, the date (UTC), the
  host and the load average before and after the run, since this kind of shared machine
  drifts 20-40% between runs.

``tectofs bench``'s summary keeps one :class:`SummaryEntry` per benchmark;
:func:`summary_state` turns it into the word or few it shows.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import time
from typing import Any, Mapping, NotRequired, Required, TypedDict

UNITS = "GB/s = 10^9 bytes/s; MiB = 2^20 bytes; s = seconds (wall clock)"
Result = dict[str, Any]  # a benchmark's result, as written to its JSON file

# ---------------------------------------------------------------------- where and when a run happened


class Commit(TypedDict):
    """Which code ran: ``git rev-parse HEAD`` of the source tree this package runs from (with
    ``uncommitted_changes``), else ``tectofs VERSION`` of the installed package."""

    commit: str
    commit_source: str  # "git", "package version" or "none (...)"
    uncommitted_changes: NotRequired[bool]  # git only


class Host(TypedDict):
    hostname: str
    cpus: int | None
    kernel: str
    python: str


class LoadAverages(TypedDict):
    """The 1, 5 and 15 minute load averages before and after the run (None: not known)."""

    before: list[float] | None
    after: list[float] | None


class RunInfo(Commit):
    """What a result file records besides its figures."""

    date: str  # UTC, ISO 8601
    host: Host
    load_average: LoadAverages
    units: str


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run_info(load_before: list[float] | None) -> RunInfo:
    """This run's :class:`RunInfo`; ``load_before`` is the load average taken before it began."""
    info: RunInfo = {
        **_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"hostname": socket.gethostname(), "cpus": os.cpu_count(), "kernel": platform.release(),
                 "python": platform.python_version()},
        "load_average": {"before": load_before, "after": load_average()},
        "units": UNITS,
    }
    return info


def _commit() -> Commit:
    # tectofs/benchmarks/ is bench/ of a checkout (a symlink), or a directory of an installed package
    tree = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    try:
        top, sha = subprocess.run(["git", "-C", tree, "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                                  text=True, timeout=10, check=True).stdout.split()
        if os.path.realpath(top) != tree:  # an installed package inside some other repository
            raise ValueError(top)
        dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        return Commit(commit=sha, commit_source="git", uncommitted_changes=bool(dirty))
    except (OSError, ValueError, subprocess.SubprocessError):
        from importlib.metadata import PackageNotFoundError, version

        try:
            return Commit(commit=f"tectofs {version('tectofs')}", commit_source="package version")
        except PackageNotFoundError:
            return Commit(commit="unknown", commit_source="none (not a git checkout, not installed)")


def ensure_work_dir(path: str | None) -> str | None:
    """Create ``--work-dir`` (and its parents) if it does not exist; a clear error if it cannot be."""
    if path is None:
        return None
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise SystemExit(f"tectofs bench: cannot create --work-dir {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise SystemExit(f"tectofs bench: --work-dir {path} is not writable")
    return path


# ---------------------------------------------------------------------- targets


class Target(TypedDict):
    """One target of a result, e.g. ``{"name": "tectofs save / dcp local save", "measured":
    0.93, "target": ">= 1x", "met": False}``."""

    name: str
    measured: float | None  # None: nothing measured (not met)
    target: str  # what it needs, as text
    met: bool


def target(name: str, measured: float | None, at_least: float | None = None, at_most: float | None = None,
           unit: str = "x") -> Target:
    """The target ``name``: ``measured`` must be ``at_least`` or ``at_most`` (exactly one of
    them given); a missing or NaN measurement is not met."""
    value = numeric(measured)
    if at_least is not None:
        assert at_most is None
        met, needs = value is not None and value >= at_least, f">= {at_least:g}{unit}"
    else:
        assert at_most is not None
        met, needs = value is not None and value <= at_most, f"<= {at_most:g}{unit}"
    return Target(name=name, measured=None if value is None else round(value, 4), target=needs, met=met)


def targets_of(result: Mapping[str, Any]) -> list[Target]:
    """The result's targets: its ``targets`` list, else the older ``targets_met`` {name: bool}."""
    if result.get("targets") is not None:
        return list(result["targets"])
    return [Target(name=name, measured=None, target=name, met=bool(met))
            for name, met in (result.get("targets_met") or {}).items()]


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def show(measured: float | None) -> str:
    """A measured figure as printed: 4 significant digits, ``-`` when there is none."""
    return "-" if measured is None else f"{measured:.4g}"


def print_targets(result: Mapping[str, Any]) -> None:
    """The targets as a table: what, measured, needed, met / NOT met."""
    targets = targets_of(result)
    if not targets:
        return
    rows = [{"target": t["name"], "measured": show(t.get("measured")), "needs": t["target"],
             "verdict": verdict(t["met"])} for t in targets]
    widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in rows[0]}
    print("  ".join(k.ljust(w) for k, w in widths.items()))
    for r in rows:
        print("  ".join(r[k].ljust(w) for k, w in widths.items()))
    unmet = sum(not t["met"] for t in targets)
    print(f"targets: {len(targets) - unmet} of {len(targets)} met" + (f", {unmet} NOT met" if unmet else ""))


# ---------------------------------------------------------------------- the summary of several benchmarks


class SummaryEntry(TypedDict, total=False):
    """One benchmark in ``tectofs bench``'s summary (and ``summary.json``). ``ok`` means it ran
    without errors, not that its targets were met: :func:`summary_state` says that."""

    ok: Required[bool]
    skipped: bool  # not run: something it needs is not installed
    error: str  # why it failed or was skipped
    seconds: float
    json: str  # its result file
    png: str | None  # its chart (None: matplotlib is missing, or nothing to draw)
    ratios: dict[str, Any]
    targets: list[Target]
    error_count: int
    state: str  # summary_state(), once the summary is printed


def summary_state(entry: SummaryEntry) -> str:
    """The one word (or few) the summary shows for a benchmark: never "ok" while a target is unmet."""
    if entry.get("skipped"):
        return "skipped"
    if entry.get("error") and "targets" not in entry:
        return "FAILED"
    parts = [f"{entry['error_count']} ERRORS"] if entry.get("error_count") else []
    targets = entry.get("targets") or []
    unmet = sum(not t["met"] for t in targets)
    if not targets:
        parts.append("ran, no targets")
    elif unmet:
        parts.append(f"targets NOT met ({unmet} of {len(targets)})")
    else:
        parts.append(f"targets met ({len(targets)} of {len(targets)})")
    return "; ".join(parts)


# ---------------------------------------------------------------------- tables


def print_result(result: Mapping[str, Any]) -> None:
    """A result's rows as a table, then its ratios and (the first ten of) its errors."""
    rows = result.get("rows") or []
    if rows:
        keys = list(rows[0])
        cells = [[_cell(r.get(k)) for k in keys] for r in rows]
        widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
        print("  ".join(k.ljust(w) for k, w in zip(keys, widths)))
        for c in cells:
            print("  ".join(v.ljust(w) for v, w in zip(c, widths)))
    for name, value in (result.get("ratios") or {}).items():
        print(f"{name}: {value}")
    errors = result.get("errors") or []
    if errors:
        print(f"errors: {len(errors)}")
        for error in errors[:10]:
            print(f"  {error}")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "-" if value != value else f"{value:.3f}"
    if isinstance(value, list):
        return " ".join(_cell(v) for v in value)
    return "-" if value is None else str(value)


def numeric(value: Any) -> float | None:
    """``value`` as a float if it is a number (not a bool, not NaN), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value else None
