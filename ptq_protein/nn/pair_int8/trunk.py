"""ESMFold's forward with the pair state in int8: the trunk, its recycling and the structure module's pair input.

Mirrors transformers' ``EsmForProteinFolding.forward`` and ``EsmFoldingTrunk.forward``
step for step, with three differences, all about the L x L tensors:

* the pair state (and the recycled one) is an :class:`Int8Pair`, built and updated
  by row chunks (:mod:`ptq_protein.nn.pair_int8.block`); the all-zero initial pair
  ``s_z_0`` is never allocated (adding zeros changes nothing);
* the structure module receives its pair input as :class:`PairRows`, a view of the
  trunk's int8 state with ``trunk2sm_z`` and its LayerNorm applied to the rows read;
  its invariant point attention runs by query rows meanwhile
  (:class:`~ptq_protein.nn.pair_int8.ipa.RowChunkedIPA`: the IPA's own L x L x heads x
  points tensors are larger than the pair);
* of the pair heads only pTM is computed (by row chunks, its maximum over rows is
  exact); the distogram logits, the predicted aligned error and ``s_z`` (each a
  float L x L tensor) are not returned;
* the recycling bins (the distogram of the predicted CB atoms) are computed by query
  rows, and only when another pass reads them (:func:`recycle_bins`).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

import torch
from torch import nn

from ptq_protein.nn.bound_forward import forward_as
from ptq_protein.nn.pair_int8.block import block_forward, spans
from ptq_protein.nn.pair_int8.holder import Int8Pair
from ptq_protein.nn.pair_int8.ipa import RowChunkedIPA

__all__ = ["forward_pair_int8", "PairRows", "RowWise", "pair_rows_in", "recycle_bins", "ROWS"]

ROWS = 64  # rows per chunk of the int8 pair operations (and of the triangle attentions when the trunk is unchunked)
_STRUCTURE_KEYS = ("s_s", "frames", "sidechain_frames", "unnormalized_angles", "angles", "positions", "states")


class PairRows:
    """The structure module's pair input as a view of the trunk's int8 pair: ``transform`` of its rows, on read.

    Nothing pair-sized is stored for it: each read dequantizes rows of the trunk's
    state and applies ``transform`` (``trunk2sm_z``, then the structure module's LayerNorm).
    """

    def __init__(self, pair: Int8Pair, rows: int, transform: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.pair, self.rows, self.transform = pair, rows, transform

    @property
    def dtype(self) -> torch.dtype:
        return self.pair.dtype

    def read(self, span: slice) -> torch.Tensor:
        return self.transform(self.pair.read(rows=span))


class RowWise(nn.Module):
    """``inner`` (any module: float or quantized) applied to a :class:`PairRows` when its rows are read."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: PairRows) -> PairRows:
        return PairRows(x.pair, x.rows, lambda rows: self.inner(x.transform(rows)))


@contextlib.contextmanager
def pair_rows_in(structure_module: nn.Module, rows: int) -> Iterator[None]:
    """The structure module's pair LayerNorm and its IPA run by row chunks.

    See :class:`RowWise` and :class:`RowChunkedIPA`.
    """
    old = structure_module.layer_norm_z, structure_module.ipa
    structure_module.layer_norm_z, structure_module.ipa = RowWise(old[0]), RowChunkedIPA(old[1], rows)
    try:
        yield
    finally:
        structure_module.layer_norm_z, structure_module.ipa = old


def forward_pair_int8(model: nn.Module, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                      position_ids: Optional[torch.Tensor] = None, masking_pattern: Optional[torch.Tensor] = None,
                      num_recycles: Optional[int] = None, **_: object):
    """``EsmForProteinFolding.forward`` (inference) with an int8 pair state; bound to the model by ``use_pair_int8``."""
    from transformers.models.esm.modeling_esmfold import EsmForProteinFoldingOutput, categorical_lddt
    from transformers.models.esm.openfold_utils import make_atom14_masks

    if masking_pattern is not None:
        raise ValueError("masking_pattern (training) is not supported with int8 pair activations")
    cfg = model.config.esmfold_config
    aa = input_ids
    batch, length = aa.shape
    if attention_mask is None:
        attention_mask = torch.ones_like(aa)
    if position_ids is None:
        position_ids = torch.arange(length, device=aa.device).expand_as(aa)
    esm_s = model.compute_language_model_representations(model.af2_idx_to_esm_idx(aa, attention_mask))
    esm_s = esm_s.to(model.esm_s_combine.dtype)
    if cfg.esm_ablate_sequence:
        esm_s = esm_s * 0
    esm_s = (model.esm_s_combine.softmax(0).unsqueeze(0) @ esm_s.detach()).squeeze(2)
    s_s_0 = model.esm_s_mlp(esm_s)
    if cfg.embed_aa:
        s_s_0 += model.embedding(aa)
    structure, pair = _trunk(model.trunk, s_s_0, aa, position_ids, attention_mask, num_recycles)
    structure = {k: v for k, v in structure.items() if k in _STRUCTURE_KEYS}
    structure["lm_logits"] = model.lm_head(structure["s_s"])
    structure["aatype"] = aa
    make_atom14_masks(structure)
    for key in ("atom14_atom_exists", "atom37_atom_exists"):
        structure[key] *= attention_mask.unsqueeze(-1)
    structure["residue_index"] = position_ids
    lddt_head = model.lddt_head(structure["states"]).reshape(structure["states"].shape[0], batch, length, -1,
                                                             model.lddt_bins)
    structure["lddt_head"] = lddt_head
    structure["plddt"] = categorical_lddt(lddt_head[-1], bins=model.lddt_bins)
    structure["ptm"] = _ptm(model, pair, ROWS)
    return EsmForProteinFoldingOutput(**structure)


def _ptm(model: nn.Module, pair: Int8Pair, rows: int, max_bin: int = 31, eps: float = 1e-8) -> torch.Tensor:
    """openfold's ``compute_tm`` (unit residue weights, as transformers calls it) by row chunks.

    pTM is the largest over rows i of the mean over j of the expected TM term: each
    row needs only its own logits, so the maximum of the chunks' maxima is exact.
    """
    from transformers.models.esm.openfold_utils.loss import _calculate_bin_centers

    n, bins = pair.shape[1], model.distogram_bins
    centers = _calculate_bin_centers(torch.linspace(0, max_bin, steps=bins - 1, device=pair.codes.device))
    d0 = 1.24 * (max(n, 19) - 15) ** (1.0 / 3) - 1.8
    tm_per_bin = 1.0 / (1 + centers ** 2 / d0 ** 2)
    best = []
    for span in spans(n, rows):
        probs = nn.functional.softmax(model.ptm_head(pair.read(rows=span)), dim=-1)
        best.append(torch.sum(torch.sum(probs * tm_per_bin, dim=-1) / (eps + n), dim=-1).max())
    return torch.stack(best).max()


def _trunk(trunk: nn.Module, s_s_0: torch.Tensor, aa: torch.Tensor, residx: torch.Tensor, mask: torch.Tensor,
           no_recycles: Optional[int]):
    """``EsmFoldingTrunk.forward`` with an int8 pair state: (structure module outputs, final pair state)."""
    rows, att_rows = ROWS, trunk.chunk_size or ROWS
    if no_recycles is None:
        no_recycles = trunk.config.max_recycles
    elif no_recycles < 0:
        raise ValueError("Number of recycles must not be negative.")
    else:
        no_recycles += 1  # as transformers: the first pass is not a recycle
    recycle_s = torch.zeros_like(s_s_0)
    recycle_z: Optional[Int8Pair] = None
    bins: Optional[torch.Tensor] = None  # None: all zero (the first pass), never allocated
    for step in range(no_recycles):
        recycle_s = trunk.recycle_s_norm(recycle_s.detach())
        z = _initial_pair(trunk, recycle_z, bins, residx, mask, rows, s_s_0.dtype)
        recycle_z = bins = None  # read: let them go before the blocks make theirs
        s = s_s_0 + recycle_s
        for block in trunk.blocks:
            with forward_as(block, block_forward):  # called as a module: its hooks run (a fold's streamed weights)
                s, z = block(s, z, mask, rows, att_rows)
        with pair_rows_in(trunk.structure_module, rows):
            structure = trunk.structure_module({"single": trunk.trunk2sm_s(s),
                                                "pair": PairRows(z, rows, trunk.trunk2sm_z)},
                                               aa, mask.float())
        recycle_s, recycle_z = s, z
        if step + 1 < no_recycles:  # transformers also bins the last pass's coordinates, which nothing reads
            bins = recycle_bins(structure["positions"][-1][:, :, :3], trunk.recycle_bins, rows)
    structure["s_s"] = s
    return structure, z


def _initial_pair(trunk: nn.Module, recycle_z: Optional[Int8Pair], bins: Optional[torch.Tensor],
                  residx: torch.Tensor, mask: torch.Tensor, rows: int, dtype: torch.dtype) -> Int8Pair:
    """recycle_z_norm(recycled pair) + recycle_disto(bins) + relative position embedding, by rows (None: zeros)."""
    batch, length = residx.shape
    c_z = trunk.config.pairwise_state_dim
    out = Int8Pair(batch, length, c_z, dtype, residx.device)
    position = trunk.pairwise_positional_embedding
    for span in spans(length, rows):
        previous = (torch.zeros(batch, span.stop - span.start, length, c_z, dtype=dtype, device=residx.device)
                    if recycle_z is None else recycle_z.read(rows=span))
        index = (torch.zeros(batch, span.stop - span.start, length, dtype=torch.int64, device=residx.device)
                 if bins is None else bins[:, span])
        z = trunk.recycle_z_norm(previous) + trunk.recycle_disto(index)
        # EsmFoldRelativePosition.forward, rows `span` of its [B, L, L] index
        diff = (residx[:, None, :] - residx[:, span, None]).clamp(-position.bins, position.bins) + position.bins + 1
        diff[(mask[:, None, :] * mask[:, span, None]) == False] = 0  # noqa: E712 (transformers' test)
        out.write(z + position.embedding(diff), rows=span)
    return out


def recycle_bins(coords: torch.Tensor, num_bins: int, rows: int) -> torch.Tensor:
    """transformers' ``EsmFoldingTrunk.distogram(coords, 3.375, 21.375, num_bins)`` by query rows: int64 [B, L, L].

    ``coords``: [B, L, 3, 3] (N, CA, C). The same arithmetic a row block at a time, so the
    bins are equal; transformers' own holds the [B, L, L, 3] CB differences and sums its
    [B, L, L, num_bins - 1] comparisons as int64 (about 140 bytes a pair: 0.08 GiB at
    L = 800, three times the int8 pair state), here only the int64 result is L x L.
    """
    boundaries = torch.linspace(3.375, 21.375, num_bins - 1, device=coords.device) ** 2
    n, ca, c = [x.squeeze(-2) for x in coords.chunk(3, dim=-2)]
    b, c = ca - n, c - ca
    cb = -0.58273431 * b.cross(c, dim=-1) + 0.56802827 * b - 0.54067466 * c + ca  # [B, L, 3]
    out = torch.empty(coords.shape[:-2] + coords.shape[-3:-2], dtype=torch.int64, device=coords.device)
    for span in spans(coords.shape[-3], rows):
        dists = (cb[..., None, :, :] - cb[..., span, None, :]).pow(2).sum(dim=-1, keepdims=True)
        out[..., span, :] = torch.sum(dists > boundaries, dim=-1)
    return out
