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
    python scripts/exp_sst2.py --batch_size 32 --ensemble_size 5 --member_processes 2  # 2 at a time
    python scripts/exp_sst2.py --max_train_samples 512 --max_steps 20 --pre_growth_steps 5 \\
        --output_dir outputs/x
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from sklearn.feature_extraction.text import TfidfVectorizer  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from transformers import DataCollatorWithPadding, Trainer, set_seed  # noqa: E402

from geoformers.configuration.ddcl_incrt import GATE_RULES, GATE_THRESHOLDS, DDCLIncrtConfig  # noqa: E402
from geoformers.modeling.bert_conversion import wrap_bert_embeddings  # noqa: E402
from geoformers.modeling.ddcl_incrt import DDCLIncrtForSequenceClassification  # noqa: E402
from geoformers.tokenization import load_bert_tokenizer, train_wordpiece  # noqa: E402
from geoformers.training.data import encode_dataset, load_sst2  # noqa: E402

from harness.analysis import (  # noqa: E402
    grow_order,
    head_count_law,
    spectrum_head_count_law,
    stop_summary,
    temperature_split,
)
from harness.flags import gate_choices  # noqa: E402
from harness.probes import gate_spectrum  # noqa: E402
from harness.recipe import run_growth_training  # noqa: E402
from harness.results import (  # noqa: E402
    REPO_ROOT,
    command_line,
    default_bert_path,
    environment,
    markdown_table,
    write_json,
)

SEED_PAPER_ACCURACY = 0.694  # DDCL-INCRT from scratch, 6 grown heads (reported by the DDCL-INCRT papers)
TARGET_ACCURACY = 0.83


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    paths = parser.add_argument_group("data and outputs")
    paths.add_argument("--data_dir", default=None,
                       help="local GLUE SST-2 folder (train.tsv, dev.tsv); default: the hub's "
                            "nyu-mll/glue sst2")
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
    model.add_argument("--tau_min", type=float, default=0.05)
    model.add_argument("--prototype_loss_weight", type=float, default=0.01,
                       help="lambda in CE + lambda L_q (0.1 collapsed prototype usage in exp_pruning_safety)")
    model.add_argument("--pooling", choices=("cls", "mean"), default="mean")
    model.add_argument("--hidden_dropout", type=float, default=None,
                       help="default 0.5 from scratch, 0.1 with --bert (frozen pre-trained features)")
    model.add_argument("--classifier_dropout", type=float, default=None, help="default as --hidden_dropout")
    model.add_argument("--word_dropout", type=float, default=0.0,
                       help="training only: drop each non-special token with this probability (DAN)")
    growth = parser.add_argument_group("growth")
    growth.add_argument("--no_growth", action="store_true",
                        help="train --initial_heads heads with no callback, in a grown run's phases")
    growth.add_argument("--pre_growth_steps", type=int, default=200,
                        help="steps the initial heads train before theta_w is calibrated and growth starts")
    growth.add_argument("--check_every", type=int, default=10, help="optimizer steps between gate checks")
    growth.add_argument("--gate_batch_size", type=int, default=256, help="training rows per gate check")
    growth.add_argument("--gate_threshold", choices=GATE_THRESHOLDS, default=None,
                        help="theta_w = factor x ||A_sym||_F at every check (relative) or calibrated once; "
                             "default: the config's (relative)")
    growth.add_argument("--gate_rule", choices=GATE_RULES, default=None,
                        help="max_only or bidirectional (docs/growth_gate.md); default: the config's")
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
    optimisation.add_argument("--ensemble_size", type=int, default=1,
                              help="members trained with seeds K * seed + m, m < K; their mean probabilities")
    optimisation.add_argument("--member_processes", type=int, default=1,
                              help="ensemble members trained at once, each in its own process on one thread")
    optimisation.add_argument("--progress", action="store_true", help="show the Trainer's progress bar")
    optimisation.add_argument("--threads", type=int, default=None,
                              help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    for name in ("max_train_samples", "max_eval_samples"):
        value = getattr(args, name)
        if value is not None and value < 2:
            parser.error(f"--{name} must be >= 2, got {value}")
    if args.ensemble_size < 1:
        parser.error(f"--ensemble_size must be >= 1, got {args.ensemble_size}")
    if args.member_processes < 1:
        parser.error(f"--member_processes must be >= 1, got {args.member_processes}")
    if args.member_processes > args.ensemble_size:
        parser.error(f"--member_processes ({args.member_processes}) must be <= --ensemble_size "
                     f"({args.ensemble_size})")
    if args.member_processes > 1 and args.threads not in (None, 1):
        parser.error(f"--member_processes > 1 runs each member on one thread; drop --threads {args.threads}")
    if not 0.0 <= args.word_dropout < 1.0:
        parser.error(f"--word_dropout must lie in [0, 1), got {args.word_dropout}")
    if args.pre_growth_steps < 0:
        parser.error(f"--pre_growth_steps must be >= 0, got {args.pre_growth_steps}")
    if 0 < args.max_steps <= args.pre_growth_steps:
        parser.error(f"--pre_growth_steps ({args.pre_growth_steps}) must be < --max_steps ({args.max_steps})")
    if args.use_encoder_outputs and not args.bert:
        parser.error("--use_encoder_outputs needs --bert")
    for name in ("hidden_dropout", "classifier_dropout"):
        if getattr(args, name) is None:
            setattr(args, name, 0.1 if args.bert else 0.5)
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


def tfidf_baseline(train, dev, max_ngram: int = 1) -> dict:
    """TF-IDF (n-grams up to `max_ngram`, sublinear tf) + logistic regression (C = 1), fitted on the same
    training rows; with max_ngram = 1 it also fits the bigram model under the key "bigram"."""
    start = time.perf_counter()
    vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, max_ngram))
    features = vectorizer.fit_transform(train["sentence"])
    classifier = LogisticRegression(max_iter=1000).fit(features, train["label"])
    predictions = classifier.predict(vectorizer.transform(dev["sentence"]))
    accuracy = float((predictions == dev["label"]).mean())
    result = {"accuracy": accuracy, "features": len(vectorizer.vocabulary_),
              "wall_time_s": time.perf_counter() - start}
    if max_ngram == 1:
        result["bigram"] = tfidf_baseline(train, dev, max_ngram=2)
    return result


def build_model(args: argparse.Namespace, tokenizer) -> DDCLIncrtForSequenceClassification:
    settings = {
        "num_hidden_layers": args.num_hidden_layers, "num_heads": args.initial_heads,
        "head_dim": args.head_dim, "max_heads": args.max_heads, "num_prototypes": args.num_prototypes,
        "tau_init": args.tau_init, "tau_min": args.tau_min,
        "prototype_loss_weight": args.prototype_loss_weight, "pooling": args.pooling,
        "hidden_dropout_prob": args.hidden_dropout, "classifier_dropout": args.classifier_dropout,
        "gate_calibration_factor": args.gate_calibration_factor, "gate_prune_factor": args.gate_prune_factor,
        "gate_check_every": args.check_every, **gate_choices(args),
    }
    if args.bert:
        return wrap_bert_embeddings(args.bert_path or default_bert_path(),
                                    use_encoder_outputs=args.use_encoder_outputs, **settings)
    config = DDCLIncrtConfig(vocab_size=len(tokenizer), hidden_size=args.hidden_size,
                             max_position_embeddings=args.max_length, pad_token_id=tokenizer.pad_token_id,
                             type_vocab_size=0, **settings)
    return DDCLIncrtForSequenceClassification(config)


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


def drop_words(input_ids: torch.Tensor, attention_mask: torch.Tensor, rate: float,
               special_ids: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Word dropout (DAN, Iyyer et al. 2015): every real token other than `special_ids` leaves the sentence
    with probability `rate` -> the new attention mask (dropped tokens are neither attended to nor pooled;
    [CLS]/[SEP] stay, so no row is emptied)."""
    kept = torch.rand(input_ids.shape, generator=generator, device=input_ids.device) >= rate
    kept |= torch.isin(input_ids, special_ids.to(input_ids.device))
    return attention_mask * kept.to(attention_mask.dtype)


class WordDropoutTrainer(Trainer):
    """`Trainer` whose training steps see `drop_words`; evaluation, prototype statistics and the growth
    callback's gate batches (drawn with the plain collator) see whole sentences."""

    def __init__(self, *args, word_dropout: float, special_ids: list[int], **kwargs):
        super().__init__(*args, **kwargs)
        self.word_dropout = word_dropout
        self.special_ids = torch.tensor(special_ids)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training and self.word_dropout > 0:
            inputs = {**inputs, "attention_mask": drop_words(inputs["input_ids"], inputs["attention_mask"],
                                                             self.word_dropout, self.special_ids)}
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)


def train(model, args: argparse.Namespace, train_rows, dev, collator, output_dir: Path) -> dict:
    """The shared growth recipe (`harness.recipe.run_growth_training`) over `--epochs` (or `--max_steps`)
    with `--warmup_ratio` warm-up, word dropout and evaluations every `--eval_steps` in the growth phase.
    `--no_growth` keeps the phases (learning-rate schedule, data orders) and drops the callback, so a static
    model differs from a grown one by its heads only. Returns the final evaluation, evaluations on global
    steps, the history on global steps (None with `--no_growth`), the exact A_sym spectra and theta_w when
    growth starts, and the training time."""
    steps_per_epoch = math.ceil(len(train_rows) / args.batch_size)
    total = args.max_steps if args.max_steps > 0 else math.ceil(args.epochs * steps_per_epoch)
    pre = args.pre_growth_steps
    if pre >= total:
        raise ValueError(f"--pre_growth_steps ({pre}) must be < the {total} training steps")
    recipe = argparse.Namespace(**{**vars(args), "max_steps": total, "pre_growth_steps": pre,
                                   "warmup_steps": round(args.warmup_ratio * total),
                                   "lr_scheduler_type": "linear"})
    spectra = []

    def spectrum_at_growth_start(start: int, end: int) -> None:
        if start == pre and not args.no_growth:
            batch = gate_batch(train_rows, collator, args.gate_batch_size, args.seed)
            spectra.append(gate_spectrum(model, batch, deflated=False))

    run = run_growth_training(
        model, recipe, train_rows, output_dir=output_dir, eval_dataset=dev,
        on_window=spectrum_at_growth_start, growth=not args.no_growth, sampling=args.sampling,
        trainer_class=WordDropoutTrainer,
        trainer_kwargs={"data_collator": collator, "word_dropout": args.word_dropout,
                        "special_ids": collator.tokenizer.all_special_ids},
    )
    evaluations = run.evaluations
    final = run.trainer.evaluate()
    if not evaluations or evaluations[-1]["step"] != total:
        evaluations.append({"step": total, "accuracy": final["eval_accuracy"]})
    theta_w = [float(layer.attention.gate.theta_w) for layer in model.base_model.layers]
    return {"final": final, "evaluations": evaluations, "history": run.history, "steps": total,
            "spectra_at_growth_start": spectra[0] if spectra else None, "theta_w": theta_w,
            "train_time_s": run.train_time_s}


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
    data = load_data(args)
    (raw_train, raw_dev), _, _ = data
    baseline = tfidf_baseline(raw_train, raw_dev)
    if args.ensemble_size > 1:
        return run_ensemble(args, argv, data, baseline, started)
    return run_single(args, argv, data, baseline, started)[0]


def run_ensemble(args: argparse.Namespace, argv: list[str] | None, data, baseline: dict,
                 started: float) -> dict:
    """`--ensemble_size` members, each a full run (its own sst2.json) under `member<m>/` with seed
    K * seed + m on the same data and vocabulary; the ensemble predicts the argmax of their mean dev
    probabilities. Writes `sst2_ensemble.json`."""
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    member_args = [argparse.Namespace(**{**vars(args), "ensemble_size": 1,
                                         "seed": args.ensemble_size * args.seed + member,
                                         "output_dir": str(output_dir / f"member{member}")})
                   for member in range(args.ensemble_size)]
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
        "command": command_line("exp_sst2.py", argv),
        "args": vars(args),
        "dev_accuracy": float((mean_probabilities.argmax(-1) == labels).double().mean()),
        "member_seeds": [member["args"]["seed"] for member in members],
        "member_dev_accuracy": accuracies,
        "member_mean_dev_accuracy": sum(accuracies) / len(accuracies),
        "member_num_heads": [member["num_heads"] for member in members],
        "baseline": members[0]["baseline"],
        "reference": members[0]["reference"],
        "parameters_total": sum(member["parameters"]["total"] for member in members),
        "wall_time_s": time.perf_counter() - started,
        "environment": environment(),
    }
    write_json(output_dir / "sst2_ensemble.json", result)
    print(markdown_table(
        ["model", "dev accuracy", "members' dev accuracy", "wall time (s)"],
        [[f"ensemble of {args.ensemble_size} DDCL-INCRT", result["dev_accuracy"], accuracies,
          result["wall_time_s"]]],
    ))
    return result


def run_in_processes(member_args: list[argparse.Namespace], argv: list[str] | None, data, baseline: dict,
                     processes: int) -> list[tuple[dict, torch.Tensor]]:
    """`run_single` for each member, `processes` at a time in forked processes on one torch thread each
    (one thread keeps them clear of OpenMP's fork hazard and makes each member identical to a sequential
    `--threads 1` run) -> the members' (result, dev probabilities) in member order."""
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork"),
                             initializer=torch.set_num_threads, initargs=(1,)) as pool:
        futures = [pool.submit(run_single, one, argv, data, baseline) for one in member_args]
        return [future.result() for future in futures]


def run_single(args: argparse.Namespace, argv: list[str] | None, data, baseline: dict,
               started: float | None = None) -> tuple[dict, torch.Tensor]:
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
        "command": command_line("exp_sst2.py", argv),
        "args": vars(args),
        "train_samples": len(train_rows), "eval_samples": len(dev), "vocab_size": len(tokenizer),
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
        } if history else {},
        "temperature_split": temperature_split(prototypes["temperatures"], args.tau_min, args.tau_init),
        "prototypes_on_dev": prototypes,
        "dev_probabilities": probabilities.tolist(),
        "parameters": parameter_counts(model),
        "steps": run["steps"],
        "train_time_s": run["train_time_s"],
        "wall_time_s": time.perf_counter() - started,
        "environment": environment(),
    }
    write_json(output_dir / "sst2.json", result)
    plot(result, history, output_dir / "sst2.png")
    print_summary(result)
    return result, probabilities


def print_summary(result: dict) -> None:
    parameters, baseline = result["parameters"], result["baseline"]
    print(markdown_table(
        ["model", "dev accuracy", "heads per layer", "parameters (trainable)", "wall time (s)"],
        [[f"DDCL-INCRT ({result['experiment']})", result["dev_accuracy"], result["num_heads"],
          f"{parameters['total']:,} ({parameters['trainable']:,})", result["wall_time_s"]],
         ["TF-IDF + logistic regression", baseline["accuracy"], "-", f"{baseline['features'] + 1:,}",
          baseline["wall_time_s"]],
         *([["TF-IDF uni+bigrams + logistic regression", baseline["bigram"]["accuracy"], "-",
             f"{baseline['bigram']['features'] + 1:,}", baseline["bigram"]["wall_time_s"]]]
           if "bigram" in baseline else [])],
    ))
    for name, layers in result["head_count_law"].items():
        for layer in layers:
            print(f"head-count law ({name}), layer {layer['layer']}: observed {layer['observed_heads']} "
                  f"heads, K* = {layer['predicted_heads']}, kappa_T = {layer['kappa_T']}")
    print(f"results in {result['args']['output_dir']}")


if __name__ == "__main__":
    main()
