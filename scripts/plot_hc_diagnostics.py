"""Plot the hyper-connection diagnostics of a Trainer run (docs/hc_diagnostics.md).

Reads a run's `trainer_state.json` (the `hc/<metric>/<layer>.<sublayer>` values that
`HyperConnectionDiagnosticsCallback` merged into `log_history`) and writes one PNG per metric,
`hc_<metric>.png`: on the left the metric over optimizer steps, one line per sublayer coloured by depth; on
the right the metric over depth (sublayers in forward order) at the first, middle and last logged step.

    python scripts/plot_hc_diagnostics.py --run run    # run/trainer_state.json, else its newest checkpoint's
    python scripts/plot_hc_diagnostics.py --run run/checkpoint-500/trainer_state.json --output_dir plots
"""

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from geoformers.training.hc_diagnostics import KEY_PATTERN, METRICS, SUBLAYERS

from harness.flag_checks import CheckedParser
from harness.threads import DEFAULT_THREADS, THREADS_HELP, set_threads

STATE_FILE = "trainer_state.json"
TITLES = {
    "row_entropy": "row entropy of H_res (0: identity, log n: J/n)",
    "saturation": "fraction of saturated interval choices",
    "beta": "mean delta gate beta",
    "res_mix": "chart weight a in H_res = (1 - a) I + a chart",
    "gain_forward": "forward gain: max row sum of prod H_res",
    "gain_backward": "backward gain: max column sum of prod H_res",
    "stream_spread": "stream spread ||X - mean_i X_i|| / ||X|| leaving the layer (0: equal streams)",
    "stream_rank": "effective rank of the streams leaving the layer (1: equal, n: orthogonal)",
}


def find_state(path: str | Path) -> Path:
    """`path` itself if it is a file, else `path/trainer_state.json`, else that of its newest checkpoint."""
    path = Path(path)
    if path.is_file():
        return path
    if (path / STATE_FILE).is_file():
        return path / STATE_FILE
    checkpoints = [p for p in path.glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name)]
    for checkpoint in sorted(checkpoints, key=lambda p: int(p.name.split("-")[1]), reverse=True):
        if (checkpoint / STATE_FILE).is_file():
            return checkpoint / STATE_FILE
    raise FileNotFoundError(f"no {STATE_FILE} at {path} (nor in a checkpoint-<step> folder inside it)")


def collect(log_history: list[dict]) -> dict[str, dict[tuple[int, str], list[tuple[int, float]]]]:
    """{metric: {(layer, sublayer): [(step, value), ...]}} from the log records."""
    series: dict[str, dict[tuple[int, str], list[tuple[int, float]]]] = {}
    for record in log_history:
        for key, value in record.items():
            match = KEY_PATTERN.match(key)
            if match is not None:
                sublayers = series.setdefault(match["metric"], {})
                sublayers.setdefault((int(match["layer"]), match["sublayer"]), []).append(
                    (record["step"], value)
                )
    return series


def _readable_limits(axis, values: list[float]) -> None:
    """y-limits spanning at least 1e-3 of the values' size, without an offset: a metric constant up to float32
    rounding (the gains of an exact chart) shows as a flat line at its value, not as rounding noise."""
    finite = [value for value in values if math.isfinite(value)]
    if not finite:
        return
    low, high = min(finite), max(finite)
    centre = (low + high) / 2
    half_span = max(0.55 * (high - low), 5e-4 * max(1.0, abs(centre)))
    axis.set_ylim(centre - half_span, centre + half_span)
    axis.ticklabel_format(axis="y", useOffset=False)


def plot_metric(metric: str, series: dict[tuple[int, str], list[tuple[int, float]]], path: Path) -> None:
    """One PNG: the metric over steps per sublayer (left) and over depth at three steps (right)."""
    sublayers = sorted(series, key=lambda item: (item[0], SUBLAYERS.index(item[1])))
    colours = colormaps["viridis"]
    norm = Normalize(0, max(len(sublayers) - 1, 1))
    figure = Figure(figsize=(11, 4))
    figure.subplots_adjust(left=0.07, right=0.98, bottom=0.2, top=0.88, wspace=0.25)
    steps_axis, depth_axis = figure.subplots(1, 2)
    for depth, sublayer in enumerate(sublayers):
        steps, values = zip(*series[sublayer], strict=True)
        steps_axis.plot(steps, values, marker=".", color=colours(norm(depth)), linewidth=1)
    mappable = ScalarMappable(norm=norm, cmap=colours)
    figure.colorbar(mappable, ax=steps_axis, label="sublayer depth", ticks=MaxNLocator(integer=True))
    steps_axis.set_xlabel("optimizer step")
    steps_axis.set_ylabel(metric)
    logged = sorted({step for sublayer in sublayers for step, _ in series[sublayer]})
    for step in sorted({logged[0], logged[len(logged) // 2], logged[-1]}):
        values = [dict(series[sublayer]).get(step, float("nan")) for sublayer in sublayers]
        depth_axis.plot(range(len(sublayers)), values, marker="o", label=f"step {step}")
    labels = [f"{layer}.{sublayer}" for layer, sublayer in sublayers]
    every = max(1, len(labels) // 16)
    depth_axis.set_xticks(range(0, len(labels), every), labels[::every], rotation=45, fontsize="small")
    depth_axis.set_xlabel("sublayer (layer.attn / layer.mlp)")
    depth_axis.legend(fontsize="small")
    everything = [value for sublayer in sublayers for _, value in series[sublayer]]
    for axis in (steps_axis, depth_axis):
        _readable_limits(axis, everything)
    figure.suptitle(TITLES.get(metric, metric))
    figure.savefig(path, dpi=100)


def plot_run(run: str | Path, output_dir: str | Path | None = None) -> list[Path]:
    """Write `hc_<metric>.png` for every diagnostic in the run's log history; returns the paths."""
    state_path = find_state(run)
    log_history = json.loads(state_path.read_text(encoding="utf-8")).get("log_history", [])
    series = collect(log_history)
    if not series:
        raise ValueError(
            f"{state_path} has no hc/<metric>/<layer>.<sublayer> records: train with "
            "geoformers.training.hc_diagnostics.HyperConnectionDiagnosticsCallback"
        )
    output_dir = Path(output_dir) if output_dir is not None else state_path.parent
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for metric in sorted(series, key=lambda m: METRICS.index(m) if m in METRICS else len(METRICS)):
        path = output_dir / f"hc_{metric}.png"
        plot_metric(metric, series[metric], path)
        paths.append(path)
    return paths


@dataclass
class PlotArguments:
    """The run to read and where the PNGs go."""

    run: str = field(metadata={"help": "trainer_state.json, or a run / checkpoint folder holding one"})
    output_dir: str | None = field(
        default=None, metadata={"help": "folder of the PNGs (default: beside the state file)"}
    )
    threads: int = field(default=DEFAULT_THREADS, metadata={"help": THREADS_HELP})


def main(argv: list[str] | None = None) -> list[Path]:
    parser = CheckedParser(PlotArguments, description=__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    set_threads(args.threads)
    paths = plot_run(args.run, args.output_dir)
    for path in paths:
        print(path)
    return paths


if __name__ == "__main__":
    main()
