"""Layers (`rankwise.nn`): each with a conformance spec."""

from __future__ import annotations

from rankwise.registry.records import BenchmarkEntry, Command, LayerEntry, MethodSpec, record, repro

METHODS: tuple[MethodSpec, ...] = (
    record("frequency-representation-learning", "Breaking Scale Anchoring: Frequency Representation Learning for Accurate High-Resolution Inference from Low-Resolution Training", "nn"),
    record("ivq-concept-bottleneck", "Escaping Low-Rank Traps: Interpretable Visual Concept Learning via Implicit Vector Quantization", "nn"),
    record("lorsa", "Towards Understanding the Nature of Attention with Low-Rank Sparse Decomposition", "nn",
       api=["rankwise.nn.lorsa:Lorsa", "rankwise.nn.lorsa:LorsaConfig", "rankwise.nn.lorsa:Rope",
            "rankwise.nn.lorsa:lorsa_from_attention", "rankwise.nn.lorsa:CausalSelfAttention", "rankwise.nn.lorsa:TopKSAE",
            "rankwise.nn.lorsa:fit", "rankwise.nn.lorsa:fvu", "rankwise.nn.lorsa:top_activating_contexts",
            "rankwise.nn.lorsa:induction_score", "rankwise.nn.lorsa:save_lorsa", "rankwise.nn.lorsa:load_lorsa"],
       experiments=[repro("lorsa", summary="toy transformer with four planted mechanisms in two layer-2 heads: Lorsa's induction heads, per-mechanism purity vs the MHA heads, FVU vs a Top-K SAE at equal K"),
                    repro("lorsa", "smollm2", "SmolLM2 middle layer: held-out FVU against K, Lorsa vs a Top-K SAE of equal width, 3 seeds")],
       commands=[Command("lorsa top", "rankwise.commands.lorsa_top")], layers=[LayerEntry("Lorsa", "rankwise.nn.lorsa.spec")], benchmarks=[BenchmarkEntry("lorsa", "bench_lorsa.py")],
       docs="docs/methods/lorsa.md"),
    record("lrnn", "Deep Learning with Learnable Product-Structured Activations", "nn",
       api=["rankwise.nn.lrnn:LRNN", "rankwise.nn.lrnn:LowRankSeparatedLayer", "rankwise.nn.lrnn:UnivariateComponents",
            "rankwise.nn.lrnn:lrnn_parameter_count", "rankwise.nn.lrnn:Siren", "rankwise.nn.lrnn:radon_transform"],
       experiments=[repro("lrnn", summary="camera 64x64 INR: 2-layer LRNN vs SIREN at matched parameters, PSNR over 3 seeds"),
                    repro("lrnn", "multiplicative", "prod_i sin(pi x_i) on [-1,1]^6: shallow LRNN vs tanh MLP at equal parameters"),
                    repro("lrnn", "audio", "synthetic 1 s, 8 kHz signal: LRNN vs SIREN, MSE and per-band spectral error"),
                    repro("lrnn", "ct", "sparse-view CT of Shepp-Logan through a differentiable Radon: LRNN vs SIREN vs FBP")],
       layers=[LayerEntry("LRNN", "rankwise.nn.lrnn.spec")], benchmarks=[BenchmarkEntry("lrnn", "bench_lrnn.py")],
       docs="docs/methods/lrnn.md"),
    record("mixture-of-memories", "MoM: Linear Sequence Modeling with Mixture-of-Memories", "nn",
       api=["rankwise.nn.mixture_of_memories:MixtureOfMemories", "rankwise.nn.mixture_of_memories:LinearAttention",
            "rankwise.nn.mixture_of_memories:load_balancing_loss", "rankwise.nn.mixture_of_memories:TopKRouter",
            "rankwise.nn.mixture_of_memories:CausalSoftmaxAttention",
            "rankwise.nn.mixture_of_memories:linear_attention_chunked",
            "rankwise.nn.mixture_of_memories:linear_attention_recurrent"],
       experiments=[repro("mixture-of-memories", summary="MQAR accuracy against the number of kv pairs: MoM vs single-memory, expanded single-memory and softmax attention, 3 seeds")],
       layers=[LayerEntry("MixtureOfMemories", "rankwise.nn.mixture_of_memories.spec")],
       benchmarks=[BenchmarkEntry("mixture-of-memories", "bench_mixture_of_memories.py")],
       docs="docs/methods/mixture-of-memories.md"),
)
