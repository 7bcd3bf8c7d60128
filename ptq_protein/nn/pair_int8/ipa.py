"""transformers' ``EsmFoldInvariantPointAttention`` by query rows, reading the int8 pair row by row.

The IPA's largest tensors are L x L x heads x points: the point-attention
differences ``[L, L, H, P_qk, 3]`` (144 values a pair at the v1 sizes, more than the
pair's 128 channels) and the point-value products ``[H, 3, L, L, P_v]`` (288). Every
one of them, and the pair bias and pair-weighted sum, belongs to one query row i,
so the attention runs ``rows`` query rows at a time; the math is transformers',
line for line, on a slice of the queries.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ptq_protein.nn.pair_int8.block import spans

__all__ = ["RowChunkedIPA"]


class RowChunkedIPA(nn.Module):
    """Wraps an ``EsmFoldInvariantPointAttention``; ``z`` is a :class:`~ptq_protein.nn.pair_int8.trunk.PairRows`."""

    def __init__(self, ipa: nn.Module, rows: int) -> None:
        super().__init__()
        self.ipa, self.rows = ipa, rows

    def forward(self, s: torch.Tensor, z, r, mask: torch.Tensor, **_: object) -> torch.Tensor:
        ipa = self.ipa
        q = ipa.linear_q(s).unflatten(-1, (ipa.num_heads, -1))
        k, v = torch.split(ipa.linear_kv(s).unflatten(-1, (ipa.num_heads, -1)), ipa.hidden_dim, dim=-1)
        q_pts = _points(ipa.linear_q_points(s), r).unflatten(-2, (ipa.num_heads, ipa.num_qk_points))
        kv_pts = _points(ipa.linear_kv_points(s), r).unflatten(-2, (ipa.num_heads, -1))
        k_pts, v_pts = torch.split(kv_pts, [ipa.num_qk_points, ipa.num_v_points], dim=-2)
        head_weights = ipa.softplus(ipa.head_weights).view(1, 1, 1, -1, 1)
        head_weights = head_weights * math.sqrt(1.0 / (3 * (ipa.num_qk_points * 9.0 / 2)))
        square_mask = ipa.config.inf * (mask.unsqueeze(-1) * mask.unsqueeze(-2) - 1)
        outs = []
        for span in spans(s.shape[-2], self.rows):
            zr = z.read(span)  # [B, r, L, C]
            a = torch.matmul(q[:, span].permute(0, 2, 1, 3), k.permute(0, 2, 3, 1))  # [B, H, r, L]
            a *= math.sqrt(1.0 / (3 * ipa.hidden_dim))
            a += math.sqrt(1.0 / 3) * ipa.linear_b(zr).permute(0, 3, 1, 2)
            pt_att = (q_pts[:, span].unsqueeze(-4) - k_pts.unsqueeze(-5)) ** 2  # [B, r, L, H, P, 3]
            pt_att = sum(torch.unbind(pt_att, dim=-1)) * head_weights
            a = a + (torch.sum(pt_att, dim=-1) * (-0.5)).permute(0, 3, 1, 2)
            a = ipa.softmax(a + square_mask[:, span].unsqueeze(-3))
            o = torch.matmul(a, v.transpose(-2, -3).to(dtype=a.dtype)).transpose(-2, -3)  # [B, r, H, c]
            o_pt = torch.sum(a[..., None, :, :, None] * v_pts.permute(0, 2, 4, 1, 3)[..., None, :, :], dim=-2)
            o_pair = torch.matmul(a.transpose(-2, -3), zr.to(dtype=a.dtype))  # [B, r, H, C]
            outs.append((o, o_pt, o_pair))
        o = torch.cat([x[0] for x in outs], dim=1).flatten(-2)
        o_pt = torch.cat([x[1] for x in outs], dim=-2).permute(0, 3, 1, 4, 2)  # [B, L, H, P_v, 3]
        o_pt = r[..., None, None].invert_apply(o_pt)
        o_pt_norm = torch.sqrt(torch.sum(o_pt ** 2, dim=-1) + ipa.config.epsilon).flatten(-2)
        o_pt = o_pt.reshape(*o_pt.shape[:-3], -1, 3)
        o_pair = torch.cat([x[2] for x in outs], dim=1).flatten(-2)
        return ipa.linear_out(torch.cat((o, *torch.unbind(o_pt, dim=-1), o_pt_norm, o_pair), dim=-1).to(z.dtype))


def _points(flat: torch.Tensor, r) -> torch.Tensor:
    """[*, N, H * P * 3] -> [*, N, H * P, 3] points in the global frame (transformers' split/stack/apply)."""
    return r[..., None].apply(torch.stack(torch.split(flat, flat.shape[-1] // 3, dim=-1), dim=-1))
