"""Jobs made of several ``pp.quantize`` steps, above the API and below the CLI.

* :mod:`.shared_calibration`: one calibration pass for several recipes;
* :mod:`.recipe_compare`: those recipes quantized and checked side by side;
* :mod:`.streaming`: quantizing a fair-esm checkpoint layer by layer;
* :mod:`.memory_budget`: the memory each mode needs, to choose one before loading.
"""
