"""`scripts/exp_stream_scaling.py` (docs/stream_scaling.md) end to end at a tiny size: every number of its
summary.json against an independent computation from the saved models (numpy float64 row/column sums and
products of the logged H_res, the validation loss re-evaluated, the timing medians), and bad flags."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from script_modules import load_script
from transformers import AutoModelForCausalLM

import geoformers  # noqa: F401  (registers DDL-mHC with the Auto classes)

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 40
BATCH, BLOCK = 2, 16
CHARTS = ("sinkhorn", "tbp")
STREAMS = (2, 4)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """(script module, its report, output folder, corpus path) of one tiny grid."""
    folder = tmp_path_factory.mktemp("stream_scaling")
    data = folder / "corpus.txt"
    data.write_text(TEXT, encoding="utf-8")
    output = folder / "out"
    argv = [
        *("--data", str(data), "--output_dir", str(output), "--width", "16", "--layers", "1"),
        *("--max_steps", "3", "--warmup_steps", "1", "--timing_steps", "3", "--eval_batches", "1"),
        *(
            "--per_device_train_batch_size",
            str(BATCH),
            "--block_size",
            str(BLOCK),
            "--seeds",
            "0",
            "--threads",
            "1",
        ),
        *("--streams", *map(str, STREAMS), "--charts", *CHARTS, "--save_models"),
    ]
    script = load_script("exp_stream_scaling.py")
    threads = torch.get_num_threads()
    try:
        report = script.main(argv)
    finally:
        torch.set_num_threads(threads)
    return script, report, output, data


def numpy_gains(matrices: list[np.ndarray]) -> tuple[float, float]:
    """Largest max-row / max-column absolute sum of the running products H_k ... H_1 over tokens and k."""
    product, forward, backward = None, 0.0, 0.0
    for h in matrices:
        product = h if product is None else h @ product
        forward = max(forward, np.abs(product).sum(-1).max())
        backward = max(backward, np.abs(product).sum(-2).max())
    return forward, backward


def test_summary_numbers_match_independent_computations(study):
    script, report, output, data = study
    saved = json.loads((output / "summary.json").read_text())
    assert len(saved["runs"]) == len(CHARTS) * len(STREAMS) and len(saved["llama"]) == 1
    assert {(run["chart"], run["n"]) for run in saved["runs"]} == {(c, n) for n in STREAMS for c in CHARTS}
    _, _, val_ids = script.load_corpus(data)
    probe = script.get_batch(val_ids, BATCH, BLOCK, torch.Generator().manual_seed(0))
    llama_memory = saved["llama"][0]["peak_memory_bytes"]
    for run in saved["runs"]:
        model = AutoModelForCausalLM.from_pretrained(output / "models" / f"{run['chart']}_n{run['n']}_seed0")
        assert (model.config.hc_streams, model.config.hc_chart) == (run["n"], run["chart"])
        assert run["parameters"] == model.num_parameters()
        with torch.no_grad():
            records = model(input_ids=probe, output_mixing=True).mixing
        matrices = [record.h_res.numpy().astype(np.float64) for record in records]
        assert len(matrices) == 2  # one layer: attention and MLP
        sums = np.concatenate(
            [np.abs(h.sum(-1) - 1).ravel() for h in matrices]
            + [np.abs(h.sum(-2) - 1).ravel() for h in matrices]
        )
        assert run["ds_error"] == pytest.approx(sums.max(), rel=1e-9, abs=1e-15)
        assert run["min_entry"] == pytest.approx(min(h.min() for h in matrices), abs=0)
        forward, backward = numpy_gains(matrices)
        assert run["gain_forward"] == pytest.approx(forward, abs=1e-12)
        assert run["gain_backward"] == pytest.approx(backward, abs=1e-12)
        if run["chart"] != "sinkhorn":  # exact charts: doubly stochastic to float32 rounding, gains 1
            assert run["ds_error"] <= 1e-6 and run["min_entry"] >= 0
            assert abs(run["gain_forward"] - 1) <= 1e-6 and abs(run["gain_backward"] - 1) <= 1e-6
        loss = script.estimate_loss(model, val_ids, BATCH, BLOCK, 1, 0, torch.device("cpu"))
        assert run["val_loss"] == pytest.approx(loss, abs=1e-6)
        assert run["train_throughput_ratio"] > 0
        assert run["train_throughput_ratio"] == pytest.approx(
            run["timing_llama_median_step_seconds"] / run["timing_median_step_seconds"]
        )
        assert run["train_tokens_per_second"] == pytest.approx(BATCH * BLOCK / run["median_step_seconds"])
        # parameters + gradients + two AdamW moments in float32 are a lower bound of the counted memory
        assert run["peak_memory_bytes"] > 16 * run["parameters"]
        assert run["memory_ratio"] == pytest.approx(run["peak_memory_bytes"] / llama_memory)


def test_summary_table_and_figure(study):
    script, report, output, _ = study
    saved = json.loads((output / "summary.json").read_text())
    assert saved["markdown"] == report["markdown"]
    assert saved["markdown_by_n"] == script.by_n_table(saved["summary"])
    rows = saved["markdown_by_n"].splitlines()[2:]
    assert [line.split(" | ")[0] for line in rows] == ["| sinkhorn", "| tbp"]
    for entry in saved["summary"]:
        run = next(r for r in saved["runs"] if (r["chart"], r["n"]) == (entry["chart"], entry["n"]))
        assert entry["val_loss_mean"] == run["val_loss"] and entry["val_loss_std"] == 0.0
        assert f"| {entry['chart']} | {entry['n']} |" in saved["markdown"]
    assert saved["command"].startswith("python scripts/exp_stream_scaling.py --data")
    assert (output / "stream_scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--streams", "1"], "--streams"),
        (["--streams", "3", "--charts", "kromhc"], "--charts kromhc with --streams 3"),
        (["--charts", "birkhoff"], "--charts"),
        (["--max_steps", "0"], "--max_steps"),
        (["--timing_steps", "2"], "--timing_steps"),
        (["--width", "18"], "--width"),
    ],
)
def test_bad_flags_name_the_flag(flags, named, capsys):
    script = load_script("exp_stream_scaling.py")
    with pytest.raises(SystemExit):
        script.main(flags)
    assert named in capsys.readouterr().err


def test_a_resumed_grid_trains_only_what_it_lacks_and_another_design_is_refused(study, tmp_path, capsys):
    script, _, output, data = study
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "summary.json").write_text((output / "summary.json").read_text())
    before = json.loads((folder / "summary.json").read_text())
    design = [
        *("--data", str(data), "--output_dir", str(folder), "--width", "16", "--layers", "1"),
        *("--warmup_steps", "1", "--timing_steps", "3", "--eval_batches", "1", "--seeds", "0"),
        *("--per_device_train_batch_size", str(BATCH), "--block_size", str(BLOCK), "--threads", "1"),
    ]
    threads = torch.get_num_threads()
    try:
        resumed = script.main([*design, "--max_steps", "3", "--streams", "2", "4", "--charts", "tbp", "rtbp"])
        assert resumed["llama"] == before["llama"]
        assert resumed["runs"][:4] == before["runs"]  # kept as they were
        assert [(run["chart"], run["n"]) for run in resumed["runs"][4:]] == [("rtbp", 2), ("rtbp", 4)]
        assert resumed["settings"]["charts"] == ["rtbp", "sinkhorn", "tbp"]
        assert len(resumed["summary"]) == 6
        kept = (folder / "summary.json").read_text()
        with pytest.raises(SystemExit):  # another design: an error naming what differs, the file untouched
            script.main([*design, "--max_steps", "4", "--streams", "2", "--charts", "tbp"])
    finally:
        torch.set_num_threads(threads)
    error = capsys.readouterr().err
    assert "another design (max_steps: 3 there, 4 here)" in error, error
    assert (folder / "summary.json").read_text() == kept


def test_the_committed_grids_resume_with_the_default_design():
    """results/stream_scaling_2000 (and the 200-step grid of results/stream_scaling with its own steps) hold
    the settings the parser makes of their commands: a later invocation there resumes them."""
    root = Path(__file__).resolve().parents[1]
    script = load_script("exp_stream_scaling.py")
    for folder, flags in (
        ("stream_scaling_2000", []),
        ("stream_scaling", ["--max_steps", "200", "--warmup_steps", "10", "--timing_steps", "15"]),
    ):
        saved = json.loads((root / "results" / folder / "summary.json").read_text())
        args = script.grid_parser().parse_args([*flags, "--use_cpu"])
        assert script.design_differences(saved["settings"], script.design_settings(args)) == [], folder
    renamed = {"max_steps": 2000, "batch_size": 12}
    assert script.design_differences(renamed, {"max_steps": 2000, "per_device_train_batch_size": 12}) == [
        "batch_size: 12 there, 'absent' here",
        "per_device_train_batch_size: 'absent' there, 12 here",
    ]


def test_merge_adds_another_folders_runs_without_training_and_refuses_foreign_ones(study, tmp_path, capsys):
    """A grid split over two folders: `--merge` brings the second folder's run and nothing is trained again
    (the merged record is the other folder's, timings included); a folder without a summary or of another
    design is a parser error naming it."""
    script, _, output, data = study
    design = [
        *("--data", str(data), "--width", "16", "--layers", "1", "--max_steps", "3"),
        *("--warmup_steps", "1", "--timing_steps", "3", "--eval_batches", "1", "--seeds", "0"),
        *("--per_device_train_batch_size", str(BATCH), "--block_size", str(BLOCK), "--threads", "1"),
    ]
    main_folder, other_folder, foreign = tmp_path / "main", tmp_path / "other", tmp_path / "foreign"
    for folder in (main_folder, other_folder):
        folder.mkdir()
        (folder / "summary.json").write_text((output / "summary.json").read_text())
    threads = torch.get_num_threads()
    try:
        other = script.main(
            [*design, "--output_dir", str(other_folder), "--streams", "2", "--charts", "rtbp"]
        )
        merged = script.main(
            [
                *design,
                "--output_dir",
                str(main_folder),
                "--streams",
                "2",
                "--charts",
                "tbp",
                "--merge",
                str(other_folder),
            ]
        )
        script.main(
            [
                *design,
                "--output_dir",
                str(foreign),
                "--streams",
                "2",
                "--charts",
                "tbp",
                "--eval_batches",
                "2",
            ]
        )  # another design: two evaluation batches
        for bad, named in (
            (tmp_path / "missing", "no summary.json"),
            (foreign, "eval_batches: 2 there, 1 here"),
        ):
            with pytest.raises(SystemExit):
                script.main(
                    [
                        *design,
                        "--output_dir",
                        str(main_folder),
                        "--streams",
                        "2",
                        "--charts",
                        "tbp",
                        "--merge",
                        str(bad),
                    ]
                )
            error = capsys.readouterr().err
            assert f"--merge {bad}: " in error and named in error, error
    finally:
        torch.set_num_threads(threads)
    assert merged["runs"] == other["runs"]  # the four runs both had, then other's rtbp at n = 2, untouched
    assert merged["llama"] == other["llama"]
    assert merged["settings"]["charts"] == ["rtbp", "sinkhorn", "tbp"]
    assert len(merged["summary"]) == 5
    assert json.loads((main_folder / "summary.json").read_text())["runs"] == other["runs"]


def test_summary_pairs_each_run_with_its_own_seeds_llama():
    """Hand numbers: tbp at n = 4 over seeds 0 and 1 is 0.10 and 0.30 above its seeds' Llamas (mean 0.20,
    std 0.1414, below the 0.2121 of its losses themselves); a group with a seed that has no Llama gets no
    paired value, and every row says how many seeds it holds."""
    script = load_script("exp_stream_scaling.py")
    metrics = {
        "train_tokens_per_second": 1.0,
        "train_throughput_ratio": 0.5,
        "peak_memory_bytes": 10,
        "memory_ratio": 2.0,
        "ds_error": 1e-8,
        "gain_forward": 1.0,
        "gain_backward": 1.0,
        "min_entry": 0.1,
        "parameters": 100,
    }
    llama = [
        {"seed": 0, "val_loss": 2.0, "parameters": 90, "train_tokens_per_second": 2.0},
        {"seed": 1, "val_loss": 1.5, "parameters": 90, "train_tokens_per_second": 2.0},
    ]
    runs = [
        {"chart": "tbp", "n": 4, "seed": 0, "val_loss": 2.1, **metrics},
        {"chart": "tbp", "n": 4, "seed": 1, "val_loss": 1.8, **metrics},
        {"chart": "tbp", "n": 8, "seed": 2, "val_loss": 1.7, **metrics},
    ]
    summary, table = script.summarize(runs, llama)
    both, alone = sorted(summary, key=lambda entry: entry["n"])
    assert both["seeds"] == [0, 1] and alone["seeds"] == [2]
    assert both["val_loss_mean"] == pytest.approx(1.95)
    assert both["val_loss_std"] == pytest.approx(0.3 / 2**0.5)
    assert both["val_loss_vs_llama_mean"] == pytest.approx(0.2)
    assert both["val_loss_vs_llama_std"] == pytest.approx(0.2 / 2**0.5)
    assert alone["val_loss_vs_llama_mean"] is None and alone["val_loss_vs_llama_std"] is None
    assert "| llama (transformers) | 1 | 2 | 90 | 1.7500 ± 0.3536 | 0 |" in table
    assert "| tbp | 4 | 2 | 100 | 1.9500 ± 0.2121 | +0.2000 ± 0.1414 |" in table
    assert "| tbp | 8 | 1 | 100 | 1.7000 | - |" in table
    by_n = script.by_n_table(summary)
    assert by_n.splitlines()[0] == "| chart | n = 4 | n = 8 | worst DS error |"
    assert by_n.splitlines()[2] == "| tbp | +0.200 ± 0.141 / 0.50× | - | 1.0e-08 |"


def test_docs_and_card_quote_the_committed_full_grid():
    """docs/stream_scaling.md and the DDL-mHC card show the tables of results/stream_scaling_2000/summary.json
    as that file has them, and the file's summary is what `summarize` makes of its own runs."""
    root = Path(__file__).resolve().parents[1]
    saved = json.loads((root / "results" / "stream_scaling_2000" / "summary.json").read_text())
    script = load_script("exp_stream_scaling.py")
    summary, table = script.summarize(saved["runs"], saved["llama"])
    assert table == saved["markdown"] and script.by_n_table(summary) == saved["markdown_by_n"]
    assert len({(run["seed"], run["n"], run["chart"]) for run in saved["runs"]}) == len(saved["runs"])
    docs = (root / "docs" / "stream_scaling.md").read_text()
    card = (root / "model_cards" / "ddl_mhc.md").read_text()
    assert saved["markdown"] in docs and saved["markdown_by_n"] in docs and saved["markdown_by_n"] in card
