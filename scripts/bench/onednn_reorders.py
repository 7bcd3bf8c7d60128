"""Weight reorders at run time under ``ONEDNN_VERBOSE=1``: one embed batch of an int8 artifact, forward twice.

The goal (weights prepacked once at load, in the layout oneDNN's int8 kernel wants) is zero reorders of a weight
after the first forward. The artifact is made as a user makes it (``ptq-protein quantize CKPT --preset R``) from
the bench's random checkpoint; a child (``inprocess.py verbose``) loads it with ``pp.load`` (the default backend,
as ``ptq-protein embed`` runs it), forwards the first 4096-token batch of the bench sequences, prints a marker,
and forwards the same batch again. oneDNN's ``exec`` lines after the marker are counted by primitive and kernel.

A reorder counts as a weight's when its source is ``s8`` (weight codes; activations are ``u8`` or float) or its
destination is a blocked layout (an upper-case format tag such as ``BA16a64b4a``: a GEMM's packed weights), and
none of its dimensions is the batch's token count (B x T rows: an activation).

    python -m scripts.bench onednn_reorders --quick
    python -m scripts.bench onednn_reorders --size 35m --recipe w8a8-smoothquant
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from bench import prepare
from bench.common import (
    ISAS,
    bench_command,
    bundled_records,
    child_cpu_facts,
    child_env,
    run_measured,
    versions,
    write_fasta,
)
from bench.inprocess import MARKER

_BLOCKED = re.compile(r"[A-Z]")


def parse_exec_lines(log: str) -> Dict[str, List[List[str]]]:
    """oneDNN verbose ``exec`` lines split at :data:`MARKER`: {"first": [...], "after": [...]}, each line as
    its comma-separated fields (``onednn_verbose,v1,primitive,exec,cpu,KIND,IMPL,PROP,MEMORY,...``)."""
    found: Dict[str, List[List[str]]] = {"first": [], "after": []}
    phase = "first"
    for line in log.splitlines():
        if line.startswith(MARKER):
            phase = "after"
        elif line.startswith("onednn_verbose,") and ",exec," in line:
            fields = line.split(",")
            if "primitive" in fields[:4]:
                found[phase].append(fields[fields.index("exec") + 1:])  # cpu, kind, impl, prop, memory, ...
    return found


def is_weight_reorder(fields: Sequence[str], tokens: Optional[int] = None) -> bool:
    """A ``reorder`` whose source is s8 codes or whose destination is a blocked (packed) layout, unless one of
    its dimensions is ``tokens`` (the batch's rows: an activation)."""
    if len(fields) < 5 or fields[1] != "reorder":
        return False
    if tokens is not None and len(fields) > 7 and str(tokens) in fields[7].split("x"):
        return False
    descriptors = dict(part.split(":", 1) for part in fields[4].split() if ":" in part)
    src, dst = descriptors.get("src", ""), descriptors.get("dst", "")
    tag = dst.split(":")[3] if dst.count(":") >= 3 else ""
    return src.startswith("s8") or bool(_BLOCKED.search(tag))


def batch_rows(marker: str) -> Optional[int]:
    """B x T of the probe's batch, from its marker line (``... tokens (B, T) ...``)."""
    found = re.search(r"tokens \((\d+), (\d+)\)", marker)
    return int(found.group(1)) * int(found.group(2)) if found else None


def summary(lines: Sequence[Sequence[str]]) -> Counter:
    """Counts of ``kind:implementation`` over exec lines (``matmul:brg_matmul:avx512_core_vnni``...)."""
    return Counter(f"{fields[1]}:{fields[2]}" for fields in lines if len(fields) > 2)


def report(log: str) -> List[str]:
    phases = parse_exec_lines(log)
    marker = next((ln for ln in log.splitlines() if ln.startswith(MARKER)), "")
    if not marker:
        return ["no marker in the child's output: the probe did not reach its second forward"]
    rows = batch_rows(marker)
    weights = [f for f in phases["after"] if is_weight_reorder(f, rows)]
    lines = [f"probe: {marker[len(MARKER):].strip()}",
             f"loading and the first forward: {len(phases['first'])} oneDNN primitives executed, "
             f"{sum(is_weight_reorder(f, rows) for f in phases['first'])} weight reorders",
             f"second forward: {len(phases['after'])} oneDNN primitives executed, {len(weights)} weight reorders "
             f"(goal 0: {'met' if not weights else 'missed'})", "", "second forward, by primitive and kernel:"]
    lines += [f"  {count:5d}  {name}" for name, count in summary(phases["after"]).most_common()]
    lines += [f"  weight reorder: {','.join(f[1:5])} dims {f[7] if len(f) > 7 else '?'}" for f in weights[:10]]
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the tiny bench model")
    p.add_argument("--size", choices=["35m", "150m"], default="35m")
    p.add_argument("--weights", choices=prepare.WEIGHTS, default="outliers")
    p.add_argument("--recipe", default=prepare.RECOMMENDED, help=f"preset (default {prepare.RECOMMENDED})")
    p.add_argument("--isa", choices=ISAS, default="native")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dir", type=Path, default=prepare.DEFAULT_DIR)
    args = p.parse_args(argv)
    model = prepare.bench_model(args.dir, "quick" if args.quick else args.size, args.weights)
    env = child_env(args.threads, args.isa)
    print(f"# oneDNN primitives of one embed batch\n\n`{bench_command('onednn_reorders', argv)}`\n\n"
          f"{child_cpu_facts(env)}\n\n{versions()}\n\nModel: {model.describe()}; recipe {args.recipe}\n")
    with tempfile.TemporaryDirectory(prefix="bench_onednn_") as tmp:
        scratch = Path(tmp)
        art = scratch / "art"
        done = prepare.quantize(model.checkpoint, args.recipe, art, env)
        if done.returncode:
            print(f"quantize failed: {done.failure()}")
            return 1
        fasta = write_fasta(scratch / "seqs.fasta", bundled_records(120))
        log = scratch / "verbose.log"
        probe = run_measured([sys.executable, "-m", "bench.inprocess", "verbose", "--artifact", str(art),
                              "--fasta", str(fasta)], {**env, "ONEDNN_VERBOSE": "1"}, log=log, tail=200)
        if probe.returncode:
            print(f"probe failed: {probe.failure()}")
            return 1
        print("\n".join(report(log.read_text(errors="replace"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
