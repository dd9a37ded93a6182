"""Domain methods (`rankwise.apps.<domain>`): RL, control, graphs, vision, chemistry."""

from __future__ import annotations

from rankwise.registry.records import Experiment, MethodSpec, RunEntry, record

METHODS: tuple[MethodSpec, ...] = (
    record("diffgda", "Learning Structure-Semantic Evolution Trajectories for Graph Domain Adaptation", "apps"),
    record("emac-autta", "Exposing Mixture and Annotating Confusion for Active Universal Test-Time Adaptation", "apps",
           api=["rankwise.apps.vision.emac:adapt_stream", "rankwise.apps.vision.emac:EmacConfig",
                "rankwise.apps.vision.emac:split_classifier", "rankwise.apps.vision.emac:EnergyMixture"],
           experiments=[Experiment("main", "rankwise.repro.emac.main:run", "EMAC vs TENT, SHOT-IM, open-set TENT, "
                                   "SimATTA-like and four selectors at a 3% label budget: stream H-score on corrupted "
                                   "Fashion-MNIST with held-out classes; pseudo-label error per energy region")],
           runs=[RunEntry("adapt", "rankwise.repro.emac.user:run_on_files", "rankwise.repro.emac.user:UserStreamConfig",
                          "adapt a model online over your image stream (safetensors), with an oracle's labels at a budget")],
           docs="docs/methods/emac-autta.md"),
    record("metavla", "MetaVLA: Unified Meta Co-Training for Efficient Embodied Adaptation", "apps"),
    record("pft-fer", "Personalized Feature Translation for Expression Recognition: An Efficient Source-Free Domain Adaptation Method", "apps",
           api=["rankwise.apps.vision.pft:personalise", "rankwise.apps.vision.pft:pretrain_translator",
                "rankwise.apps.vision.pft:PftConfig", "rankwise.apps.vision.pft:FeatureTranslator",
                "rankwise.apps.vision.pft:expression_metrics"],
           experiments=[Experiment("main", "rankwise.repro.pft_fer.main:run", "PFT vs source only, AdaBN, SHOT-IM, NRC, "
                                   "neutral fine-tuning and PFT without stage 1, each adapting from neutral-only frames: "
                                   "per-target macro-F1 and expressive recall on procedural pain-AU faces, 10 targets")],
           runs=[RunEntry("personalise", "rankwise.repro.pft_fer.user:run_on_files", "rankwise.repro.pft_fer.user:PersonaliseConfig",
                          "adapt the face-expression model to one person from their neutral frames (safetensors), score on theirs")],
           docs="docs/methods/pft-fer.md"),
    record("sample-weight-decay", "The Rank and Gradient Lost in Non-stationarity: Sample Weight Decay for Mitigating Plasticity Loss in Reinforcement Learning", "apps"),
)
