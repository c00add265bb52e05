"""The same-host handshake of an ipc link (rxcuda/distributed/_board.py), across two processes: a producer process
publishes fresh frames into the board's slots, the consumer waits for each and computes with it (checked against
NumPy every frame), never reading a slot being overwritten; a producer that skips a frame, is late, dies, or is
restarted (a new board serving later frames) is told apart."""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid

import numpy as np
import pytest

from rxcuda.distributed import _board
from rxcuda.distributed._board import GONE, LATE, READY, SKIPPED, BoardReader, LinkBoard

N = 1024
DEPTH = 3
SCALE = np.float32(2.5)


def _frame(index: int) -> np.ndarray:
    """The array a producer computes for frame ``index``: fresh random numbers, different every frame."""
    return np.random.default_rng(index).standard_normal(N).astype(np.float32)


def _produce(path: str, first: int, last: int, since: int, acked, exit_code: int | None, go=None) -> None:
    """A producer process: frames first..last, never more than DEPTH - 1 ahead of what the consumer acknowledged
    (the distributed engine's bound on frames in flight), then exits (with ``os._exit(exit_code)``: a crash)."""
    board = LinkBoard.create(path, depth=DEPTH, nbytes=N * 4, data=True, since=since)
    if go is not None:
        go.wait(30)
    for index in range(first, last + 1):
        while index - acked.value >= DEPTH:  # the slot of frame index - DEPTH is still being read
            time.sleep(1e-4)
        if index % 3 == 0:
            time.sleep(0.003)  # now and then the consumer waits: past its spin, into its sleeps
        board.put(index, _frame(index))
    if exit_code is not None:
        os._exit(exit_code)  # dies without closing: its board stays, naming a process that is gone
    board.close(unlink=False)


@pytest.fixture
def ctx():
    return multiprocessing.get_context("spawn")


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / f"board-{uuid.uuid4().hex[:8]}")


def test_a_consumer_gets_every_frame_exactly_while_its_producer_runs_ahead(ctx, path):
    acked = ctx.Value("q", 0)
    frames = 60
    p = ctx.Process(target=_produce, args=(path, 1, frames, 1, acked, None))
    p.start()
    reader = BoardReader(path)
    try:
        for index in range(1, frames + 1):
            assert reader.wait(index, timeout=30) == READY
            got = reader.read(index).view(np.float32)
            np.testing.assert_array_equal(got * SCALE, _frame(index) * SCALE)  # this frame's numbers, no other's
            acked.value = index
    finally:
        p.join(30)
        reader.close()
    assert p.exitcode == 0
    assert reader.waited >= 1  # the consumer asked before the producer published at least once


def test_a_skipped_frame_is_skipped_and_the_next_one_comes(path):
    producer = LinkBoard.create(path, depth=DEPTH, nbytes=8, data=True, since=1)
    reader = BoardReader(path)
    producer.put(1, np.array([1.0, 2.0], np.float32))
    producer.skip(2)  # its step failed
    producer.put(3, np.array([3.0, 4.0], np.float32))
    assert reader.wait(1, timeout=1) == READY and reader.read(1).view(np.float32).tolist() == [1.0, 2.0]
    assert reader.wait(2, timeout=1) == SKIPPED
    assert reader.wait(3, timeout=1) == READY and reader.read(3).view(np.float32).tolist() == [3.0, 4.0]
    reader.close(), producer.close(unlink=True)
    assert not os.path.exists(path)


def test_nothing_published_within_the_timeout_is_late(path):
    reader = BoardReader(path)
    assert reader.wait(1, timeout=0.02) == LATE  # no board yet
    producer = LinkBoard.create(path, depth=DEPTH, nbytes=8, data=True, since=1)
    assert reader.wait(1, timeout=0.02) == LATE  # a board, but frame 1 never published
    reader.close(), producer.close(unlink=True)


def test_a_producer_that_died_is_gone_not_waited_for(ctx, path):
    acked = ctx.Value("q", 0)
    p = ctx.Process(target=_produce, args=(path, 1, 2, 1, acked, 3))
    p.start()
    p.join(30)
    assert p.exitcode == 3
    reader = BoardReader(path)
    for index in (1, 2):
        assert reader.wait(index, timeout=30) == READY
        np.testing.assert_array_equal(reader.read(index).view(np.float32), _frame(index))
    assert reader.wait(3, timeout=30) == GONE  # at once, not after 30 s: its process is gone
    reader.close()


def test_a_restarted_producer_replaces_the_board_and_serves_only_later_frames(ctx, path):
    acked = ctx.Value("q", 0)
    p = ctx.Process(target=_produce, args=(path, 1, 2, 1, acked, 3))
    p.start()
    p.join(30)
    reader = BoardReader(path)
    assert reader.wait(1, timeout=30) == READY  # the consumer holds the first producer's board
    acked.value = 2
    go = ctx.Event()
    q = ctx.Process(target=_produce, args=(path, 5, 8, 5, acked, None, go))  # restarted: serves frames 5 on
    q.start()
    try:
        deadline = time.monotonic() + 30
        st = reader.wait(4, timeout=0.05)  # a frame in flight when the first one died
        while st == GONE and time.monotonic() < deadline:  # until the restarted one replaced its board
            st = reader.wait(4, timeout=0.05)
        assert st == SKIPPED  # the new board says frame 4 was its predecessor's
        assert reader.board.pid == q.pid
        acked.value = 4
        go.set()
        for index in range(5, 9):
            assert reader.wait(index, timeout=30) == READY
            got = reader.read(index).view(np.float32)
            np.testing.assert_array_equal(got * SCALE, _frame(index) * SCALE)
            acked.value = index
    finally:
        go.set()
        q.join(30)
        reader.close()
    assert q.exitcode == 0


def test_a_slot_written_again_while_read_is_an_error_never_a_stale_frame(path):
    producer = LinkBoard.create(path, depth=2, nbytes=4, data=True, since=1)
    reader = BoardReader(path)
    producer.put(1, np.array([1.0], np.float32))
    assert reader.wait(1, timeout=1) == READY
    producer.put(3, np.array([3.0], np.float32))  # frame 3 lands in frame 1's slot: the bound was broken
    with pytest.raises(RuntimeError, match=r"slot 1 was written again \(frame 3\) while frame 1 was read from it"):
        reader.read(1)
    reader.close(), producer.close(unlink=True)


def test_device_slots_carry_their_handles_and_bad_boards_are_named(path, tmp_path):
    handles = [(bytes([s]) * 64, bytes([s + 10]) * 64) for s in range(DEPTH)]
    producer = LinkBoard.create(path, depth=DEPTH, nbytes=1 << 22, data=False, since=1, handles=handles)
    assert os.path.getsize(path) < 4096  # the slots live in device memory: the board is a few hundred bytes
    producer.publish(4)
    reader = BoardReader(path)
    assert reader.wait(4, timeout=1) == READY and reader.handles(4) == handles[1]
    reader.close(), producer.close(unlink=True)
    with pytest.raises(ValueError, match=r"one \(memory, event\) handle pair per slot \(3\)"):
        LinkBoard.create(path, depth=DEPTH, nbytes=8, data=False, since=1)
    bad = tmp_path / "not-a-board"
    bad.write_bytes(bytes(4096))
    with pytest.raises(ValueError, match=r"not-a-board is not an rxcuda link board"):
        BoardReader(str(bad)).wait(1, timeout=1)


def test_an_engines_boards_are_named_per_session_and_removed_together(monkeypatch, tmp_path):
    monkeypatch.setattr(_board, "board_dir", lambda: str(tmp_path))
    mine = _board.board_path("s1", 7, "out/1")
    theirs = _board.board_path("s2", 7, "out")
    assert os.path.basename(mine) == "rxcuda-s1-7-out_1"
    for p in (mine, theirs):
        LinkBoard.create(p, depth=2, nbytes=4, data=True, since=1).close()
    _board.remove_boards("s1")
    assert not os.path.exists(mine) and os.path.exists(theirs)
