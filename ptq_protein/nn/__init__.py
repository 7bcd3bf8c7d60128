"""Quantized modules and the module swap: activation quantizers, ``QuantLinear``,
fused fake-quant loops and integer execution.

Stage 3 of the pipeline (statistics -> **quantizer modules -> module swap**). Imports
the calibration stage's site descriptions, the config and :mod:`ptq_protein.quant`;
integer kernels are imported lazily.
"""
