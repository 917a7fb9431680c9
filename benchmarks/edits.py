"""Research edits to the scripts, made to a copy of the code: tests/test_edits.py checks that each runs as written, and
throughput.py's ppo_relu and ppo_third_layer measure two of them.

    from edits import edited_copy
    folder = edited_copy(parent, "relu")      # the repository's modules, with the edit made, in parent/relu
"""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODULES = ["ppo_continuous.py", "dppo_ray.py", "gae.py", "fast_paths.py", "run_utils.py"]

# Edits as a researcher makes them: (file, text in the file, its replacement). Each text must occur exactly once.
MLP_LAYERS = """        layer_init(nn.Linear(in_dim, 64)),
        nn.Tanh(),
        layer_init(nn.Linear(64, 64)),
        nn.Tanh(),
"""
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
            "            self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))",
            "            self.actor_logstd = layer_init(nn.Linear(obs_dim, act_dim), std=0.01)",
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
            "optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)",
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
    # Not in the list: edits that keep a fast path on
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
            "optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)",
            "optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-7, betas=(0.8, 0.99))",
        )
    ],
}
# Which fast paths stay on after each edit: (acting, update)
EXPECTED = {
    "relu": (True, True),
    "third_hidden_layer": (True, True),
    "layer_norm": (True, False),  # numpy runs the LayerNorm layers in torch; the stacked update cannot
    "state_dependent_std": (False, False),
    "extra_loss_term": (True, False),
    "shared_trunk": (False, False),
    "sgd": (True, False),
    "tanh_mean": (False, False),
    "silu_wider": (True, True),
    "adam_betas": (True, True),
}


def edited_copy(parent: Path, edit: str) -> Path:
    """A folder parent/edit holding the repository's modules, with the edit made."""
    folder = Path(parent) / edit
    folder.mkdir()
    for name in MODULES:
        shutil.copy(REPO / name, folder / name)
    for name, old, new in EDITS[edit]:
        text = (folder / name).read_text()
        if text.count(old) != 1:
            raise ValueError(f"{edit}: the text to replace is not in {name} exactly once: {old!r}")
        (folder / name).write_text(text.replace(old, new))
    return folder
