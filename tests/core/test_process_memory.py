"""process_memory: glibc's mmap threshold kept fixed, and free pages returned, where glibc is the allocator."""

import platform

import pytest

from ptq_protein.support import process_memory

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



_FAULTS = """
import resource, sys, torch
from ptq_protein.support import process_memory
mode = sys.argv[1]

def batch(tokens):  # a layer's activations, of a size that changes with the batch
    kept = [torch.ones(tokens, 480), torch.ones(tokens, 1440), torch.ones(tokens, 1920, dtype=torch.uint8)]
    del kept

def faults_of_reuse():
    for tokens in range(4096, 3096, -100):  # warm: the largest batches first
        batch(tokens)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for tokens in range(2000, 4000, 100):
        batch(tokens)
    pages = sum(t * (480 * 4 + 1440 * 4 + 1920) for t in range(2000, 4000, 100)) // 4096
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, pages

if mode == "managed":
    with process_memory.managed_heap():
        with process_memory.loading():
            pass
        print(*faults_of_reuse())
elif mode == "computing":  # a quantize: forwards inside a load
    with process_memory.loading():
        with process_memory.computing():
            print(*faults_of_reuse())
else:
    process_memory.return_large_blocks()
    print(*faults_of_reuse())
"""


@glibc
@pytest.mark.parametrize("mode", ["managed", "loading"])
def test_computing_reuses_freed_blocks_loading_returns_them(mode, monkeypatch):
    """The kernel's own count of page faults: after a load, a freed activation-sized block is reused (a few
    faults); while loading it is returned, and the next one is zero-filled again (a fault per 4 KiB page)."""
    import subprocess
    import sys

    for var in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(var, raising=False)
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True)
    faults, pages = (int(v) for v in out.stdout.split()[-2:])
    assert faults < pages // 10 if mode == "managed" else faults > pages // 2


@glibc
def test_a_command_leaves_the_heap_as_it_found_it():
    with process_memory.managed_heap() as on:
        with process_memory.loading():
            assert process_memory._managed == on
    assert process_memory._managed is False


@glibc
def test_forwards_inside_a_load_reuse_their_blocks(monkeypatch):
    """The kernel's count again: inside ``computing()`` within a load, a freed block serves the next batch (the
    load alone refaults every page: the ``loading`` case above)."""
    import subprocess
    import sys

    for var in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(var, raising=False)
    out = subprocess.run([sys.executable, "-c", _FAULTS, "computing"], capture_output=True, text=True, check=True)
    faults, pages = (int(v) for v in out.stdout.split()[-2:])
    assert faults < pages // 10


class _FakeLibc:
    """glibc's two calls, recorded: which mmap threshold is in force."""

    def __init__(self):
        self.thresholds = [None]

    @property
    def threshold(self):
        return self.thresholds[-1]

    def mallopt(self, param, value):
        if param == process_memory._M_MMAP_THRESHOLD:
            self.thresholds.append(value)
        return 1

    def malloc_trim(self, pad):
        return 0


def test_quantize_calibrates_with_blocks_kept(monkeypatch, esm2, calib_seqs):
    """pp.quantize is a load (its copy's float weights are returned blocks), but its calibration forwards are
    computing: each forward of the calibration batches runs with freed blocks kept for reuse; then the load's
    setting, its trim, and the compute setting for what follows."""
    import ptq_protein as pp

    fake = _FakeLibc()
    monkeypatch.setattr(process_memory, "_glibc", lambda: fake)
    for var in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(var, raising=False)
    seen = []
    handle = esm2.layers[0].register_forward_pre_hook(lambda module, args: seen.append(fake.threshold))
    try:
        pp.quantize(esm2, "w8a8-smoothquant-gptq", calibration=list(calib_seqs))
    finally:
        handle.remove()
    keep, give = process_memory.KEEP_BELOW, process_memory._RETURN_ABOVE
    assert seen and set(seen) == {keep}
    assert fake.thresholds[1:] == [give, keep, give, keep]  # load, its passes, the load's end, computing after


_HASH_FAULTS = """
import resource, sys
from ptq_protein.support import process_memory
from ptq_protein.support.digests import file_sha256

with process_memory.loading():  # a load's setting: freed blocks go back at once
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    file_sha256(sys.argv[1])
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@glibc
def test_hashing_a_file_while_loading_reuses_one_buffer(tmp_path, monkeypatch):
    """An artifact's checksum is taken while it loads: a new chunk object per read was a fresh mapping each time,
    one page fault per 4 KiB of the file (1.3 million for a 5.3 GB artifact)."""
    import subprocess
    import sys

    for var in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * (64 << 12))  # 64 MiB: 16384 pages
    out = subprocess.run([sys.executable, "-c", _HASH_FAULTS, str(path)], capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) < 16384 // 8
