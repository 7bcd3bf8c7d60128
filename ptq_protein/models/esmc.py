"""ESM C (EvolutionaryScale's ESM Cambrian, 300M and 600M) as a plain PyTorch module, without the ``esm`` 3.x package.

The architecture as EvolutionaryScale's code defines it (``esm/models/esmc.py`` and ``esm/layers/{blocks,
attention, transformer_stack, rotary, regression_head}.py`` of ``esm`` 3.2.1.post1), written anew:

* a token embedding of 64 rows (no padding row; 33 ids are used, see :mod:`ptq_protein.models.tokens`);
* ``n_layers`` pre-LayerNorm blocks, each ``x += attn(x) / s`` then ``x += ffn(x) / s`` with the residue
  scaling ``s = sqrt(n_layers / 36)`` (1 for the 600M model, 0.91 for the 300M one):

  - ``attn``: LayerNorm, one fused QKV Linear (no bias), LayerNorm over q and over k (the whole width, no
    bias), rotary embedding on each head (half-split, base 10000), softmax attention in which a position
    attends to the positions of its own kind (tokens to tokens, padding to padding), output Linear (no bias);
  - ``ffn``: LayerNorm, Linear to ``2h`` (no bias), SwiGLU (``silu(first half) * second half``), Linear
    ``h -> d`` (no bias), ``h`` = ``8/3 d`` rounded up to a multiple of 256;

* a final LayerNorm (no bias) and the sequence head: Linear, GELU, LayerNorm, Linear to 64 logits.

Module names are the official state dict's, so ``esmc_300m_2024_12_v0.pth`` / ``esmc_600m_2024_12_v0.pth``
load as they are (``strict=True``). ``repr_layers`` count as fair-esm's do from the embedding, and every block
is one: 0 is the token embedding, ``i`` in ``1..n_layers`` the output of block ``i`` (the official
``hidden_states[i - 1]``), and ``n_layers + 1`` (:attr:`ESMC.final_norm_layer`, ``-1`` from the end) the final
LayerNorm's output (the official ``embeddings``, from which the logits are computed). fair-esm's ESM-2 has one
index for its last block and its final LayerNorm (``num_layers``, after the LayerNorm); ESM C keeps them apart.

One addition of ours, off by default: ``ffn_rotation`` rotates each SwiGLU product by a block Hadamard matrix
online (QuaRot's rotation before the down projection), for 8-bit per-token activations at ``ffn.3``.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, Tuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ptq_protein.models.tokens import ESMC_VOCAB
from ptq_protein.quant.hadamard import block_hadamard, check_hadamard_block

__all__ = ["ESMC", "EsmCBlock", "EsmCAttention", "SwiGLU", "ffn_hidden_width", "rotary", "rotary_tables"]

VOCAB_ROWS = 64  # embedding rows and logits: the official model's size (ids 33..63 are never used)
PAD_ID, BOS_ID, EOS_ID, MASK_ID = (ESMC_VOCAB.index(t) for t in ("<pad>", "<cls>", "<eos>", "<mask>"))
FFN_EXPANSION = 8 / 3  # esm/layers/transformer_stack.py's expansion_ratio
ROTARY_BASE = 10000.0
SCALING_DEPTH = 36  # residue scaling sqrt(n_layers / 36) (transformer_stack.py)


def ffn_hidden_width(d_model: int) -> int:
    """SwiGLU width ``h``: ``8/3 d`` rounded up to a multiple of 256 (960 -> 2560, 1152 -> 3072)."""
    return int((FFN_EXPANSION * d_model + 255) // 256 * 256)


def rotary_tables(tokens: Tensor, head_dim: int) -> Tuple[Tensor, Tensor]:
    """(cos, sin) [T, 1, Dh] in float32 for the positions of ``tokens`` [B, T] (half-split layout, base 10000).

    Built from ``tokens``' own length so that a traced graph (ONNX) keeps the length dynamic.
    """
    inv_freq = 1.0 / ROTARY_BASE ** (torch.arange(0, head_dim, 2, device=tokens.device, dtype=torch.float32)
                                     / head_dim)
    positions = torch.arange(tokens.shape[1], device=tokens.device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)  # [T, Dh/2]
    return angles.cos().repeat(1, 2)[:, None], angles.sin().repeat(1, 2)[:, None]


def rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary position embedding of ``x`` [B, T, H, Dh] (halves rotated, GPT-NeoX style), tables in ``x``'s dtype.

    ``x * cos + cat(-x2, x1) * sin``, written into ``x * cos`` half by half: the same products and sums (``a + (-b)``
    is ``a - b`` in floating point) without the concatenated copy. A traced graph (ONNX export) takes the formula
    itself: the in-place halves would export as scatters.
    """
    half = x.shape[-1] // 2
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    if torch.jit.is_tracing():
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin
    out = x * cos
    out[..., :half] -= x2 * sin[..., :half]
    out[..., half:] += x1 * sin[..., half:]
    return out


class SwiGLU(nn.Module):
    """``silu(a) * b`` of the two halves ``a, b`` of the last dimension, optionally rotated online.

    ``rotation`` b > 0 multiplies the product by a block-diagonal Hadamard matrix (blocks of ``b`` channels,
    :func:`~ptq_protein.quant.hadamard.block_hadamard`), in at least float32: the heavy-tailed product then
    quantizes per token far better. The float model is unchanged only when the Linear reading it holds ``W H``
    (:func:`ptq_protein.transforms.rotation.rotate_ffn_product_` does both). 0, the default, is the official
    module. The matrix is built on the fly, so the state dict is the official one either way.
    """

    def __init__(self, rotation: int = 0):
        super().__init__()
        if rotation:
            check_hadamard_block(rotation, "SwiGLU rotation")
        self.rotation = rotation

    def forward(self, x: Tensor) -> Tensor:
        a, b = x.chunk(2, dim=-1)
        product = F.silu(a) * b
        if not self.rotation:
            return product
        work = product.to(torch.promote_types(product.dtype, torch.float32))
        return block_hadamard(work, self.rotation).to(product.dtype)

    def extra_repr(self) -> str:
        return f"rotation={self.rotation}" if self.rotation else ""


class EsmCAttention(nn.Module):
    """Pre-LayerNorm multi-head attention with a fused QKV projection and LayerNorm on q and k."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.layernorm_qkv = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 3 * d_model, bias=False))
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        self.q_ln = nn.LayerNorm(d_model, bias=False)
        self.k_ln = nn.LayerNorm(d_model, bias=False)

    def forward(self, x: Tensor, same_kind: Tensor, rope: Tuple[Tensor, Tensor]) -> Tensor:
        """``x`` [B, T, C]; ``same_kind`` [B, 1, T, T] bool, True where query and key may meet; ``rope``: the
        :func:`rotary_tables`."""
        q, k, v = self.layernorm_qkv(x).chunk(3, dim=-1)
        q, k = self.q_ln(q).to(q.dtype), self.k_ln(k).to(q.dtype)
        q, k, v = (t.unflatten(-1, (self.n_heads, -1)) for t in (q, k, v))  # [B, T, H, Dh]
        q, k, v = rotary(q, *rope).transpose(1, 2), rotary(k, *rope).transpose(1, 2), v.transpose(1, 2)
        if torch._C._is_torch_function_mode_enabled():  # the MATMUL-site interceptor must see both products
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
            probs = scores.masked_fill(~same_kind, float("-inf")).softmax(dim=-1)
            context = torch.matmul(probs, v)
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=same_kind)
        return self.out_proj(context.transpose(1, 2).flatten(2))


class EsmCBlock(nn.Module):
    """One block: attention then the SwiGLU feed-forward, each added to the stream divided by ``scaling``."""

    def __init__(self, d_model: int, n_heads: int, scaling: float, ffn_rotation: int = 0):
        super().__init__()
        hidden, glu = ffn_hidden_width(d_model), SwiGLU(ffn_rotation)
        if ffn_rotation and hidden % ffn_rotation:
            raise ValueError(f"ffn_rotation={ffn_rotation} does not divide the SwiGLU width {hidden} "
                             f"(d_model={d_model}); use a power of two that divides it (e.g. 128)")
        self.attn = EsmCAttention(d_model, n_heads)
        self.ffn = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 2 * hidden, bias=False), glu,
                                 nn.Linear(hidden, d_model, bias=False))
        self.scaling = scaling

    def forward(self, x: Tensor, same_kind: Tensor, rope: Tuple[Tensor, Tensor]) -> Tensor:
        x = x + self._scaled(self.attn(x, same_kind, rope))
        return x + self._scaled(self.ffn(x))

    def _scaled(self, branch: Tensor) -> Tensor:
        """``branch / scaling``; with scaling 1 (the 600M model) the division, an identity, is skipped."""
        return branch if self.scaling == 1.0 else branch / self.scaling


class TransformerStack(nn.Module):
    """The blocks and the final LayerNorm (a container: :meth:`ESMC.forward` runs them)."""

    def __init__(self, d_model: int, n_heads: int, n_layers: int, ffn_rotation: int = 0):
        super().__init__()
        scaling = math.sqrt(n_layers / SCALING_DEPTH)
        self.blocks = nn.ModuleList(EsmCBlock(d_model, n_heads, scaling, ffn_rotation) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model, bias=False)


class ESMC(nn.Module):
    """ESM C with the official module names; ``ESMC(960, 15, 30)`` is ESM C 300M, ``ESMC(1152, 18, 36)`` 600M.

    Parameters
    ----------
    d_model, n_heads, n_layers
        Width, attention heads and blocks, as the official constructor takes them.
    ffn_rotation
        Not in the official model: the Hadamard block of every :class:`SwiGLU` (0: none, the official
        forward). A model built with it computes the official function only with each ``ffn.3`` weight
        rotated to match (:func:`ptq_protein.transforms.rotation.rotate_ffn_product_`); artifacts of
        rotated models rebuild through it.

    Examples
    --------
    >>> model = ESMC(d_model=64, n_heads=4, n_layers=2).eval()
    >>> tokens = torch.tensor([[0, 20, 15, 11, 2]])  # <cls> M K T <eos>
    >>> out = model(tokens, repr_layers=[2, 3])  # block 2's output and the final LayerNorm's (2 + 1)
    >>> out["logits"].shape, out["representations"][2].shape, torch.equal(out["representations"][3], out["embeddings"])
    (torch.Size([1, 5, 64]), torch.Size([1, 5, 64]), True)
    """

    pad_id, bos_id, eos_id, mask_id = PAD_ID, BOS_ID, EOS_ID, MASK_ID

    def __init__(self, d_model: int, n_heads: int, n_layers: int, ffn_rotation: int = 0):
        super().__init__()
        self.d_model, self.n_heads, self.num_layers = d_model, n_heads, n_layers
        self.embed = nn.Embedding(VOCAB_ROWS, d_model)
        self.transformer = TransformerStack(d_model, n_heads, n_layers, ffn_rotation)
        self.sequence_head = nn.Sequential(nn.Linear(d_model, d_model), nn.GELU(), nn.LayerNorm(d_model),
                                           nn.Linear(d_model, VOCAB_ROWS))

    @property
    def embed_dim(self) -> int:
        return self.d_model

    @property
    def final_norm_layer(self) -> int:
        """The ``repr_layers`` index of the final LayerNorm's output (``n_layers + 1``; ``-1`` counts to it)."""
        return self.num_layers + 1

    @property
    def ffn_rotation(self) -> int:
        """The Hadamard block of the SwiGLU products (0: none), read from the modules: a transform may set it."""
        blocks = {m.rotation for m in self.modules() if isinstance(m, SwiGLU)}
        if len(blocks) > 1:
            raise ValueError(f"the SwiGLU modules of this ESM C rotate with different blocks {sorted(blocks)}; "
                             "an artifact records one: rotate every block alike")
        return blocks.pop() if blocks else 0

    def forward(self, sequence_tokens: Tensor, repr_layers: Iterable[int] = ()) -> Dict[str, object]:
        """Logits [B, T, 64], ``embeddings`` [B, T, C] (after the final LayerNorm) and the ``repr_layers`` asked
        for, ``{layer: [B, T, C]}``: 0 the token embedding, ``1..n_layers`` the blocks' outputs,
        :attr:`final_norm_layer` the final LayerNorm's. ``sequence_tokens`` [B, T]: ids with BOS/EOS, padded with
        id 1."""
        keep = set(repr_layers)
        computed = sequence_tokens != self.pad_id
        same_kind = (computed[:, :, None] == computed[:, None, :]).unsqueeze(1)
        rope = rotary_tables(sequence_tokens, self.d_model // self.n_heads)
        x = self.embed(sequence_tokens)
        reps = {0: x} if 0 in keep else {}
        for i, block in enumerate(self.transformer.blocks, start=1):
            x = block(x, same_kind, rope)
            if i in keep:
                reps[i] = x
        x = self.transformer.norm(x)
        if self.final_norm_layer in keep:
            reps[self.final_norm_layer] = x
        return {"logits": self.sequence_head(x), "embeddings": x, "representations": reps}
