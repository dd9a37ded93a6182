"""Cross-check of our linear-attention update against flash-linear-attention's pure-torch reference implementations.

`import fla.ops...` needs triton (the package's op modules import their Triton kernels), so on a CPU-only install
the reference files `fla/ops/simple_gla/naive.py` and `fla/ops/linear_attn/naive.py` (torch + einops only) are
loaded by path. Skipped when fla-core or einops is not installed.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from rankwise.nn.mixture_of_memories import linear_attention_chunked, linear_attention_recurrent

pytestmark = pytest.mark.method("mixture-of-memories")


def _fla_reference(module: str):
    fla = importlib.util.find_spec("fla")
    if fla is None or fla.submodule_search_locations is None or importlib.util.find_spec("einops") is None:
        pytest.skip("flash-linear-attention (fla-core) or einops is not installed")
    path = Path(list(fla.submodule_search_locations)[0]) / "ops" / module / "naive.py"
    if not path.is_file():
        pytest.skip(f"this fla version has no {path}")
    spec = importlib.util.spec_from_file_location(f"_fla_naive_{module}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _inputs(seed, decayed):
    g = torch.Generator().manual_seed(seed)
    B, H, L, K, V = 2, 3, 45, 8, 6
    q, k = (torch.nn.functional.normalize(torch.randn(B, H, L, K, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(B, H, L, V, generator=g)
    a = -0.2 * torch.rand(B, H, L, generator=g) if decayed else torch.zeros(B, H, L)
    return q, k, v, a


def _tol(o: torch.Tensor, L: int) -> float:
    # fla computes in float32: L accumulated products of unit-norm q, k and O(1) v, a few ulps each
    return 4 * L * torch.finfo(torch.float32).eps * float(o.abs().max())


@pytest.mark.parametrize("decayed", [False, True])
@pytest.mark.parametrize("chunk", [16, None])
def test_matches_fla_simple_gla(decayed, chunk):
    ref = _fla_reference("simple_gla")
    q, k, v, a = _inputs(0, decayed)
    t = lambda x: x.transpose(1, 2).contiguous()  # ours [B, H, L, ...], fla's [B, L, H, ...]
    o_fla, s_fla = ref.naive_recurrent_simple_gla(t(q), t(k), t(v), t(a), scale=1.0, output_final_state=True)
    o, s = linear_attention_chunked(q, k, v, a if decayed else None, chunk)
    assert (t(o) - o_fla).abs().max() <= _tol(o, q.shape[2])
    assert (s - s_fla).abs().max() <= _tol(s, q.shape[2])


def test_matches_fla_linear_attention():
    ref = _fla_reference("linear_attn")
    q, k, v, _ = _inputs(1, False)
    t = lambda x: x.transpose(1, 2).contiguous()
    o_fla, s_fla = ref.naive_recurrent_linear_attn(t(q), t(k), t(v), scale=1.0, output_final_state=True)
    o, s = linear_attention_recurrent(q, k, v)
    assert (t(o) - o_fla).abs().max() <= _tol(o, q.shape[2])
    assert (s - s_fla).abs().max() <= _tol(s, q.shape[2])


def test_routed_memory_matches_fla_with_masked_gates():
    # a MoM memory = the update with zero keys and zero log-decay at non-routed steps; fla's gated reference agrees
    ref = _fla_reference("simple_gla")
    q, k, v, a = _inputs(2, True)
    routed = (torch.rand(q.shape[0], 1, q.shape[2], generator=torch.Generator().manual_seed(3)) < 0.5).float()
    k, a = k * routed.unsqueeze(-1), a * routed
    t = lambda x: x.transpose(1, 2).contiguous()
    o_fla, _ = ref.naive_recurrent_simple_gla(t(q), t(k), t(v), t(a), scale=1.0)
    o, _ = linear_attention_chunked(q, k, v, a, 8)
    assert (t(o) - o_fla).abs().max() <= _tol(o, q.shape[2])
