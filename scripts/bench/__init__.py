"""The bench package: ``python -m scripts.bench NAME`` (``__main__.py``) and what the benches share.

* ``common.py``: the shared helpers (shapes, sequences, timing, whole processes measured, tables, CPU facts);
* ``embed.py``, ``score.py``: ``embed`` and ``score`` as users type them, whole processes, against the loops users
  run instead (``loops/``: fair-esm's ``extract.py`` and ``predict.py``, a plain transformers loop), beside the
  in-process rows (``inprocess.py``);
* ``prepare.py``: the bench models (random checkpoints in fair-esm's layout and as Hugging Face folders) and
  artifacts; ``embed_memory.py``: peak RSS at 650M and 3B sizes; ``onednn_reorders.py``: weight reorders at
  run time (``ONEDNN_VERBOSE``).

Nothing here is imported by the library; the modules import each other as ``bench.X`` with ``scripts/`` on
``sys.path`` (the entry point and :func:`bench.common.child_env` put it there).
"""
