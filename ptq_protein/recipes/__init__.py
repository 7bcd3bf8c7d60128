"""Recipe families, one file each; :mod:`ptq_protein.presets` is the registry that merges them."""
