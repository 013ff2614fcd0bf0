"""Let ``dcp.save/load/async_save(checkpoint_id="tectofs://...")`` use the tectofs writer/reader.

Passing ``storage_writer=``/``storage_reader=`` needs none of this and stays the primary path.
DCP has no registry of storage classes: it picks one from a fixed list in its private
``_storage_utils._storage_setup``, and its own fsspec route (``FsspecWriter``, which would
accept ``tectofs://`` through our fsspec entry point) writes files straight into the final
directory, with no atomic commit and no per-item checksums. So ``import tectofs.torch``
installs two guarded layers, each handing everything it does not own to the original:

* **The public entry points** ``save``, ``load``, ``async_save`` (documented, keyword-only
  ``checkpoint_id`` / ``storage_writer`` / ``storage_reader``). For a ``tectofs://`` id with no
  storage object they pass a :class:`CheckpointWriter` / :class:`CheckpointReader`
  explicitly, so DCP never has to guess; ``async_save`` in PROCESS mode then ships that
  writer to DCP's background process, whose unpickling imports ``tectofs.torch`` there (no
  hook needed in advance, however late the parent imported us). A failed save deletes its
  pending directory, and a tectofs failure is re-raised as :class:`CheckpointFailed`, whose
  message starts with rank, operation, path and server.
* **The private chooser** ``_storage_setup``, for code that bound ``save``/``load`` before
  ``tectofs.torch`` was imported. Installed only when its signature is exactly the one this
  code was written against (``tests/test_torch_plugin.py`` asserts it, so a torch upgrade
  that changes it fails the tests loudly); otherwise a warning says so and nothing is
  patched. The wrapper handles only ``tectofs://`` ids without a storage object, calls that
  do not bind to the known signature go to the original unchanged.
"""

from __future__ import annotations

import functools
import inspect
import time
import warnings
from typing import Any, Callable

from ..uri import is_uri

_MARK = "_tectofs_wrapped"
_P = inspect.Parameter
# The private function's signature as of torch 2.4-2.13: (storage, checkpoint_id, reader=False).
STORAGE_SETUP_SIGNATURE = inspect.Signature([
    _P("storage", _P.POSITIONAL_OR_KEYWORD),
    _P("checkpoint_id", _P.POSITIONAL_OR_KEYWORD),
    _P("reader", _P.POSITIONAL_OR_KEYWORD, default=False),
])
# Public entry points: (module, name, the keyword-only parameters the wrapper reads).
PUBLIC_ENTRY_POINTS = (
    ("torch.distributed.checkpoint.state_dict_saver", "save", ("checkpoint_id", "storage_writer")),
    ("torch.distributed.checkpoint.state_dict_saver", "async_save", ("checkpoint_id", "storage_writer")),
    ("torch.distributed.checkpoint.state_dict_loader", "load", ("checkpoint_id", "storage_reader")),
)
_STORAGE_SETUP_MODULES = (
    "torch.distributed.checkpoint._storage_utils",
    "torch.distributed.checkpoint.state_dict_saver",
    "torch.distributed.checkpoint.state_dict_loader",
)
_PACKAGE = "torch.distributed.checkpoint"


def storage_for(checkpoint_id: Any, reader: bool) -> Any:
    """A new tectofs reader or writer for the ``tectofs://`` id ``checkpoint_id``; a writer
    saves to the tier ``$TECTOFS_TIER`` names (``memory``: the memory agent's, default storage)."""
    import os

    from ._dcp import CheckpointWriter
    from ._reader import CheckpointReader

    if reader:
        return CheckpointReader(checkpoint_id)
    return CheckpointWriter(checkpoint_id, tier=os.environ.get("TECTOFS_TIER") or "storage")


def _with_tectofs_storage(kwargs: dict[str, Any], storage_key: str) -> Any:
    """Give a ``tectofs://`` call without a storage object its tectofs one (in ``kwargs``)."""
    if kwargs.get(storage_key) is None and is_uri(kwargs.get("checkpoint_id")):
        kwargs[storage_key] = storage_for(kwargs["checkpoint_id"], reader=storage_key == "storage_reader")
    return kwargs.get(storage_key)


def _wrap_save_or_load(original: Callable[..., Any], storage_key: str) -> Callable[..., Any]:
    """``dcp.save``/``dcp.load``: tectofs storage for tectofs ids; failures told cause first."""
    from torch.distributed.checkpoint.api import CheckpointException

    from ._dcp import CheckpointWriter
    from ._failures import cause_first

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        storage = _with_tectofs_storage(kwargs, storage_key)
        try:
            return original(*args, **kwargs)
        except CheckpointException as exc:
            if isinstance(storage, CheckpointWriter):
                storage.abandon()  # every rank is past the failed collective: nobody writes now
            failed = cause_first(exc, storage)
            if failed is exc:
                raise
            raise failed from None

    return wrapper


def _wrap_async_save(original: Callable[..., Any]) -> Callable[..., Any]:
    """``dcp.async_save``: an explicit tectofs writer for tectofs ids (it is also the stager,
    and in PROCESS mode it carries ``tectofs.torch`` into the background process). With a
    tectofs writer, the time the caller was blocked and the background upload's are
    recorded (:func:`tectofs.torch._timing.track_async_save`)."""
    from ._dcp import CheckpointWriter
    from ._timing import track_async_save

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        storage = _with_tectofs_storage(kwargs, "storage_writer")
        started = time.perf_counter()
        result = original(*args, **kwargs)
        if isinstance(storage, CheckpointWriter):
            track_async_save(result, started, storage)
        return result

    return wrapper


def _wrap_storage_setup(original: Callable[..., Any]) -> Callable[..., Any]:
    """DCP's private chooser: tectofs ids without a storage object get ours; any other call,
    including one that does not bind to :data:`STORAGE_SETUP_SIGNATURE`, goes to the
    original with its arguments unchanged."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = STORAGE_SETUP_SIGNATURE.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)
        bound.apply_defaults()
        storage, checkpoint_id, reader = bound.arguments.values()
        if not storage and is_uri(checkpoint_id):
            return storage_for(checkpoint_id, bool(reader))
        return original(*args, **kwargs)

    return wrapper


def _plain_signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    """``fn``'s signature without annotations (only names, kinds and defaults bind calls)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = [p.replace(annotation=_P.empty) for p in signature.parameters.values()]
    return signature.replace(parameters=params, return_annotation=inspect.Signature.empty)


def _refuse(what: str, why: str) -> bool:
    warnings.warn(
        f"tectofs.torch: not hooking {what} ({why}); dcp.save/load(checkpoint_id='tectofs://...') "
        "may not pick the tectofs storage in this torch version: pass "
        "storage_writer=tectofs.torch.CheckpointWriter(...) / storage_reader=tectofs.torch.CheckpointReader(...)",
        RuntimeWarning,
        stacklevel=3,
    )
    return False


def _patch(modules: list[Any], name: str, original: Any, wrapper: Callable[..., Any]) -> None:
    setattr(wrapper, _MARK, True)
    for module in modules:
        if getattr(module, name, None) is original:
            setattr(module, name, wrapper)


def _install_public(import_module: Callable[[str], Any]) -> bool:
    installed = True
    package = import_module(_PACKAGE)
    for module_name, name, keywords in PUBLIC_ENTRY_POINTS:
        module = import_module(module_name)
        original = getattr(module, name, None)
        if original is None:
            installed = _refuse(f"{module_name}.{name}", "it does not exist")
            continue
        if getattr(original, _MARK, False):
            continue
        signature = _plain_signature(original)
        params = signature.parameters if signature is not None else {}
        missing = [k for k in keywords if k not in params or params[k].kind is not _P.KEYWORD_ONLY]
        if missing:
            installed = _refuse(f"{module_name}.{name}", f"no keyword-only parameter {', '.join(missing)}")
            continue
        storage_key = keywords[1]
        wrapper = _wrap_async_save(original) if name == "async_save" else _wrap_save_or_load(original, storage_key)
        _patch([module, package], name, original, wrapper)
    return installed


def _install_storage_setup(import_module: Callable[[str], Any]) -> bool:
    modules = [import_module(m) for m in _STORAGE_SETUP_MODULES]
    original = getattr(modules[0], "_storage_setup", None)
    if original is None:
        return _refuse("_storage_setup", "torch has no torch.distributed.checkpoint._storage_utils._storage_setup")
    if getattr(original, _MARK, False):
        return True
    if _plain_signature(original) != STORAGE_SETUP_SIGNATURE:
        return _refuse("_storage_setup", f"its signature is {_plain_signature(original)}, not {STORAGE_SETUP_SIGNATURE}")
    _patch(modules, "_storage_setup", original, _wrap_storage_setup(original))
    return True


def install() -> bool:
    """Install both layers (idempotent). True if both are in place; False, with a warning
    naming what was refused and why, if this torch does not look like the one we know
    (what could be installed is)."""
    import importlib

    try:
        import_module = importlib.import_module
        import_module(_PACKAGE)
    except Exception as exc:
        return _refuse("torch.distributed.checkpoint", f"it cannot be imported: {exc}")
    public = _install_public(import_module)
    private = _install_storage_setup(import_module)
    return public and private


def uninstall() -> None:
    """Put DCP's original functions back (tests)."""
    import importlib

    names = [(m, n) for m, n, _ in PUBLIC_ENTRY_POINTS] + [(m, "_storage_setup") for m in _STORAGE_SETUP_MODULES]
    for module_name, name in names + [(_PACKAGE, n) for _, n, _ in PUBLIC_ENTRY_POINTS]:
        module = importlib.import_module(module_name)
        current: Any = getattr(module, name, None)
        if getattr(current, _MARK, False):
            setattr(module, name, current.__wrapped__)
