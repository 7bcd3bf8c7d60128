"""Where artifacts meet other tools: transformers' from_pretrained/save_pretrained, ONNX export.

Sits above the artifact (it loads and saves artifacts) and below the CLI. Keep
this file free of imports: ``import ptq_protein`` installs :mod:`.hf_hook`.
"""
