"""One ESMFold trunk block (transformers ``EsmFoldTriangularSelfAttentionBlock``) on an int8 pair state, by chunks.

Each pair operation reads ``k`` rows (or columns) of the int8 state at a time,
dequantizes them, applies the block's own modules, and writes the result into a
new :class:`~ptq_protein.nn.pair_int8.holder.Int8Pair`. The operations that mix
rows are chunked along the axis they do not reduce over:

* sequence attention with the pair bias: by query rows (the bias of row i is pair row i);
* sequence -> pair, pair transition: per (i, j) vector (fused into their neighbours, below);
* triangle multiplication: the gated projections a, b are held in int8 too; output
  rows I are ``sum_k a[I, k] b[J, k]`` (outgoing) or ``sum_k a[k, I] b[k, J]``
  (incoming) over column blocks J;
* triangle attention: the [H, L, L] triangle bias first (H / C of a float pair),
  then attention by rows (starting node) or columns (ending node).

The two row-local operations are not stored on their own, which saves two of the
six roundings of the pair state a block would otherwise make (each adds about 0.4%
relative error, and they add up): the sequence -> pair update is added to the rows
the outgoing triangle multiplication reads (computed twice, it is cheap), and the
pair transition is applied to the ending-node triangle attention's output columns
before they are written. A block rounds its pair state four times.

The math is transformers' (same modules, same order); only the pair state between
operations is rounded to int8.
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional

import torch
from torch import nn

from ptq_protein.nn.pair_int8.holder import Int8Pair

__all__ = ["block_forward", "spans"]


def spans(length: int, step: int) -> Iterator[slice]:
    for start in range(0, length, step):
        yield slice(start, min(start + step, length))


def block_forward(block: nn.Module, s: torch.Tensor, z: Int8Pair, mask: torch.Tensor, rows: int, att_rows: int):
    """(sequence state, new int8 pair state) of ``block`` on ``s`` [B, L, c_s] and ``z``; ``mask`` [B, L].

    ``rows``: rows per chunk of the pair operations; ``att_rows``: of the triangle
    attentions, whose logits are ``att_rows x heads x L x L`` (the trunk's chunk size).
    """
    s = s + _sequence_attention(block, s, z, mask, rows)
    s = block.mlp_seq(s)
    pair_mask = (mask.unsqueeze(2) * mask.unsqueeze(1)).to(s.dtype)  # [B, L, L], as transformers' tri_mask
    plus_s2p = _sequence_to_pair(block.sequence_to_pair, s)
    z = _triangle_multiplication(block.tri_mul_out, z, pair_mask, rows, outgoing=True, read_rows=plus_s2p)
    z = _triangle_multiplication(block.tri_mul_in, z, pair_mask, rows, outgoing=False)
    z = _triangle_attention(block.tri_att_start, z, pair_mask, att_rows, starting=True)
    z = _triangle_attention(block.tri_att_end, z, pair_mask, att_rows, starting=False, then=block.mlp_pair)
    return s, z


def _like(z: Int8Pair, channels: Optional[int] = None) -> Int8Pair:
    b, n, _, c = z.shape
    return Int8Pair(b, n, channels or c, z.dtype, z.codes.device)


def _sequence_attention(block: nn.Module, s: torch.Tensor, z: Int8Pair, mask: torch.Tensor, rows: int):
    """``EsmFoldSelfAttention`` with the pair bias of ``EsmFoldPairToSequence``, by query rows."""
    att = block.seq_attention
    x = block.layernorm_1(s)
    t = att.proj(x).view(*x.shape[:2], att.num_heads, -1).permute(0, 2, 1, 3)
    q, k, v = t.chunk(3, dim=-1)
    q = att.rescale_factor * q
    keys_off = (mask == False)[:, None, None]  # noqa: E712 (transformers' test)
    parts = []
    for span in spans(s.shape[1], rows):
        bias = block.pair_to_sequence(z.read(rows=span)).permute(0, 3, 1, 2)  # [B, H, r, L]
        a = torch.einsum("...qc,...kc->...qk", q[:, :, span], k) + bias
        a = nn.functional.softmax(a.masked_fill(keys_off, -float("inf")), dim=-1)
        parts.append(torch.einsum("...hqk,...hkc->...qhc", a, v))
    y = torch.cat(parts, dim=1)
    y = y.reshape(*y.shape[:2], -1)
    if att.gated:
        y = att.g_proj(x).sigmoid() * y
    return att.o_proj(y)


RowReader = Callable[[Int8Pair, slice], torch.Tensor]  # (pair, rows) -> float rows [B, r, L, C]


def _sequence_to_pair(module: nn.Module, s: torch.Tensor) -> RowReader:
    """Rows of z + ``EsmFoldSequenceToPair``(s): row i of the update is built from k[i] and every q[j]."""
    q, k = module.proj(module.layernorm(s)).chunk(2, dim=-1)

    def plus_update(z: Int8Pair, span: slice) -> torch.Tensor:
        kr = k[:, span, None, :]
        return z.read(rows=span) + module.o_proj(torch.cat([q[:, None, :, :] * kr, q[:, None, :, :] - kr], dim=-1))

    return plus_update


def _rows_of(z: Int8Pair, span: slice) -> torch.Tensor:
    return z.read(rows=span)


def _triangle_multiplication(module: nn.Module, z: Int8Pair, pair_mask: torch.Tensor, rows: int, *,
                             outgoing: bool, read_rows: RowReader = _rows_of) -> Int8Pair:
    """x + ``EsmFoldTriangleMultiplicativeUpdate``(x), x = ``read_rows``(z, rows): a, b int8, the product by blocks."""
    a, b = _like(z), _like(z)
    for span in spans(z.shape[1], rows):
        zl = module.layer_norm_in(read_rows(z, span))
        m = pair_mask[:, span, :, None]
        a.write(m * module.sigmoid(module.linear_a_g(zl)) * module.linear_a_p(zl), rows=span)
        b.write(m * module.sigmoid(module.linear_b_g(zl)) * module.linear_b_p(zl), rows=span)
    out = _like(z)
    n = z.shape[1]
    for span in spans(n, rows):
        # outgoing x[i, j] = sum_k a[i, k] b[j, k]; incoming x[i, j] = sum_k a[k, i] b[k, j]  -> [B, C, I, K]
        ai = a.read(rows=span).permute(0, 3, 1, 2) if outgoing else a.read(cols=span).permute(0, 3, 2, 1)
        x = torch.empty(ai.shape[0], ai.shape[2], n, ai.shape[1], dtype=z.dtype, device=z.codes.device)
        for block in spans(n, rows):
            bj = b.read(rows=block).permute(0, 3, 2, 1) if outgoing else b.read(cols=block).permute(0, 3, 1, 2)
            x[:, :, block] = torch.matmul(ai, bj).permute(0, 2, 3, 1)
        x = module.linear_z(module.layer_norm_out(x))
        zr = read_rows(z, span)
        x = x * module.sigmoid(module.linear_g(module.layer_norm_in(zr)))
        out.write(zr + x, rows=span)
    return out


def _triangle_attention(module: nn.Module, z: Int8Pair, pair_mask: torch.Tensor, rows: int, *, starting: bool,
                        then: Optional[nn.Module] = None) -> Int8Pair:
    """``then``(z + ``EsmFoldTriangleAttention``(z)): rows (starting node) or columns (ending node) at a time.

    ``then`` (per (i, j) vector: the pair transition) is applied to each chunk before it is written.
    """
    then = then or nn.Identity()
    n = z.shape[1]
    mask = pair_mask if starting else pair_mask.transpose(-1, -2)

    def view(span: slice) -> torch.Tensor:  # [B, r, L, C] rows of z, or of z transposed
        return module.layer_norm(z.read(rows=span) if starting else z.read(cols=span).transpose(1, 2))

    bias = torch.empty(z.shape[0], module.no_heads, n, n, dtype=z.dtype, device=z.codes.device)
    for span in spans(n, rows):
        bias[:, :, span] = module.linear(view(span)).permute(0, 3, 1, 2)
    bias = bias.unsqueeze(-4)  # [B, 1, H, L, L]
    out = _like(z)
    for span in spans(n, rows):
        x = view(span)
        mask_bias = (module.inf * (mask[:, span] - 1))[..., :, None, None, :]
        update = module.mha(q_x=x, kv_x=x, biases=[mask_bias, bias])
        if starting:
            out.write(then(z.read(rows=span) + update), rows=span)
        else:
            out.write(then(z.read(cols=span) + update.transpose(1, 2)), cols=span)
    return out
