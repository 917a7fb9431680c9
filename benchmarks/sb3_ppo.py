"""Stable-Baselines3 PPO with CleanRL ppo_continuous_action.py default hyperparameters.

Meant to be timed as a whole process against our own PPO implementation. Prints one JSON line to stdout at the end.

Example:
    python benchmarks/sb3_ppo.py --env-id HalfCheetah-v5 --total-timesteps 1000000
"""

import argparse
import json
import os
import sys
import time

try:  # MuJoCo v5 envs otherwise write MUJOCO_LOG.TXT into the cwd.
    import mujoco

    _cfg = mujoco.MjLogConfig.get()
    _cfg.logto_file = False
    _cfg.set()
except (ImportError, AttributeError):
    pass

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-id", type=str, default="HalfCheetah-v5")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--total-timesteps", type=int, default=1_000_000)
    p.add_argument("--num-envs", type=int, default=1)
    p.add_argument("--num-steps", type=int, default=2048, help="rollout length per env (SB3 n_steps)")
    p.add_argument("--num-minibatches", type=int, default=32)
    p.add_argument("--update-epochs", type=int, default=10)
    p.add_argument("--learning-rate", type=float, default=3e-4)
    p.add_argument(
        "--anneal-lr",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="linearly anneal the learning rate to 0 like CleanRL (SB3's own default is constant)",
    )
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument(
        "--clip-vloss",
        action="store_true",
        help="set clip_range_vf=clip_coef (CleanRL clips the value loss by default; SB3 does not)",
    )
    p.add_argument("--ent-coef", type=float, default=0.0)
    p.add_argument(
        "--vf-coef",
        type=float,
        default=0.5,
        help="SB3 value loss is plain MSE; CleanRL's is 0.5*MSE, so 0.25 here equals CleanRL's vf_coef=0.5",
    )
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--tb-log", type=str, default=None, help="tensorboard log dir (default: none)")
    return p.parse_args()


class LauncherProgress(BaseCallback):
    """Each rollout's end said to the launcher that started this run (learning.py's launcher.Launch), as the trainers
    say theirs: its progress bar counts this run, and it passes a Ctrl-C on only to a run that has said it trains."""

    def __init__(self, channel, total_timesteps: int):
        super().__init__()
        self.channel, self.total_timesteps = channel, total_timesteps

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        from run_management import report_progress

        returns = [episode["r"] for episode in self.model.ep_info_buffer]
        recent = float(np.mean(returns)) if returns else None
        report_progress(self.channel, self.num_timesteps, self.total_timesteps, recent)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.torch_threads)

    env = make_vec_env(args.env_id, n_envs=args.num_envs, seed=args.seed, vec_env_cls=DummyVecEnv)
    env = VecNormalize(env, norm_obs=True, norm_reward=True, clip_obs=10.0, clip_reward=10.0, gamma=args.gamma)

    lr = args.learning_rate
    rollout_size = args.num_envs * args.num_steps
    batch_size = rollout_size // args.num_minibatches
    # SB3 evaluates the schedule *after* each rollout (progress_remaining = 1 - k*rollout/total at update k), so plain
    # `f * lr` would be one update behind CleanRL (never uses the full lr, last update uses lr=0). Shifting by one
    # rollout reproduces CleanRL's frac = 1 - (iteration - 1) / num_iterations exactly.
    shift = rollout_size / args.total_timesteps
    learning_rate = (lambda f: min(1.0, f + shift) * lr) if args.anneal_lr else lr

    model = PPO(
        "MlpPolicy",
        env,
        learning_rate=learning_rate,
        n_steps=args.num_steps,
        batch_size=batch_size,
        n_epochs=args.update_epochs,
        gamma=args.gamma,
        gae_lambda=args.gae_lambda,
        clip_range=args.clip_coef,
        clip_range_vf=args.clip_coef if args.clip_vloss else None,
        normalize_advantage=True,
        ent_coef=args.ent_coef,
        vf_coef=args.vf_coef,
        max_grad_norm=args.max_grad_norm,
        policy_kwargs={
            "net_arch": {"pi": [64, 64], "vf": [64, 64]},
            "activation_fn": torch.nn.Tanh,
            "ortho_init": True,
            "log_std_init": 0.0,
            "optimizer_kwargs": {"eps": 1e-5},
        },
        tensorboard_log=args.tb_log,
        seed=args.seed,
        device="cpu",
        verbose=0,
    )

    if args.tb_log is not None:  # run.json, as the trainers write it: learning.py reuses a run only if it matches
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from run_management import progress_channel, record_run

        os.makedirs(args.tb_log, exist_ok=True)
        command = [os.path.basename(__file__), *sys.argv[1:]]
        # its code is this script (and a custom env's module): run_management only writes the record
        only = [os.path.basename(__file__), args.env_id.partition(":")[0]]
        record_run(args.tb_log, command, {"hyperparameters": vars(args)}, None, env_id=args.env_id, only=only)
        channel = progress_channel()
        callback = None if channel is None else LauncherProgress(channel, args.total_timesteps)
    else:
        callback = None
        # Without this SB3 creates an empty $TMPDIR/SB3-<date> log folder on every run.
        model.set_logger(Logger(folder=None, output_formats=[]))

    start = time.perf_counter()
    try:
        model.learn(total_timesteps=args.total_timesteps, callback=callback)
    except KeyboardInterrupt:
        print("sb3_ppo.py: interrupted; SB3 saves no checkpoint here: the run starts afresh", file=sys.stderr)
        sys.exit(130)
    train_seconds = time.perf_counter() - start

    returns = [ep["r"] for ep in list(model.ep_info_buffer)[-100:]]
    mean_return = float(np.mean(returns)) if returns else None
    env.close()
    if args.tb_log is not None:  # summary.json, as the trainers write it: how the run ended and its final return
        summary = {"status": "completed", "env_steps": model.num_timesteps, "mean_return_last_episodes": mean_return}
        with open(os.path.join(args.tb_log, "summary.json"), "w") as f:
            json.dump({**summary, "num_last_episodes": len(returns)}, f, indent=2)

    print(
        json.dumps(
            {
                "impl": "sb3",
                "env_id": args.env_id,
                "total_timesteps": args.total_timesteps,
                "train_seconds": train_seconds,
                # SB3 rounds up to a whole rollout (CleanRL rounds down), so use the steps actually taken.
                "timesteps_run": model.num_timesteps,
                "sps": model.num_timesteps / train_seconds,
                "mean_return_last": mean_return,
                "num_episodes": len(returns),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
