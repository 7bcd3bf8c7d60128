"""Structure and contact evaluators: TM-score, GDT, RMSD, lDDT, contact precision."""
