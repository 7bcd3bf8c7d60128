"""Which pages of a tensor are mapped in this process, read from the kernel's page map with ``struct``: a reference
independent of ``ptq_protein.models.mapped`` for the tests of weights handed back to the OS."""

import mmap
import struct

PAGE = mmap.PAGESIZE


def pages_present(tensor) -> list:
    """Whether each page wholly inside ``tensor``'s bytes (contiguous) is mapped in this process."""
    start = tensor.data_ptr()
    lo, hi = -(-start // PAGE), (start + tensor.numel() * tensor.element_size()) // PAGE
    with open("/proc/self/pagemap", "rb") as handle:
        handle.seek(lo * 8)
        raw = handle.read((hi - lo) * 8)
    return [bool(entry >> 63) for (entry,) in struct.iter_unpack("<Q", raw)]
