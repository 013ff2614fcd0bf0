"""ISA-L's crc32c and Reed-Solomon parity, called straight from the copy of ISA-L pyeclib ships.

pyeclib already loads Intel's ISA-L (``pyeclib.libs/libisal-pyeclib.so.*``) for the
``isa_l_rs_vand`` backend. Going through pyeclib costs copies that ISA-L itself does not need:
each segment as ``bytes``, liberasurecode's aligned copy of it, each fragment as new ``bytes``,
then each fragment into its chunk buffer; and pyeclib keeps the GIL while it encodes. ISA-L's
own ``ec_encode_data`` takes pointers: it reads the data fragments where they lie and writes the
parity fragments where they go, and ctypes lets go of the GIL for the call. ISA-L's
``crc32_iscsi`` (the crc32c polynomial, with VPCLMULQDQ where the CPU has it) ran at 16-26 GB/s
here against 12-14 GB/s for the ``crc32c`` package.

Contract:
- ``crc32c(buffer, value)`` equals ``crc32c.crc32c(buffer, value)``;
- ``parity(k, m)`` returns a function computing the ``m`` parity fragments from ``k`` data
  fragments with the matrix pyeclib's ``isa_l_rs_vand`` backend uses.

Nothing here is trusted blindly. The first use loads the library and checks its crc against the
``crc32c`` package on several lengths and starting values; ``erasure`` checks whole encodes
against pyeclib's before it uses ``parity``. ``available()`` is False, and callers keep the
reference path, when the library or a symbol is missing, when the check disagrees, or with
``TECTOFS_ISAL=0``.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import logging
import os
import threading
from typing import Callable

import crc32c as _reference_crc

log = logging.getLogger("tectofs.isal")

Buffer = bytes | bytearray | memoryview
Parity = Callable[[int, list[int], list[int]], None]  # (fragment length, data addresses, parity addresses)

_CALL_MAX = 1 << 30  # ISA-L takes an int length: larger buffers go in slices
_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_tried = False


def _find() -> str | None:
    try:
        import pyeclib
    except ImportError:
        return None
    here = os.path.dirname(os.path.abspath(pyeclib.__file__))
    found = sorted(glob.glob(os.path.join(here, "..", "pyeclib.libs", "libisal*.so*")))
    return found[0] if found else None


def _load() -> ctypes.CDLL | None:
    """The library with its argument types set, or None (logged at debug: this is an optimisation)."""
    global _library, _tried
    with _lock:
        if not _tried:
            _library, _tried = _open(), True
        return _library


def _open() -> ctypes.CDLL | None:
    if os.environ.get("TECTOFS_ISAL", "1") == "0":
        return None
    path = _find()
    if path is None:
        log.debug("no ISA-L next to pyeclib; using the crc32c package and pyeclib")
        return None
    try:
        lib = ctypes.CDLL(path)
        lib.crc32_iscsi.restype = ctypes.c_uint32
        lib.crc32_iscsi.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        lib.gf_gen_rs_matrix.restype = None
        lib.gf_gen_rs_matrix.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.ec_init_tables.restype = None
        lib.ec_init_tables.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.gf_invert_matrix.restype = ctypes.c_int
        lib.gf_invert_matrix.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        lib.ec_encode_data.restype = None
        lib.ec_encode_data.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                       ctypes.c_void_p, ctypes.c_void_p]
    except (OSError, AttributeError) as exc:
        log.debug("ISA-L at %s is not usable (%s); using the crc32c package and pyeclib", path, exc)
        return None
    if not _crc_agrees(lib):
        log.warning("ISA-L's crc32_iscsi at %s disagrees with the crc32c package; not using it", path)
        return None
    return lib


def address(buffer: Buffer) -> tuple[int, object] | None:
    """The address of ``buffer``'s first byte and an object to keep alive while it is used, or
    None for a read-only buffer (ctypes takes the address of writable ones only; callers then
    use the reference path). ``buffer`` must be C-contiguous and not empty."""
    try:
        holder = ctypes.c_char.from_buffer(buffer)  # type: ignore[arg-type]  # no copy
    except TypeError:  # read-only (bytes, a view of bytes)
        return None
    return ctypes.addressof(holder), holder


def _crc_at(lib: ctypes.CDLL, where: int, length: int, value: int) -> int:
    state = value ^ 0xFFFFFFFF
    for start in range(0, length, _CALL_MAX):
        state = lib.crc32_iscsi(where + start, min(_CALL_MAX, length - start), state)
    return state ^ 0xFFFFFFFF


def _crc_agrees(lib: ctypes.CDLL) -> bool:
    data = bytearray(os.urandom(70_001))
    found = address(data)
    assert found is not None  # (a bytearray is writable)
    where, _keep = found
    for length, value in ((1, 0), (63, 0x12345678), (4096, 0), (65_536, 0xFFFFFFFF), (70_001, 7)):
        if _crc_at(lib, where, length, value) != _reference_crc.crc32c(memoryview(data)[:length], value):
            return False
    return True


def available() -> bool:
    """True when ISA-L is loaded and its crc agrees with the reference."""
    return _load() is not None


def crc32c(buffer: Buffer, value: int = 0) -> int:
    """crc32c of ``buffer`` continuing from ``value`` (as ``crc32c.crc32c``), with ISA-L when
    available; the GIL is released during the computation either way."""
    lib = _load()
    n = memoryview(buffer).nbytes
    found = address(buffer) if lib is not None and n >= 4096 else None  # (short: the package's call costs less)
    if lib is None or found is None:
        return _reference_crc.crc32c(buffer, value)
    where, _keep = found
    return _crc_at(lib, where, n, value)


def crc32c_pieces(buffer: Buffer, piece_bytes: int, whole: bool) -> tuple[list[int], int]:
    """crc32c of each ``piece_bytes`` slice of ``buffer``, and (if ``whole``) of all of it.
    The whole is folded from the pieces' crcs (``_Shift``) rather than read a second time
    (all but a last piece shorter than the others, which is read again)."""
    lib = _load()
    view = memoryview(buffer).cast("B")
    found = address(view) if lib is not None and len(view) else None
    if lib is None or found is None:
        pieces = [_reference_crc.crc32c(view[i : i + piece_bytes]) for i in range(0, len(view), piece_bytes)]
    else:
        where, _keep = found
        crc = lib.crc32_iscsi
        pieces = [crc(where + i, min(piece_bytes, len(view) - i), 0xFFFFFFFF) ^ 0xFFFFFFFF
                  for i in range(0, len(view), piece_bytes)]
    if not whole or not pieces:
        return pieces, 0
    shift = _shift(piece_bytes)
    total = 0
    for value in pieces[:-1]:
        total = shift(total) ^ value
    last = len(view) - (len(pieces) - 1) * piece_bytes
    if last == piece_bytes:
        return pieces, shift(total) ^ pieces[-1]
    return pieces, crc32c(view[len(view) - last :], total)  # a short last piece: read again, from where the rest left off


class _Shift:
    """What the crc of some bytes becomes when ``length`` more bytes follow, apart from those
    bytes' own crc: crc32c(A + B) == shift(crc32c(A)) ^ crc32c(B) for any B of ``length`` bytes
    (zlib's ``crc32_combine``). The map is linear over GF(2), so it is learnt from the crc
    library itself: its image of each bit, ``crc32c(zeros, bit) ^ crc32c(zeros, 0)``, in byte
    tables. Nothing of the crc is computed here but that fold."""

    def __init__(self, length: int) -> None:
        zeros = bytes(length)
        base = _reference_crc.crc32c(zeros, 0)
        images = [_reference_crc.crc32c(zeros, 1 << bit) ^ base for bit in range(32)]
        self.tables = []
        for byte in range(4):
            table = [0] * 256
            for value in range(1, 256):
                low = value & -value
                table[value] = table[value ^ low] ^ images[8 * byte + low.bit_length() - 1]
            self.tables.append(table)
        sample = os.urandom(2 * length)
        a, b = _reference_crc.crc32c(sample[:length]), _reference_crc.crc32c(sample[length:])
        if self(a) ^ b != _reference_crc.crc32c(sample):  # cannot happen for a crc; checked all the same
            raise AssertionError(f"crc32c shift by {length} bytes disagrees with the crc32c package")

    def __call__(self, value: int) -> int:
        t0, t1, t2, t3 = self.tables
        return t0[value & 0xFF] ^ t1[(value >> 8) & 0xFF] ^ t2[(value >> 16) & 0xFF] ^ t3[value >> 24]


@functools.lru_cache(maxsize=8)
def _shift(length: int) -> _Shift:
    return _Shift(length)


@functools.lru_cache(maxsize=32)
def parity(k: int, m: int) -> Parity | None:
    """ISA-L's parity computation for rs(k, m), set up as pyeclib's ``isa_l_rs_vand`` sets it up
    (``gf_gen_rs_matrix``, then ``ec_init_tables`` on its parity rows), or None without ISA-L.
    The caller checks it against pyeclib before trusting it (``erasure``, which knows the layout).

    The function returned takes the fragment length and the addresses of the ``k`` data
    fragments and of the ``m`` parity fragments to write; each is ``length`` bytes."""
    lib = _load()
    if lib is None:
        return None
    matrix = (ctypes.c_ubyte * ((k + m) * k))()
    lib.gf_gen_rs_matrix(matrix, k + m, k)
    tables = (ctypes.c_ubyte * (32 * k * m))()
    lib.ec_init_tables(k, m, ctypes.byref(matrix, k * k), tables)
    data_pointers, parity_pointers = ctypes.c_void_p * k, ctypes.c_void_p * m

    def compute(length: int, data: list[int], out: list[int]) -> None:
        lib.ec_encode_data(length, k, m, tables, data_pointers(*data), parity_pointers(*out))

    return compute


@functools.lru_cache(maxsize=256)
def rebuild(k: int, m: int, sources: tuple[int, ...], lost: tuple[int, ...]) -> Parity | None:
    """ISA-L's computation of the data fragments at positions ``lost`` (each below ``k``) from
    the ``k`` fragments at positions ``sources``, for rs(k, m) set up as ``parity`` sets it up:
    the rows of ``gf_gen_rs_matrix`` at ``sources``, inverted (``gf_invert_matrix``); the
    inverse's rows at ``lost`` give each lost fragment from the sources. None without ISA-L or
    when those rows cannot be inverted. The caller checks it against pyeclib before trusting it.

    The function returned takes the fragment length and the addresses of the sources (in the
    order of ``sources``) and of the lost fragments to write (in the order of ``lost``)."""
    lib = _load()
    if lib is None or len(sources) != k or not lost:
        return None
    matrix = (ctypes.c_ubyte * ((k + m) * k))()
    lib.gf_gen_rs_matrix(matrix, k + m, k)
    chosen = (ctypes.c_ubyte * (k * k))(*[matrix[p * k + c] for p in sources for c in range(k)])
    inverse = (ctypes.c_ubyte * (k * k))()
    if lib.gf_invert_matrix(chosen, inverse, k) != 0:
        return None
    rows = (ctypes.c_ubyte * (len(lost) * k))(*[inverse[i * k + c] for i in lost for c in range(k)])
    tables = (ctypes.c_ubyte * (32 * k * len(lost)))()
    lib.ec_init_tables(k, len(lost), rows, tables)
    source_pointers, lost_pointers = ctypes.c_void_p * k, ctypes.c_void_p * len(lost)

    def compute(length: int, data: list[int], out: list[int]) -> None:
        lib.ec_encode_data(length, k, len(lost), tables, source_pointers(*data), lost_pointers(*out))

    return compute

