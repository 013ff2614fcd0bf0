"""The numeric argument kinds of every ``tectofs`` command: :mod:`tectofs.arguments.numbers`
(kept under this name for the command modules that import ``tectofs.cli.numbers``)."""

from tectofs.arguments.numbers import (
    BLOCK_SIZE,
    INLINE_SIZE,
    OWNER_ID,
    PORT,
    ListOf,
    Number,
    count,
    rate,
    seconds,
    size,
)

__all__ = ["BLOCK_SIZE", "INLINE_SIZE", "OWNER_ID", "PORT", "ListOf", "Number", "count", "rate", "seconds", "size"]
