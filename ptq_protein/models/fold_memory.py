"""How much memory an ESMFold fold needs: a model of the peak, by length, chunk size, dtype and pair precision.

ESMFold's memory is dominated by tensors of L x L entries: the pair state
(``c_z`` channels), the per-head maps of the attentions and the heads' bins.
The peak of one fold is the largest of its phases, over what is always there:
the process before the fold, at least the Python runtime (:data:`RUNTIME_BYTES`,
measured on one CPU install) and the weights, or what the process holds when that
is more (``resident``: another torch build, other models, an earlier fold's
leftovers). ``b`` is the bytes of an activation (4 in float32, 2 in bfloat16),
``k`` the triangle attention's chunk size (query rows a time; unchunked: ``k = L``,
the cubic term)::

    float pairs
    trunk  = N_PAIR B L^2 c_z b                pair-sized tensors of the trunk block and its recycling
           + N_SEQ_ATT B L^2 H_seq b           sequence attention: bias, logits, softmax
           + N_TRI_ATT B H_pair L^2 min(k, L) b   triangle attention logits [k, H, L, L] (+ bias, softmax;
                                               N_TRI_ATT_UNCHUNKED when unchunked)
    heads  = N_HEAD_PAIR B L^2 c_z b + N_BINS B L^2 bins b        distogram / pTM / PAE heads
    stem   = N_STEM_ATT B H_stem (L+2)^2 b     one ESM-2 layer's attention maps

    int8 pairs (ptq_protein.nn.pair_int8; r = PAIR_INT8_ROWS rows a chunk)
    trunk  = N_PAIR_INT8 B L^2 v(c_z)          v(c_z) = c_z int8 codes + a bfloat16 scale and offset per
                                               group of 16 channels (pair_int8_vector_bytes): the state,
                                               the next state, the triangle projections a and b
           + N_CHUNK_ROWS B r L c_z b          float row chunks of one operation
           + N_TRI_ATT B H_pair L^2 min(k, L) b + B L^2 (H_pair b + BINS_INDEX_BYTES)
                                               the triangle bias [B, H, L, L] and the recycling bins
                                               (int64; their distances and comparisons by row chunks)
    struct = N_SM_INT8 B L^2 v(c_z) + B r L ipa_values b    the trunk's int8 state (read through
                                               trunk2sm_z) and one query-row chunk of its point attention

The counts ``N_*`` were fitted to peak RSS measured on a real-width ESMFold trunk
and on ``tiny-esmfold`` at L = 384-512 (BENCHMARKS.md, "Long sequences").

What a process's resident size adds to the tensors alive (``live``, the largest phase above), measured
with ``ptq-protein fold`` on a real-width random ESMFold (4 blocks, 8M stem) at 60-150 residues for the
float model, bf16-trunk, w8a8-pwlq-stem and w8a8-pwlq with and without int8 pairs (issue 52)::

    own    = FOLD_FIXED + live + heap_share(passes) min(live, HEAP_SLACK)
    base   = max(RUNTIME + weights + exec, resident)

* ``weights``: all of the model's, except where they live in a file mapping (``fold`` of an artifact or a
  ``.pt`` file): the stem's layers and the trunk's blocks hand their pages back after each forward, so
  the largest one's (``unit``) is added to the trunk's phase only (:func:`resident_weight_bytes`).
* ``HEAP_SLACK``: the heap keeps freed activation blocks for reuse (up to
  :data:`~ptq_protein.support.process_memory.KEEP_FREE`), so at its peak the
  process holds more than the live tensors. How much grows with the trunk block forwards a fold runs
  (``passes``: blocks x trunk passes, the recycles plus the first): :func:`heap_share`, fitted on
  real-width folds at 100-150 residues (1 block x 1-4 passes: 0-0.35 of the live tensors; 6 x 2: 0.54;
  48 x 5: 1.45), a share of ``HEAP_SHARE_GROWTH`` per e-fold of passes beyond two, at most
  ``HEAP_SHARE_MAX``.
* ``FOLD_FIXED``: a fold's first run (imports of the structure writer, thread workspaces).
* ``exec``: a model with quantized activations compiles its quantizer loops on the first forward
  (:mod:`ptq_protein.nn.fused`, about 80 MiB resident for good).
* bf16-trunk is predicted as float32 (its pair operations' tensors are bfloat16 under autocast, but
  the float32 state between operations dominates), except that its triangle attentions run as torch's
  fused kernel, which writes no logits: ``N_TRI_ATT_FUSED`` in place of the logits' count.
* Activation-quantized Linears inside the pair operations (``quant_width`` channels in their widest
  input, w8a8 recipes' pair transition: 4 c_z) run the quantizer eagerly on pair-sized inputs:
  ``N_QUANT_TEMPS B L^2 quant_width b`` (float pairs) or ``N_QUANT_TEMPS_ROWS B r L quant_width b``
  (int8 pairs, by row chunks) of temporaries and the heap growth they leave.

The prediction is an estimate used to refuse or to choose a chunk size, never to
change results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from torch import nn

from ptq_protein.models.esmfold_cfg import FUSED_ATTENTION
from ptq_protein.models.mapped import mapped_file_of
from ptq_protein.support.process_memory import KEEP_FREE

__all__ = ["FoldDims", "FoldPlan", "dims_of", "streamed_units", "resident_weight_bytes", "predict_peak",
           "choose_plan", "heap_share", "CHUNK_CHOICES", "RUNTIME_BYTES", "pair_int8_vector_bytes"]

RUNTIME_BYTES = 465 * 2 ** 20  # measured: Python + torch + transformers + the toolkit, before any model
CHUNK_CHOICES = (None, 512, 256, 128, 64, 32, 16, 8, 4)  # tried largest first (None: unchunked, the fastest)
PAIR_INT8_ROWS = 64  # rows a chunk of the int8 pair operations (ptq_protein.nn.pair_int8.trunk.ROWS)
PAIR_INT8_GROUP = 16  # channels sharing a scale and offset (ptq_protein.nn.pair_int8.holder.GROUP)
PAIR_INT8_GROUP_BYTES = 4  # a bfloat16 scale and a bfloat16 offset per group
FOLD_FIXED_BYTES = 24 * 2 ** 20  # a fold's first run besides its tensors (imports, thread workspaces)
HEAP_SLACK_BYTES = KEEP_FREE  # freed activation blocks the heap keeps for reuse, at most
# fitted (heap_share): the share of min(live, HEAP_SLACK_BYTES) resident on top of the live tensors
HEAP_SHARE_GROWTH = 0.3  # per e-fold of trunk block forwards beyond two
HEAP_SHARE_MAX = 1.5
EXEC_BYTES = 80 * 2 ** 20  # measured: the compiled quantizer loops of a model with quantized activations
# Fitted counts (see the module docstring): tensors alive at each phase's peak.
N_PAIR = 9.5  # float pair-sized tensors: recycling inputs, the state, its update, LayerNorm, a, b, gate
N_QUANT_TEMPS = 20.0  # [L, L, quant_width] temporaries of the eager quantizers of a float pair operation
N_QUANT_TEMPS_ROWS = 8.0  # [r, L, quant_width] ones of an int8 pair operation's row chunk
N_SEQ_ATT = 4.0  # [H_seq, L, L] maps of the sequence attention (bias, permuted bias, logits, softmax)
N_TRI_ATT = 1.8  # [k, H_pair, L, L] triangle attention logits, chunked (the softmax reuses the bias sum)
N_TRI_ATT_UNCHUNKED = 2.1  # the same, unchunked ([L, H_pair, L, L]: logits, bias sum and softmax overlap more)
N_TRI_ATT_FUSED = 1.0  # fitted: the fused kernel's mask and working buffers (bf16-trunk: no logits written)
N_HEAD_PAIR = 2.0  # pair-sized tensors alive while the heads run (s_z, structure module pair)
N_BINS = 4.5  # [L, L, bins] tensors of the distogram / pTM / PAE heads
N_STEM_ATT = 4.0  # [H_stem, L+2, L+2] maps of one ESM-2 layer
N_PAIR_INT8 = 4.0  # int8 pair tensors of an int8 triangle multiplication (state, next state, a, b)
N_CHUNK_ROWS = 8.0  # float row chunks [r, L, c_z] alive in one int8 pair operation
N_SM_INT8 = 1.0  # int8 pair tensors while the structure module runs (the trunk's state: its input is a view)
BINS_INDEX_BYTES = 8  # per (i, j): the int64 recycling bins (ptq_protein.nn.pair_int8.trunk.recycle_bins: their
# distances and comparisons by row chunks; transformers' distogram holds ~140 bytes a pair)


@dataclass(frozen=True)
class FoldDims:
    """What a fold's memory depends on, read from the model (:func:`dims_of`)."""

    c_z: int
    seq_heads: int
    pair_heads: int
    bins: int
    stem_heads: int
    weight_bytes: int  # held throughout the fold
    unit_bytes: int = 0  # held while one streamed unit runs (the largest: a trunk block or stem layer)
    act_bytes: int = 4
    ipa_values: int = 600  # values per (i, j) of the IPA's point attention: heads x (6 qk points + 3 v points + 2)
    quant_width: int = 0  # widest input (channels) of an activation-quantized Linear in a pair operation
    fused_attention: bool = False  # the triangle attentions run as torch's fused kernel (bf16-trunk)
    exec_bytes: int = 0  # one-time bytes of the first forward (the compiled quantizer loops)
    blocks: int = 1  # trunk blocks
    trunk_passes: int = 1  # trunk passes of a fold with the model's own recycles (transformers: max_recycles)


@dataclass(frozen=True)
class FoldPlan:
    """One fold: ``length`` residues, ``batch`` sequences, triangle-attention ``chunk`` (None: unchunked),
    ``recycles`` (None: the model's own, ``FoldDims.trunk_passes`` passes; n: n + 1 passes)."""

    length: int
    batch: int = 1
    chunk: Optional[int] = None
    pair_bits: Optional[int] = None
    recycles: Optional[int] = None

    def describe(self) -> str:
        chunk = "unchunked" if self.chunk is None else f"chunk size {self.chunk}"
        return chunk + ("" if self.pair_bits is None else f", pair int{self.pair_bits}")


def streamed_units(model: nn.Module) -> List[nn.Module]:
    """The parts of an ESMFold that run once per pass: the stem's layers (once per fold) and the trunk's
    blocks (once per recycle). A fold hands their mapped weights back after each forward
    (:func:`ptq_protein.models.mapped.release_after_forward`); the structure module, which runs its
    layer in a loop, and the heads keep theirs."""
    stem = getattr(getattr(getattr(model, "esm", None), "encoder", None), "layer", None)
    blocks = getattr(getattr(model, "trunk", None), "blocks", None)
    return [*(stem or ()), *(blocks or ())]


def resident_weight_bytes(model: nn.Module) -> Tuple[int, int]:
    """(bytes of weights a fold holds throughout, bytes of the largest streamed unit's mapped weights).

    All weights are held, except the mapped weights of :func:`streamed_units`: their pages are handed
    back after each unit's forward, so only the running unit's are held (while the trunk runs)."""
    mapped = mapped_file_of(model)
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}

    def size(ts) -> int:
        return sum(t.numel() * t.element_size() for t in ts)

    if mapped is None:
        return size(tensors.values()), 0
    per_unit = []
    for unit in streamed_units(model):
        own = [t for t in [*unit.parameters(), *unit.buffers()] if mapped.contains(t)]
        for t in own:
            tensors.pop(id(t), None)
        per_unit.append(size(own))
    return size(tensors.values()), max(per_unit, default=0)


def dims_of(model: nn.Module, dtype_bytes: Optional[int] = None) -> FoldDims:
    """The dimensions of a transformers ``EsmForProteinFolding`` (its config and parameters)."""
    trunk = model.config.esmfold_config.trunk
    sm = trunk.structure_module
    weights, unit = resident_weight_bytes(model)
    if dtype_bytes is None:
        dtype_bytes = model.trunk.recycle_z_norm.weight.element_size()
    quantized = [m for m in model.modules() if getattr(m, "input_quant", None) is not None]
    return FoldDims(c_z=trunk.pairwise_state_dim, seq_heads=trunk.sequence_state_dim // trunk.sequence_head_width,
                    pair_heads=trunk.pairwise_state_dim // trunk.pairwise_head_width, bins=int(model.distogram_bins),
                    stem_heads=int(model.config.num_attention_heads), weight_bytes=weights, unit_bytes=unit,
                    act_bytes=dtype_bytes,
                    ipa_values=sm.num_heads_ipa * (6 * sm.num_qk_points + 3 * sm.num_v_points + 2),
                    quant_width=_quant_width(model), exec_bytes=EXEC_BYTES if quantized else 0,
                    fused_attention=any(getattr(m, FUSED_ATTENTION, False) for m in model.trunk.modules()),
                    blocks=len(model.trunk.blocks), trunk_passes=int(trunk.max_recycles))


def predict_peak(dims: FoldDims, plan: FoldPlan, resident: Optional[int] = None) -> int:
    """Predicted peak resident bytes of a process folding ``plan`` with a model of ``dims`` (runtime included).

    ``resident``: bytes the process holds before the fold (VmRSS); the base is the larger of it and
    the runtime plus the weights, so a process heavier than the one measured is not under-predicted.
    """
    n, b, batch = plan.length, dims.act_bytes, plan.batch
    area = batch * n * n  # B L^2
    rows = n if plan.chunk is None else min(plan.chunk, n)
    per_row = N_TRI_ATT_FUSED if dims.fused_attention else N_TRI_ATT_UNCHUNKED if plan.chunk is None else N_TRI_ATT
    tri_att = per_row * batch * dims.pair_heads * n * n * rows * b
    if plan.pair_bits is None:
        quant = N_QUANT_TEMPS * area * dims.quant_width * b  # quantized pair-operation inputs, eager
        phases = [N_PAIR * area * dims.c_z * b + N_SEQ_ATT * area * dims.seq_heads * b + tri_att + quant,
                  N_HEAD_PAIR * area * dims.c_z * b + N_BINS * area * dims.bins * b]
    else:  # the int8 trunk runs its triangle attentions PAIR_INT8_ROWS rows a time when the model is unchunked
        tri_att = N_TRI_ATT * batch * dims.pair_heads * n * n * min(plan.chunk or PAIR_INT8_ROWS, n) * b
        chunk = batch * min(PAIR_INT8_ROWS, n) * n * b
        vector = pair_int8_vector_bytes(dims.c_z)
        phases = [N_PAIR_INT8 * area * vector + N_CHUNK_ROWS * chunk * dims.c_z + tri_att
                  + area * (dims.pair_heads * b + BINS_INDEX_BYTES) + N_QUANT_TEMPS_ROWS * chunk * dims.quant_width,
                  N_SM_INT8 * area * vector + chunk * dims.ipa_values]
    phases.append(N_STEM_ATT * batch * dims.stem_heads * (n + 2) ** 2 * b)
    live = max(phases)
    held = max(phases[0] + dims.unit_bytes, *phases[1:])  # the trunk's phase holds one streamed unit's weights
    passes = dims.blocks * (dims.trunk_passes if plan.recycles is None else plan.recycles + 1)
    own = FOLD_FIXED_BYTES + held + heap_share(passes) * min(live, HEAP_SLACK_BYTES)
    return int(max(RUNTIME_BYTES + dims.weight_bytes + dims.exec_bytes, resident or 0) + own)


def heap_share(passes: int) -> float:
    """The share of the live tensors (up to the heap's kept free top) a fold of ``passes`` trunk block forwards
    holds on top of them: each forward frees blocks of other sizes, so the heap's free lists grow with them."""
    return min(HEAP_SHARE_MAX, max(0.0, HEAP_SHARE_GROWTH * math.log(max(passes, 1) / 2)))


def _quant_width(model: nn.Module) -> int:
    """The widest input of an activation-quantized module inside the trunk's pair operations (0: none)."""
    from ptq_protein.models.esmfold_cfg import PAIR_PARTS

    widths = [getattr(m, "in_features", 0) for block in model.trunk.blocks for name in PAIR_PARTS
              for m in getattr(block, name).modules() if getattr(m, "input_quant", None) is not None]
    return max(widths, default=0)


def pair_int8_vector_bytes(c_z: int) -> int:
    """Bytes of one c_z-vector of an int8 pair tensor: codes + each channel group's scale and offset."""
    groups = c_z // PAIR_INT8_GROUP if c_z % PAIR_INT8_GROUP == 0 else 1
    return c_z + PAIR_INT8_GROUP_BYTES * groups


def choose_plan(dims: FoldDims, length: int, budget: int, *, batch: int = 1, pair_bits: Optional[int] = None,
                chunks: Sequence[Optional[int]] = CHUNK_CHOICES, resident: Optional[int] = None,
                recycles: Optional[int] = None) -> Optional[FoldPlan]:
    """The fastest plan (the largest chunk, unchunked first) whose predicted peak is within ``budget`` bytes.

    None when no plan fits. ``resident``: as :func:`predict_peak`'s; ``recycles``: as :class:`FoldPlan`'s.
    """
    for chunk in chunks:
        plan = FoldPlan(length, batch, chunk, pair_bits, recycles)
        if predict_peak(dims, plan, resident) <= budget:
            return plan
    return None
