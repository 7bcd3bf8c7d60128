"""Model-level passes that run before the module swap: SmoothQuant folding and sequential GPTQ.

They work on the copy :func:`ptq_protein.quantize` made (never the caller's
model) and sit between calibration (the statistics they read) and the API.
"""
