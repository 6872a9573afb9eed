"""xxh3-64 of expert bytes without holding the GIL: the python `xxhash` object holds it for
the whole hash (0.4 ms per 2.65 MB expert), so the disk tier's I/O threads hashing what they
read stalled the decode thread's Python between kernels. The same C functions (the xxhash
library inside the `xxhash` extension, exported there) called through ctypes run with the GIL
released; the digests are the same, so the checksums kept on disk stay valid. Where the
library does not export them, `xxhash.xxh3_64` is used as before.

The update is the library's `XXH3_64bits_update_dispatch` where exported: xxhash's runtime
dispatch to the widest SIMD this CPU has (AVX-512 here), where the plain `XXH3_64bits_update`
is the wheel's SSE2 build (measured on a 2.8 MB expert: 0.11 against 0.14 ms in cache, 0.38
against 0.45 ms just read from disk); the same state, the same digests."""
from __future__ import annotations

import ctypes

import xxhash


def _library():
    try:
        import xxhash._xxhash as ext
        lib = ctypes.CDLL(ext.__file__)          # CDLL: every call releases the GIL
        lib.XXH3_createState.restype = ctypes.c_void_p
        lib.XXH3_freeState.argtypes = [ctypes.c_void_p]
        lib.XXH3_64bits_reset.argtypes = [ctypes.c_void_p]
        lib.XXH3_64bits_update.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        if hasattr(lib, "XXH3_64bits_update_dispatch"):     # (xxhash's x86 dispatch: not on every build)
            lib.XXH3_64bits_update_dispatch.argtypes = lib.XXH3_64bits_update.argtypes
        lib.XXH3_64bits_digest.argtypes = [ctypes.c_void_p]
        lib.XXH3_64bits_digest.restype = ctypes.c_uint64
        return lib
    except (ImportError, OSError, AttributeError):
        return None


_LIB = _library()
UPDATES = [n for n in ("XXH3_64bits_update_dispatch", "XXH3_64bits_update") if _LIB is not None and hasattr(_LIB, n)]
_update = getattr(_LIB, UPDATES[0]) if UPDATES else None     # the widest SIMD first (tests force each)


class Xxh3NoGil:
    """The `xxhash.xxh3_64` interface this package uses (update, intdigest) over writable
    buffers (a slot's rows, a bytearray)."""

    def __init__(self):
        self._state = _LIB.XXH3_createState()
        if not self._state:
            raise MemoryError("XXH3_createState failed")
        _LIB.XXH3_64bits_reset(self._state)

    def update(self, buf) -> None:
        mv = memoryview(buf).cast("B")
        if mv.nbytes:
            c = (ctypes.c_char * mv.nbytes).from_buffer_copy(mv) if mv.readonly else ctypes.c_char.from_buffer(mv)
            _update(self._state, ctypes.addressof(c), mv.nbytes)

    def intdigest(self) -> int:
        return int(_LIB.XXH3_64bits_digest(self._state))

    @property
    def state(self) -> int:
        """The XXH3 state's address, for C that updates it (`update_address`; c_reads.py)."""
        return self._state

    def __del__(self):
        if getattr(self, "_state", None):
            _LIB.XXH3_freeState(self._state)
            self._state = None


def update_address() -> int | None:
    """The address of the update these hashers call (C: `int update(state, data, len)`), or None."""
    return None if _update is None else ctypes.cast(_update, ctypes.c_void_p).value


def xxh3_64():
    """A new xxh3-64 hasher: without the GIL where the library allows it."""
    return Xxh3NoGil() if _LIB is not None else xxhash.xxh3_64()
