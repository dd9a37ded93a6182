"""`care-mla:deploy-palu`: CARE's init against Palu's (a plain SVD of K_nope and of V, separate latents) after the same
300 healing steps on SmolLM2 at 50 % KV saving: the paper's healing claim against its second baseline.

    rankwise repro care-mla:deploy-palu --size full      # writes docs/results/care-mla/deploy-palu/

The arms, the choice of their RoPE pairs and learning rates and the healing are `heal_compare`'s; the deployable
model's invariants (cache bytes, absorbed decoding, export) are `deploy`'s. Issue 24: the 30-step claim of the
`deploy` report is retired there; this experiment has its own 30-minute budget, which two healed baselines at 300
steps would exceed together.
"""

from __future__ import annotations

from rankwise.core.report import Report
from rankwise.repro.care_mla.heal_compare import CARE, PALU, SIZES, choose_rope, declare, heal_arms, setup

ARMS = (CARE, PALU)


def run(size: str = "smoke", seed: int = 0) -> Report:
    report = Report("care-mla", "CARE vs Palu inits of a deployable MLA after equal healing", size, seed)
    sz = SIZES[size]
    declare(report, sz, PALU)
    bed, ppl = setup(report, sz, size, seed)
    chosen, first = choose_rope(report, bed, ARMS)
    heal_arms(report, sz, bed, ARMS, chosen, first, ppl)
    return report.finish()
