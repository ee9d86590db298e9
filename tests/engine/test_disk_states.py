"""The on-disk client-state store: round trips, crash safety of its checkpoints, compaction."""

import os

import pytest
import torch

from cfl.engine.stores.disk_states import DiskClientStates
from cfl.engine.stores.state_codec import decode, encode
from cfl.tensors import nbytes


def state(seed: int, width: int = 50) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {"fisher": {"w": torch.rand(width, 3, generator=gen), "b": torch.rand(3, generator=gen)},
            "anchor.w": torch.randn(width, 3, generator=gen).to(torch.bfloat16), "offset": torch.tensor(float(seed)),
            "memory": [torch.arange(seed, seed + 4), torch.zeros(0, 2)], "valid": torch.rand(5, generator=gen) > 0.5,
            "count": seed, "mode": "separate", "span": (1, 2.5), "none": None, 7: torch.ones(2, dtype=torch.int8)}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_codec_round_trips_a_nested_state():
    buffers, length, data = encode(state(3))
    raw = bytearray(b"".join(bytes(b) for b in buffers))
    assert len(raw) == length and data == nbytes(state(3))
    assert same(decode(raw), state(3))
    with pytest.raises(TypeError, match="ndarray"):
        import numpy as np
        encode({"x": np.zeros(2)})


def test_get_put_ids_len_and_removal(tmp_path):
    store = DiskClientStates(tmp_path / "s")
    assert store.get(5) == {} and len(store) == 0 and not (tmp_path / "s").exists()
    for c in (9, 2, 5):
        store.put(c, state(c))
    assert store.ids() == [2, 5, 9] and len(store) == 3
    assert all(same(store.get(c), state(c)) for c in (2, 5, 9))
    assert store.nbytes(2) == nbytes(state(2)) and store.nbytes(4) == 0
    store.put(5, {})
    assert store.ids() == [2, 9] and store.get(5) == {}


def test_unchanged_state_is_not_rewritten_and_an_in_place_change_is(tmp_path):
    store = DiskClientStates(tmp_path)
    store.put(1, state(1))
    written = store.bytes_written
    got = store.get(1)
    store.put(1, got)
    assert store.bytes_written == written  # read only: nothing appended
    got = store.get(1)
    got["fisher"]["w"].mul_(2)  # in place: torch's version counter moves
    store.put(1, got)
    assert store.bytes_written > written
    assert torch.equal(store.get(1)["fisher"]["w"], state(1)["fisher"]["w"] * 2)
    got = store.get(1)
    got["count"] = 99  # a plain value changed
    store.put(1, got)
    assert store.get(1)["count"] == 99


def test_a_crash_after_appends_restores_the_committed_records(tmp_path):
    store = DiskClientStates(tmp_path)
    for c in range(6):
        store.put(c, state(c))
    manifest = store.state_dict()  # what checkpoint.pt holds
    store.committed()
    for c in range(3, 9):
        store.put(c, state(100 + c))  # after the checkpoint: new versions and new clients
    with open(tmp_path / sorted(os.listdir(tmp_path))[-1], "ab") as fh:
        fh.write(b"CFLS\x40\x00\x00\x00{half a rec")  # a record torn by the kill
    del store  # killed: nothing closed, nothing committed

    resumed = DiskClientStates(tmp_path)
    resumed.load_state_dict(manifest)
    assert resumed.ids() == list(range(6))
    assert all(same(resumed.get(c), state(c)) for c in range(6))
    resumed.put(7, state(7))
    assert same(resumed.get(7), state(7)) and same(resumed.get(2), state(2))


def test_compaction_bounds_the_disk_and_keeps_what_the_durable_checkpoint_names(tmp_path):
    one = len(b"".join(bytes(b) for b in encode(state(0))[0]))
    store = DiskClientStates(tmp_path, segment_bytes=3 * one, compact_min_bytes=0)
    for c in range(4):
        store.put(c, state(c))
    first = store.state_dict()
    store.committed()
    for rnd in range(1, 12):  # every client rewritten many times: compaction runs
        for c in range(4):
            store.put(c, state(10 * rnd + c))
        assert store.disk_bytes() <= 2 * store.live_bytes() + 3 * one + sum(
            (tmp_path / f"seg-{s:06d}.log").stat().st_size for s in store._committed)
    assert all(same(store.get(c), state(110 + c)) for c in range(4))
    store.state_dict()  # a later checkpoint was being written when the process died: not yet durable
    del store
    back = DiskClientStates(tmp_path)
    back.load_state_dict(first)  # the durable checkpoint's records survived compaction
    assert all(same(back.get(c), state(c)) for c in range(4))


def test_committed_drops_the_files_no_checkpoint_names(tmp_path):
    one = len(b"".join(bytes(b) for b in encode(state(0))[0]))
    store = DiskClientStates(tmp_path, segment_bytes=2 * one, compact_min_bytes=0)
    for rnd in range(6):
        for c in range(4):
            store.put(c, state(rnd * 4 + c))
        store.state_dict()
        store.committed()
    files = sorted(os.listdir(tmp_path))
    assert sum((tmp_path / f).stat().st_size for f in files) <= 2 * store.live_bytes() + 2 * one
    assert all(same(store.get(c), state(20 + c)) for c in range(4))


def test_a_manifest_whose_records_are_gone_is_refused(tmp_path):
    store = DiskClientStates(tmp_path)
    store.put(0, state(0))
    manifest = store.state_dict()
    for f in os.listdir(tmp_path):
        os.truncate(tmp_path / f, 10)
    with pytest.raises(ValueError, match="shorter"):
        DiskClientStates(tmp_path).load_state_dict(manifest)


def test_store_choice_and_the_disk_refusal(tmp_path, monkeypatch):
    from cfl.config.schema import ConfigError
    from cfl.engine.stores import state_budget

    assert state_budget.choose_store("auto", state_budget.MEMORY_BYTES) == "memory"
    assert state_budget.choose_store("auto", state_budget.MEMORY_BYTES + 1) == "disk"
    assert state_budget.choose_store("memory", 10**15) == "memory"
    assert state_budget.choose_store("disk", 0) == "disk"
    def sizing(clients: int, tasks: int, rounds_per_task: int = 2) -> state_budget.StateSizing:
        return state_budget.StateSizing(model_bytes=2_555_240, sample_bytes=3136, samples_per_client=6.0,
                                        num_clients=clients, num_tasks=tasks, rounds=tasks * rounds_per_task,
                                        clients_per_round=20, protected={})

    state_budget.check_disk(tmp_path / "run", {"ewc": 125 * 5_110_000}, sizing(125, 10))  # 0.6 GB fits
    monkeypatch.setattr(state_budget, "free_bytes", lambda _: 20 * 10**9)
    with pytest.raises(ConfigError, match=r"ewc ~5.11 MB per client.*51.1 GB.*needs up to 103.3 GB.*20.0 GB free"):
        state_budget.check_disk(tmp_path / "run", {"ewc": 10_000 * 5_110_000, "fedprox": 0}, sizing(10_000, 10))
    # two tasks: one task end writes every client once; dead records only from the 4 rounds' 20 clients
    total = 10_000 * 5_110_000
    assert state_budget.disk_need(total, sizing(10_000, 2)) == total + 4 * 20 * 5_110_000 + state_budget.SEGMENT_BYTES
    assert state_budget.disk_need(total, sizing(10_000, 3)) == 2 * total + state_budget.SEGMENT_BYTES
    assert state_budget.disk_need(1000, sizing(10, 10)) == 2 * 1000 + 1000  # a segment no larger than the state
    monkeypatch.setattr(state_budget, "free_bytes", lambda _: 60 * 10**9)
    state_budget.check_disk(tmp_path / "run", {"ewc": total}, sizing(10_000, 2))  # 52.6 GB fits in 60
    with pytest.raises(ConfigError, match=r"needs up to 103.3 GB.*over 3 tasks and 6 rounds"):
        state_budget.check_disk(tmp_path / "run", {"ewc": total}, sizing(10_000, 3))


def test_the_last_clients_states_are_kept_and_older_ones_read_again(tmp_path):
    store = DiskClientStates(tmp_path, cache_clients=2)
    for c in range(3):
        store.put(c, state(c))
    read = store.bytes_read
    assert store.get(2) is store.get(2) and store.bytes_read == read  # kept as put: no read
    first = store.get(0)  # evicted by clients 1 and 2: read from disk
    assert store.bytes_read > read and same(first, state(0))
    first["count"] = -1  # changed in place and never put: the memory store would give it back too
    assert store.get(0)["count"] == -1


def test_every_record_is_checksummed_and_a_changed_one_is_refused_naming_its_file(tmp_path):
    from cfl.engine.stores.state_codec import RecordDamaged, check

    buffers, length, _ = encode(state(1))
    raw = bytearray(b"".join(bytes(b) for b in buffers))
    check(raw)
    for i in (9, 20, length - 70):  # the header length, the header, the last tensor's data
        bad = bytearray(raw)
        bad[i] ^= 0x04
        with pytest.raises(RecordDamaged, match="checksum mismatch"):
            decode(bad)
    with pytest.raises(RecordDamaged, match="older cfl, without a checksum"):
        check(b"CFLS" + bytes(raw[4:]))

    store = DiskClientStates(tmp_path)
    for c in range(3):
        store.put(c, state(c))
    manifest = store.state_dict()
    store.close()
    seg, offset, _, _ = manifest["records"][1].tolist()
    path = tmp_path / f"seg-{seg:06d}.log"
    data = bytearray(path.read_bytes())
    data[offset + 200] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(RecordDamaged, match=rf"{path}: the record of client 1 at byte {offset} is damaged"):
        DiskClientStates(tmp_path).load_state_dict(manifest)  # a resume checks every record first
    assert path.exists()  # and deletes nothing when it refuses
    store = DiskClientStates(tmp_path, cache_clients=0)
    store._index = {int(c): tuple(r) for c, r in zip(manifest["cids"].tolist(), manifest["records"].tolist(),
                                                      strict=True)}
    with pytest.raises(RecordDamaged, match="client 1"):
        store.get(1)  # damaged during a run: refused on the read too
    assert same(store.get(0), state(0))


def test_a_store_of_records_without_checksums_is_refused_with_the_way_out(tmp_path):
    store = DiskClientStates(tmp_path)
    store.put(0, state(0))
    manifest = {**store.state_dict(), "format": 1}
    with pytest.raises(ValueError, match="older cfl, whose records carry no checksum.*--overwrite"):
        DiskClientStates(tmp_path).load_state_dict(manifest)
