"""Skip the finished blocks of a sequential pass: replay their last output instead of recomputing them.

Sequential GPTQ quantizes sites in forward order and, for each group of sites, runs the calibration batches
until that group's input appears. Without help, every such forward recomputes every block before it, so the
pass costs about (groups / 2) whole forwards: O(layers^2), more than an hour for a 600M model on a CPU.

Once every site of block ``k`` (and of the blocks before it) is quantized, block ``k``'s output on a batch can
no longer change; the first forward that computes it stores it, and later forwards return it from every block
up to ``k`` without running them. The pass then costs about one forward plus each block's own reruns, and gives
the same values: block ``k + 1`` reads exactly the tensor it read before.

It applies only where that is sound, checked on a real forward (:func:`block_plan`): the model's sites all lie in
blocks ``prefix.N`` of one numbered list, each called once per forward, in order (ESM-2 and ESM C stacks). A
model whose blocks run more than once per forward (ESMFold's recycled trunk) or that has sites outside them
keeps the plain pass.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from torch import nn

__all__ = ["BlockPlan", "block_of", "block_plan", "BlockReplay"]

_NUMBERED = re.compile(r"^(.*?)\.(\d+)(?:\.|$)")  # the first numbered component: "transformer.blocks.3.ffn.1"


def block_of(site: str) -> Optional[Tuple[str, int]]:
    """``(list name, index)`` of the first numbered module on ``site``'s path, or None.

    >>> block_of("transformer.blocks.3.ffn.1")
    ('transformer.blocks', 3)
    >>> block_of("esm.encoder.layer.11.attention.self.query")
    ('esm.encoder.layer', 11)
    """
    match = _NUMBERED.match(site)
    return (match.group(1), int(match.group(2))) if match else None


@dataclass(frozen=True)
class BlockPlan:
    """The blocks of a stack, in call order, and the block index of each site group."""

    prefix: str
    count: int
    group_blocks: Tuple[int, ...]

    def block_name(self, index: int) -> str:
        return f"{self.prefix}.{index}"


def block_plan(groups: Sequence[Sequence[str]], calls: Sequence[str]) -> Optional[BlockPlan]:
    """The plan when replay is sound for these site ``groups`` (in forward order), else None.

    ``calls``: the names of the modules of the sites' numbered list, in the order one forward called them.
    Sound when every site lies in a block of one list, the list's blocks were called once each in index order,
    and the groups come block by block.
    """
    blocks = [block_of(site) for group in groups for site in group]
    if not blocks or any(b is None for b in blocks) or len({b[0] for b in blocks}) != 1:
        return None
    prefix = blocks[0][0]
    expected = [f"{prefix}.{i}" for i in range(len(calls))]
    if list(calls) != expected:
        return None
    group_blocks = tuple(block_of(group[0])[1] for group in groups)
    if any(block_of(site)[1] != b for group, b in zip(groups, group_blocks) for site in group):
        return None
    if list(group_blocks) != sorted(group_blocks) or max(group_blocks) >= len(calls):
        return None
    return BlockPlan(prefix, len(calls), group_blocks)


@contextlib.contextmanager
def call_order(model: nn.Module, prefix: str) -> Iterator[List[str]]:
    """The names of ``prefix``'s numbered children as a forward calls them (pre-hooks, removed after)."""
    calls: List[str] = []
    handles = []
    try:
        container = model.get_submodule(prefix)
    except AttributeError:
        yield calls
        return
    try:
        for name, child in container.named_children():
            handles.append(child.register_forward_pre_hook(lambda m, a, name=f"{prefix}.{name}": calls.append(name)))
        yield calls
    finally:
        for handle in handles:
            handle.remove()


@dataclass
class BlockReplay:
    """Within :meth:`active`, a call of block ``k`` on batch ``b`` returns the stored output of the latest
    finished block ``j >= k`` for ``b`` instead of running; a finished block that runs stores its output."""

    model: nn.Module
    plan: BlockPlan
    finished: int = -1  # every site of blocks 0..finished is quantized
    batch: Any = None  # the key of the batch being run
    _stored: Dict[Any, Tuple[int, Any]] = field(default_factory=dict)

    def finish_through(self, index: int) -> None:
        """Blocks ``0..index`` will not change any more."""
        self.finished = max(self.finished, index)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Every block's ``forward`` wrapped for the duration (restored after, even on an exception)."""
        patched: List[Tuple[nn.Module, Optional[Callable]]] = []
        try:
            for k in range(self.plan.count):
                block = self.model.get_submodule(self.plan.block_name(k))
                patched.append((block, block.__dict__.get("forward")))
                block.forward = self._wrapped(k, block.forward)
            yield
        finally:
            for block, own in patched:
                if own is None:
                    del block.forward  # the class's method again
                else:
                    block.forward = own

    def _wrapped(self, index: int, forward: Callable) -> Callable:
        def run(*args, **kwargs):
            stored = self._stored.get(self.batch)
            if stored is not None and index <= stored[0]:
                return stored[1]
            out = forward(*args, **kwargs)
            if index <= self.finished:
                self._stored[self.batch] = (index, out)  # calibration runs under no_grad: nothing to detach
            return out
        return run

