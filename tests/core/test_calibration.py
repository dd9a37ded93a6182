import pytest
import torch

from rankwise.core.calibration import collect_second_moments
from rankwise.errors import InvalidInputError, NumericalError
from rankwise.models import tiny_llama
from rounding import product_tol

NAMES = ["model.layers.0.self_attn.k_proj", "model.layers.1.mlp.down_proj"]


def _batches():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 1000, (2, 16), generator=g) for _ in range(3)]


def test_second_moments_equal_manual_xtx(tmp_cache):
    model = tiny_llama(seed=4)
    captured = {n: [] for n in NAMES}
    handles = [model.get_submodule(n).register_forward_pre_hook(lambda m, i, n=n: captured[n].append(i[0].reshape(-1, i[0].size(-1)).double())) for n in NAMES]
    with torch.no_grad():
        for b in _batches():
            model(b)
    for h in handles:
        h.remove()
    moments = collect_second_moments(model, NAMES, _batches())
    for n in NAMES:
        x = torch.cat(captured[n])
        assert moments[n].rows == x.size(0) == 3 * 2 * 16
        # float64 sums of the same 96 outer products, per batch vs in one matmul: within the worst-case rounding
        assert torch.allclose(moments[n].sum_xxT, x.T @ x, rtol=0, atol=product_tol(torch.float64, x.T, x))
        assert moments[n].sum_xxT.dtype == torch.float64
        c = moments[n].covariance(damping=0.1)
        base = moments[n].covariance()
        assert torch.allclose(c - base, 0.1 * base.diagonal().mean() * torch.eye(base.size(0), dtype=torch.float64))


def test_cache_hit_and_corrupt_cache_recomputed(tmp_cache):
    model = tiny_llama(seed=4)
    first = collect_second_moments(model, NAMES, _batches())
    files = list((tmp_cache / "calibration").rglob("*.safetensors"))  # one hash-checked entry folder per setting
    assert len(files) == 1
    files[0].write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="corrupted cache entry"):
        again = collect_second_moments(model, NAMES, _batches())
    assert torch.equal(first[NAMES[0]].sum_xxT, again[NAMES[0]].sum_xxT)
    cached = collect_second_moments(model, NAMES, _batches())
    assert torch.equal(first[NAMES[1]].sum_xxT, cached[NAMES[1]].sum_xxT)


def test_bad_calibration_inputs(tmp_cache):
    model = tiny_llama(seed=4)
    with pytest.raises(InvalidInputError, match="empty"):
        collect_second_moments(model, NAMES, [])
    with pytest.raises(InvalidInputError, match="no module"):
        collect_second_moments(model, ["model.nope"], _batches())
    with pytest.raises(InvalidInputError, match="too short"):
        collect_second_moments(model, NAMES, _batches(), min_rows=10_000, use_cache=False)
    with torch.no_grad():
        model.model.embed_tokens.weight[5] = float("nan")
    with pytest.raises(NumericalError):
        collect_second_moments(model, NAMES, [torch.full((1, 4), 5)], use_cache=False)


def test_hook_runner_removes_its_hooks_and_restores_the_mode_on_error():
    from rankwise.core.calibration import run_with_input_hooks

    model = tiny_llama(seed=4).train()
    seen = []

    def on_input(name, module, x, output, batch):
        seen.append((name, batch, tuple(x.shape)))
        if batch == 1:
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        run_with_input_hooks(model, NAMES, _batches(), on_input)
    assert model.training
    assert all(not model.get_submodule(n)._forward_hooks for n in NAMES)
    assert [(n, b) for n, b, _ in seen[:2]] == [(NAMES[0], 0), (NAMES[1], 0)] and seen[0][2] == (2, 16, 64)
    with pytest.raises(InvalidInputError, match="no module"):
        run_with_input_hooks(model, ["model.nope"], _batches(), on_input)
