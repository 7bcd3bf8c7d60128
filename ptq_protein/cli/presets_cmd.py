"""``ptq-protein presets``: every named recipe, one line each, grouped as ours, the baselines and the study's."""

from __future__ import annotations

import argparse

from ptq_protein.cli.common import add_json_option, print_json

GROUPS = {"ours": "ours", "baselines": "baselines (SmoothQuant, GPTQ, FP8)",
          "study": "the study's (PTQ4Protein reproduced in float simulation: evaluated in memory, never saved)"}
EPILOG = """marks:
  [fast]      language models: uniform 8-bit activations, per tensor or per token, and integer weights:
              every quantized Linear is one integer GEMM
  [accurate]  language models: the same, with the sites where outliers cost most kept in floating point
              (a little slower, more accurate; the default of --bits 8 on ESM-2)
  (none)      piecewise-linear activations run several integer GEMMs per site: about float speed on a CPU
  [ESM C]     ESM C only (it rotates ESM C's SwiGLU product); other models are refused in one line
  [ESMFold]   ESMFold only (it runs the folding trunk's pair operations in bfloat16); others are refused in one line
The marks say what each recipe computes, not a measurement; measured errors and speeds are in docs/methods.md,
docs/esmc.md and BENCHMARKS.md.

examples:
  ptq-protein presets
  ptq-protein quantize esm2_t33_650M_UR50D --preset w8a8-smoothquant --out runs/650m-fast
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("presets", help="list every named recipe (--preset), one line each",
                              description="List the named recipes 'quantize --preset' takes, grouped as ours, the "
                                          "baselines and the study's, with the fast and accurate points for "
                                          "language models and the ESM C-only and ESMFold-only ones marked.",
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_json_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ptq_protein.recipes.presets import preset_lines

    lines = preset_lines()
    if args.json:
        print_json([asdict(line) for line in lines])
        return 0
    marks = {line.name: " ".join([f"[{line.lm_point}]"] * bool(line.lm_point) + ["[ESM C]"] * line.esmc_only
                                 + ["[ESMFold]"] * line.esmfold_only) for line in lines}
    width, mark_width = max(len(line.name) for line in lines), max(len(m) for m in marks.values())
    for group, title in GROUPS.items():
        print(f"{title}:")
        for line in (x for x in lines if x.group == group):
            print(f"  {line.name:<{width}}  {marks[line.name]:<{mark_width}}  {line.doc}")
    return 0
