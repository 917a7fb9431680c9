"""Statistics over a few seeds' final returns, in the standard library only: the --num-seeds launcher's closing table
(mean, sample std and Student's t interval), which imports no numpy or scipy, and benchmarks/learning_report.py's
comparisons (Welch's interval and an exact permutation test). With 2 to 10 seeds a normal interval or a bootstrap is
too narrow; these are honest about so few. The launcher's closing lines in words (final_return_lines,
comparison_lines), and the curves' mean and band over seeds, drawn for both (numpy and matplotlib only where one is
drawn), are here too.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics


def regularized_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Lentz's method; Numerical
    Recipes, 6.4), taken on the side of x where it converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * beta_fraction(x, a, b) / a
    return 1.0 - front * beta_fraction(1.0 - x, b, a) / b


def beta_fraction(x: float, a: float, b: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 1000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return fraction


def t_quantile(probability: float, dof: float) -> float:
    """The `probability` quantile (above 0.5) of Student's t with `dof` degrees of freedom, a whole number or, as
    Welch's, not: the t whose upper tail, I_x(dof / 2, 1 / 2) / 2 at x = dof / (dof + t^2), is 1 - probability,
    found by bisection over x."""
    tail = 2.0 * (1.0 - probability)
    low, high = 0.0, 1.0
    for _ in range(200):  # I_x grows with x; 200 halvings leave x exact to the last bit
        middle = (low + high) / 2
        if regularized_beta(middle, dof / 2, 0.5) < tail:
            low = middle
        else:
            high = middle
    x = (low + high) / 2
    return math.sqrt(dof * (1.0 - x) / x)


def sample_std(values: list[float]) -> float:
    """The sample standard deviation (n - 1 in the denominator): every table's ± over seeds. 0 for one seed."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def mean_std_interval(values: list[float]) -> tuple[float, float | None, tuple[float, float] | None]:
    """The mean, the sample std and the 95% Student's t interval of the mean; no std or interval for one value."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return mean, None, None
    std = sample_std(values)
    half = t_quantile(0.975, n - 1) * std / math.sqrt(n)
    return mean, std, (mean - half, mean + half)


def welch_interval(a: list[float], b: list[float], level: float = 0.95) -> tuple[float, float]:
    """Welch's t-interval of mean(a) - mean(b): each group's own sample variance, Welch-Satterthwaite's degrees of
    freedom. With 3 to 5 seeds a side it is wide, as it should be; a percentile bootstrap over so few seeds is not."""
    difference = statistics.fmean(a) - statistics.fmean(b)
    var_a, var_b = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(var_a + var_b)
    if se == 0.0:
        return difference, difference
    dof = se**4 / (var_a**2 / (len(a) - 1) + var_b**2 / (len(b) - 1))
    half = t_quantile(0.5 + level / 2, dof) * se
    return difference - half, difference + half


# Past this many ways to split the seeds, the permutation test draws RANDOM_SPLITS of them instead of visiting each
EXACT_SPLITS = 200_000
RANDOM_SPLITS = 100_000


def permutation_is_exact(n_a: int, n_b: int) -> bool:
    """Whether permutation_pvalue visits every split of these seed counts (else it draws RANDOM_SPLITS)."""
    return math.comb(n_a + n_b, n_a) <= EXACT_SPLITS


def permutation_pvalue(a: list[float], b: list[float]) -> float:
    """Two-sided permutation test of a difference in means: the share of all ways to split the pooled seeds into
    groups of len(a) and len(b) whose difference in means is at least as large as the observed one. It assumes nothing
    about the distribution of returns, which matters with 2 to 5 seeds and Hopper's occasional collapses. Exact up to
    EXACT_SPLITS splits (7 + 7 seeds have 3,432; 10 + 10, 184,756); past that, RANDOM_SPLITS splits drawn with a fixed
    seed, the observed one counted among them (so p is never 0)."""
    pooled = [float(v) for v in [*a, *b]]
    total = math.fsum(pooled)
    observed = abs(statistics.fmean(a) - statistics.fmean(b))

    def as_extreme(chosen) -> bool:
        inside = math.fsum(chosen)
        difference = abs(inside / len(a) - (total - inside) / len(b))
        return difference >= observed - 1e-9 * max(1.0, observed)  # splits tying the observed one count, rounded

    if permutation_is_exact(len(a), len(b)):
        splits = list(itertools.combinations(pooled, len(a)))
        return sum(map(as_extreme, splits)) / len(splits)
    draw = random.Random(0)
    extreme = sum(as_extreme(draw.sample(pooled, len(a))) for _ in range(RANDOM_SPLITS))
    return (extreme + 1) / (RANDOM_SPLITS + 1)


def permutation_floor(n_a: int, n_b: int) -> float:
    """The smallest two-sided p that permutation_pvalue can give with these seed counts: the most extreme split is
    1 of C(n_a + n_b, n_a), and with equal groups its mirror image ties it. 0.10 with 3 + 3 seeds, 0.029 with 4 + 4."""
    return (2 if n_a == n_b else 1) / math.comb(n_a + n_b, n_a)


def plot_mean_and_std(ax, runs: list[tuple], column: int, label: str) -> None:
    """Return against curve column `column` (0: env steps, 1: seconds), mean ± sample std over the seeds' `runs`. The
    seeds log at different x, so each is resampled on a common grid up to the shortest run's end first (numpy is
    imported here, where a plot is drawn)."""
    import numpy as np

    grid = np.linspace(0, min(run[column][-1] for run in runs), 200)
    ys = np.array([np.interp(grid, run[column], run[2]) for run in runs])
    std = ys.std(0, ddof=1) if len(ys) > 1 else np.zeros(len(grid))  # the sample std, as the tables' ±
    (line,) = ax.plot(grid, ys.mean(0), label=label)
    ax.fill_between(grid, ys.mean(0) - std, ys.mean(0) + std, alpha=0.2, color=line.get_color())


def plot_curves(curves: dict[str, list[tuple]], path: str) -> str:
    """Each configuration's curve (`curves`: its seeds' run_record.read_curve), the mean return of the last 100
    episodes against env steps, mean and sample std over the seeds, drawn into `path` where matplotlib is installed;
    the line that says where, or why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # into a file: no display may be there
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot of the curves: matplotlib is not installed (pip install matplotlib)"
    figure, ax = plt.subplots(figsize=(8, 5))
    for config, runs in curves.items():
        if runs:
            plot_mean_and_std(ax, runs, 0, f"{config} ({len(runs)} seeds)")
    if not ax.lines:
        plt.close(figure)
        return "no plot of the curves: no configuration has a completed seed with episodes"
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean return of the last 100 episodes")
    ax.legend(fontsize="small")
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return f"curves of the configurations (mean and std over seeds): {path}"


# ---------------------------------------------------------------------------------------------------------------------
# The closing lines of a launch: each configuration's final returns, and each against the first
# ---------------------------------------------------------------------------------------------------------------------
def final_return_lines(config: str, finals: list[float], count: int) -> list[str]:
    """The mean, std and 95% t-interval of one configuration's completed seeds' final returns."""
    if not finals:
        return []
    mean, std, interval = mean_std_interval(finals)
    line = f"{config}: " if config else ""
    line += f"final return (each seed's mean over its last episodes): mean {mean:.2f} over {len(finals)} "
    line += "completed seeds" if len(finals) < count else "seeds"
    if std is not None:
        line += f", std {std:.2f}, 95% t-interval [{interval[0]:.2f}, {interval[1]:.2f}]"
    return [line]


def comparison_lines(baseline: str, base: list[float], config: str, finals: list[float]) -> list[str]:
    """A configuration against the first: the difference of the mean final returns, Welch's 95% interval and the exact
    permutation test's p, beside the least p that these seed counts allow (a difference no test of so few seeds can
    show is said as such); past EXACT_SPLITS, a p from random splits, said as such."""
    if len(base) < 2 or len(finals) < 2:
        return [f"{config} vs {baseline}: too few completed seeds to compare (2 of each at least)"]
    low, high = welch_interval(finals, base)
    difference = sum(finals) / len(finals) - sum(base) / len(base)
    p, floor = permutation_pvalue(finals, base), permutation_floor(len(finals), len(base))
    exact = permutation_is_exact(len(finals), len(base))
    line = f"{config} vs {baseline}: difference {difference:+.2f}, Welch 95% interval [{low:.2f}, {high:.2f}], "
    if exact:
        line += f"permutation p = {p:.3f} (the least p {len(finals)} + {len(base)} seeds allow: {floor:.3f})"
    else:
        line += f"permutation p = {p:.4f} (from {RANDOM_SPLITS:,} random splits of the seeds)"
    if floor > 0.05:
        line += "; too few seeds for p < 0.05"
    return [line]
