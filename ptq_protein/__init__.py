"""ptq-protein: post-training quantization for protein language models (ESM-2, ESMFold)."""

__version__ = "0.1.0"
