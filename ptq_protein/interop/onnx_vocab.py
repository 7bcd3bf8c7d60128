"""The id table written beside an exported ``.onnx``: ``vocab.txt`` and ``tokens.json``.

An ONNX graph takes token ids; without the table that made them, a user cannot
feed it. ``vocab.txt`` is one token a line, line ``i`` being id ``i`` (the file
transformers' ``EsmTokenizer`` reads: ``EsmTokenizer.from_pretrained(folder)``
then tokenizes for the graph). ``tokens.json`` says the same for any language,
with the special ids and what each input and output of the graph holds.

A language model's artifact keeps its source's ``vocab.txt`` where it had one;
otherwise, and always for ESMFold's stem (which reads ESM-2 ids, not ESMFold's
AlphaFold-order ones), the table is the 33-token ESM-2 alphabet (ESM C's own 33 tokens for ESM C).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from ptq_protein.models.tokens import esm_vocab
from ptq_protein.support.errors import InputError

__all__ = ["VOCAB", "TOKENS", "vocab_for", "id_table", "check_vocab_out", "write_vocab"]

VOCAB, TOKENS = "vocab.txt", "tokens.json"
_SPECIAL = {"bos": "<cls>", "pad": "<pad>", "eos": "<eos>", "unk": "<unk>", "mask": "<mask>"}


def vocab_for(artifact: Path, stem: bool, default: Sequence[str] = ()) -> Tuple[str, ...]:
    """The tokens, in id order, that the exported graph reads (see the module docstring); ``default``: the
    model's own table (ESM C's) where the artifact holds none."""
    source = Path(artifact) / VOCAB
    if not stem and source.is_file():
        return tuple(line.strip() for line in source.read_text(encoding="utf-8").splitlines() if line.strip())
    return tuple(default) or esm_vocab()


def id_table(tokens: Sequence[str], outputs: Sequence[str]) -> Dict[str, object]:
    """``tokens.json``: the ids, the special ids, and the graph's inputs and outputs in words."""
    index = {token: i for i, token in enumerate(tokens)}
    return {"tokens": list(tokens),
            "special_ids": {role: index[token] for role, token in _SPECIAL.items() if token in index},
            "inputs": {"input_ids": "int64 [batch, length]: <cls>, one id per residue, <eos>; pad after",
                       "attention_mask": "int64 [batch, length]: 1 for <cls>/residues/<eos>, 0 for padding"},
            "outputs": list(outputs)}


def _contents(tokens: Sequence[str], outputs: Sequence[str]) -> Dict[str, str]:
    return {VOCAB: "\n".join(tokens) + "\n", TOKENS: json.dumps(id_table(tokens, outputs), indent=2) + "\n"}


def check_vocab_out(folder: Path, tokens: Sequence[str], outputs: Sequence[str], force: bool) -> None:
    """Refuse to replace a different ``vocab.txt``/``tokens.json`` in ``folder`` without ``force``."""
    for name, text in _contents(tokens, outputs).items():
        path = Path(folder) / name
        if not force and path.exists() and (not path.is_file() or path.read_text(encoding="utf-8") != text):
            raise InputError(f"{path} already exists with other content; the export writes its id table there: "
                             "pass --force (force=True) or write the .onnx into another folder")


def write_vocab(folder: Path, tokens: Sequence[str], outputs: Sequence[str]) -> List[Path]:
    """Write ``vocab.txt`` and ``tokens.json`` into ``folder``; returns their paths."""
    from ptq_protein.support.io_utils import atomic_write_text

    written = []
    for name, text in _contents(tokens, outputs).items():
        atomic_write_text(Path(folder) / name, text)
        written.append(Path(folder) / name)
    return written
