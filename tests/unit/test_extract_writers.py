"""The extract stage's writer threads (`extract.writers`) and its room check (`extract.pool_root`, paths.root)."""

import threading

import pytest

from draftlab.data import room
from draftlab.data.features import read_manifest
from draftlab.stages import extract
from test_extract import config, pool, run, stored_samples  # noqa: F401 (pool is a fixture)


def reversed_writes(monkeypatch, fail: str | None = None) -> list[str]:
    """Makes shard-00000's write wait until shard-00001's has landed, so that several writers finish them out of
    order; `fail` names a shard whose write raises. Returns the shard names in the order their files landed."""
    landed: list[str] = []
    second_landed = threading.Event()
    original = extract.atomic_save_safetensors

    def write(path, tensors, metadata=None):
        if path.stem == "shard-00000":
            assert second_landed.wait(timeout=30), "shard-00001 was never written beside shard-00000"
        if path.stem == fail:
            raise OSError(28, "No space left on device", str(path))
        original(path, tensors, metadata)
        if path.stem.startswith("shard-"):  # not the head file
            landed.append(path.stem)
        if path.stem == "shard-00001":
            second_landed.set()

    monkeypatch.setattr(extract, "atomic_save_safetensors", write)
    return landed


def shard_entries(folder):
    return [{k: v for k, v in s.items() if k != "seconds"} for s in read_manifest(folder)["shards"]]


def test_several_writers_store_what_one_writer_stores(pool, monkeypatch):
    run(pool, config(pool, samples=14), folder="one")
    landed = reversed_writes(monkeypatch)
    run(pool, config(pool, samples=14, writers=3), folder="three")
    assert landed[:2] == ["shard-00001", "shard-00000"]  # the files did land out of order ...
    assert shard_entries(pool / "three") == shard_entries(pool / "one")  # ... and the manifest lists them in order
    for entry in shard_entries(pool / "one"):
        name = f"{entry['name']}.safetensors"
        assert (pool / "three" / name).read_bytes() == (pool / "one" / name).read_bytes()


def test_a_failed_write_keeps_the_shards_before_it_and_the_rerun_completes(pool, monkeypatch):
    run(pool, config(pool, samples=14), folder="clean")
    landed = reversed_writes(monkeypatch, fail="shard-00002")
    with pytest.raises(OSError, match="No space left"):
        run(pool, config(pool, samples=14, writers=3), folder="failed")
    assert "shard-00003" in landed  # a later shard's file was written, but the manifest stops before the gap
    assert [s["name"] for s in read_manifest(pool / "failed")["shards"]] == ["shard-00000", "shard-00001"]
    monkeypatch.undo()  # the disk has room again
    run(pool, config(pool, samples=14, writers=3), folder="failed")
    assert shard_entries(pool / "failed") == shard_entries(pool / "clean")
    assert sorted(stored_samples(pool / "failed")) == list(range(14))


@pytest.mark.parametrize("pool_root, in_memory, key", [(None, False, "paths.root"),
                                                        ("mem", True, "extract.pool_root")])
def test_an_extraction_that_cannot_fit_is_refused_before_it_starts(pool, monkeypatch, pool_root, in_memory, key):
    needed = {}
    monkeypatch.setattr(extract, "free_bytes", lambda path: (needed.setdefault("free", 4096), in_memory))
    monkeypatch.setattr(extract, "extract_shard", lambda *a, **k: pytest.fail("extraction started"))
    cfg = config(pool, samples=14, pool_root=str(pool / pool_root) if pool_root else None)
    with pytest.raises(OSError, match=key) as err:
        run(pool, cfg)
    assert ("extract.pool_root=null" in str(err.value)) == in_memory
    assert not list((pool / "extract").glob("shard-*"))


def test_the_estimate_covers_what_the_shards_take(pool, monkeypatch):
    estimates = []
    original = extract._check_room
    monkeypatch.setattr(extract, "_check_room", lambda cfg, out, manifest, tokens, samples: estimates.append(
        (tokens, room.estimated_bytes_per_token(manifest))) or original(cfg, out, manifest, tokens, samples))
    run(pool, config(pool, samples=16))
    manifest = read_manifest(pool / "extract")
    tokens, per_token = estimates[0]
    assert tokens == manifest["tokens"]  # 16 samples: two whole shards of the samples pool, no pro rata
    assert 0.8 * manifest["bytes_per_token"] <= per_token <= manifest["bytes_per_token"]  # headers and offsets


def test_filesystem_type_takes_the_longest_mount_above_the_path(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\n"
                      "tmpfs /dev/shm/my\\040pool ramfs rw 0 0\n")
    assert room.filesystem_type("/dev/shm/draftlab/extract", mounts) == "tmpfs"
    assert room.filesystem_type("/dev/shmx/a", mounts) == "ext4"
    assert room.filesystem_type("/dev/shm/my pool/x", mounts) == "ramfs"
    assert room.filesystem_type("/dev/shm", tmp_path / "absent") == ""


def test_free_bytes_of_memory_counts_the_available_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(room, "filesystem_type", lambda path: "tmpfs")
    monkeypatch.setattr(room, "available_memory", lambda: 1234)
    assert room.free_bytes(tmp_path) == (1234, True)
    monkeypatch.setattr(room, "filesystem_type", lambda path: "ramfs")  # reports 0 free: memory alone counts
    assert room.free_bytes(tmp_path) == (1234, True)
    monkeypatch.setattr(room, "filesystem_type", lambda path: "ext4")
    free, in_memory = room.free_bytes(tmp_path)
    assert free > 1234 and not in_memory


def test_available_memory_keeps_within_a_containers_limit(tmp_path):
    (tmp_path / "memory.max").write_text("3000\n")
    (tmp_path / "memory.current").write_text("1000\n")
    assert room.available_memory(tmp_path) == 2000  # far below any host's MemAvailable
    (tmp_path / "memory.max").write_text("max\n")
    assert room.available_memory(tmp_path) > 2000  # no limit: the host's MemAvailable


def test_a_pool_in_memory_also_counts_the_pinned_staging_buffers(pool, monkeypatch):
    cfg = config(pool, samples=1000, shard_size=64, writers=4)
    manifest = {"bytes_per_token": 1000.0}
    tokens, samples = 1_000_000, 1000  # 1 GB of shards; each shard of 64 samples 64 MB, 5 in flight at most
    base = tokens * 1000 + room.ROOM_MARGIN
    staging = 2 * 5 * 64 * 1000 * 1000
    for in_memory, free, fits in [(False, base + 100, True), (True, base + 100, False),
                                  (True, base + staging + 100, True)]:
        monkeypatch.setattr(extract, "free_bytes", lambda path, free=free, in_memory=in_memory: (free, in_memory))
        if fits:
            extract._check_room(cfg, pool, manifest, tokens, samples)
        else:
            with pytest.raises(OSError, match="extract.pool_root|paths.root"):
                extract._check_room(cfg, pool, manifest, tokens, samples)
