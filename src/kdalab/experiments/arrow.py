"""Arrow arrays to and from NumPy without pandas: records built and run indices read from the
arrays' buffers.

pyarrow imports pandas the first time ``pa.array`` or ``to_numpy`` meets NumPy data (its check
for pandas objects), and on the H200 host's pyarrow 25 ``DataType.to_pandas_dtype`` does too:
0.4–0.55 s of a CUDA sweep's first batch there (docs/BENCHMARKS.md), in a process that
otherwise never needs pandas (its views are drawn by the views worker).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["column", "strings", "int64s"]

_NUMPY = {pa.float64(): np.float64, pa.int64(): np.int64}


def column(values, type_: pa.DataType, valid=None) -> pa.Array:
    """A float64 or int64 Arrow array over ``values`` (cast to that NumPy type), null where
    ``valid`` is False."""
    data = np.ascontiguousarray(values, dtype=_NUMPY[type_])
    bitmap = None
    if valid is not None and not np.all(valid):
        data = np.where(valid, data, 0).astype(data.dtype)  # null slots hold 0, as pa.array's
        bitmap = pa.py_buffer(np.packbits(np.asarray(valid, dtype=bool), bitorder="little"))
    return pa.Array.from_buffers(type_, len(data), [bitmap, pa.py_buffer(data)])


def strings(codes, names: Sequence[str]) -> pa.Array:
    """An Arrow string array of ``names[codes[i]]``."""
    encoded = [name.encode() for name in names]
    sizes = np.array([len(e) for e in encoded], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    lengths = sizes[codes]
    offsets = np.zeros(len(codes) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError("too many records in one table for 32-bit string offsets")
    pool = np.frombuffer(b"".join(encoded) or b"\0", dtype=np.uint8)
    take = np.repeat(starts[codes] - offsets[:-1], lengths) + np.arange(offsets[-1])
    return pa.Array.from_buffers(pa.string(), len(codes), [
        None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(pool[take])])


def int64s(values: pa.ChunkedArray) -> np.ndarray:
    """An int64 column without nulls as NumPy (a ValueError for any other)."""
    if values.null_count or values.type != pa.int64():
        raise ValueError(f"expected int64 without nulls, not {values.type}")
    parts = [np.frombuffer(c.buffers()[1], dtype=np.int64, count=len(c), offset=8 * c.offset)
             for c in values.chunks]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
