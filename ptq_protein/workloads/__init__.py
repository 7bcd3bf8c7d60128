"""What users run with a (quantized) language model over many sequences: embeddings and variant scores.

Above the models and the artifact, below the CLI: each module turns a model and
its inputs into files users' own code reads (fair-esm's ``extract.py`` layout,
HDF5, CSV), resumably.
"""
