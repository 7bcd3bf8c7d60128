"""Fixtures for model tests: private TORCH_HOME / HF cache folders and writers of fake checkpoints.

The writers produce the on-disk layouts the real files have, from tiny models:

* fair-esm ESM-2 ``<name>.pt``: ``{"model": {"encoder.sentence_encoder.<k>" / "encoder.lm_head.<k>": tensor},
  "cfg": {"model": Namespace(encoder_layers, encoder_embed_dim, encoder_attention_heads, token_dropout)}}``
  -- what ``esm.pretrained._load_model_and_alphabet_core_v2`` reads -- and ``<name>-contact-regression.pt``
  ``{"model": {"contact_head.regression.*"}}``;
* fair-esm ESMFold ``esmfold_3B_v1.pt``: ``{"model": fair names, "cfg": {"model": <non-allowlisted object>}}``;
* Hugging Face cache: ``models--org--name/snapshots/<rev>/`` (``save_pretrained`` output) + ``refs/main``.
"""

import socket
import types

import pytest
import torch
from tiny_fixtures import write_fair_esmfold

from ptq_protein.models.fair_esm2 import save_fair_esm2 as write_fair_esm2

REVISION = "0123456789abcdef0123456789abcdef01234567"


def write_hf_cache(model, tokenizer, cache, repo_id):
    """``save_pretrained`` into ``<cache>/models--org--name/snapshots/<rev>`` with ``refs/main``."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / REVISION
    model.save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    """Tiny models run many microsecond-sized ops: with 2 OpenMP threads on a busy 2-core machine each op
    waits for the other thread (measured: 2.4 s vs 0.06 s for a tiny ESMFold fold). Restored afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Model loading must never try the network: any connection attempt fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[1:] if len(args) > 1 else args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def homes(tmp_path, monkeypatch):
    """Empty TORCH_HOME and HF hub cache for this test only."""
    torch_home, hf_cache = tmp_path / "torch_home", tmp_path / "hf_cache"
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_cache))
    monkeypatch.delenv("HF_HOME", raising=False)
    return types.SimpleNamespace(torch_home=torch_home, hf_cache=hf_cache,
                                 checkpoints=torch_home / "hub" / "checkpoints")


@pytest.fixture
def fakes():
    return types.SimpleNamespace(write_fair_esm2=write_fair_esm2, write_fair_esmfold=write_fair_esmfold,
                                 write_hf_cache=write_hf_cache)
