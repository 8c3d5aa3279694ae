"""The passage: how a block's descriptor reaches the main process, and when it is let go."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from mploader.channel.shm.errors import BlockVanishedError
from mploader.channel.shm.passage import BlockInbox, BlockSender, open_passage


def _memory_file(size: int = 4096) -> int:
    descriptor = os.memfd_create("mploader-test-passage", os.MFD_CLOEXEC)
    os.ftruncate(descriptor, size)
    return descriptor


def _open_descriptors() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def _open_targets() -> set[str]:
    """What this process's descriptors point at (``socket:[inode]``, ``/memfd:...``)."""
    targets = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue  # the listing's own descriptor, closed meanwhile
    return targets


def _send(sender: BlockSender, block_id: int, size: int = 4096) -> int:
    """Send a new memory file as ``block_id``; its inode (our descriptor is closed, as the
    worker closes its own)."""
    descriptor = _memory_file(size)
    inode = os.fstat(descriptor).st_ino
    sender.send(block_id, size, descriptor)
    os.close(descriptor)
    return inode


@pytest.fixture
def passage() -> Iterator[tuple[BlockInbox, BlockSender]]:
    """A new passage: the main process's inbox and a worker's sender (this process's); the
    inbox closed afterwards."""
    inbox, link = open_passage()
    try:
        yield inbox, BlockSender(link)
    finally:
        inbox.close()


def test_a_record_is_taken_once_with_its_descriptor(passage):
    inbox, sender = passage
    inode = _send(sender, 7)
    descriptor = inbox.take(os.getpid(), 7, 4096)
    assert os.fstat(descriptor).st_ino == inode  # the very file the sender made
    assert os.get_inheritable(descriptor) is False  # an exec'd child never holds a block
    os.close(descriptor)
    with pytest.raises(BlockVanishedError, match="never arrived"):
        inbox.take(os.getpid(), 7, 4096)


def test_a_record_whose_size_disagrees_is_refused_and_closed(passage):
    inbox, sender = passage
    _send(sender, 1, size=8192)
    before = _open_descriptors()
    with pytest.raises(BlockVanishedError, match="8192 bytes but its payload says 4096"):
        inbox.take(os.getpid(), 1, 4096)
    assert _open_descriptors() <= before


def test_records_dropped_or_of_an_ended_worker_are_closed(passage):
    inbox, sender = passage
    baseline = _open_descriptors()
    _send(sender, 1)
    _send(sender, 2)
    inbox.drop(os.getpid(), (1,))  # evicted before it was ever mapped
    assert len(_open_descriptors() - baseline) == 1  # record 2, read meanwhile, is held
    inbox.drop_worker(os.getpid())
    assert _open_descriptors() <= baseline
    _send(sender, 3)  # a late record of the ended worker: closed as it arrives
    inbox.drop_worker(os.getpid())
    assert _open_descriptors() <= baseline
    with pytest.raises(BlockVanishedError):
        inbox.take(os.getpid(), 3, 4096)


def test_a_forked_child_holds_no_copy_of_the_inbox():
    before = _open_targets()
    inbox, link = open_passage()
    (receiving,) = _open_targets() - before - {f"socket:[{os.fstat(link.fileno()).st_ino}]"}
    sender = BlockSender(link)
    _send(sender, 1)
    _send(sender, 2)
    os.close(inbox.take(os.getpid(), 2, 4096))  # record 1 is read too, and held, untaken
    _send(sender, 3)  # queued in the socket at the fork
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the inbox's socket and its records are the parent's
        os.close(reader)
        try:
            targets = _open_targets()
            held = [target for target in targets if target.startswith("/memfd:")]
            os.write(writer, f"{len(held)} {receiving not in targets}".encode())
        finally:
            os._exit(0)
    os.close(writer)
    answer = os.read(reader, 100).decode()
    os.close(reader)
    os.waitpid(pid, 0)
    assert answer == "0 True", answer
    for block_id in (1, 3):  # the parent's records are untouched
        os.close(inbox.take(os.getpid(), block_id, 4096))
    inbox.close()
    inbox.close()  # idempotent
