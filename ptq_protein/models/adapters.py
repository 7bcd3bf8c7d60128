"""Model adapters: the only place that knows ESM architectures.

An adapter tells the rest of the toolkit, for one model family, which site
group a module belongs to, which modules are heads kept in floating point,
how to turn sequences into a model call, and which positions of the
activations are real residues (for mask-aware calibration).

Families: fair-esm ``ESM2`` and ``ProteinBertModel`` (ESM-1b / ESM-1v),
transformers ``EsmModel`` / ``EsmForMaskedLM`` and ``EsmForProteinFolding``
(and fair-esm's own ESMFold when it imports), and ptq-protein's ESM C
(:class:`~ptq_protein.models.esmc.ESMC`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Sequence, Tuple

import torch
from torch import nn

from ptq_protein.models.adapter_base import ESM2_MAX_RESIDUES, ESM_ALPHABET_LETTERS, Batch, ModelAdapter

__all__ = ["Batch", "ModelAdapter", "get_adapter", "ESM_ALPHABET_LETTERS", "ESM2_MAX_RESIDUES"]

def _esm_tokens(sequences: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    """ESM tokens [B, L+2] (BOS, residues, EOS, padding) and their residue mask (see :func:`_special_of`)."""
    alphabet = _esm_alphabet()
    longest = max(len(s) for s in sequences)
    tokens = torch.full((len(sequences), longest + 2), alphabet.padding_idx, dtype=torch.long)
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    for i, seq in enumerate(sequences):
        tokens[i, 0] = alphabet.cls_idx
        tokens[i, 1:len(seq) + 1] = torch.tensor([alphabet.get_idx(a) for a in seq])
        tokens[i, len(seq) + 1] = alphabet.eos_idx
        mask[i, 1:len(seq) + 1] = True
    return tokens, mask


def _special_of(tokens: torch.Tensor, residue_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] True at BOS/EOS: computed positions (not padding) that hold no residue."""
    return (tokens != _esm_alphabet().padding_idx) & ~residue_mask


def _first_module(model: nn.Module, names: Sequence[str]) -> Optional[str]:
    modules = dict(model.named_modules())
    return next((n for n in names if n in modules), None)


_ALPHABET = None

# transformers' EsmLayer: attention.LayerNorm -> q/k/v, LayerNorm -> intermediate.dense
_HF_ESM_PAIRS = (("attention.LayerNorm", ("attention.self.query", "attention.self.key", "attention.self.value")),
                 ("LayerNorm", ("intermediate.dense",)))
# transformers' ESMFold trunk block (EsmFoldTriangularSelfAttentionBlock and its parts)
_ESMFOLD_TRUNK_PAIRS = (
    ("layernorm_1", ("seq_attention.proj", "seq_attention.g_proj")),
    ("sequence_to_pair.layernorm", ("sequence_to_pair.proj",)),
    ("pair_to_sequence.layernorm", ("pair_to_sequence.linear",)),
    ("layer_norm_in", ("linear_a_p", "linear_a_g", "linear_b_p", "linear_b_g", "linear_g")),  # tri_mul_*
    ("layer_norm_out", ("linear_z",)),
    ("layer_norm", ("linear", "mha.linear_q", "mha.linear_k", "mha.linear_v", "mha.linear_g")),  # tri_att_*
    ("mlp.0", ("mlp.1",)),  # mlp_seq / mlp_pair
)


def _esm_alphabet():
    global _ALPHABET
    if _ALPHABET is None:
        from esm.data import Alphabet

        _ALPHABET = Alphabet.from_architecture("ESM-1b")  # ESM-2 uses the same 33-token alphabet
    return _ALPHABET


def _rotary_tables_follow_dtype(module: nn.Module, args: Any) -> None:
    """Forget fair-esm RotaryEmbedding's cos/sin tables when the module's dtype changed.

    fair-esm caches them by length and device but not dtype: after one float32
    forward, ``model.half()`` would mix float32 q/k with half v ("expected m1 and
    m2 to have the same dtype").
    """
    cached = getattr(module, "_cos_cached", None)
    if cached is not None and cached.dtype != module.inv_freq.dtype:
        module._seq_len_cached = None


class FairEsmAdapter(ModelAdapter):
    """fair-esm ``ESM2`` and ``ProteinBertModel`` (ESM-1b/1v): layers run in (T, B, C)."""

    family = "fair-esm"
    head_globs = ("lm_head*", "contact_head*", "embed_tokens*", "embed_positions*")
    layout = "TB"
    norm_linear_pairs = (("self_attn_layer_norm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                         ("final_layer_norm", ("fc1",)))

    def prepare(self, model: nn.Module) -> None:
        # ESM-1b's MultiheadAttention takes F.multi_head_attention_forward, which reads
        # q_proj.weight directly and bypasses the module calls that carry quantization.
        for module in model.modules():
            if hasattr(module, "enable_torch_version"):
                module.enable_torch_version = False
            if hasattr(module, "_seq_len_cached") and not getattr(module, "_ptq_dtype_hook", False):
                module.register_forward_pre_hook(_rotary_tables_follow_dtype)
                module._ptq_dtype_hook = True
        # integer models run attention (when no map is asked for) and GELU as single fused calls
        from ptq_protein.models.fused_float import use_fused_float_

        use_fused_float_(model)

    @contextlib.contextmanager
    def calibration_mode(self, model: nn.Module) -> Iterator[None]:
        # fair-esm's RotaryEmbedding caches its cos/sin tables by length and device but
        # not dtype: tables left by the float32 calibration forwards would make q/k
        # float32 in a model later cast with .to(torch.bfloat16). Forget them.
        try:
            yield
        finally:
            for module in model.modules():
                if hasattr(module, "_seq_len_cached"):
                    module._seq_len_cached = None

    def make_batch(self, sequences: Sequence[str]) -> Batch:
        tokens, mask = _esm_tokens(sequences)
        return Batch({"tokens": tokens}, mask, mask[:, 1:-1], tuple(sequences), _special_of(tokens, mask))

    def token_ids_tap(self, model: nn.Module) -> Optional[Tuple[str, Tuple[int, ...], int]]:
        if not hasattr(model, "embed_tokens"):
            return None
        return "embed_tokens", (int(model.cls_idx), int(model.eos_idx)), int(model.padding_idx)

    def forward(self, model: nn.Module, batch: Batch) -> Any:
        device = _device_of(model)
        return model(batch.inputs["tokens"].to(device))


def _fused_hf_layers(model: nn.Module) -> None:
    """Integer transformers ESM layers run as one fused layer where they can (``models/hf_fused``)."""
    from ptq_protein.models.hf_fused import use_fused_layers_

    use_fused_layers_(model)


class HFEsmAdapter(ModelAdapter):
    """transformers ``EsmModel`` / ``EsmForMaskedLM``: batch-first hidden states."""

    family = "hf-esm"
    norm_linear_pairs = _HF_ESM_PAIRS
    head_globs = ("lm_head*", "esm.contact_head*", "contact_head*", "esm.embeddings*", "embeddings*", "pooler*",
                  "classifier*")

    def prepare(self, model: nn.Module) -> None:
        _fused_hf_layers(model)

    def make_batch(self, sequences: Sequence[str]) -> Batch:
        tokens, mask = _esm_tokens(sequences)
        attention = tokens != _esm_alphabet().padding_idx
        return Batch({"input_ids": tokens, "attention_mask": attention.long()}, mask, mask[:, 1:-1], tuple(sequences),
                     _special_of(tokens, mask))

    def token_ids_tap(self, model: nn.Module) -> Optional[Tuple[str, Tuple[int, ...], int]]:
        name = _first_module(model, ("embeddings.word_embeddings", "esm.embeddings.word_embeddings"))
        alphabet = _esm_alphabet()  # the HF ESM vocabulary is fair-esm's
        return None if name is None else (name, (alphabet.cls_idx, alphabet.eos_idx), alphabet.padding_idx)

    def forward(self, model: nn.Module, batch: Batch) -> Any:
        device = _device_of(model)
        return model(**{k: v.to(device) for k, v in batch.inputs.items()})


class HFEsmFoldAdapter(ModelAdapter):
    """transformers ``EsmForProteinFolding``: LM tokens are [B, L+2], trunk tensors [B, L(, L)]."""

    family = "hf-esmfold"
    groups = ("esm", "trunk", "structure")
    # Pair tensors make padding cost L^2 (triangle attention L^3): one sequence a forward is
    # faster on CPU (tiny-esmfold with 2 recycles, casp14:50 cropped to 128: 24 s vs 28.5 s at batch 4), and is
    # the study's pass.
    calibration_batch = 1
    norm_linear_pairs = _HF_ESM_PAIRS + _ESMFOLD_TRUNK_PAIRS
    head_globs = ("distogram_head*", "ptm_head*", "lm_head*", "lddt_head*", "esm.contact_head*",
                  "esm.embeddings*", "embedding", "trunk.pairwise_positional_embedding*", "trunk.recycle_disto*",
                  "esm_s_combine*")

    def prepare(self, model: nn.Module) -> None:
        _fused_hf_layers(model)  # the ESM-2 stem

    def group_of(self, name: str) -> str:
        if name.startswith("esm."):
            return "esm"
        if name.startswith("trunk.structure_module.") or name.startswith("trunk.trunk2sm"):
            return "structure"
        return "trunk"

    @contextlib.contextmanager
    def calibration_mode(self, model: nn.Module) -> Iterator[None]:
        trunk = getattr(model, "trunk", None)
        old = getattr(trunk, "chunk_size", None)
        if trunk is not None and hasattr(trunk, "set_chunk_size"):
            trunk.set_chunk_size(None)
        try:
            yield
        finally:
            if trunk is not None and hasattr(trunk, "set_chunk_size"):
                trunk.set_chunk_size(old)

    def calibrates_as_it_runs(self, model: nn.Module) -> bool:
        return getattr(getattr(model, "trunk", None), "chunk_size", None) is None

    def make_batch(self, sequences: Sequence[str]) -> Batch:
        from transformers.models.esm.openfold_utils import residue_constants as rc

        longest = max(len(s) for s in sequences)
        aatype = torch.zeros((len(sequences), longest), dtype=torch.long)
        residue_mask = torch.zeros((len(sequences), longest), dtype=torch.bool)
        x_index = rc.restype_order_with_x["X"]
        for i, seq in enumerate(sequences):
            aatype[i, :len(seq)] = torch.tensor([rc.restype_order_with_x.get(a, x_index) for a in seq])
            residue_mask[i, :len(seq)] = True
        token_mask = torch.nn.functional.pad(residue_mask, (1, 1), value=False)
        special = torch.zeros_like(token_mask)  # the LM stem's input: BOS, residues, EOS, padding
        special[:, 0] = True
        special[torch.arange(len(sequences)), torch.tensor([len(s) + 1 for s in sequences])] = True
        inputs = {"input_ids": aatype, "attention_mask": residue_mask.long(),
                  "position_ids": torch.arange(longest).expand(len(sequences), -1)}
        return Batch(inputs, token_mask, residue_mask, tuple(sequences), special)

    def token_ids_tap(self, model: nn.Module) -> Optional[Tuple[str, Tuple[int, ...], int]]:
        if _first_module(model, ("esm.embeddings.word_embeddings",)) is None:
            return None
        return ("esm.embeddings.word_embeddings", (int(model.esm_dict_cls_idx), int(model.esm_dict_eos_idx)),
                int(model.esm_dict_padding_idx))

    def forward_for_sites(self, model: nn.Module, batch: Batch, sites: Sequence[Any], **kwargs: Any) -> Any:
        """The ESM-2 stem alone when every site is in it: the stem runs first and reads nothing of the trunk."""
        if sites and all(self.group_of(s.name) == "esm" for s in sites):
            return self.stem_forward(model, batch)
        return self.forward(model, batch, **kwargs)

    def stem_forward(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The stem's hidden states [B, L, layers + 1, C], computed as ESMFold's forward computes them first."""
        device = _device_of(model)
        aa, mask = batch.inputs["input_ids"].to(device), batch.inputs["attention_mask"].to(device)
        return model.compute_language_model_representations(model.af2_idx_to_esm_idx(aa, mask))

    def forward(self, model: nn.Module, batch: Batch, num_recycles: Optional[int] = None) -> Any:
        device = _device_of(model)
        kwargs = {k: v.to(device) for k, v in batch.inputs.items()}
        if num_recycles is not None:
            kwargs["num_recycles"] = num_recycles
        return model(**kwargs)


class EsmCAdapter(ModelAdapter):
    """ptq-protein's ESM C: batch-first, fused QKV and SwiGLU linears, no contact head, no length limit (rotary)."""

    family, max_residues = "esmc", None
    head_globs = ("embed*", "sequence_head*")
    norm_linear_pairs = (("attn.layernorm_qkv.0", ("attn.layernorm_qkv.1",)), ("ffn.0", ("ffn.1",)))
    rotation_pairs = (("ffn.2", "ffn.3"),)  # SwiGLU -> down projection

    def make_batch(self, sequences: Sequence[str]) -> Batch:
        tokens, mask = _esm_tokens(sequences)  # ESM C's ids are ESM-2's for residues, BOS, EOS, padding (tokens.py)
        return Batch({"sequence_tokens": tokens}, mask, mask[:, 1:-1], tuple(sequences), _special_of(tokens, mask))

    def token_ids_tap(self, model: nn.Module) -> Optional[Tuple[str, Tuple[int, ...], int]]:
        return "embed", (int(model.bos_id), int(model.eos_id)), int(model.pad_id)

    def forward(self, model: nn.Module, batch: Batch) -> Any:
        return model(batch.inputs["sequence_tokens"].to(_device_of(model)))


def _device_of(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return torch.device("cpu")


_ADAPTERS = {
    "ESM2": FairEsmAdapter, "ProteinBertModel": FairEsmAdapter,
    "EsmForProteinFolding": HFEsmFoldAdapter,
    "EsmModel": HFEsmAdapter, "EsmForMaskedLM": HFEsmAdapter,
    "EsmForTokenClassification": HFEsmAdapter, "EsmForSequenceClassification": HFEsmAdapter,
    "ptq_protein.models.esmc.ESMC": EsmCAdapter,  # by module too: EvolutionaryScale's class has the same name
}


def get_adapter(model: nn.Module) -> ModelAdapter:
    """Pick the adapter by class, subclasses included (never by checkpoint name)."""
    for cls in type(model).__mro__:
        for key in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}"):
            if key in _ADAPTERS:
                return _ADAPTERS[key](model)
    raise TypeError(
        f"ptq-protein does not know how to calibrate a {type(model).__name__}; supported: fair-esm ESM2 / "
        "ProteinBertModel, transformers EsmModel / EsmForMaskedLM / EsmForProteinFolding (or subclasses), "
        "ptq-protein's ESM C (ptq_protein.models.esmc.ESMC)"
    )
