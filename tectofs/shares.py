"""Fair shares of one budget among the principals holding some of it.

One rule, used by a chunk server's admission (its in-flight bytes, by the uid of each write's
capability) and a memory agent's steps not yet persisted (its ``--memory-bytes``, by owner): a
principal alone may hold ``alone_fraction`` of the budget, so a newcomer always finds room; with
``others`` other principals holding some, each may hold ``1/(others + 1)`` of it.
"""

from __future__ import annotations


def fair_share(budget: float, alone_fraction: float, others: int) -> float:
    """The most one principal may hold of ``budget`` while ``others`` other principals hold some."""
    assert others >= 0
    return budget * alone_fraction if not others else budget / (others + 1)
