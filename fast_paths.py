"""Fast paths: what stands in for ppo_continuous.py's plain code on the hot loops, and when it may.

- **Acting, mirrored.** `NumpyActor` stands in for `TorchActor` (Agent.get_distribution, one torch call per env
  step): the actor net walked layer by layer in numpy (a layer it cannot mirror runs in torch), with the Gaussian's
  state-independent log-std. It is a second implementation, so it is checked: at start-up on random inputs
  (`check_acting`), and on every rollout against TorchActor on the very observations and noise it acted with
  (`audit_acting`). One that differs steps aside with one line; the rollout it acted in is sampled again with torch.
- **The gradient, derived.** The update has no second implementation: its gradient is the script's one gradient
  function (ppo_continuous.clipped_gradient, autograd's through Agent and gae.ppo_loss, passed in by the script),
  compiled with torch.compile where it compiles (`compile_for`, `compiled_step`), and every step is the optimizer's
  own. What this file adds is the plumbing around it: the gradient left in each trained tensor's .grad (`set_grads`),
  this update's choice of compiled or eager (`update_gradient`), when the compiled graph cannot stand in for the
  function run eagerly (`compile_blockers`: a gradient hook, a module hook, a random layer, a buffer) or neither runs
  a hook (`unrun_hook`), said in one line, and which way each part runs (`choose_paths`).

`FastPaths` records which way each part runs, for the console, TensorBoard and summary.json.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import re
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from checkpoints import PROG, StopRun, agent_attributes, unwrapped
from gae import LOG_SQRT_2PI, PPOLoss
from run_record import first_line

# A mirror matches when each value it computes differs from the plain path's by at most this fraction of that value's
# largest magnitude (see relative_differences). Both compute in float32, whose rounding (about 1e-7 relative)
# accumulates over a few layers to around 1e-6; a real difference in the math (another activation, a clamp that binds)
# is orders of magnitude larger.
TOLERANCE = 1e-4

# A gradient function that keeps recompiling (a Python number the graph holds as a constant, changed at every call)
# would rebuild its graph at every change: after this many recompiles it runs eagerly instead, with one line.
RECOMPILES = 2

# The compile rule: by default a run compiles its gradient only when it takes enough gradient steps to repay a cold
# build of the graph (a run after an edit of what the gradient traces, or the first on a machine): the build's cost over
# what a compiled step saves, as benchmarks/compile_rule.py measures them (benchmarks/results/README.md has the figures)
COMPILE_PAYS_AFTER_STEPS = 20_000

RANDOM_LAYERS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def say(line: str) -> None:
    """One line on stderr under the running script's name: why a fast path stepped aside, and the training script's
    other notes (an attribute the samplers' copies do not carry)."""
    tqdm.write(f"{PROG}: {line}", file=sys.stderr)  # above a progress bar, not inside it


def failure(e: BaseException) -> str:
    """An exception in a few words: its type and its message in one line (run_record.first_line: torch.compile's
    "backend='inductor' raised:" with its cause)."""
    text = first_line(e) if str(e).strip() else "no message"
    return f"{type(e).__name__}: {text[:240]}"


class DoesNotFit(Exception):
    """The network is not one the numpy actor can mirror; the message says why."""


# ---------------------------------------------------------------------------------------------------------------------
# Acting: the actor net in numpy
# ---------------------------------------------------------------------------------------------------------------------
def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)  # the same function, without exp's overflow for large |x|


def numpy_layer(module: nn.Module):
    """A numpy function computing `module`, for the layers of an MLP; a layer it cannot mirror runs in torch."""
    if isinstance(module, nn.Linear):
        weight = module.weight.detach().cpu().numpy().T.copy()
        bias = None if module.bias is None else module.bias.detach().cpu().numpy().copy()
        return (lambda x: x @ weight) if bias is None else (lambda x: x @ weight + bias)
    if type(module) is nn.Tanh:
        return np.tanh
    if type(module) is nn.ReLU:
        return lambda x: np.maximum(x, 0.0)
    if type(module) is nn.LeakyReLU:
        slope = module.negative_slope
        return lambda x: np.where(x > 0, x, slope * x)
    if type(module) is nn.ELU:
        alpha = module.alpha
        return lambda x: np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0)))
    if type(module) is nn.SiLU:
        return lambda x: x * sigmoid(x)
    if type(module) is nn.Sigmoid:
        return sigmoid
    if type(module) is nn.Identity:
        return lambda x: x
    return torch_layer(module)


def torch_layer(module: nn.Module):
    """`module` called from numpy: its own code, on the CPU."""
    module = copy.deepcopy(module).cpu()

    def run(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))).numpy()

    return run


class NumpyActor:
    """TorchActor's fast path: the Agent's actor net (`agent.actor_mean`, an nn.Sequential) mirrored in numpy, and a
    Gaussian with the state-independent log-std `agent.actor_logstd`. Built from the sampler's copy of the Agent
    whenever new weights arrive."""

    def __init__(self, agent: nn.Module):
        if not isinstance(getattr(agent, "actor_mean", None), nn.Sequential):
            raise DoesNotFit("Agent.actor_mean is not an nn.Sequential to mirror")
        self.layers = [numpy_layer(module) for module in agent.actor_mean]
        logstd = getattr(agent, "actor_logstd", None)
        if not isinstance(logstd, torch.Tensor) or logstd.dim() != 2 or logstd.shape[0] != 1:
            raise DoesNotFit("Agent has no state-independent actor_logstd of shape (1, action_dim)")
        self.logstd = logstd.detach().cpu().double().numpy().reshape(-1)
        self.std = np.exp(self.logstd)
        self.logprob_offset = self.logstd.sum() + len(self.logstd) * LOG_SQRT_2PI

    def actor(self, obs: np.ndarray) -> np.ndarray:
        """The actor net's output: the Gaussian's mean."""
        for layer in self.layers:
            obs = layer(obs)
        return obs

    def act(self, obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Actions for a batch of observations, drawn with the rollout's standard normal `noise` (N, action_dim)."""
        return self.actor(obs) + self.std * noise

    def log_prob(self, obs: np.ndarray, actions: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Log-probabilities of the actions `act` drew (any leading shape). They follow from the noise alone, so a
        rollout computes them once, after its loop."""
        return -0.5 * (noise * noise).sum(axis=-1) - self.logprob_offset


def perturbed_copy(agent: nn.Module) -> nn.Module:
    """A CPU copy of the agent with every parameter moved by random noise: at the initial weights the actor's means
    are near 0 and its log-std is 0, where an edit such as a tanh on the mean or a clamp on the std changes nothing;
    the check must see the network where it will train."""
    copied = copy.deepcopy(agent).cpu()
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in copied.parameters():
            param.add_(0.3 * torch.randn(param.shape, generator=generator).to(param.dtype))
    return copied


def check_acting(agent: nn.Module, plain_actor: type, rows: int = 64) -> str | None:
    """None when NumpyActor acts as `plain_actor` (ppo_continuous.TorchActor) does, on random observations and noise
    with a perturbed copy of the agent: the same actions and log-probabilities; else why not."""
    generator = torch.Generator().manual_seed(0)
    try:
        cpu_agent = perturbed_copy(agent)
        obs = torch.randn(rows, agent.obs_dim, generator=generator).numpy()
        noise = torch.randn(rows, agent.act_dim, generator=generator).double().numpy()
        numpy_actor, torch_actor = NumpyActor(cpu_agent), plain_actor(cpu_agent)
        actions = torch_actor.act(obs, noise)
        if not np.array_equal(actions, torch_actor.act(obs, noise)):
            raise DoesNotFit(
                "TorchActor gives two answers for one observation and noise: it draws randomness of its own (a random "
                "layer, or a distribution it does not draw from the rollout's Gaussian noise)"
            )
        fast_actions = numpy_actor.act(obs, noise)
        compared = {
            "actions": (fast_actions, actions),
            "log-probabilities": (numpy_actor.log_prob(obs, actions, noise), torch_actor.log_prob(obs, actions, noise)),
        }
    except DoesNotFit as e:
        return f"the network does not fit it ({e})"
    except Exception as e:  # noqa: BLE001 (any network that the plain path runs must not end the run here)
        return f"mirroring Agent failed ({failure(e)})"
    _, reason = worst_of(compared, "TorchActor")
    return reason


def audit_acting(actor: NumpyActor, plain_actor, obs: np.ndarray, noise: np.ndarray, actions, logprobs):
    """NumpyActor against `plain_actor` (the TorchActor the plain path acts with) on a rollout's own data: the actions
    the rollout took and the log-probabilities it stored, against what TorchActor computes from the same observations
    and noise. Returns the largest difference as a fraction of its value's scale, and what differed when that is
    beyond float noise (None otherwise)."""
    flat_obs = obs.reshape(-1, obs.shape[-1])
    flat_noise = noise.reshape(len(flat_obs), -1)
    flat_actions = actions.reshape(len(flat_obs), -1)
    compared = {
        "actions": (flat_actions, plain_actor.act(flat_obs, flat_noise)),
        # the noise-free part on its own scale: a small change of the mean hides in the noise of a whole action
        "mean actions": (flat_actions - actor.std * flat_noise, plain_actor.act(flat_obs, np.zeros_like(flat_noise))),
        "log-probabilities of the actions taken": (logprobs, plain_actor.log_prob(obs, actions, noise)),
    }
    return worst_of(compared, "TorchActor on this rollout's observations")


def sample_again(sampler, discarded: dict, num_steps: int) -> dict[str, np.ndarray]:
    """A rollout of `sampler` acting with torch, in place of `discarded`, whose numpy actor failed its audit: it
    carries the discarded rollout's steps, episodes and audit, which count (ppo_continuous.Sampler.rollout)."""
    sampler.policy = sampler.make_actor(False)
    again = sampler.sample(num_steps)
    again["env_steps"] += discarded["env_steps"]
    for key in ("episode_returns", "episode_lengths"):
        again[key] = np.concatenate([discarded[key], again[key]])
    return again | {key: discarded[key] for key in ("acting_audit", "acting_problem")}


def module_hooks(agent: nn.Module) -> str | None:
    """A forward or backward hook on one of the Agent's modules, or a global one, in words, or None: where there is
    one, neither the numpy mirror nor the compiled gradient stands in (acting_blockers and compile_blockers ask)."""
    from torch.nn.modules import module as module_globals

    hooked = [name or "Agent" for name, m in agent.named_modules() if m._forward_hooks or m._forward_pre_hooks]
    hooked += [name or "Agent" for name, m in agent.named_modules() if m._backward_hooks or m._backward_pre_hooks]
    if hooked:
        return f"a module hook on {hooked[0]}"
    if any(getattr(module_globals, f"_global_{kind}_hooks", None) for kind in ("forward", "forward_pre", "backward")):
        return "a global module hook (torch.nn.modules.module.register_module_*_hook)"
    return None


def batch_norm_in_training(agent: nn.Module) -> str | None:
    """A BatchNorm layer in training mode, in words: each output row depends on the other rows of its batch, and its
    running statistics are buffers that every forward pass changes; None when there is none."""
    for name, module in agent.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.training:
            return (
                f"a BatchNorm layer ({type(module).__name__}) in {name or 'Agent'} in training mode (its batch "
                "statistics make each row depend on the rest of the batch, and every forward pass changes its running "
                "statistics; LayerNorm normalizes each row alone)"
            )
    return None


def acting_blockers(agent: nn.Module) -> str | None:
    """What a numpy mirror of a sampler's copy cannot carry (a random layer, a BatchNorm in training mode, a module
    hook), in words, or None."""
    for name, module in agent.named_modules():
        if isinstance(module, RANDOM_LAYERS):
            return f"a random layer ({type(module).__name__}) in {name or 'Agent'}"
    return batch_norm_in_training(agent) or module_hooks(agent)


# ---------------------------------------------------------------------------------------------------------------------
# The compiled gradient: when it cannot stand in for the same function run eagerly
# ---------------------------------------------------------------------------------------------------------------------
def compile_blockers(agent: nn.Module) -> str | None:
    """Why the compiled gradient (the gradient function traced into a graph of its own) would not compute what the
    same function computes run eagerly through the live Agent, in words; None when it would. Checked before every
    update, so a hook registered during the run counts from the next one."""
    hooked = [name for name, p in agent.named_parameters() if p._backward_hooks]
    if hooked:
        return f"a gradient hook on {hooked[0]} (a compiled graph does not run it)"
    hooks = module_hooks(agent) or batch_norm_in_training(agent)
    if hooks:
        return hooks
    buffers = [name for name, _ in agent.named_buffers()]
    if buffers:
        return f"a buffer ({buffers[0]}), which a forward pass may change"
    if any(p.dtype not in (torch.float32, torch.float64) for p in agent.parameters()):
        return "parameters that are not float32 or float64"
    return None


def compile_pays(args) -> str | None:
    """Why a run of these flags trains with the eager gradient by default, or None where the compiled one pays: its
    gradient steps (iterations x --update-epochs x --num-minibatches) under COMPILE_PAYS_AFTER_STEPS. The flags
    decide, never the cache or the clock, so that one command trains one run, cold or warm."""
    steps = args.num_iterations * args.update_epochs * args.num_minibatches
    if steps >= COMPILE_PAYS_AFTER_STEPS:
        return None
    return (
        f"{steps:,} gradient steps, under the {COMPILE_PAYS_AFTER_STEPS:,} that repay a compile (--compile forces it)"
    )


def compile_for(function, agent: nn.Module):
    """torch.compile of `function` into one graph (autograd's gradient included), for the device the Agent is on."""
    import torch._dynamo.config  # here: a process that never compiles does not import the compiler
    import torch._inductor.config

    torch._dynamo.config.trace_autograd_ops = True  # torch.autograd.grad inside the graph
    # A random op in the graph (a Dropout, functional or a layer, noise added to the loss or to the gradients) calls
    # torch's own kernel on torch's generator, in the order the function draws, rather than inductor's generator of its
    # own: compiled, the gradient draws what it draws run eagerly (--no-compile), and the run trains alike.
    torch._inductor.config.fallback_random = True
    # dynamo warns in many lines when a function hits its recompile limit; compiled_step says it in one
    logging.getLogger("torch._dynamo.convert_frame").setLevel(logging.ERROR)
    if os.environ.get("TORCHINDUCTOR_VEC_ISA_OK") is None:
        # inductor checks each vector ISA the CPU's flags list by building and loading a test library in a child
        # process, at every start of a process, which costs more than loading the cached graph; a build or load that
        # fails still ends in the caller's line and the eager gradient
        torch._inductor.config.cpp.vec_isa_ok = True
    # On the CPU the graph's kernels are called from generated C++ rather than a Python wrapper (per call that is most
    # of the graph's overhead at a minibatch of 64); elsewhere inductor's default wrapper.
    on_cpu = all(p.device.type == "cpu" for p in agent.parameters())
    # isolate_recompiles: the recompiles of this call (this Agent's) are counted apart from other calls' (another
    # Agent compiled in the same process, as a test or a notebook may)
    return torch.compile(
        function,
        fullgraph=True,
        options={"cpp_wrapper": on_cpu},
        recompile_limit=RECOMPILES + 1,
        isolate_recompiles=True,
    )


def recompile_reason(function) -> str:
    """What made dynamo compile `function` again, in the user's names: the failed guard of its newest graph, such as
    "agent.calls (the newest graph holds it as the constant 2)" for a counter on the Agent."""
    from torch._dynamo.utils import guard_failures

    newest = max(
        (re.match(r"\d+/(\d+): (.*)", failure) for failure in guard_failures.get(function.__code__, [])),
        key=lambda match: int(match[1]) if match else -1,
        default=None,
    )
    if not newest:
        return "a value the graph was traced with"
    guard = newest[2].splitlines()[0].split("  #")[0].split(" (HINT")[0].strip()
    guard = re.sub(r"\b[LG]\['([^']+)'\]", r"\1", guard)
    constant = re.fullmatch(r"(.+?) == (.+)", guard)
    if constant:
        return f"{constant[1]} (the newest graph holds it as the constant {constant[2][:40]})"
    return f"a value the guard `{guard[:120]}` checks"


def traced_line(e: BaseException) -> tuple[str, str] | None:
    """Where dynamo stopped tracing, from its message: the last frame of the user's code it names, as ("file:line",
    the source line); None when the message names none."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n +([^\n]+)', str(e))
    if not frames:
        return None
    path, line, source = frames[-1]
    return f"{os.path.basename(path)}:{line}", source.strip()


def untraceable(e: BaseException) -> str | None:
    """A failed compile in words a researcher acts on, where dynamo's message names the line it could not trace and
    that line draws from Python's or numpy's generator (which a graph cannot do; torch's random ops it can, and draws
    them as eager code does); None otherwise (the caller says torch's own error)."""
    where = traced_line(e)
    if where is None:
        return None
    place, source = where
    source = source if len(source) <= 80 else source[:77] + "..."
    if re.search(r"\b(np|numpy)\.random\.", source):
        generator = "numpy's generator (np.random)"
    elif re.search(r"(?<![\w.])random\.\w+\(", source):
        generator = "Python's random module"
    else:
        return None
    return (
        f"a draw from {generator} at {place} (`{source}`), which a compiled graph cannot make: draw with torch "
        "instead (torch.rand, torch.randn_like: compiled, they draw what they draw eagerly), or train with --no-compile"
    )


def compiled_step(gradient, agent: nn.Module, fast: FastPaths):
    """set_grads of `gradient` (the script's clipped_gradient) compiled into one graph (compile_for): the same code,
    far fewer ops than autograd's per-op dispatch, said in one line before it first compiles. If compiling or running
    the graph fails (no C++ compiler for inductor, code it cannot trace, a value that changes at every call and so
    would recompile at every call), `fast` records why, with one line, and `gradient` runs eagerly from that call on:
    the same code, so an error of the user's code recurs there."""
    from torch._dynamo.exc import FailOnRecompileLimitHit

    compiled = compile_for(gradient, agent)
    announced = False

    def run(*args):
        nonlocal announced
        if fast.compiled is not None:
            if not announced and not fast.quiet:
                say(
                    "compiling the gradient with torch.compile (a graph not in the cache takes a while to build; "
                    "--no-compile trains without it)"
                )
            announced = True
            try:
                return set_grads(compiled, *args)
            except Exception as e:  # noqa: BLE001 (said in one line; the eager function computes the same)
                fast.compiled = None
                reason = untraceable(e) or f"torch.compile failed ({failure(e)})"
                if isinstance(e, FailOnRecompileLimitHit):
                    reason = (
                        f"{recompile_reason(gradient)} keeps changing, and each value compiles a graph of its own "
                        f"({RECOMPILES} recompiles; a Python number does, a tensor would not)"
                    )
                fast.step_aside("gradient", fast.iteration, reason, "eager")
        return set_grads(gradient, *args)

    return run


# ---------------------------------------------------------------------------------------------------------------------
# This update's gradient: the script's gradient function, compiled or eager, into each trained tensor's .grad
# ---------------------------------------------------------------------------------------------------------------------
def trained_tensors(learner) -> list[torch.Tensor]:
    """What loss.backward() would give a gradient: the Agent's parameters and every tensor the optimizer holds, those
    that require one (a frozen layer does not)."""
    held = [p for group in learner.optimizer.param_groups for p in group["params"]]
    tensors = {id(p): p for p in [*learner.agent.parameters(), *held] if p.requires_grad}
    return list(tensors.values())


def set_grads(gradient, learner, minibatch: dict, loss_kwargs: dict, max_grad_norm: float):
    """`gradient` (the script's clipped_gradient or its compiled graph) of the minibatch, left in the .grad of every
    trained tensor (None where the loss does not reach it) for the optimizer's step; returns the loss's statistics and
    the gradient's norm."""
    params = trained_tensors(learner)
    learner.optimizer.zero_grad()
    grads, fields, norm = gradient(learner.agent, params, minibatch, loss_kwargs, max_grad_norm)
    for param, grad in zip(params, grads):
        param.grad = grad
    return PPOLoss(**fields, clip_coef=loss_kwargs["clip_coef"]), norm


def unrun_hook(learner) -> str | None:
    """A post-accumulate-grad hook on a trained tensor, in words: loss.backward() would run it, but the gradient here is
    taken with torch.autograd.grad, which accumulates nothing and so runs none. None when there is none."""
    names = {id(p): name for name, p in learner.agent.named_parameters()}
    for tensor in trained_tensors(learner):
        if getattr(tensor, "_post_accumulate_grad_hooks", None):
            return (
                f"a post-accumulate-grad hook on {names.get(id(tensor), 'a tensor the optimizer holds')} would never "
                f"run: the gradient is taken with torch.autograd.grad (Tensor.register_hook runs, before the clip)"
            )
    return None


def update_gradient(learner, gradient, iteration: int):
    """This update's gradient function, called with (learner, minibatch, loss_kwargs, max_grad_norm): `gradient` (the
    script's clipped_gradient) compiled while nothing in the Agent stops it (checked before every update, so a hook
    registered during the run counts from the next), else `gradient` run eagerly; either way set_grads leaves the
    gradients in .grad for the optimizer's step. A hook that neither runs stops the run before the update (StopRun:
    its checkpoint is whole)."""
    hook = unrun_hook(learner)
    if hook:
        raise StopRun(hook)
    fast = learner.fast
    fast.iteration = iteration
    if fast.compiled is not None:
        problem = compile_blockers(unwrapped(learner.agent))
        if problem is not None:
            fast.compiled = None
            fast.step_aside("gradient", iteration, problem, "eager")
    return fast.compiled or functools.partial(set_grads, gradient)


# ---------------------------------------------------------------------------------------------------------------------
# Which way each part runs
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class FastPaths:
    """Which way each part runs: `acting` True for NumpyActor; `compiled` the compiled gradient step (compiled_step of
    the script's clipped_gradient) or None for the eager one. `used` says it in words, for summary.json and
    TensorBoard; `differences` holds the latest acting audit's largest relative difference, and `switches` each part
    that stepped aside during the run."""

    acting: bool = False
    compiled: object = None
    used: dict[str, str] = field(default_factory=dict)
    differences: dict[str, float] = field(default_factory=dict)
    switches: list[dict] = field(default_factory=list)
    said: set[str] = field(default_factory=set)
    quiet: bool = False  # --quiet: no line while the gradient compiles
    iteration: int = 0  # the update running now, for a switch during it

    def table(self) -> str:
        """`used` as a markdown table, for TensorBoard's text tab."""
        return "|part|runs on|\n|-|-|\n" + "\n".join(f"|{part}|{way}|" for part, way in self.used.items())

    def step_aside(self, part: str, iteration: int, reason: str, then: str) -> None:
        """Record that `part` ("acting" or "gradient") runs the plain way from `iteration` on, and say so once per
        reason."""
        self.switches.append({"part": part, "iteration": iteration, "reason": reason})
        self.used[part] = f"{then} from iteration {iteration}: {reason}"
        if reason not in self.said:
            self.said.add(reason)
            name = "compiled gradient" if part == "gradient" else f"fast {part}"
            say(f"{name} off at iteration {iteration}: {reason}; {then} from now on")

    def read_acting_audits(self, rollouts: list[dict], iteration: int, counters: dict) -> None:
        """The samplers' audits of their numpy actors (audit_acting, on each rollout's own observations). A rollout
        whose actor acted otherwise than TorchActor was not trained on: the sampler sampled it again acting with torch
        (sampling again keeps PPO's ratio anchored to the policy that acted; rescoring the actions would not). Then
        acting moves to torch for the rest of the run, and the discarded rollouts are counted."""
        # a rollout of several samplers (dppo_ray.py's actors) carries an audit and a problem for each
        audits = [float(a) for r in rollouts for a in np.atleast_1d(r["acting_audit"]) if np.isfinite(a)]
        if audits:
            self.differences["acting"] = max(audits)
        problems = [str(p) for r in rollouts for p in np.atleast_1d(r["acting_problem"]) if str(p)]
        counters["discarded_rollouts"] += len(problems)
        if problems and self.acting:
            self.acting = False
            reason = f"{problems[0]}; its rollout was discarded and sampled again"
            self.step_aside("acting", iteration, reason, "torch (TorchActor)")

    def scalars(self) -> dict[str, float]:
        """What TensorBoard records of the fast paths each iteration, under audit/."""
        scalars = {"audit/fast_acting": float(self.acting), "audit/compiled_gradient": float(self.compiled is not None)}
        return scalars | {f"audit/{part}_difference": value for part, value in self.differences.items()}


# ---------------------------------------------------------------------------------------------------------------------
# Comparing a mirror with the plain path
# ---------------------------------------------------------------------------------------------------------------------
def as_float64(x) -> torch.Tensor:
    x = torch.from_numpy(np.asarray(x)) if isinstance(x, np.ndarray) else torch.as_tensor(x)
    return x.detach().double().cpu()


def relative_differences(fast, plain, floor: float = 0.0) -> list[float]:
    """Each pair's largest difference as a fraction of its scale (what TOLERANCE bounds; inf for a non-finite
    difference or a shape mismatch). The scale of a pair is its plain value's largest magnitude, floored at a
    thousandth of the largest over all pairs (float noise in a near-zero tensor is no mismatch) and at `floor`."""
    pairs = [(as_float64(f), as_float64(p)) for f, p in zip(fast, plain, strict=True)]
    if any(f.shape != p.shape for f, p in pairs):
        return [float("inf")] * len(pairs)
    differences = [float((f - p).abs().max()) if p.numel() else 0.0 for f, p in pairs]
    scales = [float(p.abs().max()) if p.numel() else 0.0 for _, p in pairs]
    floor = max(floor, 1e-6, 1e-3 * max((x for x in scales if np.isfinite(x)), default=0.0))
    return [d / max(scale, floor) if np.isfinite(d) else float("inf") for d, scale in zip(differences, scales)]


def worst_of(compared: dict[str, tuple], against: str, floor: float = 0.0) -> tuple[float, str | None]:
    """The largest relative difference over named (fast, plain) pairs, and a reason naming the worst pair when it is
    beyond float noise (None otherwise)."""
    relatives = relative_differences([f for f, _ in compared.values()], [p for _, p in compared.values()], floor)
    worst = int(np.argmax(relatives))
    if relatives[worst] <= TOLERANCE:
        return relatives[worst], None
    return relatives[
        worst
    ], f"its {list(compared)[worst]} differ from {against} by {relatives[worst]:.3g} of their scale"


def choose_paths(learner, args, plain_actor: type, gradient, numpy_acting: bool = True) -> FastPaths:
    """Which way acting and the gradient run, said in one line for each part that cannot run fast: the numpy actor
    where it acts as `plain_actor` (the script's TorchActor) does (check_acting; `numpy_acting` False: a policy it does
    not compute, DPPO's Discrete one), and `gradient` (the script's clipped_gradient) compiled (compiled_step) where
    nothing in the Agent stops it (compile_blockers)."""
    fast = FastPaths(quiet=args.quiet)
    agent = unwrapped(learner.agent)
    acting_problem = None
    if args.fast_path and numpy_acting:
        acting_problem = acting_blockers(agent)
        if acting_problem is None:
            with torch.random.fork_rng(devices=[]):  # the check runs the user's code; the run's stream must not move
                acting_problem = check_acting(agent, plain_actor)
        fast.acting = acting_problem is None
    fast.used["acting"] = "numpy (NumpyActor, audited against TorchActor)" if fast.acting else "torch (TorchActor)"
    if acting_problem:
        say(f"fast acting off: {acting_problem}; acting with torch through TorchActor")
    compile_problem = "--no-fast-path" if not args.fast_path else "--no-compile" if args.compile is False else None
    if compile_problem is None and args.compile is None:
        compile_problem = compile_pays(args)
    if compile_problem is None:
        compile_problem = compile_blockers(agent)
        if compile_problem is not None:
            say(f"compiled gradient off: {compile_problem}; training with the eager gradient")
    if compile_problem is None:
        fast.compiled = compiled_step(gradient, agent, fast)
    compiled = "torch.compile of clipped_gradient (autograd through Agent and gae.ppo_loss)"
    fast.used["gradient"] = compiled if fast.compiled else f"eager clipped_gradient ({compile_problem})"
    fast.used["optimizer step"] = f"{type(learner.optimizer).__module__}.{type(learner.optimizer).__name__}.step()"
    dropped = agent_attributes(agent)[1]
    if dropped:
        say(f"the samplers' copies of Agent do not carry its attribute {dropped[0]} (only numbers, strings and arrays)")
    return fast
