"""The artifact: a sealed folder that rebuilds the quantized model.

``save_load`` writes and reads it, ``seal`` checks every file against the recipe's digests, ``tensors`` reads the
safetensors file, ``build`` rebuilds the model from a verified recipe, ``hf_files`` and ``fair_hf`` are what
transformers reads (``from_pretrained``), ``model_card`` the README.md written beside them.
"""
