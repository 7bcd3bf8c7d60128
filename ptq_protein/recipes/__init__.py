"""Recipe families, one file each; :mod:`ptq_protein.recipes.presets` is the registry that merges them."""
