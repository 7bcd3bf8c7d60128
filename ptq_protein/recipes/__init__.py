"""What a recipe is and which recipes exist.

The description: :mod:`.config` (``QuantConfig`` and its tensor specs), :mod:`.method_config` (SmoothQuant, GPTQ
and the study's options), :mod:`.site_plan` (a mixed-precision plan). The families, one file each: the study's
(:mod:`.study`), ours (:mod:`.ours`) and the field's baselines (:mod:`.baselines`); :mod:`.presets` is the
registry that merges them. Nothing here imports a pipeline stage: every stage reads recipes.
"""
