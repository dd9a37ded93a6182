"""Control environments: seeded gymnasium environments (classic control and MuJoCo locomotion), and Meta-World
(MT10 / ML45 task lists, scripted-expert demonstrations as tensors, cached by task, episodes and seed).

    env, obs = make_env("Pendulum-v1", seed=0)            # reset with the seed, action space seeded
    benchmark_tasks("MT10")                              # {"train": ("reach-v3", ...), "test": ()}
    demos = expert_demonstrations("pick-place-v3", episodes=20, seed=0)
    demos.observations [E, T, 39], demos.actions [E, T, 4], demos.success [E, T], demos.lengths [E]

Nothing here renders: environments are built with `render_mode=None`, so no display, OpenGL or pygame is needed
(MuJoCo imports glfw but opens no window). Meta-World needs `metaworld` 3.1 (which pins mujoco 3.3.0).

Demonstrations, and what differs from a plain loop over the expert, and why:

- Goals come from Meta-World's own MT1 benchmark for the task, seeded (`metaworld.MT1(task, seed=seed)`): 50
  distinct goal positions per seed, episode e using the e-th. More than 50 episodes would repeat goals (the
  simulator is deterministic given the goal), so they are refused; another seed gives another 50 goals (e.g.
  held-out goals for evaluation).
- The goal is observable (observation[36:39]), as the experts read it; zero those entries to hide it.
- The experts' actions can exceed the action box (Meta-World warns, then clips them in the simulator); the actions
  stored are the clipped ones, what the robot executed, so a cloned policy learns the executed action.
- `action_noise` adds seeded Gaussian noise (then clips) for demonstrations that are not perfect.
- An episode ends at its first success (`stop_on_success`, inclusive) or after `max_steps`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from rankwise.core.cache import cache_key, cached_entry, store_entry
from rankwise.core.io import load_tensors, save_tensors_atomic
from rankwise.core.progress import progress
from rankwise.errors import CorruptFileError, InvalidInputError, MissingPackageError, UnknownNameError

GYMNASIUM = "gymnasium==1.4.0"
METAWORLD = "metaworld==3.1.1"
CLASSIC_CONTROL = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Pendulum-v1")
MUJOCO = ("InvertedPendulum-v5", "InvertedDoublePendulum-v5", "Reacher-v5", "Pusher-v5", "Swimmer-v5", "Hopper-v5",
          "HalfCheetah-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5", "HumanoidStandup-v5")
ENVIRONMENTS = CLASSIC_CONTROL + MUJOCO
BENCHMARKS = ("MT10", "MT50", "ML10", "ML45")
GOALS_PER_SEED = 50  # Meta-World's MT1 draws 50 goals per seed
MAX_PATH_LENGTH = 500  # Meta-World's episode limit: its step() refuses to go further
OBS_DIM, ACTION_DIM = 39, 4
CACHE_NAMESPACE = "control"
CACHE_VERSION = 1

if TYPE_CHECKING:
    import gymnasium


def make_env(name: str, seed: int = 0) -> tuple[gymnasium.Env, np.ndarray]:
    """A gymnasium environment from ENVIRONMENTS, reset with `seed` and with its action space seeded (so
    `env.action_space.sample()` is reproducible too). -> (env, first observation)"""
    if name not in ENVIRONMENTS:
        raise UnknownNameError(f"unknown environment {name!r}; choose one of {ENVIRONMENTS}")
    gym = _gymnasium()
    if name in MUJOCO:
        _mujoco()
    env = gym.make(name, render_mode=None)
    observation, _ = env.reset(seed=int(seed))
    env.action_space.seed(int(seed))
    return env, observation


def benchmark_tasks(benchmark: str) -> dict[str, tuple[str, ...]]:
    """The task names of a Meta-World benchmark: {"train": (...), "test": (...)} (MT benchmarks have no test)."""
    if benchmark not in BENCHMARKS:
        raise UnknownNameError(f"unknown Meta-World benchmark {benchmark!r}; choose one of {BENCHMARKS}")
    env_dict = _metaworld().env_dict
    if benchmark.startswith("MT"):
        return {"train": tuple(getattr(env_dict, f"{benchmark}_V3")), "test": ()}
    split = getattr(env_dict, f"{benchmark}_V3")
    return {"train": tuple(split["train"]), "test": tuple(split["test"])}


@dataclass(frozen=True)
class Demonstrations:
    """Expert episodes of one Meta-World task. E episodes, padded to T = max_steps; entries at or past an episode's
    length are zero (`mask` says which are real).

    observations [E, T, 39] float32: the observation each action was taken in; actions [E, T, 4] float32 in
    [-1, 1]; rewards [E, T] float32; success [E, T] bool (the task's success flag after the step); lengths [E] int64;
    final_observations [E, 39] float32: the observation after each episode's last step.
    """

    task: str
    seed: int
    observations: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    success: torch.Tensor
    lengths: torch.Tensor
    final_observations: torch.Tensor

    @property
    def episodes(self) -> int:
        return int(self.lengths.numel())

    @property
    def mask(self) -> torch.Tensor:
        """Which steps are real. -> [E, T] bool"""
        return torch.arange(self.actions.shape[1])[None, :] < self.lengths[:, None]

    @property
    def solved(self) -> torch.Tensor:
        """Whether each episode reached success. -> [E] bool"""
        return self.success.any(dim=1)

    def first_success(self) -> torch.Tensor:
        """Step count at the first success (1-based), -1 if never. -> [E] int64"""
        steps = torch.where(self.success, torch.arange(1, self.success.shape[1] + 1), self.success.shape[1] + 1)
        first = steps.min(dim=1).values
        return torch.where(self.solved, first, torch.full_like(first, -1))

    def steps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The real (observation, action) pairs, episode by episode, for behaviour cloning. -> [S, 39], [S, 4]"""
        mask = self.mask
        return self.observations[mask], self.actions[mask]


def expert_demonstrations(task: str, episodes: int = 20, seed: int = 0, max_steps: int = 200,
                          stop_on_success: bool = True, action_noise: float = 0.0,
                          use_cache: bool = True) -> Demonstrations:
    """Episodes of Meta-World's scripted expert on `task` (any of the 50 v3 tasks), one goal each (see the module
    text). Cached by every argument and the metaworld and mujoco versions."""
    if not isinstance(episodes, int) or not 1 <= episodes <= GOALS_PER_SEED:
        raise InvalidInputError(f"episodes must be an integer in [1, {GOALS_PER_SEED}] (Meta-World draws "
                                f"{GOALS_PER_SEED} goals per seed; use further seeds for more), got {episodes!r}")
    if not isinstance(max_steps, int) or not 1 <= max_steps <= MAX_PATH_LENGTH:
        raise InvalidInputError(f"max_steps must be an integer in [1, {MAX_PATH_LENGTH}], got {max_steps!r}")
    if not action_noise >= 0:
        raise InvalidInputError(f"action_noise must be >= 0, got {action_noise}")
    metaworld = _metaworld()
    from metaworld.policies import ENV_POLICY_MAP

    if task not in metaworld.env_dict.ALL_V3_ENVIRONMENTS or task not in ENV_POLICY_MAP:
        raise UnknownNameError(f"unknown Meta-World task {task!r}; choose one of "
                               f"{tuple(metaworld.env_dict.ALL_V3_ENVIRONMENTS)}")
    key = cache_key(what="metaworld-expert", version=CACHE_VERSION, task=task, episodes=episodes, seed=int(seed),
                    max_steps=max_steps, stop_on_success=bool(stop_on_success), action_noise=float(action_noise),
                    metaworld=_version("metaworld"), mujoco=_version("mujoco"))
    entry = cached_entry(CACHE_NAMESPACE, key) if use_cache else None
    if entry is not None:
        try:
            return _from_cache(entry, task, int(seed), episodes, max_steps)
        except (CorruptFileError, KeyError, ValueError):
            pass  # unreadable despite its manifest (another version's layout): collect again
    demos = _collect(metaworld, ENV_POLICY_MAP[task](), task, episodes, int(seed), max_steps, stop_on_success,
                     float(action_noise))
    if use_cache:
        store_entry(CACHE_NAMESPACE, key, lambda tmp: _to_cache(tmp, demos))
    return demos


def _collect(metaworld, policy, task: str, episodes: int, seed: int, max_steps: int, stop_on_success: bool,
             action_noise: float) -> Demonstrations:
    benchmark = metaworld.MT1(task, seed=seed)
    env = benchmark.train_classes[task]()  # render_mode None: no rendering
    noise = np.random.default_rng(seed)
    obs = np.zeros((episodes, max_steps, OBS_DIM), dtype=np.float32)
    actions = np.zeros((episodes, max_steps, ACTION_DIM), dtype=np.float32)
    rewards = np.zeros((episodes, max_steps), dtype=np.float32)
    success = np.zeros((episodes, max_steps), dtype=bool)
    lengths = np.zeros(episodes, dtype=np.int64)
    final = np.zeros((episodes, OBS_DIM), dtype=np.float32)
    low, high = env.action_space.low, env.action_space.high
    try:
        for e in progress(range(episodes), desc=f"expert {task}", total=episodes):
            env.set_task(benchmark.train_tasks[e])
            observation, _ = env.reset()
            for t in range(max_steps):
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="Constant.*too high")  # we clip, as the simulator does
                    action = np.asarray(policy.get_action(observation), dtype=np.float64)
                if action_noise > 0:
                    action = action + noise.normal(0.0, action_noise, size=action.shape)
                action = np.clip(action, low, high).astype(np.float32)
                obs[e, t], actions[e, t] = observation, action
                observation, reward, _, truncated, info = env.step(action)
                rewards[e, t], success[e, t] = reward, bool(info["success"])
                lengths[e] = t + 1
                if (stop_on_success and success[e, t]) or truncated:
                    break
            final[e] = observation
    finally:
        env.close()
    as_t = torch.from_numpy
    return Demonstrations(task, seed, as_t(obs), as_t(actions), as_t(rewards), as_t(success), as_t(lengths),
                          as_t(final))


def _to_cache(folder: Path, d: Demonstrations) -> None:
    save_tensors_atomic(folder / "demonstrations.safetensors", {
        "observations": d.observations, "actions": d.actions, "rewards": d.rewards, "success": d.success,
        "lengths": d.lengths, "final_observations": d.final_observations})


def _from_cache(folder: Path, task: str, seed: int, episodes: int, max_steps: int) -> Demonstrations:
    t = load_tensors(folder / "demonstrations.safetensors")
    d = Demonstrations(task, seed, t["observations"], t["actions"], t["rewards"], t["success"], t["lengths"],
                       t["final_observations"])
    if d.actions.shape != (episodes, max_steps, ACTION_DIM) or d.observations.shape != (episodes, max_steps, OBS_DIM):
        raise CorruptFileError(f"{folder}: cached demonstrations have shape {tuple(d.actions.shape)}")
    return d


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def _gymnasium():
    try:
        import gymnasium
    except ImportError:
        raise MissingPackageError(f"control environments need gymnasium; install it with: "
                                  f"pip install {GYMNASIUM}") from None
    return gymnasium


def _mujoco():
    try:
        import mujoco
    except ImportError:
        raise MissingPackageError("MuJoCo environments need mujoco; install it with: pip install mujoco==3.3.0 "
                                  f"(the version {METAWORLD} pins)") from None
    return mujoco


def _metaworld():
    try:
        import metaworld
        import metaworld.env_dict  # noqa: F401  (the task tables)
    except ImportError:
        raise MissingPackageError(f"Meta-World tasks need metaworld; install it with: pip install {METAWORLD} "
                                  "(it pins mujoco==3.3.0 and needs gymnasium 1.x)") from None
    return metaworld
