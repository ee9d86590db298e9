"""Every client's method state on disk: an append-only segment log with an in-memory index.

Cross-device runs hold thousands of clients of which a few train each round; keeping every client's state
in memory (and rewriting all of it into every checkpoint) does not scale. :class:`DiskClientStates` keeps
the same interface as the in-memory store (``get``, ``put``, ``ids``, ``len``, ``state_dict``,
``load_state_dict``), so methods never see the difference:

- ``put`` appends the state, encoded by :mod:`cfl.engine.stores.state_codec`, to the active segment file
  (``seg-NNNNNN.log``, a new one past ``segment_bytes``) and points the index ``cid -> (segment, offset,
  length)`` at it; the client's previous record becomes dead bytes. ``get`` reads one record with one
  ``pread`` into a buffer its tensors are views of: memory is bounded by the states in use, not by the
  number of clients (the index costs ~100 bytes a client).
- Writes are flushed to disk every ``SYNC_BYTES`` and a full segment when it is sealed (a task end rewrites
  every client), and ``state_dict`` fsyncs what was written since the last call (at most ``SYNC_BYTES``
  are left) and returns the *manifest*: the index as two int64 tensors (40 bytes a client). It goes into
  ``checkpoint.pt``, which is replaced atomically, so a checkpoint and the records it names are committed
  together; a checkpoint rewrites no client state.
- ``committed`` (called once the checkpoint holding the last manifest is durable) deletes segment files that
  neither the live index nor that manifest reference. Until then nothing a durable checkpoint may name is
  deleted or overwritten (segments are only appended to), so a SIGKILL at any moment, in a write included,
  leaves the last checkpoint and its records intact; ``load_state_dict`` of its manifest restores the index,
  deletes the files written after it and appends to a new segment.
- Compaction: when dead bytes exceed live bytes (and ``compact_min_bytes``), the live records of every
  segment that is at least half dead are copied, undecoded, to a new segment; the old files go at once,
  or at the next ``committed`` where the committed manifest still names them. Disk use stays below about
  twice the live states plus one segment.
- The last ``cache_clients`` states given out or put are kept as they are (the runner sets it to the clients
  of a round, which a round may read twice), and a ``put`` of such a dict whose tensors are the same objects
  at the same version (torch counts in-place writes) and whose other values are equal writes nothing: a
  method that only reads its state during a round costs one read per sampled client.

Format measurements (against SQLite, a file per client and a memory-mapped file) are in docs/scaling.md
(``benchmarks/state_store_formats.py``).
"""

from __future__ import annotations

import itertools
import os
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from cfl.engine.stores.state_codec import RecordDamaged, check, decode, encode

State = dict[str, Any]
SEGMENT_BYTES = 1 << 30
SYNC_BYTES = 32 << 20  # written bytes flushed to disk as they accumulate, so a checkpoint waits for few
COMPACT_MIN_BYTES = 64 << 20
MANIFEST_FORMAT = 2  # 2: every record carries a CRC-32 (1: records without one, refused)
_IOV_MAX = 512


def _segment_name(seg: int) -> str:
    return f"seg-{seg:06d}.log"


def _segment_files(root: Path) -> dict[int, Path]:
    out = {}
    if root.is_dir():
        for path in root.glob("seg-*.log"):
            try:
                out[int(path.stem[4:])] = path
            except ValueError:
                continue
    return out


def _write_all(fd: int, buffers: list[Any], offset: int) -> int:
    """Write ``buffers`` at ``offset`` (short writes retried); the bytes written."""
    written = 0
    pending = [memoryview(b).cast("B") for b in buffers if len(b)]
    while pending:
        n = os.pwritev(fd, pending[:_IOV_MAX], offset + written)
        written += n
        while pending and n >= len(pending[0]):
            n -= len(pending[0])
            pending.pop(0)
        if n:
            pending[0] = pending[0][n:]
    return written


def _read_exact(fd: int, length: int, offset: int) -> bytearray:
    buf = bytearray(length)
    view, done = memoryview(buf), 0
    while done < length:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise OSError(f"client-state segment ended {length - done} bytes early")
        done += n
    return buf


def _skeleton(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """``obj`` with its tensors replaced by markers (collected into ``tensors``), for change detection."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return ("<tensor>",)
    if isinstance(obj, dict):
        return tuple((k, _skeleton(v, tensors)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, *(_skeleton(v, tensors) for v in obj))
    return obj


class DiskClientStates:
    """Client id -> state, stored under ``root`` (created on the first write); see the module docstring."""

    kind = "disk"

    def __init__(self, root: Path | str, device: torch.device | str = "cpu", segment_bytes: int = SEGMENT_BYTES,
                 compact_min_bytes: int = COMPACT_MIN_BYTES, cache_clients: int = 32) -> None:
        self.root, self.device = Path(root), torch.device(device)
        self.segment_bytes, self.compact_min_bytes = segment_bytes, compact_min_bytes
        self._index: dict[int, tuple[int, int, int, int]] = {}  # cid -> (segment, offset, length, tensor bytes)
        self._size: dict[int, int] = {}  # segment -> bytes in the file
        self._live: dict[int, int] = {}  # segment -> bytes of records the index points at
        self._fds: dict[int, int] = {}
        self._active: int | None = None
        self._next: int | None = None  # number of the next segment file
        self._dirty: set[int] = set()  # segments written since the last state_dict
        self._new_files = False
        self._committed: set[int] = set()  # segments named by the last durable checkpoint
        self._pending: set[int] | None = None  # segments named by the last state_dict, not yet durable
        self.cache_clients = cache_clients
        self._cache: OrderedDict[int, State] = OrderedDict()  # the last states given or put, as they are
        self._handed: dict[int, tuple[int, Any, list[tuple[weakref.ref, int]]]] = {}  # their signatures
        self.bytes_written = 0
        self.bytes_read = 0
        self._unsynced = 0  # bytes written to the active segment since it was last flushed

    # ---- the ClientStates interface ----
    def get(self, cid: int) -> State:
        """The client's state (``{}`` for a client without one); write changes back with ``put``. One of the
        last ``cache_clients`` clients gets the very dict it was last given or put (as the memory store does:
        a round reads its clients' states for training and, for methods acting after rounds, ``client_end``);
        others are read from disk."""
        cid = int(cid)
        if cid in self._cache:
            self._cache.move_to_end(cid)
            return self._cache[cid]
        entry = self._index.get(cid)
        if entry is None:
            return {}
        seg, offset, length, _ = entry
        raw = self._read(seg, offset, length)
        self._check(raw, cid, seg, offset)
        state = decode(raw, self.device)
        self._remember(cid, state)
        return state

    def put(self, cid: int, state: State) -> None:
        """Store the client's state (appended to the log unless unchanged); an empty dict removes it."""
        cid = int(cid)
        if self._unchanged(cid, state):
            self._remember(cid, state)
            return
        old = self._index.pop(cid, None)
        if old is not None:
            self._live[old[0]] -= old[2]
        self._cache.pop(cid, None)
        self._handed.pop(cid, None)
        if state:
            buffers, length, data = encode(state)
            seg, offset = self._append(buffers, length)
            self._index[cid] = (seg, offset, length, data)
            self._live[seg] += length
            self._remember(cid, state)
        if self._dead() > max(self._total_live(), self.compact_min_bytes):
            self.compact()

    def ids(self) -> list[int]:
        """The clients holding a state, sorted."""
        return sorted(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def nbytes(self, cid: int) -> int:
        """Bytes of the client's state as :func:`cfl.tensors.nbytes` counts them (0 without one), from the
        index: no read."""
        entry = self._index.get(int(cid))
        return 0 if entry is None else entry[3]

    # ---- checkpoints ----
    def state_dict(self) -> dict[str, Any]:
        """Make every record written so far durable and return the manifest that names them (for the checkpoint)."""
        for seg in sorted(self._dirty):
            os.fsync(self._fd(seg))
        if self._new_files:
            fd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._dirty.clear()
        self._new_files = False
        cids = sorted(self._index)
        records = torch.tensor([self._index[c] for c in cids], dtype=torch.int64).reshape(len(cids), 4)
        self._pending = {int(s) for s in records[:, 0].unique().tolist()}
        return {"store": "disk", "format": MANIFEST_FORMAT, "cids": torch.tensor(cids, dtype=torch.int64),
                "records": records}

    def committed(self) -> None:
        """The checkpoint holding the last ``state_dict`` is durable: drop the files no checkpoint can name."""
        if self._pending is None:
            return
        self._committed, self._pending = self._pending, None
        self._delete_unreferenced()

    def load_state_dict(self, manifest: dict[Any, Any]) -> None:
        """Point the index at a checkpoint's records; delete segments written after it (they hold no record it
        names) and write on to a new segment. Every record is read and its checksum checked first: raises
        ``ValueError`` (:class:`RecordDamaged` for a changed record) when the files do not hold the records.

        A checkpoint of the in-memory store (client id -> state) is written into a fresh store instead."""
        if manifest.get("store") != "disk":
            self._reset()
            for cid, state in manifest.items():
                self.put(int(cid), state)
            return
        if manifest.get("format") == 1:
            raise ValueError(f"the client states in {self.root} were written by an older cfl, whose records carry no "
                             f"checksum (manifest format 1; this cfl reads format {MANIFEST_FORMAT} only, so that a "
                             "changed record is never read as a state); resume the run with the cfl that wrote it, "
                             "or start it again with --overwrite")
        if manifest.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"not a disk client-state manifest of format {MANIFEST_FORMAT}")
        self.close()
        files = _segment_files(self.root)
        records = manifest["records"].tolist()
        index = {int(c): tuple(int(v) for v in r) for c, r in zip(manifest["cids"].tolist(), records, strict=True)}
        needed: dict[int, int] = {}
        for seg, offset, length, _ in index.values():
            needed[seg] = max(needed.get(seg, 0), offset + length)
        for seg, end in needed.items():
            size = files[seg].stat().st_size if seg in files else -1
            if size < end:
                raise ValueError(f"{self.root / _segment_name(seg)} is missing or shorter ({size} bytes) than the "
                                 f"checkpoint's records need ({end} bytes)")
        self._index = index  # type: ignore[assignment]
        self._verify(files)
        self._size = {seg: files[seg].stat().st_size for seg in needed}
        self._live = dict.fromkeys(needed, 0)
        for seg, _, length, _ in index.values():
            self._live[seg] += length
        self._committed, self._pending = set(needed), None
        self._active, self._dirty, self._new_files = None, set(), False
        self._handed, self._cache = {}, OrderedDict()
        self._next = max(files, default=0) + 1
        self._delete_unreferenced()

    def _reset(self) -> None:
        """Forget every record and delete every segment file (no durable checkpoint names them)."""
        self.close()
        self._index, self._size, self._live, self._handed, self._cache = {}, {}, {}, {}, OrderedDict()
        self._committed, self._pending, self._dirty, self._next = set(), None, set(), None
        for path in _segment_files(self.root).values():
            path.unlink()

    def close(self) -> None:
        """Close the open segment files (the store reopens them on use)."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._active = None

    # ---- disk use ----
    def disk_bytes(self) -> int:
        """Bytes of all segment files this store holds (live and dead records)."""
        return sum(self._size.values())

    def live_bytes(self) -> int:
        return self._total_live()

    def compact(self) -> None:
        """Copy the live records of every segment that is at least half dead to a new segment; drop the old files
        at once, or at the next ``committed`` when the last durable checkpoint names them."""
        self._roll()
        victims = [s for s in sorted(self._size)
                   if s != self._active and self._size[s] - self._live[s] >= self._live[s]]
        for seg in victims:
            moving = sorted(((e[1], cid) for cid, e in self._index.items() if e[0] == seg))
            for offset, cid in moving:
                _, _, length, data = self._index[cid]
                raw = self._read(seg, offset, length)
                self._check(raw, cid, seg, offset)  # a damaged record is not copied on as if it were sound
                new_seg, new_offset = self._append([raw], length)
                self._index[cid] = (new_seg, new_offset, length, data)
                self._live[new_seg] += length
                self._live[seg] -= length
        self._delete_unreferenced()

    # ---- internals ----
    def _remember(self, cid: int, state: State) -> None:
        """Keep ``state`` as the client's cached state, with its signature for ``_unchanged``."""
        tensors: list[torch.Tensor] = []
        skeleton = _skeleton(state, tensors)
        self._handed[cid] = (id(state), skeleton, [(weakref.ref(t), t._version) for t in tensors])
        self._cache[cid] = state
        self._cache.move_to_end(cid)
        while len(self._cache) > self.cache_clients:
            old, _ = self._cache.popitem(last=False)
            self._handed.pop(old, None)

    def _unchanged(self, cid: int, state: State) -> bool:
        handed = self._handed.get(cid)
        if handed is None or handed[0] != id(state) or cid not in self._index:
            return False
        tensors: list[torch.Tensor] = []
        if _skeleton(state, tensors) != handed[1] or len(tensors) != len(handed[2]):
            return False
        return all(ref() is t and t._version == version for t, (ref, version) in zip(tensors, handed[2], strict=True))

    def _total_live(self) -> int:
        return sum(self._live.values())

    def _dead(self) -> int:
        return sum(self._size.values()) - self._total_live()

    def _fd(self, seg: int) -> int:
        if seg not in self._fds:
            self._fds[seg] = os.open(self.root / _segment_name(seg), os.O_RDONLY)
        return self._fds[seg]

    def _read(self, seg: int, offset: int, length: int) -> bytearray:
        self.bytes_read += length
        return _read_exact(self._fd(seg), length, offset)

    def _check(self, raw: bytearray, cid: int, seg: int, offset: int) -> None:
        try:
            check(raw)
        except RecordDamaged as err:
            raise RecordDamaged(f"{self.root / _segment_name(seg)}: the record of client {cid} at byte {offset} is "
                                f"damaged: {err}; the file was changed after cfl wrote it") from None

    def _verify(self, files: dict[int, Path]) -> None:
        """Read every record the index names, in file order, and check its checksum (one record in memory)."""
        in_order = sorted(self._index.items(), key=lambda item: item[1][:2])
        for seg, records in itertools.groupby(in_order, key=lambda item: item[1][0]):
            fd = os.open(files[seg], os.O_RDONLY)
            try:
                for cid, (_, offset, length, _) in records:
                    self._check(_read_exact(fd, length, offset), cid, seg, offset)
            finally:
                os.close(fd)

    def _roll(self) -> None:
        """Start a new active segment (a new file, never one that exists)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self._next is None:
            self._next = max(_segment_files(self.root), default=0) + 1
        seg, self._next = self._next, self._next + 1
        if self._active is not None and self._active in self._fds:  # reopen the sealed one read-only on use
            if self._unsynced:  # seal it durable now: the next checkpoint waits only for the active one's tail
                os.fdatasync(self._fds[self._active])
                self._dirty.discard(self._active)
            os.close(self._fds.pop(self._active))
        self._unsynced = 0
        self._fds[seg] = os.open(self.root / _segment_name(seg), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        self._active, self._size[seg], self._live[seg], self._new_files = seg, 0, 0, True

    def _append(self, buffers: list[Any], length: int) -> tuple[int, int]:
        if self._active is None or self._size[self._active] + length > self.segment_bytes and self._size[self._active]:
            self._roll()
        seg = self._active
        assert seg is not None
        offset = self._size[seg]
        written = _write_all(self._fds[seg], buffers, offset)
        if written != length:
            raise AssertionError(f"client-state record: wrote {written} bytes, expected {length}")
        self._size[seg] += length
        self._dirty.add(seg)
        self.bytes_written += length
        self._unsynced += length
        if self._unsynced >= SYNC_BYTES:  # a task end writing every client: flush as it goes
            os.fdatasync(self._fds[seg])
            self._unsynced = 0
        return seg, offset

    def _delete_unreferenced(self) -> None:
        keep = {e[0] for e in self._index.values()} | self._committed | (self._pending or set())
        if self._active is not None:
            keep.add(self._active)
        for seg, path in _segment_files(self.root).items():
            if seg not in keep:
                if seg in self._fds:
                    os.close(self._fds.pop(seg))
                path.unlink(missing_ok=True)
                self._size.pop(seg, None)
                self._live.pop(seg, None)
                self._dirty.discard(seg)
