"""Domain methods (`rankwise.apps.<domain>`): RL, control, graphs, vision, chemistry."""

from __future__ import annotations

from rankwise.registry.records import MethodSpec, record

METHODS: tuple[MethodSpec, ...] = (
    record("diffgda", "Learning Structure-Semantic Evolution Trajectories for Graph Domain Adaptation", "apps"),
    record("emac-autta", "Exposing Mixture and Annotating Confusion for Active Universal Test-Time Adaptation", "apps"),
    record("metavla", "MetaVLA: Unified Meta Co-Training for Efficient Embodied Adaptation", "apps"),
    record("pft-fer", "Personalized Feature Translation for Expression Recognition: An Efficient Source-Free Domain Adaptation Method", "apps"),
    record("sample-weight-decay", "The Rank and Gradient Lost in Non-stationarity: Sample Weight Decay for Mitigating Plasticity Loss in Reinforcement Learning", "apps"),
)
