"""Arrow columns built from their buffers, without ``pa.array``, and read back without
``to_numpy``.

``pa.array`` imports pandas on its first call, whatever it is given, to ask whether the values
are a pandas object: a third of a second at the start of every command that writes a table,
longer than writing the tables of a small run. These build the same arrays (same types, same
nulls, equal to what ``pa.array`` gives) from numpy buffers. ``Array.to_numpy`` imports pandas
the same way; ``numbers`` reads a numeric column as ``to_numpy(zero_copy_only=False)`` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa


def floats(values: Iterable[float] | np.ndarray) -> pa.Array:
    """float64; NaN stays a value, as ``pa.array`` keeps it."""
    data = np.ascontiguousarray(_array(values, np.float64))
    return pa.Array.from_buffers(pa.float64(), len(data), [None, pa.py_buffer(data)])


def ints(values: Iterable[int | None] | np.ndarray) -> pa.Array:
    """int64; None is null."""
    if isinstance(values, np.ndarray):
        data, valid = np.ascontiguousarray(values, dtype=np.int64), None
    else:
        items = list(values)
        valid = np.fromiter((v is not None for v in items), dtype=bool, count=len(items))
        data = np.fromiter((0 if v is None else v for v in items), dtype=np.int64,
                           count=len(items))
    return pa.Array.from_buffers(pa.int64(), len(data), [_validity(valid), pa.py_buffer(data)])


def bools(values: Iterable[bool]) -> pa.Array:
    items = np.fromiter(values, dtype=bool)
    bits = np.packbits(items, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(items), [None, pa.py_buffer(bits)])


def strings(values: Sequence[str | None]) -> pa.Array:
    """utf8; None is null."""
    encoded = [b"" if v is None else v.encode() for v in values]
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    offsets[1:] = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))
    return pa.Array.from_buffers(pa.string(), len(encoded),
                                 [_validity(valid), pa.py_buffer(offsets),
                                  pa.py_buffer(b"".join(encoded))])


def dictionary(indices: np.ndarray, values: pa.Array) -> pa.Array:
    """A dictionary column: row ``i`` is ``values[indices[i]]`` (int32 indices). Millions of
    rows that repeat a few thousand strings (a run's chunk rows and their request ids) are
    built without copying a string, and written to Parquet as the dictionary pages Parquet
    would have made of them (``harness.results.write_parquet_atomic``)."""
    data = np.ascontiguousarray(indices, dtype=np.int32)
    return pa.DictionaryArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), len(data), [None, pa.py_buffer(data)]), values)


def numbers(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numeric or boolean column as numpy, what ``to_numpy(zero_copy_only=False)`` gives:
    the column's own type (a read-only view of its buffer when it has one chunk), float64 with
    NaN where a value is null (all NaN for a column of nulls only, type ``null``). TypeError for
    any other type."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    size, offset = len(arr), arr.offset
    if pa.types.is_null(arr.type):
        return np.full(size, np.nan)
    if pa.types.is_boolean(arr.type):
        values = _bits(arr.buffers()[1], offset, size)
    elif pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type):
        dtype = np.dtype(arr.type.to_pandas_dtype())  # the numpy type; no pandas involved
        data = arr.buffers()[1]
        values = (np.empty(0, dtype=dtype) if size == 0 or data is None else
                  np.frombuffer(data, dtype=dtype, count=size, offset=offset * dtype.itemsize))
    else:
        raise TypeError(f"not a numeric column: {arr.type}")
    if arr.null_count:
        values = values.astype(np.float64)
        values[~_bits(arr.buffers()[0], offset, size)] = np.nan
    return values


def _bits(buffer: pa.Buffer | None, offset: int, size: int) -> np.ndarray:
    """Arrow's little-endian bitmap (validity or booleans) as one bool per value."""
    if buffer is None or size == 0:
        return np.zeros(size, dtype=bool)
    packed = np.frombuffer(buffer, dtype=np.uint8)
    return np.unpackbits(packed, bitorder="little", count=offset + size)[offset:].astype(bool)


def table(columns: Mapping[str, pa.Array]) -> pa.Table:
    return pa.Table.from_arrays(list(columns.values()), names=list(columns))


def _array(values: Iterable[float] | np.ndarray, dtype: type) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values.astype(dtype, copy=False)
    return np.fromiter(values, dtype=dtype)


def _validity(valid: np.ndarray | None) -> pa.Buffer | None:
    """The validity bitmap, or None when every value is there."""
    if valid is None or valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))
