"""Row ranges of one tensor out of a torch.distributed.checkpoint, without loading its shards.

DCP's own reader `torch.load`s a whole stored chunk (a rank's shard: a full table under
table-wise sharding, 2.6 GB for Criteo's largest) and then narrows it, so loading a table
costs the table plus the stored chunk. Export needs one row chunk at a time. Each chunk of a
`FileSystemWriter` checkpoint is a `torch.save` zip inside a `.distcp` file at a recorded
offset; its tensor storage is stored uncompressed. This module reads the zip's directory and
the pickled tensor header (never the storage), so a row range is one `pread` per overlapping
chunk, whatever the sharding type (table-, row-, column-wise, grid, data-parallel).

A chunk whose header it does not recognise (a non-contiguous layout, a dtype numpy lacks, a
pickle it cannot follow) falls back to `torch.load` of that one chunk, kept until the reads move
to another chunk: correct, only heavier. A chunk stored through a DCP storage transform
(compression) is refused with a clear error; `rec train` writes none.

Example:
    >>> reader = CheckpointReader("runs/x/checkpoints/step_40")  # doctest: +SKIP
    >>> reader.shape("model.model.sparse_arch.embedding_bag_collection.embedding_bags.t0.weight")
    ... # doctest: +SKIP
    (2000, 16)
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

_NUMPY = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: None}


@dataclass(frozen=True)
class _Layout:
    """Where a chunk's elements lie: absolute file offset of element 0, and its strides."""

    path: Path
    data_offset: int
    stride: tuple[int, ...]
    dtype: torch.dtype


class _FileView(io.RawIOBase):
    """A seekable window [start, start + length) of an open file, for zipfile."""

    def __init__(self, f, start: int, length: int) -> None:
        self._f, self._start, self._length, self._pos = f, start, length, 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer) -> int:
        n = max(0, min(len(buffer), self._length - self._pos))
        data = os.pread(self._f.fileno(), n, self._start + self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


class _TensorHeader(pickle.Unpickler):
    """Unpickles torch.save's data.pkl into (storage, storage offset, size, stride), where
    storage is {"type": storage class name, "key": its file in the zip}, without touching
    storage bytes."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda storage, offset, size, stride, *rest: (storage, offset, size, stride)
        if module == "collections" and name == "OrderedDict":
            import collections

            return collections.OrderedDict
        if module == "torch" and name.endswith("Storage"):
            return name
        raise pickle.UnpicklingError(f"unexpected {module}.{name} in a DCP tensor chunk")

    def persistent_load(self, pid):
        # ('storage', storage_type, key, location, numel)
        return {"type": pid[1], "key": pid[2]}


_STORAGE_DTYPES = {"FloatStorage": torch.float32, "HalfStorage": torch.float16,
                   "BFloat16Storage": torch.bfloat16}  # fmt: skip


def _parse_chunk(path: Path, start: int, length: int) -> _Layout | None:
    """The layout of a torch.save'd tensor stored at [start, start + length) of `path`."""
    with open(path, "rb") as f:
        try:
            z = zipfile.ZipFile(_FileView(f, start, length))
            pkl = next(n for n in z.namelist() if n.endswith("/data.pkl"))
            storage, offset, size, stride = _TensorHeader(io.BytesIO(z.read(pkl))).load()
            dtype = _STORAGE_DTYPES.get(storage["type"])
            info = z.getinfo(f"{pkl[: -len('data.pkl')]}data/{storage['key']}")
        except (zipfile.BadZipFile, StopIteration, pickle.UnpicklingError, TypeError, ValueError,
                KeyError):  # fmt: skip
            return None
        if dtype is None or info.compress_type != zipfile.ZIP_STORED:
            return None
        # Local file header: 30 fixed bytes, then the name and the extra field.
        header = os.pread(f.fileno(), 30, start + info.header_offset)
        name_len = int.from_bytes(header[26:28], "little")
        extra_len = int.from_bytes(header[28:30], "little")
        data = start + info.header_offset + 30 + name_len + extra_len
    item = torch.empty((), dtype=dtype).element_size()
    return _Layout(path, data + offset * item, tuple(stride), dtype)


class CheckpointReader:
    """Reads tensors, or row ranges of them, from one DCP checkpoint directory."""

    def __init__(self, step_dir: str | Path) -> None:
        self.step_dir = Path(step_dir)
        self.metadata = dcp.FileSystemReader(str(self.step_dir)).read_metadata()
        self._layouts: dict[tuple[str, tuple[int, ...]], _Layout | None] = {}
        self._loaded: tuple[tuple[str, tuple[int, ...]], torch.Tensor] | None = None

    def _tensor_md(self, fqn: str) -> TensorStorageMetadata:
        md = self.metadata.state_dict_metadata.get(fqn)
        if not isinstance(md, TensorStorageMetadata):
            raise KeyError(f"checkpoint {str(self.step_dir)!r} holds no tensor {fqn!r}")
        return md

    def shape(self, fqn: str) -> tuple[int, ...]:
        return tuple(self._tensor_md(fqn).size)

    def _layout(self, fqn: str, offsets: tuple[int, ...]) -> _Layout | None:
        key = (fqn, offsets)
        if key not in self._layouts:
            info = self.metadata.storage_data[MetadataIndex(fqn, torch.Size(offsets))]
            if getattr(info, "transform_descriptors", None):
                raise ValueError(
                    f"checkpoint {str(self.step_dir)!r} stores {fqn!r} through DCP storage "
                    f"transforms {list(info.transform_descriptors)}; rec export reads plain "
                    "FileSystemWriter checkpoints (what rec train writes)"
                )
            path = self.step_dir / info.relative_path
            self._layouts[key] = _parse_chunk(path, info.offset, info.length)
        return self._layouts[key]

    def _load_chunk(self, fqn: str, offsets: tuple[int, ...]) -> torch.Tensor:
        """The fallback: DCP's own way, the whole stored chunk (the last one is kept, since a
        table's row chunks read the same stored chunk one after the other)."""
        key = (fqn, offsets)
        if self._loaded is None or self._loaded[0] != key:
            self._loaded = None  # release the previous chunk before reading the next
            info = self.metadata.storage_data[MetadataIndex(fqn, torch.Size(offsets))]
            with open(self.step_dir / info.relative_path, "rb") as f:
                f.seek(info.offset)
                blob = io.BytesIO(f.read(info.length))
            self._loaded = (key, torch.load(blob, map_location="cpu", weights_only=True))
            del blob
        return self._loaded[1]

    def read_tensor(self, fqn: str) -> torch.Tensor:
        """A whole small tensor of any dtype and rank (a ZCH table's id map), its stored chunks
        loaded DCP's way and put in place; KeyError when the checkpoint holds none."""
        md = self._tensor_md(fqn)
        out = torch.empty(tuple(md.size), dtype=md.properties.dtype)
        for chunk in md.chunks:
            part = self._load_chunk(fqn, tuple(chunk.offsets))
            where = tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.sizes, strict=True))
            out[where] = part
        self._loaded = None
        return out

    def read_rows(self, fqn: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of a 2-D tensor as a new fp32 tensor [stop - start, cols]."""
        md = self._tensor_md(fqn)
        rows, cols = md.size
        if not 0 <= start <= stop <= rows:
            raise IndexError(f"rows [{start}, {stop}) outside {fqn!r} with {rows} rows")
        out = torch.empty(stop - start, cols, dtype=torch.float32)
        covered = 0
        for chunk in md.chunks:
            (r0, c0), (nr, nc) = chunk.offsets, chunk.sizes
            lo, hi = max(start, r0), min(stop, r0 + nr)
            if lo >= hi or nc == 0:
                continue
            part = self._read_chunk_rows(fqn, tuple(chunk.offsets), (nr, nc), lo - r0, hi - r0)
            out[lo - start : hi - start, c0 : c0 + nc] = part
            covered += part.numel()
        if covered != out.numel():  # shards overlap or leave holes: not a checkpoint DCP writes
            raise ValueError(
                f"the shards of {fqn!r} in {str(self.step_dir)!r} cover {covered} of the "
                f"{out.numel()} values of rows [{start}, {stop})"
            )
        return out

    def _read_chunk_rows(self, fqn, offsets, sizes, lo: int, hi: int) -> torch.Tensor:
        layout = self._layout(fqn, offsets)
        nr, nc = sizes
        contiguous = layout is not None and (nc <= 1 or layout.stride[1] == 1)
        np_dtype = _NUMPY.get(layout.dtype) if layout is not None else None
        if not contiguous or np_dtype is None or (nr > 1 and layout.stride[0] != nc):
            return self._load_chunk(fqn, offsets)[lo:hi].float()
        item = np.dtype(np_dtype).itemsize
        count = (hi - lo) * nc
        out = np.empty(count, dtype=np_dtype)
        with open(layout.path, "rb", buffering=0) as f:
            f.seek(layout.data_offset + lo * nc * item)
            got = f.readinto(memoryview(out).cast("B"))
        if got != count * item:
            raise OSError(f"{layout.path}: short read at {fqn!r} rows [{lo}, {hi})")
        return torch.from_numpy(out.reshape(hi - lo, nc)).float()
