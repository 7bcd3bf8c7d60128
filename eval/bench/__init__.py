"""Benchmark runs: folding and contact tasks over the bundled sets, their results store and summaries.

Unlike the metrics one level up (which know nothing of quantization), these runs
build quantized models through the public API and score them with the metrics.
"""
