"""The argument parser of every ``tectofs`` command and benchmark: usage errors as one line
and exit status 2, help wrapped without splitting a flag."""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from typing import Any, NoReturn

from .terminal import shown


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; every option's help wrapped at spaces only, so a flag
    it names (``--mount-opens-directories``) is never split at a hyphen across two lines."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(re.sub(r"\s+", " ", text).strip(), width, break_on_hyphens=False)


class Parser(argparse.ArgumentParser):
    """Usage errors as one line, ``tectofs CMD: message``, exit status 2 (subcommands inherit the
    class); help in :class:`HelpFormatter` unless another is given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {shown(message, sys.stderr)} ('{self.prog} --help' lists the options)\n")
