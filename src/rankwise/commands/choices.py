"""The names the command parsers offer, derived without importing the method packages (they import torch):
adapter, procedure, optimizer and task names from the registry records, and the MLA conversion's option names
read from the literals of the modules that define them (`targets.literal`, no import). Nothing here is a copy."""

from __future__ import annotations

from rankwise.registry.tables import adapter_entries, optimizer_entries, procedure_entries, task_entries
from rankwise.targets import literal

_MLA = "rankwise.compress.mla"
MLA_METHODS = tuple(sorted([*literal(f"{_MLA}.factorize:METHODS"), *literal(f"{_MLA}.factorize:ALIASES")]))
MLA_ALLOCATIONS = tuple(literal(f"{_MLA}.allocation:ALLOCATIONS"))
MLA_SCORES = tuple(literal(f"{_MLA}.allocation:SCORES"))
MLA_CALIB_SAMPLES = literal(f"{_MLA}.calibration:DEFAULT_SAMPLES")
MLA_CALIB_SEQ_LEN = literal(f"{_MLA}.calibration:DEFAULT_SEQ_LEN")
ROPE_SELECTIONS = tuple(sorted(literal("rankwise.compress.mla_deploy.rope:SELECTIONS")))
ADAPTER_METHODS = tuple(sorted(adapter_entries()))
OPTIMIZERS = tuple(sorted(optimizer_entries()))
UNCHECKPOINTABLE_OPTIMIZERS = tuple(sorted(n for n, e in optimizer_entries().items() if not e.checkpointable))
PROCEDURES = tuple(sorted(procedure_entries()))
BASE_PROCEDURES = tuple(sorted(n for n, e in procedure_entries().items() if e.trains != "adapter"))
TASKS = tuple(task_entries())
DECAYS = tuple(literal("rankwise.core.training.schedule:DECAYS"))
