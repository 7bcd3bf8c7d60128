"""process_memory: glibc's mmap threshold kept fixed, and free pages returned, where glibc is the allocator."""

import platform

import pytest

from ptq_protein import process_memory

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")


@glibc
def test_threshold_is_set_on_glibc_unless_the_user_set_one(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert process_memory.return_large_blocks() is True
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert process_memory.return_large_blocks() is False  # the user's own setting wins


@glibc
def test_freed_heap_pages_go_back():
    blocks = [bytearray(64 * 1024) for _ in range(2000)]  # below the threshold: heap, not mmap
    del blocks
    assert isinstance(process_memory.release_freed_memory(), bool)


def test_no_glibc_means_no_call(monkeypatch):
    monkeypatch.setattr(process_memory, "_glibc", lambda: None)
    assert process_memory.return_large_blocks() is False and process_memory.release_freed_memory() is False

