"""Which sites hurt, and the cheapest precision per unit under a budget.

* :mod:`~ptq_protein.search.workbench` -- calibrate once, swap modules per unit;
* :mod:`~ptq_protein.search.sensitivity` -- rank units by a protein metric;
* :mod:`~ptq_protein.search.auto` -- greedy mixed precision plus a verification pass.

Sits above :mod:`ptq_protein.api` (it calls calibration once and reuses its statistics).
"""
