"""The benchmarks: ``bench/`` of a source tree, ``tectofs.benchmarks`` once imported
(``tectofs/benchmarks`` is a symlink to ``bench/``, and a wheel ships it as a directory).

``tectofs bench NAME`` (:mod:`tectofs.benchmarks.run`) runs the main ones and reports them
alike (:mod:`.report`, :mod:`.charts`). Every benchmark also runs alone as a module:

    python3 -m tectofs.benchmarks.meta_ops --help

from the root of a checkout (its ``tectofs`` is then imported, not an installed one) or
anywhere tectofs is installed; ``python3 bench/meta_ops.py`` works too where ``tectofs``
is importable (``PYTHONPATH=.`` in a checkout). The modules import each other as
``tectofs.benchmarks.X``; helpers they share are in :mod:`.common`.
"""
