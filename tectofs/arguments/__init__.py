"""What the ``tectofs`` command line and the benchmarks (``bench/``) share to read their
arguments: below both, so ``tectofs bench`` may call into ``bench/`` while ``bench/`` never
imports the command line (``tectofs.cli``).

* ``numbers``: one argparse ``type=`` per kind of number (sizes, counts, ports, seconds,
  rates), each with its bounds and a one-line usage error.
* ``parser``: the argument parser class (usage errors as one line, exit status 2) and its
  help formatter.
* ``terminal``: how a name is shown on a terminal (non-printable characters as ``?``).
"""
