"""--num-seeds N: N seeds of the training script in one process, each trained as its single run.

    python ppo_continuous.py --num-seeds 4      # seeds 1..4 in runs/<run-name>__1 .. __4
    python my_ppo.py --num-seeds 4              # a researcher's copy: its own code in every seed

The script hands this module itself (`script`), as it hands itself to checkpoints.load_policy: every seed runs the
script's own `training_loop`, and so its `ppo_update`, `make_learner`, `Agent` and loss. An edit of the script (or of
gae.py) reaches every seed, and a copy of the script runs its own code. This file adds only what several seeds in one
process need:

- **Turns.** Each seed's loop runs in a thread of its own, one at a time: a seed keeps the turn until it waits for a
  rollout. Each seed draws from random streams of its own (torch's, numpy's and Python's global generators), swapped in
  whenever it takes the turn, so that its shuffles, a Dropout or a random op in the loss draw as its single run would.
- **Sampler processes.** The seeds' envs step in other processes (`--seed-processes`, by default one per core, at most
  one per seed), seed k in process k mod their number, so that some seeds sample while others update. A process's
  seeds step their envs in lockstep and act in one stacked numpy forward where their actor nets stack
  (StackedNumpyActor); each seed's actions are audited against its own TorchActor, as a single run's are.
- **Per-seed runs.** Each seed writes what its single run writes (runs/<run-name>__<seed>), its run.json records its
  single run's command, and its checkpoints list every seed's, for --resume. A seed whose env fails, or whose guard
  stops it, stops alone with its line; Ctrl-C or SIGTERM stops every seed after its iteration, each with a checkpoint.

This file imports nothing of the script: the script is handed in, so the house stays one-way.
"""

from __future__ import annotations

import contextlib
import contextvars
import multiprocessing
import os
import queue
import random
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import torch

from checkpoints import SPEAKER, UsageError, load_checkpoint, resume_checkpoint
from fast_paths import DoesNotFit, NumpyActor, StackedNumpyActor, failure, say
from run_management import (
    PROG,
    BadBatchError,
    StopRun,
    TrainingLoop,
    run_folder,
    say_rounded_timesteps,
    seed_everything,
)


class SamplerFailed(Exception):
    """A seed's sampler failed (its env raised, or its process died); the message says how, in one line."""


# ---------------------------------------------------------------------------------------------------------------------
# Turns: one seed runs at a time, on its own random streams
# ---------------------------------------------------------------------------------------------------------------------
class RandomStreams:
    """The global random generators' states of one seed: torch's (and CUDA's), numpy's and Python's; made from the
    states they have now."""

    def __init__(self):
        self.save()

    def save(self) -> None:
        self.torch_state, self.cuda_states = torch.get_rng_state(), cuda_states()
        self.numpy_state, self.python_state = np.random.get_state(), random.getstate()  # noqa: NPY002

    def restore(self) -> None:
        torch.set_rng_state(self.torch_state)
        np.random.set_state(self.numpy_state)  # noqa: NPY002
        random.setstate(self.python_state)
        if self.cuda_states:
            torch.cuda.set_rng_state_all(self.cuda_states)


def cuda_states() -> list:
    return torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []


class Turns:
    """The seeds' threads take turns: one runs at a time, with its own random streams in the global generators."""

    def __init__(self):
        self.lock = threading.Lock()
        self.local = threading.local()  # the streams of the seed this thread runs

    @contextlib.contextmanager
    def turn(self, streams: RandomStreams):
        """Run what follows as this seed, once no other seed runs."""
        self.lock.acquire()
        self.local.streams = streams
        streams.restore()
        try:
            yield
        finally:
            streams.save()
            self.lock.release()

    @contextlib.contextmanager
    def waiting(self):
        """Inside a turn: give the turn to the other seeds while this one waits."""
        streams = self.local.streams
        streams.save()
        self.lock.release()
        try:
            yield
        finally:
            self.lock.acquire()
            streams.restore()


# ---------------------------------------------------------------------------------------------------------------------
# Sampler processes: each steps the envs of some seeds, in lockstep
# ---------------------------------------------------------------------------------------------------------------------
def sampler_process(conn, sampler_class, starts: list[tuple[int, object, int, str]]) -> None:
    """A sampler process: it builds the Samplers of its seeds ((index, flags, env seed, video folder) each) with the
    script's Sampler class, then serves ("rollouts", None, ({index: weights}, num_steps)), ("warm_up", index, steps)
    and ("rng_state", index, state) in order until ("close", ...) or the end of its pipe. Each answer is (index,
    result, error line or None, rng state), one per seed."""
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM):  # the training process's to handle: it stops after the iteration
        signal.signal(signum, signal.SIG_IGN)  # and closes this process (which exits too when its pipe closes)
    torch.set_num_threads(starts[0][1].torch_threads)
    seed_everything(replace(starts[0][1], seed=starts[0][2]))  # an env that draws from a global generator: seeded
    samplers = {}
    try:
        for index, args, seed, video_dir in starts:
            samplers[index] = sampler_class(args.env_id, args.num_envs, seed, args, video_dir)
    except Exception as e:  # noqa: BLE001 (said by the training process, in one line)
        conn.send((None, None, str(e) if isinstance(e, UsageError) else failure(e), None))
        return
    described = {i: (s.spaces, s.action_space, s.obs_layout, s.rng_state) for i, s in samplers.items()}
    conn.send((None, described, None, None))
    # Answers go out from a thread: a rollout is larger than the pipe's buffer, and its send waits until the training
    # process reads it; the next rollout must not wait for that.
    outbox: queue.Queue = queue.Queue()
    threading.Thread(target=send_all, args=(conn, outbox), daemon=True).start()
    while True:
        try:
            command, index, payload = conn.recv()
        except (EOFError, OSError):
            command = "close"
        if command == "close":
            for sampler in samplers.values():  # a video being recorded is finished
                with contextlib.suppress(Exception):
                    sampler.close()
            return
        if command == "rollouts":
            serve_rollouts(samplers, *payload, outbox)
            continue
        sampler = samplers[index]
        try:
            if command == "warm_up":
                result = sampler.warm_up(payload)
            else:
                sampler.rng_state, result = payload, None
            outbox.put((index, result, None, sampler.rng_state))
        except Exception as e:  # noqa: BLE001 (that seed's env failed: it stops, this process serves the others)
            outbox.put((index, None, failure(e), None))


def serve_rollouts(samplers: dict, weights: dict[int, dict], num_steps: int, outbox: queue.Queue) -> None:
    """A rollout of each seed in `weights` (its policy's), in lockstep; an answer for each seed, a failure its own."""
    order = sorted(weights)  # the seeds stack in one order, whichever asked first
    try:
        for index in order:
            samplers[index].set_policy(weights[index])
        results = rollouts_in_lockstep([samplers[index] for index in order], num_steps)
    except Exception as e:  # noqa: BLE001 (not an env's: every seed of the call fails with it)
        results = [e] * len(order)
    for index, result in zip(order, results):
        if isinstance(result, Exception):
            outbox.put((index, None, failure(result), None))
        else:
            outbox.put((index, result, None, samplers[index].rng_state))


def send_all(conn, outbox: queue.Queue) -> None:
    """Send what comes into `outbox`, in order, until the pipe closes. An answer that cannot be sent (a result that
    does not pickle) goes out as its seed's error, so that no seed waits for it forever."""
    while True:
        answer = outbox.get()
        try:
            conn.send(answer)
        except (BrokenPipeError, OSError):
            return
        except Exception as e:  # noqa: BLE001 (that seed's answer, as an error line)
            try:
                conn.send((answer[0], None, f"its rollout could not be sent ({failure(e)})", None))
            except (BrokenPipeError, OSError):
                return


class SamplerProcess:
    """A sampler process as the training process sees it: its pipe, the seeds it still steps, and their answers (read
    by a thread of its own, so that a seed waiting for its rollout gives the turn to the others)."""

    def __init__(self, conn, process, turns: Turns):
        self.conn, self.process, self.turns = conn, process, turns
        self.members: set[int] = set()  # its seeds still training
        self.asked: dict[int, dict] = {}  # this round's policies, by seed
        self.answers: dict[int, tuple] = {}
        self.arrived = threading.Condition()
        self.died = False

    def start_reading(self) -> None:
        threading.Thread(target=self.read_all, daemon=True).start()

    def read_all(self) -> None:
        while True:
            try:
                index, result, error, rng_state = self.conn.recv()
            except Exception:  # noqa: BLE001 (the pipe closed, or an answer that does not unpickle: every seed hears)
                with self.arrived:
                    self.died = True
                    self.arrived.notify_all()
                return
            with self.arrived:
                self.answers[index] = (result, error, rng_state)
                self.arrived.notify_all()

    def answer(self, index: int):
        """Wait for seed `index`'s answer (the caller gives its turn away meanwhile, when it has one)."""
        with self.arrived:
            while index not in self.answers and not self.died:
                self.arrived.wait()
            if index not in self.answers:
                raise SamplerFailed(f"its sampler process died (exit code {self.process.exitcode or 'unknown'})")
            result, error, rng_state = self.answers.pop(index)
        if error:
            raise SamplerFailed(f"its env failed ({error})")
        return result, rng_state

    def ask_rollout(self, index: int, weights: dict, num_steps: int) -> None:
        """Seed `index` wants a rollout: once every seed of this process still training has asked, one call asks for
        all of them, and their envs step in lockstep."""
        self.asked[index] = weights
        self.num_steps = num_steps
        self.send_round()

    def leave(self, index: int) -> None:
        """Seed `index` has ended: the others go on without it."""
        self.members.discard(index)
        self.send_round()

    def send_round(self) -> None:
        if self.asked and self.members <= set(self.asked):
            with contextlib.suppress(BrokenPipeError, OSError):  # a dead process: its seeds learn it from answer()
                self.conn.send(("rollouts", None, (self.asked, self.num_steps)))
            self.asked = {}

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.conn.send(("close", None, None))
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()


class SeedSampler:
    """A seed's Sampler as its training loop sees it when the Sampler lives in a sampler process: the spaces,
    set_policy and rollout the loop uses, warm_up and the rng state (for checkpoints) that start_run uses."""

    def __init__(self, process: SamplerProcess, index: int, described: tuple):
        self.process, self.index = process, index
        self.spaces, self.action_space, self.obs_layout, self.last_rng_state = described
        self.weights = None

    def set_policy(self, weights: dict) -> None:
        self.weights = weights

    def rollout(self, num_steps: int) -> dict:
        self.process.ask_rollout(self.index, self.weights, num_steps)
        with self.process.turns.waiting():
            result, self.last_rng_state = self.process.answer(self.index)
        return result

    def request(self, command: str, payload):
        """warm_up or rng_state, asked before the seeds' loops start."""
        self.process.conn.send((command, self.index, payload))
        result, self.last_rng_state = self.process.answer(self.index)
        return result

    def warm_up(self, steps: int):
        return self.request("warm_up", steps)

    @property
    def rng_state(self) -> dict:
        return self.last_rng_state

    @rng_state.setter
    def rng_state(self, state: dict) -> None:
        self.request("rng_state", state)

    def close(self) -> None:
        self.process.leave(self.index)


def start_sampler_processes(script, starts: list, turns: Turns, count: int) -> list[SeedSampler]:
    """The seeds' Samplers in `count` processes, seed k in process k % count: while this process updates one
    process's seeds, the others sample."""
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no fork of torch's threads
    processes = []
    for p in range(count):
        mine = [
            (k, a, script.sampler_seed(a, ckpt), os.path.join("runs", a.run_name, "videos"))
            for k, (a, ckpt) in enumerate(starts)
            if k % count == p
        ]
        here, there = context.Pipe()
        process = context.Process(target=sampler_process, args=(there, script.Sampler, mine), daemon=True)
        process.start()
        there.close()
        processes.append(SamplerProcess(here, process, turns))
    samplers = {}
    for handle in processes:
        try:
            _, described, error, _ = handle.conn.recv()
        except (EOFError, OSError):
            raise UsageError(f"a sampler process died as it started (exit code {handle.process.exitcode})") from None
        if error:
            raise UsageError(error)
        handle.members = set(described)
        handle.start_reading()
        samplers |= {k: SeedSampler(handle, k, d) for k, d in described.items()}
    return [samplers[k] for k in range(len(starts))]


# ---------------------------------------------------------------------------------------------------------------------
# Lockstep: a process's seeds step their envs together and act in one call
# ---------------------------------------------------------------------------------------------------------------------
def rollouts_in_lockstep(samplers: list, num_steps: int) -> list[dict | Exception]:
    """One rollout of each sampler: its own (Sampler.rollout) for one sampler; for several, the samplers joined into
    one (Lockstep) whose rollout is the script's own Sampler.sample loop over all their envs, then split into each
    sampler's rollout (its own finish_sample, audit and, where the audit fails, its own sample_again). A sampler whose
    env raises gets the exception as its result; the others go on."""
    if len(samplers) == 1:
        try:
            return [samplers[0].rollout(num_steps)]
        except Exception as e:  # noqa: BLE001 (the caller says it)
            return [e]
    results = Lockstep(samplers).sample(num_steps)
    for k, (sampler, result) in enumerate(zip(samplers, results)):
        if not isinstance(result, Exception) and result["acting_problem"]:
            try:
                results[k] = sampler.sample_again(result, num_steps)
            except Exception as e:  # noqa: BLE001
                results[k] = e
    return results


class FailedEnv(Exception):
    """An env of a lockstep's seed raised; the seed's rollout ends with its exception."""


class Lockstep:
    """Several seeds' Samplers as one Sampler over all their envs (each seed's envs a block of rows), so that the
    script's own rollout loop (Sampler.sample, called with this as `self`) steps them together: their noise, statistics
    and actors stacked by seed, an env that raises caught for its seed alone."""

    def __init__(self, samplers: list):
        self.samplers = samplers
        first = samplers[0]
        self.sizes = [len(s.envs) for s in samplers]
        self.raw_obs = np.concatenate([s.raw_obs for s in samplers])
        envs = [(k, env) for k, s in enumerate(samplers) for env in s.envs]
        self.envs = [GuardedEnv(env, k, self, obs) for (k, env), obs in zip(envs, self.raw_obs)]
        self.action_space, self.obs_clip = first.action_space, first.obs_clip
        self.env_action = first.env_action
        self.failed: dict[int, Exception] = {}
        self.policy = StackedActor(samplers, self.sizes)
        self.obs_mean = self.obs_std = None
        if first.obs_mean is not None:
            self.obs_mean = np.concatenate([np.broadcast_to(s.obs_mean, (n, len(s.obs_mean))) for s, n in self.pairs()])
            self.obs_std = np.concatenate([np.broadcast_to(s.obs_std, (n, len(s.obs_std))) for s, n in self.pairs()])

    def __getattr__(self, name: str):
        raise AttributeError(
            f"Sampler.sample uses self.{name}, which seeds stepped in lockstep do not share: give each seed a sampler "
            "process of its own (--seed-processes equal to --num-seeds)"
        )

    def pairs(self):
        return zip(self.samplers, self.sizes)

    def bounds(self) -> list[tuple[int, int]]:
        ends = np.cumsum(self.sizes)
        return [(int(end - n), int(end)) for end, n in zip(ends, self.sizes)]

    def own_torch_stream(self):
        return contextlib.nullcontext()  # each seed acts and finishes its rows on its own stream

    def normalize(self, raw, out=None, fill: float = np.nan):
        return type(self.samplers[0]).normalize(self, raw, out, fill)

    def draw_noise(self, shape: tuple[int, ...]) -> np.ndarray:
        num_steps, _ = shape
        return np.concatenate([s.draw_noise((num_steps, n)) for s, n in self.pairs()], axis=1)

    def sample(self, num_steps: int) -> list[dict | Exception]:
        return type(self.samplers[0]).sample(self, num_steps)

    def finish_sample(self, obs, raw_obs, actions, rewards, terminations, truncations, noise, finals) -> list:
        """Each seed's rows, finished by its own Sampler (or its env's exception)."""
        results = []
        for k, (sampler, (start, end)) in enumerate(zip(self.samplers, self.bounds())):
            if k in self.failed:
                results.append(self.failed[k])
                continue
            rows = slice(start, end)
            own = [(step, i - start, last) for step, i, last in finals if start <= i < end]
            with sampler.own_torch_stream():
                results.append(
                    sampler.finish_sample(
                        obs[:, rows].copy(),
                        raw_obs[:, rows].copy(),
                        actions[:, rows].copy(),
                        rewards[:, rows].copy(),
                        terminations[:, rows].copy(),
                        truncations[:, rows].copy(),
                        noise[:, rows].copy(),
                        own,
                    )
                )
        return results


class GuardedEnv:
    """An env of a lockstep's seed: its exception is kept for its seed (whose rollout ends with it), and the env then
    plays a finished episode, so that the other seeds' envs go on stepping."""

    def __init__(self, env, seed_index: int, lockstep: Lockstep, obs: np.ndarray):
        self.env, self.seed_index, self.lockstep = env, seed_index, lockstep
        self.last_obs = obs

    def step(self, action):
        if self.seed_index in self.lockstep.failed:
            return self.last_obs, 0.0, True, False, {}
        try:
            result = self.env.step(action)
        except Exception as e:  # noqa: BLE001 (its seed's result)
            self.lockstep.failed[self.seed_index] = e
            return self.last_obs, 0.0, True, False, {}
        self.last_obs = result[0]
        return result

    def reset(self, **kwargs):
        if self.seed_index in self.lockstep.failed:
            return self.last_obs, {}
        try:
            result = self.env.reset(**kwargs)
        except Exception as e:  # noqa: BLE001
            self.lockstep.failed[self.seed_index] = e
            return self.last_obs, {}
        self.last_obs = result[0]
        return result


class StackedActor:
    """The seeds' actors acting on all their envs' rows: one stacked numpy forward (fast_paths.StackedNumpyActor)
    where every seed acts with a NumpyActor and their nets stack, else each seed's own actor on its rows."""

    def __init__(self, samplers: list, sizes: list[int]):
        self.samplers = samplers
        self.policies = [s.policy for s in samplers]
        self.sizes = sizes
        self.stacked = None
        if all(isinstance(p, NumpyActor) for p in self.policies) and len(set(sizes)) == 1:
            with contextlib.suppress(DoesNotFit):
                self.stacked = StackedNumpyActor([s.agent for s in samplers], self.policies)

    def act(self, obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        groups, per = len(self.sizes), self.sizes[0]
        if self.stacked is not None:
            shaped = self.stacked.act(obs.reshape(groups, per, -1), noise.reshape(groups, per, -1))
            return shaped.reshape(len(obs), -1)
        bounds = np.cumsum([0, *self.sizes])
        actions = []
        for sampler, a, b in zip(self.samplers, bounds[:-1], bounds[1:]):
            with sampler.own_torch_stream():  # a torch actor that draws, draws from its seed's own stream
                actions.append(sampler.policy.act(obs[a:b], noise[a:b]))
        return np.concatenate(actions)


# ---------------------------------------------------------------------------------------------------------------------
# The seeds' runs
# ---------------------------------------------------------------------------------------------------------------------
def seed_runs_to_start(args) -> list[tuple[object, dict | None]]:
    """Each seed's flags (seed, seed+1, ...; its own run folder) and, with --resume, its checkpoint (every seed's
    checkpoint lists them all)."""
    if not args.resume:
        stamp = int(time.time())
        names = [
            f"{args.run_name}__{args.seed + k}"
            if args.run_name
            else f"{args.env_id.replace(':', '_')}__{args.exp_name}__{args.seed + k}__{stamp}"
            for k in range(args.num_seeds)
        ]
        return [(replace(args, seed=args.seed + k, run_name=name), None) for k, name in enumerate(names)]
    listed = load_checkpoint(args.resume).get("seed_runs", [args.resume])
    starts = []
    for path in listed[: args.num_seeds]:
        if not os.path.exists(path):
            say(f"{path} is missing (that seed stopped before its first checkpoint): resuming the other seeds")
            continue
        seed_args = replace(args, resume=path, run_name=None)
        ckpt = resume_checkpoint(seed_args)
        starts.append((replace(seed_args, seed=int(ckpt["args"]["seed"])), ckpt))
    if not starts:
        raise UsageError(
            f"none of the seeds' checkpoints that {args.resume} lists exist here: resume from the folder the run "
            "started in"
        )
    return starts


def single_run_command(args) -> list[str]:
    """The command line of a seed's single run (this process's flags, less --num-seeds and --seed-processes, with the
    seed's own --seed, --run-name and --resume), which its run.json records so that a sweep compares it as that
    run."""
    own = {"--num-seeds", "--seed", "--run-name", "--resume", "--seed-processes"}
    flags, skip = [], False
    for item in sys.argv[1:]:
        if skip:
            skip = False
            continue
        name = item.partition("=")[0].replace("_", "-")
        if name in own:
            skip = "=" not in item  # its value is the next item
            continue
        flags.append(item)
    flags += [f"--seed={args.seed}", f"--run-name={args.run_name}"]
    if args.resume:
        flags.append(f"--resume={args.resume}")
    return [PROG, *flags]


@contextlib.contextmanager
def speaking_for(seed: int):
    """The lines printed meanwhile name `seed`."""
    token = SPEAKER.set(f"seed {seed}: ")
    try:
        yield
    finally:
        SPEAKER.reset(token)


class SeedsStop:
    """What each seed's training loop sees of the training process's loop: a signal ends every seed's iteration under
    way, as it does a single run's."""

    def __init__(self, loop: TrainingLoop):
        self.loop = loop
        self.error: BaseException | None = None  # an error of the script's code in one seed: every seed stops

    @property
    def signum(self):
        return self.loop.signum if self.error is None else -1


def train(script, args) -> int:
    """--num-seeds N: N seeds in this process, each running `script`'s training loop as its single run would (its own
    envs, statistics, optimizer, random streams, guard and files). A seed whose env fails, or whose guard stops it,
    stops alone, with its checkpoint and one line; the exit status then says so."""
    if args.track:
        raise UsageError("--track and --num-seeds do not fit together: track each seed as a run of its own")
    starts = seed_runs_to_start(args)
    for seed_args, _ in starts:
        run_folder(seed_args)  # an existing folder is refused before any process starts
    count = min(len(starts), args.seed_processes or len(os.sched_getaffinity(0)))
    turns = Turns()
    samplers = start_sampler_processes(script, starts, turns, count)
    try:
        return train_seeds(script, args, starts, samplers, turns)
    finally:
        for process in {sampler.process for sampler in samplers}:
            process.close()


def train_seeds(script, args, starts: list, samplers: list[SeedSampler], turns: Turns) -> int:
    runs, streams = [], []
    for k, ((seed_args, ckpt), sampler) in enumerate(zip(starts, samplers)):
        device = seed_everything(seed_args)  # as a single run seeds itself (a checkpoint restores its own stream)
        command, extra = single_run_command(seed_args), {"launched_by": [PROG, *sys.argv[1:]]}
        with speaking_for(seed_args.seed):
            runs.append(script.start_run(seed_args, ckpt, device, sampler, command, extra))
        streams.append(RandomStreams())
        if k > 0:
            runs[-1].monitor.progress.close()  # one progress bar, the first seed's
    for run in runs:
        run.checkpoint_extra = {"seed_runs": [os.path.join(other.run_dir, "checkpoint.pt") for other in runs]}
    say_rounded_timesteps(args)
    statuses = ["running"] * len(runs)

    def run_seed(k: int) -> None:
        run = runs[k]
        SPEAKER.set(f"seed {run.args.seed}: ")  # this thread's lines name its seed
        with turns.turn(streams[k]):
            try:
                script.training_loop(run, stop)
            except BadBatchError as e:
                statuses[k] = "stopped_by_guard"
                say(f"error: {e}; the last good checkpoint stays in {run.run_dir}")
            except (SamplerFailed, StopRun) as e:  # its env, or a hook its gradient cannot run: that seed stops
                statuses[k] = "failed"
                checkpoint = os.path.join(run.run_dir, "checkpoint.pt")
                say(f"error: stopped: {e}; continue it with --resume {checkpoint}")
            except BaseException as e:  # noqa: BLE001 (the script's own error: every seed stops, then it is raised)
                statuses[k] = "error"
                stop.error = stop.error or e
            finally:
                run.sampler.process.leave(run.sampler.index)

    with TrainingLoop(runs[0].run_dir) as loop:
        stop = SeedsStop(loop)
        # each in a copy of this thread's context: torch.compile's settings are per context
        threads = [
            threading.Thread(target=contextvars.copy_context().run, args=(run_seed, k), daemon=True)
            for k in range(len(runs))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():  # a timed join: Ctrl-C's handler runs in this thread meanwhile
                thread.join(timeout=0.5)
    if loop.hard:  # a second signal: the seeds may be mid-iteration; their last checkpoints stay
        turns.lock.acquire(timeout=30)
    exit_status = loop.exit_status()
    for run, status, seed_streams in zip(runs, statuses, streams):
        if status == "error":  # as a single run that raised: no checkpoint of a state left mid-iteration
            continue
        if status == "running":  # stopped by a signal, by another seed's error, or done
            finished = run.state.iteration >= run.args.num_iterations
            status = loop.status if stop.error is None or finished else "failed"
        keeps_state = status != "stopped_by_guard" and loop.keeps_state
        with speaking_for(run.args.seed), turns.turn(seed_streams) if not loop.hard else contextlib.nullcontext():
            eval_failed = script.end_run(run, status, keeps_state)  # its checkpoint saves its own torch stream
        exit_status = exit_status or (1 if status in ("failed", "stopped_by_guard") else eval_failed)
    if stop.error is not None:  # the script's own error in one seed: the others ended with their state, now say it
        raise stop.error
    return exit_status
