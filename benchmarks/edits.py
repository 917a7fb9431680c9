"""Research edits to the scripts, made to a copy of the code: tests/test_edits.py checks that each runs as written, and
throughput.py's ppo_relu, ppo_third_layer, ppo_dual_clip and ppo_huber measure four of them.

    from edits import edited_copy
    folder = edited_copy(parent, "relu")      # the repository's modules, with the edit made, in parent/relu
"""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODULES = [
    "ppo_continuous.py",
    "launcher.py",
    "command_line.py",
    "ray_cluster.py",
    "run_record.py",
    "seed_statistics.py",
    "stop_signals.py",
    "dppo_ray.py",
    "gae.py",
    "fast_paths.py",
    "checkpoints.py",
    "run_management.py",
]

# Edits as a researcher makes them: (file, text in the file, its replacement). Each text must occur exactly once.
MLP_LAYERS = """        layer_init(nn.Linear(in_dim, 64)),
        nn.Tanh(),
        layer_init(nn.Linear(64, 64)),
        nn.Tanh(),
"""
GET_VALUE = """    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)
"""
GET_DISTRIBUTION = """        \"\"\"The policy at observations x: one distribution over whole action vectors.\"\"\"
"""
EVALUATE_RETURN = "        return dist.log_prob(action), dist.entropy(), self.get_value(x)\n"
GAUSSIAN = "        return Independent(Normal(action_mean, action_std, validate_args=False), 1, validate_args=False)"
TANH_SQUASHED = """        tanh = torch.distributions.TanhTransform()
        return Independent(torch.distributions.TransformedDistribution(Normal(action_mean, action_std), tanh), 1)"""
# A squashed action of exactly +-1 has log-probability -inf: the log-probability is taken just inside; the negative
# log-probability of the action taken estimates the entropy, which a squashed Gaussian has no closed form for
TANH_EVALUATE_RETURN = """        logprob = dist.log_prob(action.clamp(-1 + 1e-6, 1 - 1e-6))
        return logprob, -logprob, self.get_value(x)
"""
MIXTURE = """        means = torch.stack([action_mean, action_mean + 1], -2)
        components = Independent(Normal(means, action_std[..., None, :]), 1)
        weights = torch.distributions.Categorical(logits=torch.zeros(*action_mean.shape[:-1], 2))
        return torch.distributions.MixtureSameFamily(weights, components)"""
EDITS = {
    "relu": [("ppo_continuous.py", MLP_LAYERS, MLP_LAYERS.replace("nn.Tanh()", "nn.ReLU()"))],
    "third_hidden_layer": [
        ("ppo_continuous.py", MLP_LAYERS, MLP_LAYERS + "        layer_init(nn.Linear(64, 64)),\n        nn.Tanh(),\n")
    ],
    "layer_norm": [
        (
            "ppo_continuous.py",
            MLP_LAYERS,
            MLP_LAYERS.replace("64)),\n        nn.Tanh()", "64)),\n        nn.LayerNorm(64),\n        nn.Tanh()"),
        )
    ],
    "state_dependent_std": [
        (
            "ppo_continuous.py",
            "        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))",
            "        self.actor_logstd = layer_init(nn.Linear(obs_dim, act_dim), std=0.01)",
        ),
        (
            "ppo_continuous.py",
            "        action_std = self.actor_logstd.expand_as(action_mean).exp()",
            "        action_std = self.actor_logstd(x).exp()",
        ),
    ],
    "extra_loss_term": [
        (
            "gae.py",
            "    loss = policy_loss + vf_coef * value_loss\n",
            "    loss = policy_loss + vf_coef * value_loss + 0.1 * ((ratio - 1.0) - logratio).mean()\n",
        )
    ],
    "shared_trunk": [
        (
            "ppo_continuous.py",
            """        self.critic = mlp(obs_dim, 1, out_std=1.0)
        self.actor_mean = mlp(obs_dim, act_dim, out_std=0.01)
""",
            """        self.trunk = nn.Sequential(layer_init(nn.Linear(obs_dim, 64)), nn.Tanh())
        self.critic = layer_init(nn.Linear(64, 1), std=1.0)
        self.actor_mean = layer_init(nn.Linear(64, act_dim), std=0.01)
""",
        ),
        (
            "ppo_continuous.py",
            "        return self.critic(x).squeeze(-1)",
            "        return self.critic(self.trunk(x)).squeeze(-1)",
        ),
        (
            "ppo_continuous.py",
            "        action_mean = self.actor_mean(x)",
            "        action_mean = self.actor_mean(self.trunk(x))",
        ),
    ],
    "sgd": [
        (
            "ppo_continuous.py",
            "optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)",
            "optim.SGD(agent.parameters(), lr=args.learning_rate, momentum=0.9)",
        )
    ],
    # Not in the list: an edit that changes nothing at the initial weights (means near 0), only later
    "tanh_mean": [
        (
            "ppo_continuous.py",
            "        action_mean = self.actor_mean(x)",
            "        action_mean = torch.tanh(self.actor_mean(x))",
        )
    ],
    "silu_wider": [
        (
            "ppo_continuous.py",
            MLP_LAYERS,
            MLP_LAYERS.replace("nn.Tanh()", "nn.SiLU()").replace("64)", "128)").replace("Linear(64,", "Linear(128,"),
        ),
        (
            "ppo_continuous.py",
            "        layer_init(nn.Linear(64, out_dim), std=out_std),",
            "        layer_init(nn.Linear(128, out_dim), std=out_std),",
        ),
    ],
    "adam_betas": [
        (
            "ppo_continuous.py",
            "optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)",
            "optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-7, betas=(0.8, 0.99))",
        )
    ],
    # Edits of acting the start-up check cannot see, which the audit on the run's own data must catch
    # (tests/test_edits.py runs the first two with --no-norm-obs, so that Pendulum's angular velocity reaches past 5)
    "input_clamp": [
        (
            "ppo_continuous.py",
            GET_VALUE,
            GET_VALUE.replace("        return", "        x = x.clamp(-5, 5)\n        return"),
        ),
        ("ppo_continuous.py", GET_DISTRIBUTION, GET_DISTRIBUTION + "        x = x.clamp(-5, 5)\n"),
    ],
    "drift_beyond_4": [  # the numpy actor, mirrored wrongly for inputs beyond 4 only
        (
            "fast_paths.py",
            "(lambda x: x @ weight + bias)",
            "(lambda x: np.where(np.abs(x) > 4, 1.01 * x, x) @ weight + bias)",
        ),
    ],
    "std_floor": [  # reached only once training has driven the log-std down (the test's flags do that)
        (
            "ppo_continuous.py",
            "        action_std = self.actor_logstd.expand_as(action_mean).exp()",
            "        action_std = self.actor_logstd.clamp(min=-0.2).expand_as(action_mean).exp()",
        )
    ],
    "gradient_hook": [
        (
            "ppo_continuous.py",
            "    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)\n",
            "    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)\n"
            "    for p in agent.parameters():\n        p.register_hook(lambda g: g * 0.5)\n",
        )
    ],
    "dropout": [
        ("ppo_continuous.py", MLP_LAYERS, MLP_LAYERS.replace("nn.Tanh(),\n", "nn.Tanh(),\n        nn.Dropout(0.1),\n"))
    ],
    "random_ops_in_gradient": [  # functional dropout, noise on the loss and on the gradients: no layer to see
        (
            "ppo_continuous.py",
            GET_VALUE,
            GET_VALUE.replace(
                "self.critic(x).squeeze(-1)",
                "nn.functional.dropout(self.critic(x), 0.1, training=self.training).squeeze(-1)",
            ),
        ),
        (
            "ppo_continuous.py",
            "    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))\n",
            "    grads = [g + 1e-4 * torch.randn_like(g) for g in grads]\n"
            "    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))\n",
        ),
        (
            "gae.py",
            "    loss = policy_loss + vf_coef * value_loss\n",
            "    loss = policy_loss + vf_coef * value_loss * (1.0 + 0.05 * torch.rand(()))\n",
        ),
    ],
    "tanh_squashed": [  # README's worked example: SAC's squashed Gaussian, with an entropy estimate
        (
            "ppo_continuous.py",
            GAUSSIAN,
            TANH_SQUASHED,
        ),
        ("ppo_continuous.py", EVALUATE_RETURN, TANH_EVALUATE_RETURN),
    ],
    "tanh_no_entropy": [  # the same without the entropy estimate: one line saying what to do
        (
            "ppo_continuous.py",
            GAUSSIAN,
            TANH_SQUASHED,
        ),
    ],
    "mixture_policy": [  # a mixture of two Gaussians: no entropy (an estimate is returned) and no mode
        ("ppo_continuous.py", GAUSSIAN, MIXTURE),
        ("ppo_continuous.py", EVALUATE_RETURN, TANH_EVALUATE_RETURN.replace(".clamp(-1 + 1e-6, 1 - 1e-6)", "")),
    ],
    # Loss edits (throughput.py measures these two)
    "dual_clip": [
        (
            "gae.py",
            "    surrogate = torch.max(unclipped, clipped)\n",
            "    surrogate = torch.max(unclipped, clipped)\n"
            "    surrogate = torch.where(advantages < 0, torch.min(surrogate, -3.0 * advantages), surrogate)\n",
        )
    ],
    "huber_value_loss": [
        (
            "gae.py",
            "        value_loss = 0.5 * torch.max(squared, squared_clipped).mean()\n",
            "        value_loss = torch.nn.functional.huber_loss(new_values, returns)\n",
        )
    ],
}
# The seams between the code a researcher edits and what trains: each must train as written on both paths
SEAMS = {
    # the optimizer's own step takes every step: a step hook, its state, what the loop does to .grad and .data
    "optimizer_step_hook": [
        (
            "ppo_continuous.py",
            "    return Learner(agent, optimizer, ",
            "    optimizer.register_step_post_hook(lambda opt, args, kwargs: [p.data.clamp_(-0.5, 0.5) "
            "for p in agent.parameters()])\n    return Learner(agent, optimizer, ",
        )
    ],
    "optimizer_state_cleared": [
        (
            "ppo_continuous.py",
            "        ent_coef = anneal(run.learner.optimizer, args, iteration)\n",
            "        ent_coef = anneal(run.learner.optimizer, args, iteration)\n"
            "        run.learner.optimizer.state.clear()\n",
        )
    ],
    "gradient_rebound": [
        (
            "ppo_continuous.py",
            "            learner.optimizer.step()\n",
            "            for p in learner.agent.parameters():\n                p.grad = p.grad * 0.5 + 0.001\n"
            "            learner.optimizer.step()\n",
        )
    ],
    "data_rebound": [
        (
            "ppo_continuous.py",
            "            ratios.append(stats.ratio.detach())\n",
            "            for p in learner.agent.parameters():  # after the step\n"
            "                p.data = p.data.clamp(-0.3, 0.3)\n"
            "            ratios.append(stats.ratio.detach())\n",
        )
    ],
    # acting: TorchActor is what the numpy actor is checked against
    "torch_actor_noise": [
        (
            "ppo_continuous.py",
            "                return (gaussian.loc + gaussian.scale * torch.from_numpy(noise)",
            "                return (gaussian.loc + 0.5 * gaussian.scale * torch.from_numpy(noise)",
        )
    ],
    # the loss, in its clipped region only: a dual clip of the ratio from above, binding once ratios leave 1
    "upper_clip_only": [
        (
            "gae.py",
            "    surrogate = torch.max(unclipped, clipped)\n",
            "    surrogate = torch.max(unclipped, clipped)\n"
            "    surrogate = torch.where(ratio > 1.0 + 2 * clip_coef, surrogate.detach(), surrogate)\n",
        )
    ],
    "module_forward_hook": [
        (
            "ppo_continuous.py",
            "        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))\n",
            "        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))\n"
            "        self.critic.register_forward_hook(lambda module, inputs, output: output * 0.5)\n",
        )
    ],
    # the one gradient function, which the compiled and the eager path both run
    "gradient_function_edit": [
        (
            "ppo_continuous.py",
            "    grads = torch.autograd.grad(stats.loss, params, allow_unused=True)\n",
            "    penalty = 1e-3 * sum((p**2).sum() for p in params)  # an L2 penalty where the gradient is taken\n"
            "    grads = torch.autograd.grad(stats.loss + penalty, params, allow_unused=True)\n",
        )
    ],
    # what autograd leaves alone: a frozen first critic layer (fixed random features)
    "frozen_layer": [
        (
            "ppo_continuous.py",
            "        self.critic = mlp(obs_dim, 1, out_std=1.0)\n",
            "        self.critic = mlp(obs_dim, 1, out_std=1.0)\n        self.critic[0].requires_grad_(False)\n",
        )
    ],
}
EDITS |= SEAMS

# Edits of every layer of the script that --num-seeds must run in each seed as its single run does, made together in
# one copy (tests/test_num_seeds.py): the update loop (gradients accumulated over two minibatches), the training loop
# (Adam's state cleared every other iteration, a scheduler stepped each iteration, numpy's global generator drawn),
# make_learner (a learning rate per parameter group), the Agent (a Python attribute drawn at initialization that
# differs by seed, a frozen layer) and the loss (a random op); "seed_random_layers" adds a Dropout to the critic and
# the actor, which train with the eager gradient and act with torch; "seed_state_everywhere" keeps state outside the
# run's objects, everywhere a researcher's code can.
SEED_EDITS = {
    "seed_all_layers": [
        (
            "ppo_continuous.py",
            "            stats, grad_norm = gradient(learner, minibatch, loss_kwargs, args.max_grad_norm)\n",
            "            stats, grad_norm = gradient(learner, minibatch, loss_kwargs, args.max_grad_norm)\n"
            "            params = [p for p in learner.agent.parameters() if p.grad is not None]\n"
            "            if len(ratios) % 2 == 0:  # accumulate two minibatches' gradients, then step\n"
            "                held = [p.grad for p in params]\n"
            "                ratios.append(stats.ratio.detach())\n"
            "                continue\n"
            "            for p, g in zip(params, held):\n"
            "                p.grad = (p.grad + g) / 2\n",
        ),
        (
            "ppo_continuous.py",
            "        iteration = run.state.iteration + 1\n",
            "        iteration = run.state.iteration + 1\n"
            "        if iteration % 2 == 0:\n"
            "            run.learner.optimizer.state.clear()\n",
        ),
        (
            "ppo_continuous.py",
            "    args = run.args\n    while run.state.iteration",
            "    args = run.args\n"
            "    scheduler = optim.lr_scheduler.ExponentialLR(run.learner.optimizer, gamma=0.7)\n"
            "    while run.state.iteration",
        ),
        (
            "ppo_continuous.py",
            "        log_update(run, batch, stats, problem, ent_coef)\n",
            "        scheduler.step()\n        log_update(run, batch, stats, problem, ent_coef)\n",
        ),
        (
            "ppo_continuous.py",
            "        ent_coef = anneal(run.learner.optimizer, args, iteration)\n",
            "        ent_coef = anneal(run.learner.optimizer, args, iteration) + 0.01 * np.random.rand()\n",
        ),
        (
            "ppo_continuous.py",
            "    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)\n",
            "    critic = list(agent.critic.parameters())\n"
            "    rest = [p for p in agent.parameters() if all(p is not q for q in critic)]\n"
            '    groups = [{"params": critic, "lr": 3 * args.learning_rate}, {"params": rest}]\n'
            "    optimizer = optim.Adam(groups, lr=args.learning_rate, eps=1e-5, fused=True)\n",
        ),
        (
            "ppo_continuous.py",
            "        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))\n",
            "        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))\n"
            "        self.return_scale = round(1.0 + torch.rand(()).item(), 3)\n",
        ),
        ("ppo_continuous.py", GET_VALUE, GET_VALUE.replace("squeeze(-1)", "squeeze(-1) * self.return_scale")),
        *EDITS["frozen_layer"],
        (
            "gae.py",
            "    loss = policy_loss + vf_coef * value_loss\n",
            "    loss = policy_loss + vf_coef * value_loss * (1.0 + 0.1 * torch.rand(()))\n",
        ),
    ],
    "seed_random_layers": [
        (
            "ppo_continuous.py",
            "        self.critic = mlp(obs_dim, 1, out_std=1.0)\n",
            "        self.critic = mlp(obs_dim, 1, out_std=1.0)\n        self.critic.insert(2, nn.Dropout(0.1))\n",
        ),
        (  # acting draws too
            "ppo_continuous.py",
            "        self.actor_mean = mlp(obs_dim, act_dim, out_std=0.01)\n",
            "        self.actor_mean = mlp(obs_dim, act_dim, out_std=0.01)\n"
            "        self.actor_mean.insert(2, nn.Dropout(0.1))\n",
        ),
        (
            "ppo_continuous.py",
            "        ent_coef = anneal(run.learner.optimizer, args, iteration)\n",
            "        ent_coef = anneal(run.learner.optimizer, args, iteration) + 0.01 * np.random.rand()\n",
        ),
    ],
    # State a researcher's code keeps outside the run's objects, each of which a seed sharing a process with others
    # would see mixed with theirs: module globals, a cache, a class attribute, numpy's and torch's global generators,
    # an attribute made on first use, an edit of the rollout, and the training loop reading the Sampler's envs.
    "seed_state_everywhere": [
        (
            "ppo_continuous.py",
            "def ppo_update(",
            "UPDATES_DONE = 0  # a schedule driven by a module-level counter\n\n\ndef ppo_update(",
        ),
        (
            "ppo_continuous.py",
            '    problem = gae.too_few_samples(len(batch["advantages"]), batch["size"])\n',
            "    global UPDATES_DONE\n"
            "    UPDATES_DONE += 1\n"
            "    for group in learner.optimizer.param_groups:\n"
            '        group["lr"] = group["lr"] / UPDATES_DONE\n'
            '    problem = gae.too_few_samples(len(batch["advantages"]), batch["size"])\n',
        ),
        ("ppo_continuous.py", "import importlib\n", "import functools\nimport importlib\n"),
        (
            "ppo_continuous.py",
            "def prepare_batch(",
            "@functools.lru_cache\n"
            "def reward_scale() -> float:\n"
            "    return 1.0 + float(np.random.rand())  # drawn once, cached\n\n\n"
            'REWARD_MEAN = {"running": 0.0}  # a module-level running statistic\n'
            "VALUE_OFFSET = 0.0  # a module-level float that Agent.get_value reads\n\n\n"
            "def prepare_batch(",
        ),
        (
            "ppo_continuous.py",
            '    rewards = rollout["rewards"]\n',
            '    REWARD_MEAN["running"] = 0.9 * REWARD_MEAN["running"] + 0.1 * float(rollout["rewards"].mean())\n'
            '    rewards = rollout["rewards"] * reward_scale() - 0.1 * REWARD_MEAN["running"]\n',
        ),
        (
            "ppo_continuous.py",
            "class Agent(nn.Module):\n",
            "class Agent(nn.Module):\n    calls: list = []  # a mutable class attribute\n",
        ),
        (
            "ppo_continuous.py",
            GET_VALUE,
            "    def get_value(self, x: torch.Tensor) -> torch.Tensor:\n"
            "        Agent.calls.append(1)\n"
            "        scale = 1.0 + 0.001 * min(len(Agent.calls), 50)\n"
            "        return self.critic(x).squeeze(-1) * scale + VALUE_OFFSET\n",
        ),
        (
            "ppo_continuous.py",
            "        ent_coef = anneal(run.learner.optimizer, args, iteration)\n",
            "        ent_coef = anneal(run.learner.optimizer, args, iteration) * len(run.sampler.envs)\n"
            "        global VALUE_OFFSET\n"
            "        VALUE_OFFSET += 0.01\n",
        ),
        (
            "ppo_continuous.py",
            "        return self.rng.standard_normal((*shape, *self.action_space.shape))\n",
            "        drawn = self.rng.standard_normal((*shape, *self.action_space.shape))\n"
            "        return drawn + 0.01 * torch.randn(drawn.shape, dtype=torch.float64).numpy()\n",
        ),
        (
            "ppo_continuous.py",
            "        seen = [self.raw_obs]\n",
            "        seen = [self.raw_obs]\n        steps += int(np.random.randint(0, 3))\n",
        ),
        (
            "ppo_continuous.py",
            "            acting_obs = self.normalize(raw_obs[step], out=obs[step], fill=0.0)\n",
            "            acting_obs = self.normalize(raw_obs[step], out=obs[step], fill=0.0)\n"
            "            noise[step] += 0.01 * np.random.standard_normal(noise[step].shape)\n",
        ),
        (
            "ppo_continuous.py",
            "        rollout = self.sample(num_steps)\n",
            "        rollout = self.sample(num_steps)\n"
            '        self.rollouts_done = getattr(self, "rollouts_done", 0) + 1  # made on first use\n'
            '        rollout["rewards"] = rollout["rewards"] + 0.1 * self.rollouts_done  # a reward bonus\n',
        ),
    ],
}

# Edits of the training loop and its steps, made together in one copy (tests/test_edits.py): a scalar logged in
# log_update, one in rollout_batch, and one in training_loop itself, which also changes the batch before the update
# (zero advantages: the policy loss is 0 in every update); a line printed by the rollout's wrapper, sample_rollout;
# a field added to the checkpoint in save_checkpoint. dppo_ray.py's learner runs this loop, so each shows in its runs
# as in the single run's.
LOOP_EDITS = {
    "loop_steps": [
        (
            "ppo_continuous.py",
            "        run.monitor.diagnose(stats)  # health warnings, progress bar\n",
            '        run.monitor.writer.add_scalar("charts/edited_scalar", 7.0, run.state.global_step)\n'
            "        run.monitor.diagnose(stats)  # health warnings, progress bar\n",
        ),
        (
            "ppo_continuous.py",
            "    update_statistics(rollout, learner, run.args)\n",
            '    writer.add_scalar("charts/edited_rollout_steps", int(rollout["env_steps"]), state.global_step)\n'
            "    update_statistics(rollout, learner, run.args)\n",
        ),
        (
            "ppo_continuous.py",
            "        stats, problem = ppo_update(run.learner, batch, args, loss_settings(args, ent_coef), iteration)\n",
            '        run.monitor.writer.add_scalar("charts/edited_loop_iteration", iteration, run.state.global_step)\n'
            '        batch["advantages"] = torch.zeros_like(batch["advantages"])\n'
            "        stats, problem = ppo_update(run.learner, batch, args, loss_settings(args, ent_coef), iteration)\n",
        ),
        (
            "ppo_continuous.py",
            "            return sampler.rollout(num_steps)\n",
            "            rollout = sampler.rollout(num_steps)\n"
            "            print(f\"edited rollout wrapper: {rollout['env_steps']} steps\", file=sys.stderr)\n"
            "            return rollout\n",
        ),
        (
            "ppo_continuous.py",
            '    checkpoint["sampler_rng"] = run.sampler.rng_state\n',
            '    checkpoint["sampler_rng"] = run.sampler.rng_state\n'
            '    checkpoint["edited_field"] = run.state.iteration\n',
        ),
    ],
}

# Which way each part runs after each edit: (numpy acting, compiled gradient)
EXPECTED = {
    "relu": (True, True),
    "third_hidden_layer": (True, True),
    "layer_norm": (True, True),  # numpy runs the LayerNorm layers in torch
    "state_dependent_std": (False, True),
    "extra_loss_term": (True, True),
    "shared_trunk": (False, True),
    "sgd": (True, True),
    "tanh_mean": (False, True),
    "silu_wider": (True, True),
    "adam_betas": (True, True),
    "input_clamp": (False, True),  # acting at iteration 1, by the audit
    "drift_beyond_4": (False, True),  # at iteration 1, by the audit
    "std_floor": (False, True),  # acting a few iterations in, by the audit
    "gradient_hook": (True, False),
    "dropout": (False, True),  # the compiled graph draws with torch's generator, as eager does
    "random_ops_in_gradient": (True, True),
    "tanh_squashed": (False, True),
    "dual_clip": (True, True),
    "huber_value_loss": (True, True),
    "optimizer_step_hook": (True, True),
    "optimizer_state_cleared": (True, True),
    "gradient_rebound": (True, True),
    "data_rebound": (True, True),
    "torch_actor_noise": (False, True),
    "upper_clip_only": (True, True),
    "module_forward_hook": (False, False),
    "gradient_function_edit": (True, True),
    "frozen_layer": (True, True),
}
# The parts that the audit moves to the plain path during the run (the others step aside at start-up, if at all)
AUDITED = {
    "input_clamp": {"acting"},
    "drift_beyond_4": {"acting"},
    "std_floor": {"acting"},
}


def edited_copy(parent: Path, edit: str) -> Path:
    """A folder parent/edit holding the repository's modules, with the edit made."""
    folder = Path(parent) / edit
    folder.mkdir()
    for name in MODULES:
        shutil.copy(REPO / name, folder / name)
    for name, old, new in (EDITS | SEED_EDITS | LOOP_EDITS)[edit]:
        text = (folder / name).read_text()
        if text.count(old) != 1:
            raise ValueError(f"{edit}: the text to replace is not in {name} exactly once: {old!r}")
        (folder / name).write_text(text.replace(old, new))
    return folder
