"""A saved classification adapter, loaded the peft way and the rankwise way onto fresh classifiers: the check that
`rankwise finetune` output is a real PEFT folder, shared by the CLI and procedure tests."""

from __future__ import annotations

from pathlib import Path

import torch

TEXTS = ["A river in France.", "The 1998 World Cup final."]


def logits_both_ways(adapter_dir: Path, base: str | Path = "minilm-l6", num_labels: int = 12, texts: list[str] = TEXTS):
    """-> (peft's logits, rankwise's logits, logits of a fresh classifier without the adapter, rankwise's model).

    Both classifiers get freshly initialised heads from different seeds, so equal logits mean the saved head
    (`modules_to_save`) was restored by both loaders."""
    import peft

    from rankwise.adapters import load_adapter
    from rankwise.models import load_model
    from rankwise.training import SequenceClassifier

    def fresh(seed: int) -> SequenceClassifier:
        torch.manual_seed(seed)
        return SequenceClassifier(load_model(base)[0], num_labels)

    _, tok = load_model("minilm-l6")
    enc = tok(texts, return_tensors="pt", padding=True)
    theirs = peft.PeftModel.from_pretrained(fresh(1), adapter_dir).eval()
    ours = load_adapter(fresh(2), adapter_dir).eval()
    with torch.no_grad():
        args = (enc["input_ids"], enc["attention_mask"])
        return theirs(*args), ours(*args), fresh(1).eval()(*args), ours
