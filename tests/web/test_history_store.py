"""Per-user history: restarts, isolation between users, SIGKILL mid-write, concurrent requests, the cap."""

import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.contract import image_files as image_io
from pipeline.contract.errors import InvalidInput
from web.history.store import DATABASE_NAME, REQUIRED_SETTINGS, HistoryLocked, HistoryStore

ROOT = Path(__file__).resolve().parents[2]  # the repository


def _settings(seed: int, **extra) -> dict:
    return {
        "prompt": f"a red fox number {seed}",
        "negative_prompt": "blurry",
        "seed": seed,
        "steps": 4,
        "sampler": "Euler",
        "guidance_scale": 5.0,
        "width": 64,
        "height": 64,
        **extra,
    }


@pytest.fixture(scope="module")
def request_files(tmp_path_factory) -> list[Path]:
    """Two images of one request, written as the app writes them (JPEG gallery file, lossless PNG)."""
    directory = tmp_path_factory.mktemp("request")
    pixels = np.random.default_rng(0).integers(0, 256, (2, 64, 96, 3), dtype=np.uint8)
    images = image_io.to_pil(pixels, ["a red fox\nSteps: 4, Sampler: Euler, Seed: 1"] * 2)
    return [image_io.save_jpeg(images[0], directory / "a-00.jpg"), image_io.save_png(images[1], directory / "a-01.png")]


def _export(store: HistoryStore, user: str, entry_id: int, index: int, directory: Path) -> Path | None:
    """A copy of one of `user`'s files in `directory` (what a page serving them through Gradio's cache would do)."""
    source = store.file_of(user, entry_id, index)
    if source is None:
        return None
    target = directory / f"history-{entry_id}-{source.name}"
    shutil.copyfile(source, target)
    return target


def _files_on_disk(directory: Path) -> set[str]:
    return {str(p.relative_to(directory / "files")) for p in (directory / "files").glob("*/*") if p.is_dir()}


def test_entries_survive_a_restart(tmp_path, request_files):
    with HistoryStore(tmp_path) as store:
        ids = [store.add("alice", _settings(seed), request_files, created=1_700_000_000 + seed) for seed in range(3)]
    with HistoryStore(tmp_path) as store:  # a new store on the same directory: a restarted server
        entries = store.list("alice")
        assert [entry.id for entry in entries] == ids[::-1]  # newest first
        assert [entry.settings["seed"] for entry in entries] == [2, 1, 0]
        answer = entries[0].as_json()
        assert set(REQUIRED_SETTINGS) | {"id", "created", "images"} <= set(answer)
        assert answer["created"] == "2023-11-14T22:13:22.000Z" and answer["images"] == ["00.jpg", "01.png"]
        for index, source in enumerate(request_files):
            kept = store.file_of("alice", ids[0], index)
            assert kept.read_bytes() == source.read_bytes()  # the very file, parameters included
            assert image_io.read_parameters(kept).startswith("a red fox")
            with Image.open(store.file_of("alice", ids[0], index, thumbnail=True)) as thumbnail:
                assert thumbnail.format == "JPEG" and max(thumbnail.size) <= 256
        assert store.file_of("alice", ids[0], 2) is None  # past the entry's images
        assert store.count("alice") == 3 and store.get("alice", ids[1]).settings == _settings(1)


def test_thumbnails_from_images_in_memory(tmp_path, request_files):
    """The request's PIL images (still in memory) spare decoding its PNGs; the kept files are the PNG/JPEG given."""
    y, x = np.mgrid[0:64, 0:96]
    smooth = [np.stack([x * 2, y * 3, (x + y) % 256], axis=-1).astype(np.uint8), np.full((64, 96, 3), 200, np.uint8)]
    in_memory = [Image.fromarray(pixels) for pixels in smooth]  # not the files' pixels: the thumbnails show these
    big = Image.fromarray(np.tile(smooth[0], (12, 8, 1)))  # 768x768 ... reduced 6x before resizing
    with HistoryStore(tmp_path, thumbnail_size=128) as store:
        entry = store.add("alice", _settings(1), request_files, thumbnail_sources=in_memory)
        wide = store.add("alice", _settings(2), request_files[:1], thumbnail_sources=[big])
        with Image.open(store.file_of("alice", entry, 1, thumbnail=True)) as thumbnail:
            assert thumbnail.size == (96, 64)  # not enlarged
            assert np.abs(np.asarray(thumbnail, int) - 200).max() <= 2
        with Image.open(store.file_of("alice", wide, 0, thumbnail=True)) as thumbnail:
            assert thumbnail.size == (128, 128)
        assert store.file_of("alice", entry, 1).read_bytes() == request_files[1].read_bytes()
        with pytest.raises(ValueError, match="1 thumbnail sources for 2 images"):
            store.add("alice", _settings(3), request_files, thumbnail_sources=in_memory[:1])


def test_users_never_see_each_others_entries(tmp_path, request_files):
    with HistoryStore(tmp_path) as store:
        mine = store.add("alice", _settings(1), request_files)
        theirs = store.add("bob", _settings(2), request_files)
        assert [e.id for e in store.list("alice")] == [mine] and [e.id for e in store.list("bob")] == [theirs]
        # Bob asks for Alice's entry by its id: it does not exist for him.
        assert store.get("bob", mine) is None
        assert store.file_of("bob", mine, 0) is None and store.file_of("bob", mine, 0, thumbnail=True) is None
        assert _export(store, "bob", mine, 0, tmp_path) is None
        assert store.delete("bob", mine) is False
        assert store.delete_all("bob") == 1  # his own only
        assert [e.id for e in store.list("alice")] == [mine] and store.list("bob") == []
        assert store.file_of("alice", mine, 1).is_file()
        # Folders are named by a keyed hash, never by the name.
        names = [p.name for p in (tmp_path / "files").rglob("*")]
        assert names and not any("alice" in name or "bob" in name for name in names)
        (tmp_path / "served").mkdir()
        exported = _export(store, "alice", mine, 1, tmp_path / "served")
        assert exported.read_bytes() == request_files[1].read_bytes()
        assert store.delete("alice", mine) is True and store.get("alice", mine) is None
        assert _files_on_disk(tmp_path) == set()  # deleted entries take their files with them
        assert exported.is_file()  # an exported copy (e.g. in Gradio's cache) is the page's to expire


def test_bad_requests_get_one_sentence(tmp_path, request_files):
    with HistoryStore(tmp_path) as store:
        entry = store.add("alice", _settings(1), request_files)
        for user in ("", "   ", None, "x" * 300):
            with pytest.raises(InvalidInput):
                store.list(user)
        for bad_id in ("abc", 1.5, True, 0, -3, None):
            with pytest.raises(InvalidInput, match="History entry ids"):
                store.get("alice", bad_id)
        assert store.get("alice", str(entry)).id == entry  # an API client's string id works
        with pytest.raises(InvalidInput, match="limit"):
            store.list("alice", limit=10**6)
        with pytest.raises(ValueError, match="settings lack negative_prompt"):
            store.add("alice", {k: v for k, v in _settings(1).items() if k != "negative_prompt"}, request_files)
        with pytest.raises(ValueError, match="not an image file"):
            store.add("alice", _settings(1), [tmp_path / DATABASE_NAME])
        assert store.count("alice") == 1
        assert not any((tmp_path / "staging").iterdir())  # refused adds leave nothing behind


def test_a_second_server_on_the_same_directory_is_refused(tmp_path):
    with HistoryStore(tmp_path), pytest.raises(HistoryLocked, match="--data-dir"):
        HistoryStore(tmp_path)
    HistoryStore(tmp_path).close()  # released once the first closes


def _add_at_once(store: HistoryStore, seeds: list[int], files) -> list[Exception]:
    """One thread per seed, all released at the same moment; the errors they met."""
    barrier, errors = threading.Barrier(len(seeds)), []

    def add(seed):
        try:
            barrier.wait()
            store.add("alice" if seed % 2 else "bob", _settings(seed), files)
        except Exception as error:  # reported by the caller
            errors.append(error)

    threads = [threading.Thread(target=add, args=(seed,)) for seed in seeds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_concurrent_requests_all_land(tmp_path, request_files):
    """Requests finishing at the same moment (the app runs 2 at once; here 4) are all kept, each whole."""
    with HistoryStore(tmp_path, durable=False) as store:
        for round_ in range(10):
            assert _add_at_once(store, [round_ * 4 + i for i in range(4)], request_files) == []
        assert store.count("alice") == store.count("bob") == 20
        seeds = sorted(e.settings["seed"] for user in ("alice", "bob") for e in store.list(user))
        assert seeds == list(range(40))
        assert len(_files_on_disk(tmp_path)) == 40


def test_the_cap_prunes_the_oldest_with_their_files(tmp_path, request_files):
    with HistoryStore(tmp_path, max_entries=3) as store:
        ids = [store.add("alice", _settings(seed), request_files) for seed in range(5)]
        store.add("bob", _settings(99), request_files)  # another user's entries do not count against alice's
        assert [e.id for e in store.list("alice")] == ids[:1:-1]  # the newest three, newest first
        assert store.get("alice", ids[0]) is None and store.file_of("alice", ids[1], 0) is None
        assert len(_files_on_disk(tmp_path)) == 4  # alice's 3 + bob's 1: the pruned folders are gone
    with HistoryStore(tmp_path, max_entries=2) as store:  # a lower cap applies from the next add on
        store.add("alice", _settings(5), request_files)
        assert [e.settings["seed"] for e in store.list("alice")] == [5, 4]
        assert len(_files_on_disk(tmp_path)) == 3


# ---- a writer killed with SIGKILL ----------------------------------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {root!r})
    from web.history.store import HistoryStore
    from web.history.image_store import LocalImageStore
    directory, files = sys.argv[1], sys.argv[2:]
    store = HistoryStore(directory, max_entries=int(os.environ.get("CAP", "1000")),
                         database_url=os.environ.get("DATABASE_URL") or None)

    def hold(name):  # stand still at one step of an add, so that the parent's SIGKILL lands exactly there
        open(os.path.join(directory, "at-" + name), "w").close()
        time.sleep(60)

    def after(name, method):
        def wrapped(self, *args):
            result = method(self, *args)
            hold(name)
            return result
        return wrapped

    def before_pruned_folders_go(method):
        def wrapped(self, owner, folders):
            if folders:
                hold("_remove_folders")
            return method(self, owner, folders)
        return wrapped

    step = os.environ.get("STOP_AT")
    if step == "_remove_folders":
        HistoryStore._remove_folders = before_pruned_folders_go(HistoryStore._remove_folders)
    elif step:  # the files' steps (staged, then published) are the image store's
        setattr(LocalImageStore, step, after(step, getattr(LocalImageStore, step)))
    seed = 0
    while True:
        seed += 1
        settings = dict(prompt="p", negative_prompt="", seed=seed, steps=4, sampler="Euler", guidance_scale=5.0,
                        width=64, height=64)
        entry = store.add("alice", settings, files)
        print(entry, flush=True)
    """
)


def _start_writer(directory: Path, files, **env) -> subprocess.Popen:
    script = _WRITER.format(root=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", script, str(directory), *map(str, files)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def _check_consistent(directory: Path, request_files) -> list[int]:
    """After a crash: the database is sound, every listed entry is whole, nothing unlisted is left on disk."""
    with sqlite3.connect(directory / DATABASE_NAME) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with HistoryStore(directory) as store:  # start-up sweeps what the killed writer left
        entries = store.list("alice", limit=1000)
        for entry in entries:
            for index, source in enumerate(request_files):
                assert store.file_of("alice", entry.id, index).read_bytes() == source.read_bytes()
                with Image.open(store.file_of("alice", entry.id, index, thumbnail=True)) as thumbnail:
                    thumbnail.load()
        assert len(_files_on_disk(directory)) == len(entries)
        assert not any((directory / "staging").iterdir())
        return [entry.id for entry in entries]


@pytest.mark.parametrize(
    ("step", "listed"),
    [
        ("_stage", []),  # files copied into staging/, nothing published
        ("_publish", []),  # files renamed into files/<owner>/, no row yet
        ("_remove_folders", [2]),  # cap 1: entry 2 committed and entry 1's row pruned, its folder not yet removed
    ],
)
def test_killed_at_each_step_of_an_add(tmp_path, request_files, step, listed):
    writer = _start_writer(tmp_path, request_files, STOP_AT=step, CAP="1")
    marker = tmp_path / f"at-{step}"
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert writer.poll() is None, "the writer died before reaching the step"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    marker.unlink()
    on_disk = list((tmp_path / "staging").iterdir()) + sorted((tmp_path / "files").glob("*/*"))
    assert len(on_disk) == len(listed) + 1  # the kill did leave files no entry lists ...
    assert _check_consistent(tmp_path, request_files) == listed  # ... and they are swept; whole entries stay


def test_killed_at_random_moments_while_writing(tmp_path, request_files):
    """A writer adding entries in a loop, killed at random moments: only whole entries, none lost once returned."""
    rng = random.Random(0)
    committed: set[int] = set()  # ids whose add returned, plus any the kill hid (committed, not yet printed)
    for _ in range(8):
        writer = _start_writer(tmp_path, request_files, CAP="5")  # the cap also prunes while it is killed
        first = writer.stdout.readline()  # one entry landed: it is now mid-loop
        assert first.strip().isdigit(), "the writer failed to start"
        time.sleep(rng.uniform(0, 0.05))
        writer.send_signal(signal.SIGKILL)
        out, _ = writer.communicate()
        committed |= {int(line) for line in [first, *out.splitlines()] if line.strip().isdigit()}
        listed = _check_consistent(tmp_path, request_files)
        hidden = set(listed) - committed
        assert hidden <= {max(committed) + 1}  # at most the one add whose answer the kill cut off
        committed |= hidden
        assert listed == sorted(committed, reverse=True)[:5]  # the newest five, whole, newest first
    assert len(committed) > 8  # the loop really was adding when killed


# ---- storage: an earlier version's SQLite history, an object store --------------------------------------------------

#: The schema the SQLite-only store of earlier versions wrote (the history store before SQLAlchemy), verbatim.
_EARLIER_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL, created REAL NOT NULL, folder TEXT NOT NULL UNIQUE,
    settings TEXT NOT NULL, images TEXT NOT NULL, thumbnails TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_by_owner ON entries (owner, id);
"""


def test_an_earlier_versions_history_opens_as_it_is(tmp_path, request_files):
    """A data directory written by the SQLite-only store: its entries, ids and files are all still there."""
    import hashlib
    import json

    key = bytes(range(32))
    owner = hashlib.blake2b(b"alice", key=key, digest_size=16).hexdigest()
    folder = tmp_path / "files" / owner / "0123456789abcdef01234567"
    folder.mkdir(parents=True)
    shutil.copyfile(request_files[1], folder / "00.png")
    Image.new("RGB", (8, 8)).save(folder / "00.thumb.jpg")
    with sqlite3.connect(tmp_path / DATABASE_NAME) as db:
        db.executescript(_EARLIER_SCHEMA)
        db.executemany("INSERT INTO meta VALUES (?, ?)", [("schema_version", "1"), ("owner_key", key.hex())])
        db.execute(
            "INSERT INTO entries VALUES (41, ?, 1700000000.0, ?, ?, '[\"00.png\"]', '[\"00.thumb.jpg\"]')",
            (owner, folder.name, json.dumps(_settings(7))),
        )
    with HistoryStore(tmp_path) as store:
        assert [(e.id, e.settings["seed"]) for e in store.list("alice")] == [(41, 7)]
        assert store.file_of("alice", 41, 0).read_bytes() == request_files[1].read_bytes()
        assert store.list("bob") == []
        newer = store.add("alice", _settings(8), request_files)
        store.delete("alice", newer)
        assert store.add("alice", _settings(9), request_files) == newer + 1  # ids never reused (AUTOINCREMENT)


def test_an_object_store_keeps_the_files(tmp_path, request_files):
    """`--image-store` as an fsspec URL (memory:// here; s3:// or gs:// in production): files come back as bytes."""
    url = f"memory://history-{tmp_path.name}"
    with HistoryStore(tmp_path, image_store=url, max_entries=2) as store:
        ids = [store.add("alice", _settings(seed), request_files) for seed in range(3)]
        assert [e.id for e in store.list("alice")] == ids[:0:-1]
        assert store.file_of("alice", ids[2], 1) == request_files[1].read_bytes()
        thumbnail = store.file_of("alice", ids[2], 0, thumbnail=True)
        assert thumbnail[:3] == b"\xff\xd8\xff"
        assert store.file_of("alice", ids[0], 0) is None and store.file_of("bob", ids[2], 0) is None
        assert not (tmp_path / "files").exists()  # nothing went to the directory
        files = store.files.fs.find(f"/history-{tmp_path.name}")
        assert len(files) == 2 * 2 * 2  # two entries left (the cap), two images and two thumbnails each
        store.delete_all("alice")
        assert store.files.fs.find(f"/history-{tmp_path.name}") == []


def test_bad_storage_urls_get_one_sentence(tmp_path):
    with pytest.raises(InvalidInput, match="postgresql://"):
        HistoryStore(tmp_path, database_url="mysql://db/history")
    with pytest.raises(InvalidInput, match="--image-store nosuchfs://bucket"):
        HistoryStore(tmp_path, image_store="nosuchfs://bucket")
    with pytest.raises(InvalidInput, match="cannot open the history database postgresql\\+psycopg://sdxl:\\*\\*\\*@"):
        HistoryStore(tmp_path, database_url=f"postgresql://sdxl:secret@/sdxl?host={tmp_path}/no-such-socket")
    HistoryStore(tmp_path).close()  # a refused store let go of the directory


# ---- replicas: one PostgreSQL, one shared folder ------------------------------------------------------------------


def test_replicas_share_one_history(postgres, tmp_path, request_files):
    """Two stores (two page replicas) on one PostgreSQL and one image folder: the same entries, whoever wrote them."""
    url, shared = postgres.new_database(), tmp_path / "shared"
    with (
        HistoryStore(tmp_path / "a", database_url=url, image_store=str(shared)) as a,
        HistoryStore(tmp_path / "b", database_url=url, image_store=str(shared)) as b,
    ):
        assert a.shared and "postgres" in a.where() and str(shared) in a.where()
        made_on_a = a.add("alice", _settings(1), request_files)
        assert [e.id for e in b.list("alice")] == [made_on_a]
        assert b.file_of("alice", made_on_a, 1).read_bytes() == request_files[1].read_bytes()
        assert b.list("bob") == [] and b.file_of("bob", made_on_a, 0) is None
        errors = _add_at_once(a, [10, 11], request_files) + _add_at_once(b, [12, 13], request_files)
        assert errors == [] and a.count("alice") == 3 and b.count("bob") == 2
        assert b.delete("alice", made_on_a) and a.get("alice", made_on_a) is None
        assert a.file_of("alice", made_on_a, 0) is None
    with HistoryStore(tmp_path / "c", database_url=url, image_store=str(shared)) as c:  # a replica started later
        assert sorted(e.settings["seed"] for e in c.list("alice")) == [11, 13]


def test_a_replica_killed_mid_write_loses_nothing(postgres, tmp_path, request_files):
    """A writer on PostgreSQL killed at random moments: every entry it returned is listed and whole; what the kill
    left is unlisted files, kept until they are older than the shared store's grace (another replica may be
    mid-write), and then swept."""
    url, rng, committed = postgres.new_database(), random.Random(1), set()
    for _ in range(4):
        writer = _start_writer(tmp_path, request_files, DATABASE_URL=url)
        first = writer.stdout.readline()
        assert first.strip().isdigit(), "the writer failed to start"
        time.sleep(rng.uniform(0, 0.05))
        writer.send_signal(signal.SIGKILL)
        out, _ = writer.communicate()
        committed |= {int(line) for line in [first, *out.splitlines()] if line.strip().isdigit()}
    with HistoryStore(tmp_path, database_url=url) as store:
        listed = [entry.id for entry in store.list("alice", limit=1000)]
        assert set(listed) >= committed and len(set(listed) - committed) <= 4  # at most one cut-off answer per kill
        for entry_id in listed:
            for index, source in enumerate(request_files):
                assert store.file_of("alice", entry_id, index).read_bytes() == source.read_bytes()
        assert len(_files_on_disk(tmp_path)) >= len(listed)  # young leftovers stay: they may be another's
        store.files.sweep(
            {f"{p.parent.name}/{p.name}" for p in (tmp_path / "files").glob("*/*") if int(_row_of(store, p.name) or 0)},
            grace_s=0,
        )
        assert len(_files_on_disk(tmp_path)) == len(listed)


def _row_of(store: HistoryStore, folder: str) -> int | None:
    import sqlalchemy as sa

    from web.history.database import ENTRIES

    with store._require().reading() as db:
        return db.execute(sa.select(ENTRIES.c.id).where(ENTRIES.c.folder == folder)).scalar()


def test_a_one_process_history_moves_to_the_replicas_storage(postgres, tmp_path, request_files):
    """`python -m web.history.migrate`: the SQLite history's entries, ids and files, now in PostgreSQL and an object
    store; each login finds its own as it was, and new entries follow the copied ids."""
    from web.history.migrate import main

    with HistoryStore(tmp_path) as store:
        ids = [store.add(user, _settings(seed), request_files) for seed, user in enumerate(["alice", "bob", "alice"])]
    url, images = postgres.new_database(), f"memory://copied-{tmp_path.name}"
    assert main(["--data-dir", str(tmp_path), "--database-url", url, "--image-store", images]) == 0
    with HistoryStore(tmp_path / "replica", database_url=url, image_store=images) as replica:
        assert [e.id for e in replica.list("alice")] == [ids[2], ids[0]] and [e.id for e in replica.list("bob")] == [
            ids[1]
        ]
        assert replica.file_of("bob", ids[1], 1) == request_files[1].read_bytes()
        assert replica.add("bob", _settings(9), request_files) == ids[2] + 1
    assert main(["--data-dir", str(tmp_path), "--database-url", url, "--image-store", images]) == 1  # not empty
