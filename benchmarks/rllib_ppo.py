"""RLlib PPO (new API stack) baseline, meant to be timed as a whole process against dppo_ray.py.

Needs its own venv: ray[rllib] pins gymnasium 1.2.2, the main venv has a newer one (see requirements-rllib.txt).
From the repository root (benchmarks/throughput.py and scaling.py look for it there; git ignores the folder):
    python3 -m venv benchmarks/.venv-rllib && benchmarks/.venv-rllib/bin/pip install \\
        -r benchmarks/requirements-rllib.txt

Hyperparameters follow CleanRL's ppo_continuous_action.py as far as RLlib allows: 64-64 tanh actor and critic without
shared layers, state-independent log std, observation normalization (MeanStdFilter connector, clipped to +-10), GAE
0.99/0.95, clip 0.2, no KL penalty, vf coef 0.5 (on MSE), global-norm gradient clip 0.5, lr linearly annealed to 0
(--no-anneal-lr keeps it constant). Not matched: reward normalization, CleanRL's value clipping (RLlib's vf_clip_param
clips the squared error instead; disabled here), per-minibatch advantage normalization (RLlib normalizes per train
batch), Adam eps 1e-5 (RLlib: torch default 1e-8) and orthogonal weight init.

Prints one JSON line to stdout at the end.

Example:
    benchmarks/.venv-rllib/bin/python benchmarks/rllib_ppo.py --env-id HalfCheetah-v5 --total-timesteps 100000
"""

import argparse
import json
import logging
import os
import time


def quiet_mujoco() -> None:
    """MuJoCo v5 envs otherwise write MUJOCO_LOG.TXT into the cwd (per process, so env runners call this too)."""
    try:
        import mujoco

        cfg = mujoco.MjLogConfig.get()
        cfg.logto_file = False
        cfg.set()
    except (ImportError, AttributeError):
        pass


quiet_mujoco()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-id", type=str, default="HalfCheetah-v5")
    p.add_argument("--total-timesteps", type=int, default=100_000)
    p.add_argument("--num-env-runners", type=int, default=1, help="0 samples in the driver process")
    p.add_argument("--num-envs-per-env-runner", type=int, default=1)
    p.add_argument("--env-runner-cpus", type=float, default=1.0, help="CPUs reserved per env runner (fractions ok)")
    p.add_argument("--train-batch-size", type=int, default=2048, help="env steps per train() iteration")
    p.add_argument("--minibatch-size", type=int, default=64)
    p.add_argument("--num-epochs", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument(
        "--anneal-lr",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="linearly anneal the learning rate to 0 over --total-timesteps like CleanRL",
    )
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--ent-coef", type=float, default=0.0)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--torch-threads", type=int, default=1, help="torch threads of the driver (which hosts the learner)")
    p.add_argument(
        "--obs-norm", action=argparse.BooleanOptionalAction, default=True, help="MeanStdFilter on observations"
    )
    args = p.parse_args()
    if args.total_timesteps < 1 or args.train_batch_size < 1 or args.num_envs_per_env_runner < 1:
        p.error("--total-timesteps, --train-batch-size and --num-envs-per-env-runner must be >= 1")
    if args.num_env_runners < 0 or args.env_runner_cpus <= 0 or args.torch_threads < 1:
        p.error("--num-env-runners must be >= 0, --env-runner-cpus > 0 and --torch-threads >= 1")
    if not 1 <= args.minibatch_size <= args.train_batch_size:
        p.error("--minibatch-size must be between 1 and --train-batch-size")
    # Ray would otherwise leave the env runners that don't fit pending and build_algo() would wait forever.
    needed = args.num_env_runners * args.env_runner_cpus
    if needed > os.cpu_count() + 1e-9:
        p.error(f"--num-env-runners x --env-runner-cpus = {needed:g} exceeds the {os.cpu_count()} CPUs")
    return args


if __name__ == "__main__":
    parse_args()  # --help and bad flags answer here, before importing Ray and RLlib (only the RLlib venv has them)

import gymnasium as gym  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from ray.rllib.algorithms.ppo import PPOConfig  # noqa: E402
from ray.rllib.connectors.env_to_module import MeanStdFilter  # noqa: E402
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig  # noqa: E402
from ray.tune.registry import register_env  # noqa: E402

ENV_NAME = "rllib_ppo_bench_env"


def make_env(env_config: dict) -> gym.Env:
    quiet_mujoco()
    return gym.make(env_config["env_id"])


def mean_std_filter(env=None, spaces=None, device=None) -> MeanStdFilter:
    return MeanStdFilter(clip_by_value=10.0)


def build_config(args: argparse.Namespace) -> PPOConfig:
    # RLlib sets the lr after each update from the lifetime env steps sampled so far, for the next iteration: that is
    # CleanRL's lr * (1 - (iteration - 1) / num_iterations).
    lr = [[0, args.lr], [args.total_timesteps, 0.0]] if args.anneal_lr else args.lr
    return (
        PPOConfig()
        .environment(ENV_NAME, env_config={"env_id": args.env_id})
        .env_runners(
            num_env_runners=args.num_env_runners,
            num_envs_per_env_runner=args.num_envs_per_env_runner,
            num_cpus_per_env_runner=args.env_runner_cpus,
            env_to_module_connector=mean_std_filter if args.obs_norm else None,
        )
        .training(
            lr=lr,
            gamma=args.gamma,
            lambda_=args.gae_lambda,
            clip_param=args.clip_coef,
            vf_loss_coeff=args.vf_coef,
            vf_clip_param=float("inf"),
            entropy_coeff=args.ent_coef,
            use_kl_loss=False,
            grad_clip=args.max_grad_norm,
            grad_clip_by="global_norm",
            train_batch_size_per_learner=args.train_batch_size,
            minibatch_size=args.minibatch_size,
            num_epochs=args.num_epochs,
        )
        .rl_module(
            model_config=DefaultModelConfig(
                fcnet_hiddens=[64, 64],
                fcnet_activation="tanh",
                vf_share_layers=False,
                free_log_std=True,
            )
        )
        .debugging(seed=args.seed, log_level="ERROR")
    )


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.torch_threads)
    register_env(ENV_NAME, make_env)
    ray.init(
        include_dashboard=False,
        logging_level=logging.ERROR,
        num_cpus=os.cpu_count(),
        log_to_driver=False,
    )
    try:
        algo = build_config(args).build_algo()
        steps = 0
        mean_return = None
        start = time.perf_counter()
        while steps < args.total_timesteps:
            result = algo.train()
            runners = result.get("env_runners", {})
            steps = runners.get("num_env_steps_sampled_lifetime", result.get("num_env_steps_sampled_lifetime", 0))
            mean_return = runners.get("episode_return_mean", mean_return)
            if not steps:
                raise RuntimeError("train() reported no env steps sampled; unknown result layout")
        train_seconds = time.perf_counter() - start
        algo.stop()
    finally:
        ray.shutdown()
    print(
        json.dumps(
            {
                "impl": "rllib",
                "env_id": args.env_id,
                "num_env_runners": args.num_env_runners,
                "total_timesteps": int(steps),
                "train_seconds": round(train_seconds, 3),
                "sps": round(steps / train_seconds, 1),
                "mean_return": None if mean_return is None else float(mean_return),
            }
        )
    )


if __name__ == "__main__":
    main()
