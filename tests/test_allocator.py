"""glibc's allocator for serving (rag.generate.allocator): what it sets, and that it stops a
freed multi-MB buffer from coming back as fresh pages."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rag.generate import allocator


class FakeLibc:
    def __init__(self, refuse: int | None = None) -> None:
        self.calls: list[tuple[int, int]] = []
        self.refuse = refuse

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 0 if param == self.refuse else 1


def test_it_keeps_blocks_on_the_heap_and_freed_memory_mapped():
    libc = FakeLibc()
    assert allocator.keep_freed_memory(libc) is True
    assert dict(libc.calls) == {
        allocator.M_MMAP_THRESHOLD: 32 * 2**20,
        allocator.M_TRIM_THRESHOLD: 2**30,
        allocator.M_TOP_PAD: 64 * 2**20,
    }


def test_a_refused_setting_is_reported(caplog):
    with caplog.at_level("WARNING", logger="rag.generate.allocator"):
        assert allocator.keep_freed_memory(FakeLibc(refuse=allocator.M_TOP_PAD)) is False
    assert "mallopt refused" in caplog.text


CHURN = """
import json, resource, sys, threading, torch
if sys.argv[1] == "tuned":
    from rag.generate.allocator import keep_freed_memory
    assert keep_freed_memory()
torch.empty(1)
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def churn(out):
    before = faults()
    for _ in range(5):  # a buffer regrown 1 MB at a time to 24 MB, then dropped, 5 times over,
        keep = []  # as the batch KV cache grows with its rows and columns and is let go
        for mb in range(1, 25):
            keep.append(torch.empty(mb * 2**18).fill_(1.0))
            if len(keep) > 2:
                keep.pop(0)
    out.append(faults() - before)
out = []
churn(out)
worker = threading.Thread(target=churn, args=(out,))  # the batched decoder's own thread
worker.start()
worker.join()
print(json.dumps(out))
"""


def faults(mode: str) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", CHURN, mode], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(allocator._glibc() is None, reason="not glibc: nothing is set")
def test_regrown_buffers_reuse_freed_memory_instead_of_faulting_in_fresh_pages():
    """Buffers regrown and dropped (a KV cache as rows join and leave) on the main thread and on
    a worker thread: with the settings, under two thirds of the fresh pages (here ~180,000 /
    140,000-158,000 minor faults plain against 23,000-48,000 / 67,000-70,000 tuned, glibc
    2.36)."""
    plain, tuned = faults("plain"), faults("tuned")
    assert all(3 * t < 2 * p for p, t in zip(plain, tuned, strict=True)), (plain, tuned)
