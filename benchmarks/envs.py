"""Envs for benchmarks, usable as `--env-id benchmarks.envs:<Id>` (gymnasium's module:id form)."""

from __future__ import annotations

import time

import gymnasium as gym
from gymnasium.envs.classic_control.pendulum import PendulumEnv
from gymnasium.envs.registration import register


class FixedLatency(gym.Wrapper):
    """Adds a fixed wall-clock latency to every step, standing in for an expensive simulator or real hardware: the
    process waits without using the CPU, as it would for a robot or a remote simulator."""

    def __init__(self, env: gym.Env, latency_seconds: float):
        super().__init__(env)
        self.latency_seconds = latency_seconds

    def step(self, action):
        time.sleep(self.latency_seconds)
        return self.env.step(action)


def make_slow_pendulum(latency_seconds: float = 0.005, **kwargs) -> gym.Env:
    # The bare PendulumEnv: gym.make of this id adds the time limit and checks once (not twice, as through gym.make)
    return FixedLatency(PendulumEnv(**kwargs), latency_seconds)


register(id="SlowPendulum-v1", entry_point=make_slow_pendulum, max_episode_steps=200)
