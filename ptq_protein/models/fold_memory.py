"""How much memory an ESMFold fold needs: a model of the peak, by length, chunk size, dtype and pair precision.

ESMFold's memory is dominated by tensors of L x L entries: the pair state
(``c_z`` channels), the per-head maps of the attentions and the heads' bins.
The peak of one fold is the largest of three phases, over what is always there
(the Python runtime, :data:`RUNTIME_BYTES`, and the weights)::

    trunk  = n_pair * B L^2 c_z b                 pair-sized tensors of the trunk block
           + n_seq_att * B L^2 H_seq b            sequence attention: bias, logits, softmax
           + n_tri_att * B H_pair L^2 min(k, L) b triangle attention logits over k query rows
                                                  (k: the chunk size; unchunked, k = L: the cubic term)
    heads  = n_head_pair * B L^2 c_z b + n_bins * B L^2 bins b     distogram / pTM / PAE heads
    stem   = n_stem_att * B H_stem (L+2)^2 b      one ESM-2 layer's attention maps

``b`` is the bytes of an activation (4 in float32, 2 in bfloat16). With the
pair state in int8 (:mod:`ptq_protein.nn.pair_int8`) the trunk keeps
``n_pair_int8`` int8 pair tensors (one byte a value plus one float32 scale per
``c_z``-vector) and float copies of ``n_chunk_rows`` row chunks of ``k`` rows;
the heads keep only the pLDDT and structure inputs. The counts ``n_*`` below
were fitted to peak RSS measured on a real-width ESMFold trunk and on
``tiny-esmfold`` (BENCHMARKS.md, "Long sequences"): the prediction is an
estimate used to refuse or to choose a chunk size, never to change results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from torch import nn

__all__ = ["FoldDims", "FoldPlan", "dims_of", "predict_peak", "choose_plan", "CHUNK_CHOICES", "RUNTIME_BYTES"]

RUNTIME_BYTES = 450 * 2 ** 20  # measured: Python + torch + transformers + the toolkit, before any model
CHUNK_CHOICES = (None, 512, 256, 128, 64, 32, 16, 8)  # tried largest first (None: unchunked, the fastest)
# Fitted counts (see the module docstring): tensors alive at each phase's peak.
N_PAIR = 9.0  # float pair-sized tensors at the trunk block's peak (state, its update, LayerNorm, a, b, gate)
N_SEQ_ATT = 4.0  # [H_seq, L, L] maps of the sequence attention (bias, permuted bias, logits, softmax)
N_TRI_ATT = 3.0  # [k, H_pair, L, L] triangle attention logits (+ bias, softmax)
N_HEAD_PAIR = 2.0  # pair-sized tensors alive while the heads run (s_z, structure module pair)
N_BINS = 6.0  # [L, L, bins] tensors of the distogram / pTM / PAE heads
N_STEM_ATT = 4.0  # [H_stem, L+2, L+2] maps of one ESM-2 layer
N_PAIR_INT8 = 4.0  # int8 pair tensors of the int8 trunk (state, next state, triangle a and b)
N_CHUNK_ROWS = 8.0  # float row chunks [k, L, c_z] alive in one int8 pair operation
INT8_HEAD_PAIR = 2.0  # int8 pair tensors of the int8 structure-module input


@dataclass(frozen=True)
class FoldDims:
    """What a fold's memory depends on, read from the model (:func:`dims_of`)."""

    c_z: int
    seq_heads: int
    pair_heads: int
    bins: int
    stem_heads: int
    weight_bytes: int
    act_bytes: int = 4


@dataclass(frozen=True)
class FoldPlan:
    """One fold: ``length`` residues, ``batch`` sequences, triangle-attention ``chunk`` (None: unchunked)."""

    length: int
    batch: int = 1
    chunk: Optional[int] = None
    pair_bits: Optional[int] = None

    def describe(self) -> str:
        chunk = "unchunked" if self.chunk is None else f"chunk size {self.chunk}"
        return chunk + ("" if self.pair_bits is None else f", pair int{self.pair_bits}")


def dims_of(model: nn.Module, dtype_bytes: Optional[int] = None) -> FoldDims:
    """The dimensions of a transformers ``EsmForProteinFolding`` (its config and parameters)."""
    trunk = model.config.esmfold_config.trunk
    params = list(model.parameters()) + list(model.buffers())
    weights = sum(p.numel() * p.element_size() for p in params)
    if dtype_bytes is None:
        dtype_bytes = model.trunk.recycle_z_norm.weight.element_size()
    return FoldDims(c_z=trunk.pairwise_state_dim, seq_heads=trunk.sequence_state_dim // trunk.sequence_head_width,
                    pair_heads=trunk.pairwise_state_dim // trunk.pairwise_head_width, bins=int(model.distogram_bins),
                    stem_heads=int(model.config.num_attention_heads), weight_bytes=weights, act_bytes=dtype_bytes)


def predict_peak(dims: FoldDims, plan: FoldPlan) -> int:
    """Predicted peak resident bytes of a process folding ``plan`` with a model of ``dims`` (runtime included)."""
    n, b = plan.length, dims.act_bytes
    area = plan.batch * n * n  # B L^2
    rows = n if plan.chunk is None else min(plan.chunk, n)
    tri_att = N_TRI_ATT * plan.batch * dims.pair_heads * n * n * rows * b
    seq_att = N_SEQ_ATT * area * dims.seq_heads * b
    if plan.pair_bits is None:
        trunk = N_PAIR * area * dims.c_z * b + seq_att + tri_att
        heads = N_HEAD_PAIR * area * dims.c_z * b + N_BINS * area * dims.bins * b
    else:
        int8_pair = area * (dims.c_z + 4)  # codes + one float32 scale per vector
        chunk_rows = N_CHUNK_ROWS * plan.batch * rows * n * dims.c_z * b
        trunk = N_PAIR_INT8 * int8_pair + chunk_rows + tri_att + N_SEQ_ATT * plan.batch * rows * n * dims.seq_heads * b
        heads = INT8_HEAD_PAIR * int8_pair + chunk_rows
    stem = N_STEM_ATT * plan.batch * dims.stem_heads * (n + 2) ** 2 * b
    return int(RUNTIME_BYTES + dims.weight_bytes + max(trunk, heads, stem))


def choose_plan(dims: FoldDims, length: int, budget: int, *, batch: int = 1, pair_bits: Optional[int] = None,
                chunks: Sequence[Optional[int]] = CHUNK_CHOICES) -> Optional[FoldPlan]:
    """The fastest plan (the largest chunk, unchunked first) whose predicted peak is within ``budget`` bytes, or None."""
    for chunk in chunks:
        plan = FoldPlan(length, batch, chunk, pair_bits)
        if predict_peak(dims, plan) <= budget:
            return plan
    return None
