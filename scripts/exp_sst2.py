"""SST-2 experiment (docs/experiments.md, 'exp_sst2.py'): DDCL-INCRT from scratch with INCRT head growth,
against a TF-IDF baseline.

A WordPiece vocabulary is trained on the SST-2 training split and DDCL-INCRT starts with `--initial_heads`
heads per layer. Training follows the experiments' shared growth recipe (`harness.recipe`): the initial
heads first train `--pre_growth_steps` steps with no gate (a gate acting on untrained weights grows heads
until max_heads), then `IncrtGrowthCallback` grows (and prunes) heads every `--check_every` steps until the
end, by default against the relative threshold theta_w = 0.1 ||A_sym||_F of each check (the config's default);
one optimizer (`make_optimizer`, prototypes at `--prototype_lr_multiplier` times the learning rate) serves
both phases, and each phase draws its own shuffled order of the training rows. A TF-IDF + logistic
regression baseline (scikit-learn) is fitted on the same rows. `--bert` runs the same on a pre-trained BERT's
frozen embeddings (`wrap_bert_embeddings`, its WordPiece vocabulary; default the offline MiniLM),
`--use_encoder_outputs` on its frozen encoder outputs. `--ensemble_size K` trains K members (seeds
K * seed + m, each a full run under `member<m>/`, `--member_processes` of them at once) and reports the
accuracy of their mean dev probabilities.

Reported in `<output_dir>/sst2.json` (+ `sst2.png`, `growth_history.{json,png}` on global steps): dev
accuracy (final and at every evaluation), heads per layer, parameters, wall times, grow order, how growth
ended, per-head temperatures (local/global split) and prototype statistics on the dev set, and the head-count
law K* = kappa_T^2 log(Gamma_res^(0) / theta_w) against the observed heads with the two shared estimators
(`head_count_law`: kappa_T from the gate's lambda_max trajectory; `spectrum_head_count_law`: the exact
spectrum of A_sym when growth starts, kappa_T = the condition number of its part above theta_w). The
Theta() constant is taken as 1; the papers do not say how kappa_T is estimated.

    python scripts/exp_sst2.py                                   # from scratch, the default recipe
    python scripts/exp_sst2.py --bert                            # on frozen MiniLM embeddings
    python scripts/exp_sst2.py --per_device_train_batch_size 32 --ensemble_size 5 \\
        --member_processes 2                                     # 5 members, 2 at a time
    python scripts/exp_sst2.py --max_train_samples 512 --max_steps 20 --pre_growth_steps 5 \\
        --output_dir outputs/x
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from sklearn.feature_extraction.text import TfidfVectorizer  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from transformers import DataCollatorWithPadding, set_seed  # noqa: E402

from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification  # noqa: E402

from harness.analysis import (  # noqa: E402
    grow_order,
    head_count_law,
    spectrum_head_count_law,
    stop_summary,
    temperature_split,
)
from harness.flags import parsed_settings  # noqa: E402
from harness.results import markdown_table, write_results  # noqa: E402
from harness.sst2 import build_model, load_data, parse_args, train  # noqa: E402
from harness.threads import set_threads  # noqa: E402

SEED_PAPER_ACCURACY = 0.694  # DDCL-INCRT from scratch, 6 grown heads (reported by the DDCL-INCRT papers)
TARGET_ACCURACY = 0.83


def tfidf_baseline(train, dev, max_ngram: int = 1) -> dict:
    """TF-IDF (n-grams up to `max_ngram`, sublinear tf) + logistic regression (C = 1), fitted on the same
    training rows; with max_ngram = 1 it also fits the bigram model under the key "bigram"."""
    start = time.perf_counter()
    vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, max_ngram))
    features = vectorizer.fit_transform(train["sentence"])
    classifier = LogisticRegression(max_iter=1000).fit(features, train["label"])
    predictions = classifier.predict(vectorizer.transform(dev["sentence"]))
    accuracy = float((predictions == dev["label"]).mean())
    result = {
        "accuracy": accuracy,
        "features": len(vectorizer.vocabulary_),
        "wall_time_s": time.perf_counter() - start,
    }
    if max_ngram == 1:
        result["bigram"] = tfidf_baseline(train, dev, max_ngram=2)
    return result


@torch.no_grad()
def dev_outputs(model: DDCLIncrtForSequenceClassification, dev, collator):
    """The trained model's outputs on the whole dev set in one batch (so the DDCL means are exact)."""
    batch = collator([dev[index] for index in range(len(dev))])
    inputs = {name: value for name, value in batch.items() if name != "labels"}
    return model.eval()(**inputs, output_prototype_statistics=True)


def prototype_statistics(outputs) -> dict:
    """DDCL quantities of `dev_outputs`: per-head temperature, min pairwise prototype distance, effective
    number of used prototypes."""
    return {
        "l_q": float(outputs.l_q),
        "l_ols": float(outputs.l_ols),
        "prototype_variance": float(outputs.prototype_variance),
        "temperatures": [t.tolist() for t in outputs.temperatures],
        "min_prototype_distance": [d.tolist() for d in outputs.min_prototype_distance],
        "effective_prototypes": [p.tolist() for p in outputs.prototype_perplexity],
    }


def parameter_counts(model: DDCLIncrtForSequenceClassification) -> dict:
    embeddings = sum(p.numel() for p in model.model.embeddings.parameters())
    return {
        "total": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "embeddings": embeddings,
        "non_embedding": sum(p.numel() for p in model.parameters()) - embeddings,
    }


def plot(result: dict, history: dict | None, path: Path) -> None:
    figure, (accuracy_axis, heads_axis) = plt.subplots(1, 2, figsize=(11, 4))
    evaluations = result["dev_accuracy_history"]
    accuracy_axis.plot(
        [e["step"] for e in evaluations], [e["accuracy"] for e in evaluations], marker="o", label="DDCL-INCRT"
    )
    accuracy_axis.axhline(
        result["baseline"]["accuracy"],
        color="tab:green",
        linestyle="--",
        label="TF-IDF + logistic regression",
    )
    accuracy_axis.axhline(TARGET_ACCURACY, color="grey", linestyle=":", label="target 83 %")
    accuracy_axis.axhline(SEED_PAPER_ACCURACY, color="tab:red", linestyle=":", label="paper 69.4 %")
    accuracy_axis.set(xlabel="optimizer step", ylabel="dev accuracy", title="SST-2 dev accuracy")
    accuracy_axis.legend(fontsize=8)
    accuracy_axis.grid(alpha=0.3)
    if history is not None:
        steps = [0] + [check["step"] for check in history["checks"]]
        for layer, initial in enumerate(history["initial_num_heads"]):
            heads = [initial] + [check["num_heads"][layer] for check in history["checks"]]
            heads_axis.step(steps, heads, where="post", label=f"layer {layer}")
        heads_axis.legend(fontsize=8)
    heads_axis.set(xlabel="optimizer step", ylabel="heads", title="heads per layer (INCRT growth)")
    for axis in (accuracy_axis, heads_axis):
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    heads_axis.yaxis.set_major_locator(MaxNLocator(integer=True))
    heads_axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv, __doc__.split("\n\n")[0])
    set_threads(args.threads)
    started = time.perf_counter()
    data = load_data(args)
    (raw_train, raw_dev), _, _ = data
    baseline = tfidf_baseline(raw_train, raw_dev)
    if args.ensemble_size > 1:
        return run_ensemble(args, argv, data, baseline, started)
    return run_single(args, argv, data, baseline, started)[0]


def run_ensemble(
    args: argparse.Namespace, argv: list[str] | None, data, baseline: dict, started: float
) -> dict:
    """`--ensemble_size` members, each a full run (its own sst2.json) under `member<m>/` with seed
    K * seed + m on the same data and vocabulary; the ensemble predicts the argmax of their mean dev
    probabilities. Writes `sst2_ensemble.json`."""
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    member_args = [
        argparse.Namespace(
            **{
                **vars(args),
                "ensemble_size": 1,
                "seed": args.ensemble_size * args.seed + member,
                "output_dir": str(output_dir / f"member{member}"),
            }
        )
        for member in range(args.ensemble_size)
    ]
    if args.member_processes == 1:
        runs = [run_single(one, argv, data, baseline) for one in member_args]
    else:
        runs = run_in_processes(member_args, argv, data, baseline, args.member_processes)
    members = [member for member, _ in runs]
    probabilities = [member_probabilities for _, member_probabilities in runs]
    (_, raw_dev), _, _ = data
    labels = torch.tensor(list(raw_dev["label"]))
    mean_probabilities = torch.stack(probabilities).mean(0)
    accuracies = [member["dev_accuracy"] for member in members]
    result = {
        "experiment": "sst2_ensemble",
        "dev_accuracy": float((mean_probabilities.argmax(-1) == labels).double().mean()),
        "member_seeds": [member["settings"]["seed"] for member in members],
        "member_dev_accuracy": accuracies,
        "member_mean_dev_accuracy": sum(accuracies) / len(accuracies),
        "member_num_heads": [member["num_heads"] for member in members],
        "baseline": members[0]["baseline"],
        "reference": members[0]["reference"],
        "parameters_total": sum(member["parameters"]["total"] for member in members),
        "wall_time_s": time.perf_counter() - started,
    }
    result = write_results(
        output_dir / "sst2_ensemble.json", "exp_sst2.py", argv, parsed_settings(args), result
    )
    print(
        markdown_table(
            ["model", "dev accuracy", "members' dev accuracy", "wall time (s)"],
            [
                [
                    f"ensemble of {args.ensemble_size} DDCL-INCRT",
                    result["dev_accuracy"],
                    accuracies,
                    result["wall_time_s"],
                ]
            ],
        )
    )
    return result


def run_in_processes(
    member_args: list[argparse.Namespace], argv: list[str] | None, data, baseline: dict, processes: int
) -> list[tuple[dict, torch.Tensor]]:
    """`run_single` for each member, `processes` at a time in forked processes on one torch thread each
    (one thread keeps them clear of OpenMP's fork hazard and makes each member identical to a sequential
    `--threads 1` run) -> the members' (result, dev probabilities) in member order."""
    with ProcessPoolExecutor(
        processes,
        mp_context=multiprocessing.get_context("fork"),
        initializer=torch.set_num_threads,
        initargs=(1,),
    ) as pool:
        futures = [pool.submit(run_single, one, argv, data, baseline) for one in member_args]
        return [future.result() for future in futures]


def run_single(
    args: argparse.Namespace, argv: list[str] | None, data, baseline: dict, started: float | None = None
) -> tuple[dict, torch.Tensor]:
    """One model on `data` (`load_data`): train, write `sst2.json` and the figures -> (the result, its dev
    probabilities). Its wall time counts from `started` (default: now)."""
    started = time.perf_counter() if started is None else started
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    set_seed(args.seed)
    _, tokenizer, (train_rows, dev) = data
    model = build_model(args, tokenizer)
    collator = DataCollatorWithPadding(tokenizer)
    run = train(model, args, train_rows, dev, collator, output_dir)
    history = run["history"]
    if args.save_model:
        model.save_pretrained(output_dir / "model")
        tokenizer.save_pretrained(output_dir / "model")
    outputs = dev_outputs(model, dev, collator)
    prototypes = prototype_statistics(outputs)
    probabilities = outputs.logits.float().softmax(-1)
    result = {
        "experiment": "sst2_bert" if args.bert else "sst2",
        "train_samples": len(train_rows),
        "eval_samples": len(dev),
        "vocab_size": len(tokenizer),
        "dev_accuracy": run["final"]["eval_accuracy"],
        "dev_accuracy_history": run["evaluations"],
        "baseline": {"name": "tfidf_logistic_regression", **baseline},
        "reference": {"paper_ddcl_incrt_from_scratch": SEED_PAPER_ACCURACY, "target": TARGET_ACCURACY},
        "num_heads": list(model.config.num_heads),
        "growth_started_at_step": history["growth_started_at_step"] if history else None,
        "growth_stopped_at_step": history["growth_stopped_at_step"] if history else None,
        "growth_end": stop_summary(history) if history else [],
        "grow_order": grow_order(history) if history else [],
        "growth_events": [e for e in history["events"] if e["action"] != "calibrated"] if history else [],
        "head_count_law": {
            "trajectory": head_count_law(history),
            "spectrum_at_growth_start": spectrum_head_count_law(
                run["spectra_at_growth_start"], run["theta_w"], list(model.config.num_heads)
            ),
        }
        if history
        else {},
        "temperature_split": temperature_split(prototypes["temperatures"], args.tau_min, args.tau_init),
        "prototypes_on_dev": prototypes,
        "dev_probabilities": probabilities.tolist(),
        "parameters": parameter_counts(model),
        "steps": run["steps"],
        "train_time_s": run["train_time_s"],
        "wall_time_s": time.perf_counter() - started,
    }
    print_summary(result)
    result = write_results(output_dir / "sst2.json", "exp_sst2.py", argv, parsed_settings(args), result)
    plot(result, history, output_dir / "sst2.png")
    print(f"wrote {output_dir / 'sst2.png'}")
    return result, probabilities


def print_summary(result: dict) -> None:
    parameters, baseline = result["parameters"], result["baseline"]
    print(
        markdown_table(
            ["model", "dev accuracy", "heads per layer", "parameters (trainable)", "wall time (s)"],
            [
                [
                    f"DDCL-INCRT ({result['experiment']})",
                    result["dev_accuracy"],
                    result["num_heads"],
                    f"{parameters['total']:,} ({parameters['trainable']:,})",
                    result["wall_time_s"],
                ],
                [
                    "TF-IDF + logistic regression",
                    baseline["accuracy"],
                    "-",
                    f"{baseline['features'] + 1:,}",
                    baseline["wall_time_s"],
                ],
                *(
                    [
                        [
                            "TF-IDF uni+bigrams + logistic regression",
                            baseline["bigram"]["accuracy"],
                            "-",
                            f"{baseline['bigram']['features'] + 1:,}",
                            baseline["bigram"]["wall_time_s"],
                        ]
                    ]
                    if "bigram" in baseline
                    else []
                ),
            ],
        )
    )
    for name, layers in result["head_count_law"].items():
        for layer in layers:
            print(
                f"head-count law ({name}), layer {layer['layer']}: observed {layer['observed_heads']} "
                f"heads, K* = {rounded(layer['predicted_heads'])}, kappa_T = {rounded(layer['kappa_T'])}"
            )


def rounded(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


if __name__ == "__main__":
    main()
