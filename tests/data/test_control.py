import sys

import numpy as np
import pytest
import torch

from rankwise.data import control
from rankwise.data.control import benchmark_tasks, expert_demonstrations, make_env
from rankwise.errors import InvalidInputError, MissingPackageError, UnknownNameError

pytestmark = pytest.mark.usefixtures("tmp_cache")  # cached demonstrations go to a private cache, never the user's

MT10 = ("reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
        "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3")


def _rollout(name: str, seed: int, steps: int = 20) -> np.ndarray:
    env, obs = make_env(name, seed)
    trajectory = [obs]
    for _ in range(steps):
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        trajectory.append(obs)
        if terminated or truncated:
            break
    env.close()
    return np.stack(trajectory)


@pytest.mark.parametrize("name", ["CartPole-v1", "Pendulum-v1", "Hopper-v5"])
def test_environment_resets_and_rollouts_are_determined_by_the_seed(name):
    a, b, c = _rollout(name, 3), _rollout(name, 3), _rollout(name, 4)
    assert np.array_equal(a, b)
    assert not np.array_equal(a[0], c[0])
    env, _ = make_env(name, 0)
    assert env.render_mode is None  # nothing renders: no display needed
    env.close()


def test_unknown_environment_is_refused_before_gymnasium_is_touched(monkeypatch):
    monkeypatch.setattr(control, "_gymnasium", lambda: pytest.fail("validated too late"))
    with pytest.raises(UnknownNameError):
        make_env("Pong-v5")


def test_benchmark_task_lists():
    assert benchmark_tasks("MT10") == {"train": MT10, "test": ()}
    ml45 = benchmark_tasks("ML45")
    assert len(ml45["train"]) == 45 and len(ml45["test"]) == 5 and not set(ml45["train"]) & set(ml45["test"])
    assert "bin-picking-v3" in ml45["test"]
    with pytest.raises(UnknownNameError):
        benchmark_tasks("MT11")


def test_expert_solves_an_mt10_task_within_the_step_budget():
    demos = expert_demonstrations("pick-place-v3", episodes=4, seed=0, max_steps=150, use_cache=False)
    assert demos.observations.shape == (4, 150, 39) and demos.actions.shape == (4, 150, 4)
    assert demos.solved.all()
    assert torch.equal(demos.first_success(), demos.lengths)  # stops at the first success, inclusive
    assert (demos.actions.abs() <= 1).all() and not demos.actions[~demos.mask].any()
    assert demos.rewards[demos.mask].gt(0).all()
    obs, act = demos.steps()
    assert obs.shape == (int(demos.lengths.sum()), 39) and act.shape[1] == 4
    goals = demos.observations[:, 0, 36:39]
    assert torch.unique(goals, dim=0).shape[0] == 4  # one goal per episode, visible in the observation
    assert "pygame" not in sys.modules


def test_collection_is_determined_by_the_seed_and_cached(tmp_cache, monkeypatch):
    first = expert_demonstrations("reach-v3", episodes=2, seed=5, max_steps=60)  # miss: collects and stores
    again = expert_demonstrations("reach-v3", episodes=2, seed=5, max_steps=60, use_cache=False)
    assert torch.equal(first.observations, again.observations) and torch.equal(first.actions, again.actions)
    other = expert_demonstrations("reach-v3", episodes=2, seed=6, max_steps=60, use_cache=False)
    assert not torch.equal(first.observations[:, 0], other.observations[:, 0])  # other goals
    real_collect = control._collect
    monkeypatch.setattr(control, "_collect", lambda *a: pytest.fail("a cache hit must not collect"))
    hit = expert_demonstrations("reach-v3", episodes=2, seed=5, max_steps=60)
    assert torch.equal(hit.actions, first.actions) and torch.equal(hit.success, first.success)
    (entry,) = (tmp_cache / control.CACHE_NAMESPACE).iterdir()
    (entry / "demonstrations.safetensors").write_bytes(b"\0" * 64)
    collected = []
    monkeypatch.setattr(control, "_collect", lambda *a: collected.append(a[2]) or real_collect(*a))
    with pytest.warns(UserWarning, match="corrupted cache entry"):
        rebuilt = expert_demonstrations("reach-v3", episodes=2, seed=5, max_steps=60)
    assert collected == ["reach-v3"] and torch.equal(rebuilt.observations, first.observations)


def test_action_noise_is_seeded():
    a = expert_demonstrations("reach-v3", episodes=1, seed=1, max_steps=30, action_noise=0.5, use_cache=False)
    b = expert_demonstrations("reach-v3", episodes=1, seed=1, max_steps=30, action_noise=0.5, use_cache=False)
    clean = expert_demonstrations("reach-v3", episodes=1, seed=1, max_steps=30, use_cache=False)
    assert torch.equal(a.actions, b.actions) and not torch.equal(a.actions, clean.actions)


def test_bad_input_raises_before_any_work(monkeypatch):
    monkeypatch.setattr(control, "_collect", lambda *a: pytest.fail("validated too late"))
    for bad in (dict(episodes=control.GOALS_PER_SEED + 1), dict(episodes=0), dict(max_steps=501),
                dict(action_noise=-1.0)):
        with pytest.raises(InvalidInputError):
            expert_demonstrations("reach-v3", **bad)
    with pytest.raises(UnknownNameError):
        expert_demonstrations("make-coffee-v3")


def test_missing_metaworld_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "metaworld", None)  # makes `import metaworld` raise ImportError
    with pytest.raises(MissingPackageError, match=r"pip install metaworld==3\.1\.1"):
        benchmark_tasks("MT10")
