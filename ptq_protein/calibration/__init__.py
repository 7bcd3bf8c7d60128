"""Calibration: where the quantizers go (sites), which values count (masks), and the statistics pass.

Stage 2 of the pipeline (model -> **sites -> calibration** -> quantizer parameters ->
module swap -> artifact -> evaluation). Imports the models' adapters, the config
and the pure math in :mod:`ptq_protein.quant`; never the quantized modules.
"""
