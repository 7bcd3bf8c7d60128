"""Print the PWLQ-vs-uniform MSE table (not a test; run it directly).

    python tests/quant/pwlq_mse_table.py [n_samples] [seed]

For Gaussian and Laplacian samples (unit variance) at 4, 6 and 8 bits it
reports MSE(PWLQ) / MSE(uniform), both on the same bit width and the same range
``max|x|``, measured on the samples themselves. PWLQ variants: one breakpoint at
the Gaussian/Laplacian optimum ``sigma * p*(m)`` with the equal code split (the
paper's recipe), and the histogram-MSE search (2048 bins) with 1 breakpoint
(equal split, then searched split) and 2-3 breakpoints (searched split).
"""

from __future__ import annotations

import sys

import torch

from ptq_protein.quant import (
    HistogramObserver,
    breakpoint_from_stats,
    choose_qparams,
    fake_quantize,
    pwlq_fake_quantize,
    quantization_mse,
    search_pwlq,
    symmetric_pwlq,
)

VARIANTS = ("paper_1bp", "search_1bp", "search_1bp_split", "search_2bp", "search_3bp")


def samples(dist: str, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dist == "gaussian":
        return torch.randn(n, generator=g, dtype=torch.float64)
    u = torch.rand(n, generator=g, dtype=torch.float64) - 0.5  # inverse-CDF Laplace, b = 1/sqrt(2)
    return -torch.sign(u) * torch.log1p(-2 * u.abs()) / 2**0.5


def ratios(x: torch.Tensor, dist: str, bits: int) -> dict[str, float]:
    """Measured MSE ratios PWLQ / uniform for every variant."""
    m = float(x.abs().max())
    s, zp = choose_qparams(-m, m, bits, symmetric=True)
    uni = quantization_mse(x, lambda t: fake_quantize(t, s, zp, bits, True))
    hist = HistogramObserver(2048)
    hist.update(x)
    counts, edges = hist.support()
    cbs = {
        "paper_1bp": symmetric_pwlq(m, breakpoint_from_stats(m, float(x.std()), dist), bits),
        "search_1bp": search_pwlq(counts, edges, bits, 1, search_split=False).codebook,
        "search_1bp_split": search_pwlq(counts, edges, bits, 1).codebook,
        "search_2bp": search_pwlq(counts, edges, bits, 2).codebook,
        "search_3bp": search_pwlq(counts, edges, bits, 3).codebook,
    }
    return {k: quantization_mse(x, lambda t, cb=cb: pwlq_fake_quantize(t, cb)) / uni for k, cb in cbs.items()}


def main(n: int = 100_000, seed: int = 0) -> None:
    print(f"n={n} seed={seed}; entries: MSE(PWLQ)/MSE(uniform), same bits and range max|x|")
    print("| dist | m/sigma | bits | " + " | ".join(VARIANTS) + " |")
    print("|---" * (3 + len(VARIANTS)) + "|")
    for dist in ("gaussian", "laplacian"):
        x = samples(dist, n, seed)
        for bits in (4, 6, 8):
            r = ratios(x, dist, bits)
            m = float(x.abs().max() / x.std())
            print(f"| {dist} | {m:.2f} | {bits} | " + " | ".join(f"{r[k]:.3f}" for k in VARIANTS) + " |")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
