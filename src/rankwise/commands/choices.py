"""The names the command parsers offer, as plain data: building the parser must not import the method packages
(they import torch), so their name tables are mirrored here. `tests/commands/test_cli_startup.py` checks that each
equals its source of truth; a new adapter, optimizer or MLA method adds its name here too."""

from __future__ import annotations

# rankwise.compress.mla.factorize: METHODS and ALIASES
MLA_METHODS = ("asvd", "care", "mha2mla", "palu", "svd", "svd-llm", "svdllm")
# rankwise.compress.mla.allocation: ALLOCATIONS, SCORES
MLA_ALLOCATIONS = ("uniform", "adjusted")
MLA_SCORES = ("paper", "code")
# rankwise.compress.mla.calibration: DEFAULT_SAMPLES, DEFAULT_SEQ_LEN
MLA_CALIB_SAMPLES = 256
MLA_CALIB_SEQ_LEN = 32
# rankwise.compress.mla_deploy.rope: SELECTIONS
ROPE_SELECTIONS = ("contribution", "high", "sensitivity", "uniform")
# rankwise.adapters.types: ADAPTER_TYPES
ADAPTER_METHODS = ("coa-lora", "guardspace", "lora", "pica", "svft")
# rankwise.training.optimizers: OPTIMIZERS, and those that cannot be checkpointed (a projector object in their state)
OPTIMIZERS = ("adamw", "galore", "lora-pre")
UNCHECKPOINTABLE_OPTIMIZERS = ("galore",)
# rankwise.training.procedures: PROCEDURES (filled by rankwise.training.procedure_table)
PROCEDURES = ("car-lora", "coa-lora", "la-lora", "lmao", "peso")
# rankwise.training.schedule: DECAYS
DECAYS = ("cosine", "linear", "constant")
