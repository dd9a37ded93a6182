"""The layer conformance check: what every layer of `rankwise.nn` must do, checked the same way for all of them.

`check_layer(spec)` raises `ConformanceError` naming the first property that fails:
  forward    finite output, the same output twice in eval mode (no hidden state between calls);
  backward   every trainable parameter not listed in `spec.frozen` gets a finite, not-all-zero gradient;
  state      `load_state_dict` into an instance built with another seed reproduces the output exactly;
  dtype      after `.double()` the output is float64 and equals the float32 one to fp32 rounding;
  device     the forward runs on the meta device (shapes only) and, where CUDA is present, on the GPU.
"""

from __future__ import annotations

import copy

import torch

from rankwise.errors import RankwiseError
from rankwise.nn.registry import LayerSpec

# The float32 and float64 forwards differ by fp32 rounding amplified through the layer: a few hundred ulps of the
# output's scale covers a small layer's depth of reassociated sums (eps32 = 1.2e-7).
DTYPE_RTOL = 512 * torch.finfo(torch.float32).eps


class ConformanceError(RankwiseError, AssertionError):
    """A layer violates the contract every rankwise.nn layer keeps."""


def _forward(spec: LayerSpec, layer: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return spec.output(layer(*inputs))


def check_layer(spec: LayerSpec, seed: int = 0) -> None:
    """Raise `ConformanceError` at the first property `spec`'s layer violates (see the module docstring)."""
    try:
        _check(spec, seed)
    except ConformanceError:
        raise
    except Exception as e:  # a crash in any phase is a conformance failure with the phase's traceback attached
        raise ConformanceError(f"{spec.name}: the check crashed ({type(e).__name__}: {e})") from e


def _check(spec: LayerSpec, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    layer = spec.build(seed).eval()
    inputs = spec.inputs(gen, torch.float32)
    out = _forward(spec, layer, inputs)
    if not torch.isfinite(out).all():
        raise ConformanceError(f"{spec.name}: forward produced non-finite values")
    if not torch.equal(out, _forward(spec, layer, inputs)):
        raise ConformanceError(f"{spec.name}: two eval-mode forwards on the same input differ (hidden state?)")

    layer.train()
    layer.zero_grad(set_to_none=True)
    loss = _forward(spec, layer, inputs).double().pow(2).mean()
    loss.backward()
    for name, p in layer.named_parameters():
        if not p.requires_grad or name in spec.frozen:
            continue
        if p.grad is None or not torch.isfinite(p.grad).all() or not p.grad.any():
            raise ConformanceError(f"{spec.name}: parameter {name!r} got no usable gradient ({'none' if p.grad is None else 'zero or non-finite'})")
    layer.eval()

    other = spec.build(seed + 1).eval()
    other.load_state_dict(copy.deepcopy(layer.state_dict()))
    if not torch.equal(_forward(spec, other, inputs), out):
        raise ConformanceError(f"{spec.name}: a state_dict round trip changes the output (state kept outside the state_dict?)")

    wide = copy.deepcopy(layer).double()
    out64 = _forward(spec, wide, tuple(t.double() if t.is_floating_point() else t for t in inputs))
    if out64.dtype != torch.float64:
        raise ConformanceError(f"{spec.name}: after .double() the output is {out64.dtype}, not float64")
    scale = out64.abs().max().clamp_min(1e-30)
    if (out64 - out.double()).abs().max() > DTYPE_RTOL * scale:
        raise ConformanceError(f"{spec.name}: float64 and float32 outputs differ by more than fp32 rounding")

    if spec.meta_device:
        meta = copy.deepcopy(layer).to("meta")
        meta_out = _forward(spec, meta, tuple(t.to("meta") for t in inputs))
        if meta_out.shape != out.shape:
            raise ConformanceError(f"{spec.name}: on the meta device the output shape is {tuple(meta_out.shape)}, not {tuple(out.shape)}")
    if torch.cuda.is_available():
        gpu = copy.deepcopy(layer).cuda()
        gpu_out = _forward(spec, gpu, tuple(t.cuda() for t in inputs))
        if gpu_out.device.type != "cuda" or gpu_out.shape != out.shape:
            raise ConformanceError(f"{spec.name}: the CUDA forward's output is on {gpu_out.device} with shape {tuple(gpu_out.shape)}")
