"""The benchmarks' memory counters (benchmarks/memory.py) count what they say: exact byte sums on known programs."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from memory import live_tensor_peak, saved_tensor_bytes  # noqa: E402

N = 1000  # float32 elements: 4,000 bytes a tensor


def test_live_peak_counts_existing_and_created_tensors():
    x = torch.ones(N)

    def program():
        y = x * 2
        z = y + 1
        return z.sum()  # y, z and the 0-d sum are all alive here

    peak, start, out = live_tensor_peak(program, [x])
    assert start == 4 * N
    assert peak == 4 * N * 3 + 4
    assert float(out) == 3 * N


def test_live_peak_forgets_freed_tensors():
    def program():
        a = torch.zeros(2 * N)
        del a  # freed before b exists: the peak is the larger of the two, not their sum
        b = torch.zeros(N)
        return b

    peak, start, _ = live_tensor_peak(program)
    assert start == 0
    assert peak == 8 * N


def test_live_peak_counts_a_storage_once_through_its_views():
    def program():
        a = torch.zeros(N)
        return a.view(10, -1), a[: N // 2], a.t() if a.dim() == 2 else a.unsqueeze(0)

    peak, _, _ = live_tensor_peak(program)
    assert peak == 4 * N


def test_live_peak_sees_the_backward():
    w = torch.ones(N, requires_grad=True)
    x = torch.ones(N)

    def program():
        (w * x).sum().backward()

    peak, _, _ = live_tensor_peak(program, [w, x])
    assert w.grad is not None
    assert peak >= 4 * N * 3  # w, x and at least the gradient of w at once


@pytest.mark.parametrize("by_storage", [True, False])
def test_saved_bytes_exclude_parameters(by_storage):
    w = torch.nn.Parameter(torch.ones(N))
    x = torch.ones(N)
    saved, _ = saved_tensor_bytes(lambda: (torch.sin(w * x)).sum(), exclude=[w], by_storage=by_storage)
    assert saved == 4 * N * 2  # x (for d/dw of w*x) and w*x (for sin's backward); w itself excluded
