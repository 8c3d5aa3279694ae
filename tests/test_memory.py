"""``mploader.memory``: the memory the job may use and may still allocate, read from fake
``/proc`` and cgroup trees (v1 and v2, nested, ``max``, missing files) and from this machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from mploader import memory
from mploader.memory import AVAILABLE_BYTES_ENV, MemoryLimit, available_memory, job_memory

GIB = 1 << 30
MIB = 1 << 20
V1_UNLIMITED = "9223372036854771712"
V1_MOUNT = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"
V1_CPU_MOUNT = "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu"
V2_MOUNT = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw"


class Tree:
    """A fake root: ``/proc/meminfo``, ``/proc/self/{cgroup,mountinfo}`` and cgroup files."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, path: str, text: str) -> Path:
        file = self.root / path.lstrip("/")
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)
        return file

    def meminfo(self, available: int | None = 16 * GIB, total: int | None = 32 * GIB) -> None:
        lines = []
        if total is not None:
            lines.append(f"MemTotal:       {total // 1024} kB")
        lines.append("MemFree:         1000 kB")
        if available is not None:
            lines.append(f"MemAvailable:   {available // 1024} kB")
        lines.append("Buffers:          100 kB")
        self.write("/proc/meminfo", "\n".join(lines) + "\n")

    def cgroup(self, *lines: str) -> None:
        self.write("/proc/self/cgroup", "\n".join(lines) + "\n")

    def mountinfo(self, *lines: str) -> None:
        self.write("/proc/self/mountinfo", "\n".join(lines) + "\n")

    def v1(self, directory: str, limit: str | None = V1_UNLIMITED, usage: int | None = None,
           stat: str = "") -> str:
        """A v1 memory cgroup ``directory`` (relative to /sys/fs/cgroup/memory); its limit file."""
        return self._memory_cgroup("/sys/fs/cgroup/memory" + directory, stat,
                                   ("memory.limit_in_bytes", limit),
                                   ("memory.usage_in_bytes", usage))

    def v2(self, directory: str, limit: str | None = "max", current: int | None = None,
           stat: str = "") -> str:
        """A v2 cgroup ``directory`` (relative to /sys/fs/cgroup); its memory.max file."""
        return self._memory_cgroup("/sys/fs/cgroup" + directory, stat,
                                   ("memory.max", limit), ("memory.current", current))

    def _memory_cgroup(self, directory: str, stat: str, limit: tuple[str, str | None],
                       usage: tuple[str, int | None]) -> str:
        """The cgroup ``directory`` with its memory.stat (unless empty), and its limit and usage
        files, each a (name, value) (None: no such file); the limit file's path."""
        base = directory.rstrip("/")
        (self.root / base.lstrip("/")).mkdir(parents=True, exist_ok=True)
        for name, value in (limit, usage):
            if value is not None:
                self.write(f"{base}/{name}", f"{value}\n")
        if stat:
            self.write(f"{base}/memory.stat", stat)
        return str(self.root / base.lstrip("/") / limit[0])


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Tree:
    monkeypatch.setattr(memory, "_ROOT", str(tmp_path))
    monkeypatch.delenv(AVAILABLE_BYTES_ENV, raising=False)
    fake = Tree(tmp_path)
    fake.meminfo()
    return fake


def v1_tree(tree: Tree, path: str = "/a/b") -> None:
    tree.cgroup("9:name=systemd:/", "5:cpu,cpuacct:/", f"4:memory:{path}", "0::/")
    tree.mountinfo("23 1 0:21 / / rw - overlay overlay rw", V1_CPU_MOUNT, V1_MOUNT, V2_MOUNT[:-2]
                   .replace("/sys/fs/cgroup ", "/sys/fs/cgroup/unified ") + "rw")
    tree.v1("/")


# -- job_memory -------------------------------------------------------------------------------


def test_no_cgroup_limit_is_memavailable(tree: Tree) -> None:
    v1_tree(tree)
    tree.v1("/a")
    tree.v1("/a/b")
    assert job_memory() == MemoryLimit(
        16 * GIB, "the machine's available memory (MemAvailable in /proc/meminfo)")


def test_v1_nested_the_smallest_limit_of_the_cgroup_and_its_ancestors(tree: Tree) -> None:
    v1_tree(tree)
    outer = tree.v1("/a", limit=str(2 * GIB))
    tree.v1("/a/b", limit=str(3 * GIB))
    assert job_memory() == MemoryLimit(2 * GIB, f"the memory cgroup's limit ({outer})")
    inner = tree.v1("/a/b", limit=str(GIB))  # read at each call
    assert job_memory() == MemoryLimit(GIB, f"the memory cgroup's limit ({inner})")


def test_a_limit_above_memavailable_is_not_the_bound(tree: Tree) -> None:
    v1_tree(tree)
    tree.v1("/a", limit=str(64 * GIB))
    tree.v1("/a/b")
    assert job_memory().bytes == 16 * GIB
    tree.meminfo(available=512 * MIB)
    assert job_memory() == MemoryLimit(
        512 * MIB, "the machine's available memory (MemAvailable in /proc/meminfo)")


def test_v2_nested_and_max(tree: Tree) -> None:
    tree.cgroup("0::/user.slice/job.scope")
    tree.mountinfo("23 1 0:21 / / rw - overlay overlay rw", V2_MOUNT)
    (tree.root / "sys/fs/cgroup").mkdir(parents=True)  # the root cgroup has no memory.max
    tree.v2("/user.slice", limit="max")
    tree.v2("/user.slice/job.scope", limit="max")
    assert job_memory().bytes == 16 * GIB  # "max" everywhere: no limit
    outer = tree.v2("/user.slice", limit=str(3 * GIB))
    assert job_memory() == MemoryLimit(3 * GIB, f"the memory cgroup's limit ({outer})")
    inner = tree.v2("/user.slice/job.scope", limit=str(GIB))
    assert job_memory() == MemoryLimit(GIB, f"the memory cgroup's limit ({inner})")


def test_hybrid_mode_reads_the_v1_memory_controller(tree: Tree) -> None:
    """A v2 hierarchy beside v1's holds no memory controller: the v1 line decides."""
    tree.cgroup("4:memory:/job", "0::/other")
    tree.mountinfo(V1_MOUNT, V2_MOUNT)
    tree.v1("/")
    limit = tree.v1("/job", limit=str(GIB))
    tree.v2("/other", limit=str(MIB))  # would be wrong to read
    assert job_memory() == MemoryLimit(GIB, f"the memory cgroup's limit ({limit})")


def test_a_container_sees_its_cgroup_as_the_mount_root(tree: Tree) -> None:
    """Docker on v1 without a cgroup namespace: /proc/self/cgroup names /docker/<id>, the mount
    shows that cgroup as its root."""
    tree.cgroup("4:memory:/docker/abc")
    tree.mountinfo("35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup "
                   "rw,memory")
    limit = tree.v1("/", limit=str(GIB))
    assert job_memory() == MemoryLimit(GIB, f"the memory cgroup's limit ({limit})")


def test_a_path_outside_the_mount_reads_the_mount_top(tree: Tree) -> None:
    """A cgroup namespace entered after a move shows the path as ``/../x``: the mount's top is
    what can be read."""
    tree.cgroup("0::/../x")
    tree.mountinfo(V2_MOUNT)
    limit = tree.v2("/", limit=str(2 * GIB))
    assert job_memory() == MemoryLimit(2 * GIB, f"the memory cgroup's limit ({limit})")


def test_a_mount_point_with_a_space(tree: Tree) -> None:
    tree.cgroup("0::/job")
    tree.mountinfo("29 23 0:26 / /sys/fs/cgroup\\040x rw - cgroup2 cgroup2 rw")
    limit = tree.write("/sys/fs/cgroup x/job/memory.max", f"{GIB}\n")
    assert job_memory() == MemoryLimit(GIB, f"the memory cgroup's limit ({limit})")


def test_no_mountinfo_falls_back_to_the_usual_mount_point(tree: Tree) -> None:
    tree.cgroup("4:memory:/job")
    tree.v1("/")
    limit = tree.v1("/job", limit=str(GIB))
    assert job_memory() == MemoryLimit(GIB, f"the memory cgroup's limit ({limit})")


def test_no_cgroup_mount_is_memavailable(tree: Tree) -> None:
    tree.cgroup("4:memory:/job", "0::/")
    tree.mountinfo("23 1 0:21 / / rw - overlay overlay rw")
    assert job_memory().bytes == 16 * GIB


@pytest.mark.parametrize("missing", ["/proc/self/cgroup", "/proc/self/mountinfo", "limit"])
def test_missing_cgroup_files_fall_back_to_memavailable(tree: Tree, missing: str) -> None:
    v1_tree(tree, "/job")
    limit = tree.v1("/job", limit=str(GIB))
    if missing == "limit":
        Path(limit).unlink()
    else:
        (tree.root / missing.lstrip("/")).unlink()
        (tree.root / "sys").rename(tree.root / "sys.gone")  # nor the usual places
    assert job_memory().bytes == 16 * GIB


def test_an_unreadable_limit_is_no_limit(tree: Tree) -> None:
    v1_tree(tree, "/job")
    tree.v1("/job", limit="garbage")
    assert job_memory().bytes == 16 * GIB


def test_without_memavailable_memtotal_then_sysconf(tree: Tree) -> None:
    tree.meminfo(available=None, total=8 * GIB)
    assert job_memory() == MemoryLimit(8 * GIB, "the machine's memory (MemTotal in /proc/meminfo)")
    (tree.root / "proc/meminfo").unlink()
    fallback = job_memory()
    assert fallback.bytes > 0 and "sysconf" in fallback.source


def test_moving_to_another_cgroup_is_seen(tree: Tree) -> None:
    v1_tree(tree, "/one")
    tree.v1("/one", limit=str(GIB))
    two = tree.v1("/two", limit=str(2 * GIB))
    assert job_memory().bytes == GIB
    v1_tree(tree, "/two")
    assert job_memory() == MemoryLimit(2 * GIB, f"the memory cgroup's limit ({two})")


# -- available_memory -------------------------------------------------------------------------


def test_available_is_the_limit_less_the_usage_file_cache_counted_free(tree: Tree) -> None:
    v1_tree(tree, "/job")
    stat = (f"cache {300 * MIB}\nactive_file {MIB}\ninactive_file {MIB}\n"
            f"total_active_file {50 * MIB}\ntotal_inactive_file {100 * MIB}\n")
    limit = tree.v1("/job", limit=str(2 * GIB), usage=GIB + 512 * MIB, stat=stat)
    left = available_memory()
    assert left.bytes == 512 * MIB + 150 * MIB
    assert limit in left.source and "memory.usage_in_bytes" in left.source
    assert left.source.startswith("the memory cgroup's limit less its usage")


def test_available_is_the_tightest_level(tree: Tree) -> None:
    v1_tree(tree, "/a/b")
    tree.v1("/a", limit=str(4 * GIB), usage=3 * GIB + 924 * MIB)
    tree.v1("/a/b", limit=str(2 * GIB), usage=GIB)
    assert available_memory().bytes == 100 * MIB
    tree.meminfo(available=50 * MIB)
    assert available_memory().bytes == 50 * MIB


def test_available_v2_reads_memory_current_and_stat(tree: Tree) -> None:
    tree.cgroup("0::/job")
    tree.mountinfo(V2_MOUNT)
    tree.v2("/job", limit=str(GIB), current=900 * MIB,
            stat=f"anon {800 * MIB}\nfile {100 * MIB}\nactive_file {60 * MIB}\n"
                 f"inactive_file {40 * MIB}\nshmem 0\n")
    left = available_memory()
    assert left.bytes == 124 * MIB + 100 * MIB
    assert "memory.current" in left.source


def test_available_over_the_limit_is_zero_and_no_usage_is_no_bound(tree: Tree) -> None:
    v1_tree(tree, "/job")
    tree.v1("/job", limit=str(GIB), usage=GIB + MIB)
    assert available_memory().bytes == 0
    tree.v1("/job", limit=str(GIB))
    (tree.root / "sys/fs/cgroup/memory/job/memory.usage_in_bytes").unlink()
    assert available_memory().bytes == 16 * GIB


def test_the_test_override(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AVAILABLE_BYTES_ENV, str(3 * MIB))
    assert available_memory() == MemoryLimit(
        3 * MIB, f"the test override ({AVAILABLE_BYTES_ENV}={3 * MIB})")
    assert job_memory().bytes == 16 * GIB  # the override is for what is left, not the limit
    monkeypatch.setenv(AVAILABLE_BYTES_ENV, "lots")
    with pytest.raises(ValueError, match=AVAILABLE_BYTES_ENV):
        available_memory()


# -- this machine -------------------------------------------------------------------------------


def test_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AVAILABLE_BYTES_ENV, raising=False)
    total = job_memory()
    left = available_memory()
    assert total.bytes > 0 and left.bytes >= 0
    for limit in (total, left):
        assert "(" in limit.source and limit.source.endswith(")")
