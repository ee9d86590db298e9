"""Formats for per-client method state on disk, measured: write and read throughput, memory growth.

Each format stores ``--clients`` states of EWC's size on the Permuted-MNIST reference MLP (Fisher and anchor:
two model-sized float32 tensors, 5.1 MB), then reads them all back in a shuffled order (as rounds sample
clients), after dropping them from the page cache (``posix_fadvise(DONTNEED)`` on the fsynced files), so reads
come from the disk. Each format runs in a fresh process; ``rss_growth_mb`` is its peak RSS less the RSS before
the first write (one state is ~5 MB, so a format that keeps nothing resident grows by a few states at most).

- ``segment``: ``cfl.engine.stores.disk_states.DiskClientStates`` (append-only segment log, one fsync at the end).
- ``sqlite``: one table ``(cid INTEGER PRIMARY KEY, state BLOB)``, the same encoded records, one transaction.
- ``files``: one file per client (the same record), each fsynced (a checkpoint must be durable).
- ``mmap``: one preallocated file mapped with ``numpy.memmap``, a fixed slot per client, flushed at the end.

    python benchmarks/state_store_formats.py [--clients 120] [--dir /tmp/cfl-formats] [--formats segment,sqlite]

Prints one JSON line per format.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from cfl.engine.stores.disk_states import DiskClientStates
from cfl.engine.stores.state_codec import decode, encode

PARAMS = 784 * 400 + 400 + 2 * (400 * 400 + 400) + 400 * 10 + 10  # reference MLP 784-400-400-400-10


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def ewc_state(cid: int, fisher: torch.Tensor, anchor: torch.Tensor) -> dict:
    fisher[0], anchor[0] = cid, -cid  # each client's record differs; no fresh 5 MB per client
    return {"fisher": fisher, "anchor": anchor, "offset": torch.tensor(float(cid))}


def record(state: dict) -> bytes:
    return b"".join(bytes(b) for b in encode(state)[0])


def evict(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_format(name: str, clients: int, root: Path) -> dict:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    fisher, anchor = torch.rand(PARAMS), torch.randn(PARAMS)
    size = len(record(ewc_state(0, fisher, anchor)))
    order = list(range(clients))
    random.Random(0).shuffle(order)
    base = rss_mb()
    start = time.perf_counter()
    if name == "segment":
        store = DiskClientStates(root)
        for c in range(clients):
            store.put(c, ewc_state(c, fisher, anchor))
        store.state_dict()  # fsync, as a checkpoint does
        wrote = time.perf_counter() - start
        evict(list(root.glob("*.log")))
        start = time.perf_counter()
        for c in order:
            assert float(store.get(c)["offset"]) == c
    elif name == "sqlite":
        db = sqlite3.connect(root / "states.db")
        db.execute("CREATE TABLE s (cid INTEGER PRIMARY KEY, state BLOB)")
        with db:
            for c in range(clients):
                db.execute("INSERT INTO s VALUES (?, ?)", (c, record(ewc_state(c, fisher, anchor))))
        wrote = time.perf_counter() - start
        evict([root / "states.db"])
        start = time.perf_counter()
        for c in order:
            (blob,) = db.execute("SELECT state FROM s WHERE cid = ?", (c,)).fetchone()
            assert float(decode(bytearray(blob))["offset"]) == c
    elif name == "files":
        for c in range(clients):
            with open(root / f"{c}.rec", "wb") as fh:
                fh.write(record(ewc_state(c, fisher, anchor)))
                fh.flush()
                os.fsync(fh.fileno())
        wrote = time.perf_counter() - start
        evict(list(root.glob("*.rec")))
        start = time.perf_counter()
        for c in order:
            assert float(decode(bytearray((root / f"{c}.rec").read_bytes()))["offset"]) == c
    elif name == "mmap":
        slots = np.memmap(root / "states.bin", dtype=np.uint8, mode="w+", shape=(clients, size))
        for c in range(clients):
            slots[c] = np.frombuffer(record(ewc_state(c, fisher, anchor)), dtype=np.uint8)
        slots.flush()
        wrote = time.perf_counter() - start
        evict([root / "states.bin"])
        start = time.perf_counter()
        for c in order:
            assert float(decode(bytearray(slots[c]))["offset"]) == c
    else:
        raise SystemExit(f"unknown format {name}")
    read = time.perf_counter() - start
    total = clients * size / 1e6
    shutil.rmtree(root, ignore_errors=True)
    return {"format": name, "clients": clients, "record_mb": round(size / 1e6, 2), "total_mb": round(total),
            "write_mb_per_s": round(total / wrote), "read_mb_per_s": round(total / read),
            "rss_growth_mb": round(peak_mb() - base, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=120)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/cfl-formats"))
    parser.add_argument("--formats", default="segment,sqlite,files,mmap")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.one:
        print(json.dumps(run_format(args.one, args.clients, args.dir / args.one)))
        return
    for name in args.formats.split(","):  # a fresh process each: peak RSS is per format
        subprocess.run([sys.executable, __file__, "--one", name, "--clients", str(args.clients), "--dir",
                        str(args.dir)], check=True)


if __name__ == "__main__":
    main()
