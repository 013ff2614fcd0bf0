"""Numeric command-line values: one parser per kind, shared by every ``tectofs`` command and the benchmarks.

Each kind is a :class:`Number` used as an argparse ``type=``: sizes in bytes with K/M/G
suffixes (:func:`size`), whole counts and ids (:func:`count`), ports (:data:`PORT`), durations
in seconds (:func:`seconds`) and rates in MiB/s (:func:`rate`), each with its own bounds.

Contract: a Number returns a finite value within its bounds, or raises
``argparse.ArgumentTypeError`` (never ``OverflowError`` or anything else) whose message names
the text and says what the option accepts. argparse turns that into one line,
``tectofs CMD: argument --OPT: 'inf' is not ...``, and exit status 2. So ``inf``, ``nan``,
negatives, ``1e400``, ``99999999999999999999P``, an empty string and garbage are all usage
errors. A bare ``type=int`` or ``type=float`` would let some of them through (``float``
accepts ``inf`` and ``nan``, ``int`` any negative or huge number); ``tests/test_cli_options.py``
refuses both in every parser.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable, Generic, TypeVar

from tectofs import limits

_SIZE_UNITS = {"": 1, "K": limits.KiB, "M": limits.MiB, "G": limits.GiB}

N = TypeVar("N", int, float)


def _read_size(text: str) -> float:
    """``"64M"`` / ``"1GiB"`` / ``"1.5k"`` / ``"4096"`` -> bytes (a float: the bounds are checked before
    it becomes an int). ValueError for anything else."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = value[-1] if value and value[-1] in "KMG" else ""
    return float(value[: len(value) - len(unit)]) * _SIZE_UNITS[unit]


def _show_size(n: int) -> str:
    """``65536`` -> ``"64K"``: the largest unit that divides ``n``."""
    for unit in ("G", "M", "K"):
        if n and n % _SIZE_UNITS[unit] == 0:
            return f"{n // _SIZE_UNITS[unit]}{unit}"
    return str(n)


class Number(Generic[N]):
    """An argparse ``type=`` for one kind of number (see the module's contract).

    ``read`` turns the text into a number (raising ValueError for garbage); the value must be
    finite, within ``low``..``high`` (above ``low`` when ``above_low``) and, when ``whole``,
    a whole number. ``accepts`` is what the error message says the option takes."""

    def __init__(self, read: Callable[[str], float], convert: Callable[[float], N], low: N, high: N, accepts: str,
                 above_low: bool = False, whole: bool = True) -> None:
        assert low <= high
        self.read = read
        self.convert: Callable[[float], N] = convert
        self.low: N = low
        self.high: N = high
        self.accepts, self.above_low, self.whole = accepts, above_low, whole

    def __call__(self, text: str) -> N:
        try:
            value = self.read(text)
            in_range = self.low < value <= self.high if self.above_low else self.low <= value <= self.high
            good = in_range and math.isfinite(value) and (not self.whole or value == int(value))  # nan: not in range
        except (ValueError, OverflowError):  # garbage; a float too large for the text's digits
            good = False
        if not good:
            raise argparse.ArgumentTypeError(f"{text!r} is not {self.accepts}")
        return self.convert(value)

    def __repr__(self) -> str:
        return f"Number({self.accepts!r})"


def size(low: int = 1, high: int = limits.int64_max) -> Number[int]:
    """Bytes, with an optional K, M or G (powers of 1024; ``KiB``, ``MB`` ... too): ``4096``,
    ``64K``, ``1.5M``; a whole number of bytes from ``low`` to ``high``."""
    bounds = f"from {_show_size(low)} to {_show_size(high)}" if high < limits.int64_max else f"of at least {low}"
    return Number(_read_size, int, low, high, f"a size in bytes {bounds} (e.g. 4096, 64K, 1M; suffixes K, M, G)")


def count(low: int = 1, high: int = limits.int64_max, what: str = "a whole number") -> Number[int]:
    """A decimal integer from ``low`` to ``high`` (counts, ids, a write minimum)."""
    return Number(int, int, low, high, f"{what} from {low} to {high}")


PORT: Number[int] = count(0, 65535, "a port number")  # 0: any free one, where the option says so


def seconds(low: float = 0.0, high: float = limits.option_seconds_max, above_low: bool = False) -> Number[float]:
    """A duration in seconds, fractions allowed: ``0.5``, ``30``, ``1e3``."""
    bounds = f"more than {low:g} and at most {high:.0f}" if above_low else f"from {low:g} to {high:.0f}"
    return Number(float, float, low, high, f"a number of seconds {bounds}", above_low=above_low, whole=False)


def rate(high: float = limits.option_rate_mib_per_s_max) -> Number[float]:
    """A rate in MiB/s from 0 (what 0 means is the option's to say) to ``high``."""
    return Number(float, float, 0.0, high, f"a rate in MiB/s from 0 to {high:.0f}", whole=False)


class ListOf(Generic[N]):
    """An argparse ``type=``: comma-separated values of one :class:`Number` kind (``27,100``); an
    empty text is an empty list, an empty item an error."""

    def __init__(self, item: Number[N]) -> None:
        self.item: Number[N] = item
        self.accepts = f"a comma-separated list, each {item.accepts}"

    def __call__(self, text: str) -> list[N]:
        if not text.strip():
            return []
        try:
            return [self.item(part) for part in text.split(",")]
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {self.accepts}") from None


BLOCK_SIZE = size(limits.block_size_min_bytes, limits.block_size_max_bytes)
INLINE_SIZE = size(0, limits.inline_bytes_max)  # tectofs meta --inline-max
OWNER_ID = count(0, limits.owner_id_max, "an id")  # uid or gid
