"""Vocabularies and batch tokenization for the model families, offline.

* fair-esm and transformers ESM-2 share the 33-token ESM alphabet
  (``esm.data.Alphabet.from_architecture("ESM-1b").all_toks``): ``<cls>`` + residues + ``<eos>``.
* ESM C (:mod:`ptq_protein.models.esmc`) reads EvolutionaryScale's 33-token sequence vocabulary
  (:data:`ESMC_VOCAB`): the same ids as ESM-2's for every residue letter, ``<cls>``, ``<pad>``,
  ``<eos>``, ``<unk>`` and ``<mask>``; only id 31 differs (``|``, the chain break, where ESM-2 has
  ``<null_1>``), so ESM-2's batch layout feeds it unchanged (``tests/models/test_esmc.py`` checks
  both against the official tokenizer's output).
* transformers ESMFold takes AlphaFold2 residue indices (``restypes_with_x``:
  ARNDCQEGHILKMFPSTWYV, X = 20), no BOS/EOS, padding 0 masked out, as its
  ``infer()`` builds them; letters B/U/Z/O become X like ``infer()`` does.

``EsmTokenizer`` insists on a vocab file, so :func:`esm_tokenizer` writes one
to a temp folder that is removed once the tokenizer has read it.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import List, Sequence, Tuple

import torch

__all__ = ["ESMC_VOCAB", "esm_vocab", "esmc_vocab", "esmfold_vocab", "esm_tokenizer", "esmfold_tokenizer",
           "tokenize_fair_esm", "tokenize_hf_esm", "tokenize_esmc", "tokenize_esmfold"]

#: ESM C's sequence vocabulary in id order (``SEQUENCE_VOCAB`` of esm/utils/constants/esm3.py, esm 3.2.1.post1).
ESMC_VOCAB = ("<cls>", "<pad>", "<eos>", "<unk>",
              "L", "A", "G", "V", "S", "E", "R", "T", "I", "D", "P", "K",
              "Q", "N", "F", "Y", "M", "H", "W", "C", "X", "B", "U", "Z",
              "O", ".", "-", "|",
              "<mask>")


@functools.lru_cache(maxsize=1)
def esm_vocab() -> Tuple[str, ...]:
    """The 33 ESM-2 tokens in id order (fair-esm's ESM-1b/ESM-2 alphabet)."""
    import esm

    return tuple(esm.data.Alphabet.from_architecture("ESM-1b").all_toks)


def esmc_vocab() -> Tuple[str, ...]:
    """The 33 ESM C tokens in id order (:data:`ESMC_VOCAB`)."""
    return ESMC_VOCAB


@functools.lru_cache(maxsize=1)
def esmfold_vocab() -> Tuple[str, ...]:
    """ESMFold input vocabulary: AF2 ``restypes_with_x`` then the special tokens of transformers' converter."""
    from transformers.models.esm.openfold_utils import residue_constants

    return tuple(residue_constants.restypes_with_x) + ("<pad>", "<mask>", "<cls>", "<sep>", "<eos>")


def esm_tokenizer(vocab: Sequence[str] = ()):
    """A transformers ``EsmTokenizer`` for ``vocab`` (default: :func:`esm_vocab`), built without network."""
    from transformers import EsmTokenizer

    tokens = list(vocab) or list(esm_vocab())
    with tempfile.TemporaryDirectory(prefix="ptq-vocab-") as folder:
        path = Path(folder) / "vocab.txt"
        path.write_text("\n".join(tokens), encoding="utf-8")
        return EsmTokenizer(vocab_file=str(path))


def esmfold_tokenizer():
    """``EsmTokenizer`` over :func:`esmfold_vocab` with pad id 0, as transformers' ESMFold converter builds it."""
    tokenizer = esm_tokenizer(esmfold_vocab())
    tokenizer.pad_token_id = 0
    return tokenizer


def tokenize_fair_esm(alphabet, sequences: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(tokens, mask), shape (B, L_max + 2), with fair-esm's batch converter (BOS/EOS added)."""
    _, _, tokens = alphabet.get_batch_converter()([(str(i), s) for i, s in enumerate(sequences)])
    return tokens, tokens != alphabet.padding_idx


def tokenize_hf_esm(tokenizer, sequences: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask as bool), shape (B, L_max + 2), with the model's own tokenizer."""
    encoded = tokenizer(list(sequences), padding=True, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"].bool()


def tokenize_esmc(sequences: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(tokens, mask), shape (B, L_max + 2): ``<cls>``, one id per residue (``<unk>`` for a letter outside the
    vocabulary), ``<eos>``, then ``<pad>``; as the official ``ESMC._tokenize`` builds a batch."""
    index = {token: i for i, token in enumerate(ESMC_VOCAB)}
    rows = [[index["<cls>"], *(index.get(letter, index["<unk>"]) for letter in seq), index["<eos>"]]
            for seq in sequences]
    tokens = torch.full((len(rows), max((len(r) for r in rows), default=0)), index["<pad>"], dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, :len(row)] = torch.tensor(row, dtype=torch.long)
    return tokens, tokens != index["<pad>"]


def tokenize_esmfold(sequences: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(AF2 residue indices, mask), shape (B, L_max), padding 0 with mask False."""
    from transformers.models.esm.openfold_utils import residue_constants

    order = residue_constants.restype_order_with_x
    unknown = order["X"]
    rows: List[List[int]] = [[order.get(letter, unknown) for letter in seq] for seq in sequences]
    width = max((len(r) for r in rows), default=0)
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        tokens[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, :len(row)] = True
    return tokens, mask
