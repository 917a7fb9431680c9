"""Tiny deterministic envs for end-to-end tests, usable as `--env-id tests.envs:<Id>` (gymnasium's module:id form)."""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import register


class CountingEnv(gym.Env):
    """Reward 1 every step; the observation is the step count modulo 5. The episode is cut by the time limit
    (`terminate=False`, a truncation) or ends for real (`terminate=True`) after `length` steps. Modulo 5, the final
    observation of a 5-step episode is the start state, so V(final obs) is a value the critic is trained on."""

    def __init__(self, length: int = 5, terminate: bool = False, nan_after: int | None = None):
        self.length, self.terminate, self.nan_after = length, terminate, nan_after
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.t = 0
        self.total_steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        self.total_steps += 1
        reward = 1.0
        if self.nan_after is not None and self.total_steps > self.nan_after:
            reward = float("nan")
        terminated = self.terminate and self.t >= self.length
        return np.array([self.t % 5], dtype=np.float32), reward, terminated, False, {}


register(id="Truncating-v0", entry_point=CountingEnv, max_episode_steps=5, kwargs={"length": 1000})
register(id="Terminating-v0", entry_point=CountingEnv, kwargs={"length": 5, "terminate": True})
register(id="NanReward-v0", entry_point=CountingEnv, max_episode_steps=5, kwargs={"length": 1000, "nan_after": 600})


def claim(path: str) -> bool:
    """Create the file at `path` if no one has: True for the one process that did. (Actors in sync mode reach the same
    step together; checking for the file and then creating it would let two of them hang.)"""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class CrashOnceEnv(CountingEnv):
    """Kills its own process once, mid-run, to test actor restarts: on its `crash_at`-th step, if the file named by
    $DPPO_CRASH_MARKER does not exist yet, it creates the file and exits the process without cleanup."""

    def __init__(self, crash_at: int = 300, **kwargs):
        super().__init__(**kwargs)
        self.crash_at = crash_at

    def step(self, action):
        marker = os.environ.get("DPPO_CRASH_MARKER")
        if marker and self.total_steps + 1 == self.crash_at and claim(marker):
            os._exit(1)
        return super().step(action)


register(id="CrashOnce-v0", entry_point=CrashOnceEnv, max_episode_steps=5, kwargs={"length": 1000})


class HangOnceEnv(CountingEnv):
    """A simulator that deadlocks once: on its `hang_at`-th step, if the file named by $DPPO_HANG_MARKER does not
    exist yet, it creates the file and never returns from step, until its process is killed: it sleeps in Python, or
    with `in_c`, waits in C code that no signal interrupts (it blocks them all in its thread and reads a pipe that
    nobody writes). Every other step takes `step_seconds`."""

    def __init__(self, hang_at: int = 300, step_seconds: float = 0.002, in_c: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.hang_at, self.step_seconds, self.in_c = hang_at, step_seconds, in_c

    def step(self, action):
        marker = os.environ.get("DPPO_HANG_MARKER")
        if marker and self.total_steps + 1 == self.hang_at and claim(marker):
            if self.in_c:
                signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
                read_end, _ = os.pipe()  # the write end stays open, unwritten: the read never returns
                os.read(read_end, 1)
            while True:
                time.sleep(60)
        time.sleep(self.step_seconds)  # a simulator's cost: the other actors keep sampling for a while meanwhile
        return super().step(action)


register(id="HangOnce-v0", entry_point=HangOnceEnv, max_episode_steps=5, kwargs={"length": 1000})
register(id="HangOnceInC-v0", entry_point=HangOnceEnv, max_episode_steps=5, kwargs={"length": 1000, "in_c": True})


class PauseOnceEnv(CountingEnv):
    """A simulator that waits for the test once: on its `pause_at`-th step (the warm-up's steps count), while the file
    named by $TESTS_PAUSE_UNTIL does not exist, it waits for that file (10 minutes at most). A test can then signal a
    run that it knows is under way, however fast the machine is. Without the variable it never waits."""

    def __init__(self, pause_at: int = 600, **kwargs):
        super().__init__(**kwargs)
        self.pause_at = pause_at

    def step(self, action):
        until = os.environ.get("TESTS_PAUSE_UNTIL")
        if until and self.total_steps + 1 == self.pause_at:
            deadline = time.monotonic() + 1800  # a safety net: the test makes the file
            while not os.path.exists(until) and time.monotonic() < deadline:
                time.sleep(0.05)
        return super().step(action)


register(id="PauseOnce-v0", entry_point=PauseOnceEnv, max_episode_steps=5, kwargs={"length": 1000})


class PauseOnResetEnv(CountingEnv):
    """A simulator slow to start: with $TESTS_PAUSE_UNTIL set, its first reset touches the file named by
    $TESTS_PAUSED_AT and then waits for the file named by $TESTS_PAUSE_UNTIL (30 minutes at most). A test can then
    signal a run that it knows is starting up."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.paused = False

    def reset(self, *, seed=None, options=None):
        until = os.environ.get("TESTS_PAUSE_UNTIL")
        if until and not self.paused:
            self.paused = True
            with open(os.environ["TESTS_PAUSED_AT"], "w"):
                pass
            deadline = time.monotonic() + 1800  # a safety net: the test makes the file
            while not os.path.exists(until) and time.monotonic() < deadline:
                time.sleep(0.05)
        return super().reset(seed=seed, options=options)


register(id="PauseOnReset-v0", entry_point=PauseOnResetEnv, max_episode_steps=5, kwargs={"length": 1000})


class BrokenResetEnv(CountingEnv):
    """A simulator that breaks for good after a while: from its process's `after`-th reset on (or
    $DPPO_RESETS_BEFORE_FAILURE's), every reset raises (`how="raise"`) or takes the process down without cleanup
    (`how="kill"`, as a segfault in C code would). A restarted process counts afresh, so a killed one comes back and
    dies again."""

    def __init__(self, after: int = 200, how: str = "raise", **kwargs):
        super().__init__(**kwargs)
        self.after = int(os.environ.get("DPPO_RESETS_BEFORE_FAILURE", after))
        self.how, self.resets = how, 0

    def reset(self, *, seed=None, options=None):
        self.resets += 1
        if self.resets >= self.after:
            if self.how == "kill":
                os._exit(1)
            raise RuntimeError(f"simulator lost its connection on reset {self.resets}")
        return super().reset(seed=seed, options=options)


register(id="RaisesOnReset-v0", entry_point=BrokenResetEnv, max_episode_steps=5, kwargs={"length": 1000})
register(id="DiesOnReset-v0", entry_point=BrokenResetEnv, max_episode_steps=5, kwargs={"length": 1000, "how": "kill"})


class FlakyEnv(CountingEnv):
    """A flaky simulator or sensor: every `every`-th step returns a NaN reward (`what="reward"`) or a NaN observation
    (`what="obs"`); every other step is normal. `every=1` makes every step bad."""

    def __init__(self, every: int = 97, what: str = "reward", **kwargs):
        super().__init__(**kwargs)
        self.every, self.what = every, what

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.total_steps % self.every == 0:
            if self.what == "reward":
                reward = float("nan")
            else:
                obs = np.full_like(obs, np.nan)
        return obs, reward, terminated, truncated, info


register(id="NanSometimes-v0", entry_point=FlakyEnv, max_episode_steps=5, kwargs={"length": 1000})
register(id="NanObsSometimes-v0", entry_point=FlakyEnv, max_episode_steps=5, kwargs={"length": 1000, "what": "obs"})
register(id="AlwaysNan-v0", entry_point=FlakyEnv, max_episode_steps=5, kwargs={"length": 1000, "every": 1})


class CycleEnv(gym.Env):
    """The observation walks o -> o + 1 (mod 10) from a random start, and the reward is o itself. Episodes are cut by
    a 5-step time limit, so the final observation (start + 5) differs from the next reset observation. With
    truncation bootstrapping, V(o) = o + gamma * V(o + 1 mod 10) for every o (see `cycle_values`)."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(0.0, 9.0, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.o = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.o = int(self.np_random.integers(10))
        return np.array([self.o], dtype=np.float32), {}

    def step(self, action):
        reward = float(self.o)
        self.o = (self.o + 1) % 10
        return np.array([self.o], dtype=np.float32), reward, False, False, {}


def cycle_values(gamma: float) -> np.ndarray:
    """The true values of CycleEnv: solve V = r + gamma * P V for the 10-state cycle."""
    transition = np.roll(np.eye(10), 1, axis=1)
    return np.linalg.solve(np.eye(10) - gamma * transition, np.arange(10.0))


register(id="Cycle-v0", entry_point=CycleEnv, max_episode_steps=5)


class ReachEnv(gym.Env):
    """A point that moves by its action toward a target, observed as a nested Dict of Boxes (like dm_control's
    observations): {"body": {"position", "velocity"}, "target"}. Reward: minus the distance to the target."""

    def __init__(self, discrete_leaf: bool = False):
        body = gym.spaces.Dict(
            [("position", gym.spaces.Box(-10, 10, (2,), np.float64)), ("velocity", gym.spaces.Box(-1, 1, (2,)))]
        )
        entries = [("target", gym.spaces.Box(-1, 1, (2,), np.float64)), ("body", body)]
        if discrete_leaf:
            entries.append(("mode", gym.spaces.Discrete(3)))
        self.observation_space = gym.spaces.Dict(entries)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)

    def observation(self) -> dict:
        return {"target": self.target.copy(), "body": {"position": self.position.copy(), "velocity": self.velocity}}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-1, 1, 2)
        self.target = self.np_random.uniform(-1, 1, 2)
        self.velocity = np.zeros(2, dtype=np.float32)
        return self.observation(), {}

    def step(self, action):
        self.velocity = np.clip(action, -1, 1).astype(np.float32)
        self.position = np.clip(self.position + 0.1 * self.velocity, -10, 10)
        return self.observation(), -float(np.linalg.norm(self.position - self.target)), False, False, {}


register(id="Reach-v0", entry_point=ReachEnv, max_episode_steps=50)
register(id="ReachDiscreteLeaf-v0", entry_point=ReachEnv, max_episode_steps=50, kwargs={"discrete_leaf": True})


class FailsForSeedEnv(CountingEnv):
    """A simulator that fails in one seed's run only: on its `at`-th step, if it was first reset with seed `seed`, step
    raises (the other seeds' envs run on)."""

    def __init__(self, seed: int = 2, at: int = 300, **kwargs):
        super().__init__(**kwargs)
        self.failing_seed, self.at, self.first_seed, self.steps = seed, at, None, 0

    def reset(self, *, seed=None, options=None):
        if self.first_seed is None:
            self.first_seed = seed
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.first_seed == self.failing_seed and self.steps == self.at:
            raise RuntimeError(f"simulator diverged at step {self.steps}")
        return super().step(action)


register(id="FailsForSeed2-v0", entry_point=FailsForSeedEnv, max_episode_steps=5, kwargs={"length": 1000})
