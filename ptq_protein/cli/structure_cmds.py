"""``ptq-protein tmscore | lddt | contacts``: score predicted structures and contact maps against natives."""

from __future__ import annotations

import argparse
from pathlib import Path

from ptq_protein.cli.common import add_json_option, add_tm_normalize_option, print_json

TMSCORE_EXAMPLES = """examples:
  ptq-protein tmscore pred.pdb native.pdb
  ptq-protein tmscore pred.pdb 7oj2.A.pdb --pairing sequence --json
  ptq-protein tmscore model.cif native.pdb.gz --native-chain B
  ptq-protein tmscore pred.pdb native.pdb --tm-normalize sequence   # as 'TMscore native pred'
"""
LDDT_EXAMPLES = """examples:
  ptq-protein lddt pred.pdb native.pdb
  ptq-protein lddt pred.pdb native.pdb --mode ca --per-residue --json
"""
CONTACTS_EXAMPLES = """examples:
  ptq-protein contacts contacts.npy native.pdb
  ptq-protein contacts contacts.npy native.pdb --sequence query.fasta --json
"""


def register(subparsers) -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    p = subparsers.add_parser("tmscore", help="TM-score, GDT-TS, GDT-HA and RMSD of a model against a native",
                              description="Score a model against a native with TMscore's superposition search "
                                          "(scores normalised by the native's observed residues, or with "
                                          "--tm-normalize sequence by the model's: TMscore NATIVE MODEL).",
                              epilog=TMSCORE_EXAMPLES, formatter_class=formatter)
    _add_structure_args(p)
    add_tm_normalize_option(p)
    p.set_defaults(func=run_tmscore)

    p = subparsers.add_parser("lddt", help="lDDT of a model against a native (CA-only or all-atom)",
                              description="Superposition-free lDDT (15 A inclusion radius, 0.5/1/2/4 A thresholds).",
                              epilog=LDDT_EXAMPLES, formatter_class=formatter)
    _add_structure_args(p)
    p.add_argument("--mode", default="auto", choices=["auto", "ca", "all"],
                   help="atoms: auto = all-atom when both files have side chains (default)")
    p.add_argument("--per-residue", action="store_true", help="also list per-residue lDDT")
    p.set_defaults(func=run_lddt)

    p = subparsers.add_parser("contacts", help="precision of a predicted contact map against a native",
                              description="Precision at L/5, L/2, L and its AUC per separation range, from an [L, L] "
                                          ".npy of contact probabilities; native residue n is row n-1 unless "
                                          "--sequence is given.",
                              epilog=CONTACTS_EXAMPLES, formatter_class=formatter)
    p.add_argument("pred", help="predicted contact probabilities, an [L, L] .npy file")
    p.add_argument("native", help="native structure (PDB, PDB.gz or mmCIF)")
    p.add_argument("--sequence", help="the predicted sequence (or a FASTA file with it): place the native by alignment")
    p.add_argument("--chain", help="native chain (default: the first)")
    add_json_option(p)
    p.set_defaults(func=run_contacts)


def _add_structure_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model structure (PDB, PDB.gz or mmCIF)")
    p.add_argument("native", help="native structure (PDB, PDB.gz or mmCIF)")
    p.add_argument("--pairing", default="number", choices=["number", "sequence"],
                   help="pair residues by number (default, as TMscore) or by sequence alignment")
    p.add_argument("--chain", help="chain to read from both files (default: the first)")
    p.add_argument("--model-chain", help="chain of the model (overrides --chain)")
    p.add_argument("--native-chain", help="chain of the native (overrides --chain)")
    add_json_option(p)


def _chains(args: argparse.Namespace) -> dict:
    return {"model_chain": args.model_chain or args.chain, "native_chain": args.native_chain or args.chain}


def run_tmscore(args: argparse.Namespace) -> int:
    from ptq_protein.eval.tmscore import tm_score

    result = tm_score(args.model, args.native, pairing=args.pairing, normalize=args.tm_normalize, **_chains(args))
    if args.json:
        print_json({"model": args.model, "native": args.native, "pairing": args.pairing,
                    "tm_normalize": args.tm_normalize, **result.to_dict()})
        return 0
    by = "the native" if args.tm_normalize == "native" else "the model"
    print(f"model      {args.model}\nnative     {args.native}\nlength     {result.length} ({by}'s residues: "
          f"scores normalised by it, --tm-normalize {args.tm_normalize})")
    print(f"pairs      {result.n_aligned} residues in common (pairing by {args.pairing})")
    print(f"TM-score   {result.tm_score:.4f}\nRMSD       {result.rmsd:.3f} A (all common residues)")
    print(f"GDT-TS     {result.gdt_ts:.4f}\nGDT-HA     {result.gdt_ha:.4f}")
    return 0


def run_lddt(args: argparse.Namespace) -> int:
    from ptq_protein.eval.lddt import lddt

    result = lddt(args.model, args.native, pairing=args.pairing, mode=args.mode, **_chains(args))
    if args.json:
        print_json({"model": args.model, "native": args.native, "pairing": args.pairing,
                    **result.to_dict(per_residue=args.per_residue)})
        return 0
    print(f"lDDT       {result.lddt:.4f} ({result.mode}, {result.n_distances} distances, "
          f"{len(result.residue_labels)} native residues)")
    if args.per_residue:
        for label, value in zip(result.residue_labels, result.per_residue.tolist()):
            print(f"{label:>8}  {'-' if value != value else f'{value:.4f}'}")
    return 0


def run_contacts(args: argparse.Namespace) -> int:
    import numpy as np

    from ptq_protein.eval.contacts import contact_precision
    from ptq_protein.support.errors import InputError
    from ptq_protein.support.file_reads import regular_file

    path = regular_file(args.pred, "contact map")
    try:
        pred = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:  # numpy's own words suggest allow_pickle, no option here has it
        raise InputError(f"{path}: not a numeric .npy array (save the map with numpy.save, float [L, L])") from err
    metrics = contact_precision(pred, args.native, sequence=_read_sequence(args.sequence), chain=args.chain)
    if args.json:
        undefined_as_null = {k: (None if v != v else v) for k, v in metrics.items()}  # NaN: no native contact
        print_json({"pred": args.pred, "native": args.native, **undefined_as_null})
        return 0
    print(f"{'range':<8} {'P@L':>7} {'P@L2':>7} {'P@L5':>7} {'AUC':>7}")
    for name in ("local", "short", "medium", "long"):
        values = [metrics[f"{name}_{key}"] for key in ("P@L", "P@L2", "P@L5", "AUC")]
        print(f"{name:<8} " + " ".join("  undef" if v != v else f"{v:7.4f}" for v in values))
    return 0


def _read_sequence(value):
    """A sequence given inline, or the first record of a FASTA file."""
    if value is None:
        return None
    if not Path(value).is_file():
        return value.strip().upper()
    from ptq_protein.data.fasta import read_fasta
    from ptq_protein.support.errors import InputError

    records = read_fasta(Path(value))
    if not records:
        raise InputError(f"{value}: no FASTA record found")
    return records[0][1]
