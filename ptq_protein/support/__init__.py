"""Plumbing every stage uses: errors, safe file reads and atomic writes, digests, locks, progress, memory
policy, environment settings and plots. Nothing here imports a pipeline stage."""
