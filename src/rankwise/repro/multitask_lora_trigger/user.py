"""`rankwise run multitask-lora-trigger KEY=VALUE ... --out DIR`: one multi-task LoRA run on the testbed's three
wiki tasks with a chosen weighting and aggregator (the reproduction's arms, one at a time), optionally with the
benign canary planted, then the trigger scan of the trained adapter against a threshold calibrated on `calibration`
clean sum-arm adapters. Writes the LoRA factors and heads to DIR/adapter.safetensors; returns the scores."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rankwise.core.options import option
from rankwise.errors import InvalidInputError
from rankwise.recipes.multitask import AGGREGATORS, WEIGHTINGS, MultiTaskConfig


@dataclass(frozen=True)
class MultiTaskRunConfig:
    """weighting / aggregator: as MultiTaskConfig; lr: the LoRA factors' rate; steps, seed; canary: plant the benign
    canary (10% of training texts start with a rare word and get topic 0); calibration: clean adapters for the scan
    threshold (0: no scan); size: the reproduction's settings to use ("full": MiniLM; "smoke": a tiny stand-in)."""

    weighting: str = field(default="sum", metadata=option(choices=WEIGHTINGS))
    aggregator: str = field(default="sum", metadata=option(choices=AGGREGATORS))
    lr: float = 3e-3
    steps: int = 100
    seed: int = 0
    canary: bool = False
    calibration: int = 2
    size: str = field(default="full", metadata=option(choices=("smoke", "full")))

    def validate(self) -> None:
        MultiTaskConfig(self.weighting, self.aggregator).validate()
        if not self.lr > 0 or self.steps < 1 or self.calibration < 0:
            raise InvalidInputError(f"need lr > 0, steps >= 1, calibration >= 0; got {self}")


def run_multitask(config: MultiTaskRunConfig, out: Path) -> dict:
    import dataclasses

    from rankwise.adapters.trigger_scan import ScanConfig, calibrate_threshold
    from rankwise.core.io import save_tensors_atomic
    from rankwise.repro.multitask_lora_trigger import main as M
    from rankwise.repro.multitask_lora_trigger.scan import Scanner
    from rankwise.repro.multitask_lora_trigger.tasks import plant_canary, rare_words, splits
    from rankwise.repro.multitask_lora_trigger.train import Protocol, fit_heads, majority_rates, train_arm
    from rankwise.repro.setup import experiment_model

    config.validate()
    s = dataclasses.replace(M.SIZES[config.size], steps=config.steps)
    base, tok = experiment_model("minilm-l6", config.size, config.seed)
    data = splits(s.train, s.val, s.test, s.probe, s.words, M.DATA_SEED)
    train, val, test, probe = (M._cache(base, tok, d, s) for d in (data.train, data.val, data.test, data.probe))
    majority = majority_rates(train)
    protocol = Protocol(s.steps, s.batch, M.HEAD_LR, M.RHO_LR, top=M.TOP)
    heads = fit_heads(base, probe, protocol, M.DATA_SEED)
    candidates = rare_words(tok, data.train.texts, s.candidates, M.DATA_SEED)
    trigger = candidates[(7 * config.seed + 3) % len(candidates)]
    fit_on = M._cache(base, tok, plant_canary(data.train, trigger, M.CANARY_FRACTION, M.DATA_SEED + config.seed), s) \
        if config.canary else train
    arm = MultiTaskConfig(config.weighting, config.aggregator)
    run = train_arm(base, arm, config.lr, config.seed, protocol, fit_on, val, test, majority, heads, keep=True)
    out.mkdir(parents=True, exist_ok=True)
    save_tensors_atomic(out / "adapter.safetensors", run.adapter)
    result = {"test": run.test, "validation": run.val, "conflicting_steps": run.conflict_fraction,
              "sigma2": run.sigma2, "canary_trigger": trigger if config.canary else None}
    if config.calibration:
        scanner = Scanner(base, M.TOP, tok, data.val.texts[: s.prompts], candidates,
                          ScanConfig(max_length=s.max_length, beam=s.beam))
        clean = [train_arm(base, M.ARMS["sum"], config.lr, config.seed + 1000 + i, protocol, train, val, test,
                           majority, heads, keep=True) for i in range(config.calibration)]
        threshold = calibrate_threshold([scanner.scan(c.adapter) for c in clean], M.SCAN_MARGIN)
        scan = scanner.scan(run.adapter)
        result["scan"] = {**scan.summary(), "threshold": threshold, "flagged": scan.flagged(threshold)}
    return result
