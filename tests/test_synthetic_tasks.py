"""Synthetic tasks: the planted structure of the spectral task, the non-stationary stream and the CoV-2
genomes, read back from the token rows; determinism; bad arguments."""

import itertools
import json

import numpy as np
import pytest
from datasets import ClassLabel, Dataset

from geoformers.tokenization import build_kmer_tokenizer, kmerize
from geoformers.training import synthetic_tasks
from geoformers.training.synthetic_tasks import (
    build_cov2_variant_task,
    build_majority_relations_task,
    build_nonstationary_stream,
    build_spectral_task,
    task_spec,
)

SMALL_SPECTRAL = {"num_train": 400, "num_validation": 200}


# ------------------------------------------------------------------------------------ synthetic spectral task


def order_signs(input_ids: np.ndarray, relations: list[dict]) -> np.ndarray:
    """z_i = +1 where a_i comes before b_i, from the token rows (an independent reading of the data)."""
    signs = []
    for relation in relations:
        key_position = np.argmax(input_ids == relation["key_token"], axis=1)
        query_position = np.argmax(input_ids == relation["query_token"], axis=1)
        signs.append(np.where(key_position < query_position, 1.0, -1.0))
    return np.stack(signs, axis=1)


def test_spectral_task_layout_and_balance():
    task = build_spectral_task(**SMALL_SPECTRAL)
    spec = task_spec(task)
    relations = spec["relations"]
    assert [relation["strength"] for relation in relations] == [0.9, 0.8, 0.7, 0.6]
    for split, size in (("train", 400), ("validation", 200)):
        ids = np.array(task[split]["input_ids"])
        assert ids.shape == (size, 24)
        assert (ids[:, 0] == 2).all() and (ids[:, -1] == 3).all()
        assert np.array_equal(np.array(task[split]["attention_mask"]), np.ones_like(ids))
        content = ids[:, 1:-1]
        assert content.min() >= 5 and content.max() < 48
        for relation in relations:  # every relation token exactly once per row: counts carry no signal
            for token in (relation["key_token"], relation["query_token"]):
                assert ((content == token).sum(axis=1) == 1).all()
        assert np.bincount(task[split]["labels"]).tolist() == [size // 2, size // 2]
        assert isinstance(task[split].features["labels"], ClassLabel)


def test_spectral_task_correlations_and_bayes_accuracy_match_the_plan():
    task = build_spectral_task(num_train=8000, num_validation=2)
    spec = task_spec(task)
    ids, labels = np.array(task["train"]["input_ids"]), np.array(task["train"]["labels"])
    signs = order_signs(ids, spec["relations"])
    signed_labels = 2 * labels - 1
    correlations = (signs * signed_labels[:, None]).mean(axis=0)
    strengths = np.array([0.9, 0.8, 0.7, 0.6])
    np.testing.assert_allclose(correlations, strengths, atol=0.03)  # std ~ 0.01
    weights = np.array([relation["bayes_weight"] for relation in spec["relations"]])
    np.testing.assert_allclose(weights, np.log((1 + strengths) / (1 - strengths)))
    bayes_predictions = (signs @ weights > 0).astype(int)
    assert abs((bayes_predictions == labels).mean() - spec["bayes_accuracy"]) < 0.01  # std ~ 0.002
    losses = [spec["bayes_accuracy"] - relation["bayes_accuracy_without"] for relation in spec["relations"]]
    assert all(loss > 0 for loss in losses) and losses == sorted(losses, reverse=True)


def test_bayes_accuracy_by_hand():
    # k = 3 with w_1 < w_2 + w_3: the Bayes rule is the majority of the three orders; each agrees with y
    # with probability (1 + s)/2 = 0.95, 0.9, 0.8: P(>= 2 agree) = 0.684 + 0.171 + 0.076 + 0.036 = 0.967
    majority = build_spectral_task((0.9, 0.8, 0.6), **SMALL_SPECTRAL)
    assert task_spec(majority)["bayes_accuracy"] == pytest.approx(0.967)
    single = build_spectral_task(np.array([0.6]), **SMALL_SPECTRAL)
    assert task_spec(single)["bayes_accuracy"] == pytest.approx(0.8)


def test_spectral_task_is_deterministic_from_the_seed():
    first = build_spectral_task(**SMALL_SPECTRAL, seed=3)
    again = build_spectral_task(**SMALL_SPECTRAL, seed=3)
    other = build_spectral_task(**SMALL_SPECTRAL, seed=4)
    assert first["train"]["input_ids"] == again["train"]["input_ids"]
    assert first["validation"]["labels"] == again["validation"]["labels"]
    assert first["train"]["input_ids"] != other["train"]["input_ids"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"strengths": (0.6, 0.8)}, ValueError, "strengths"),
        ({"strengths": (0.9, 0.0)}, ValueError, "strengths"),
        ({"strengths": (1.0, 0.5)}, ValueError, "strengths"),
        ({"strengths": (0.8, 0.6)}, ValueError, r"strengths\[1\]"),  # log 9 > log 4: relation 2 never decides
        ({"strengths": ()}, ValueError, "strengths"),
        ({"strengths": "0.9"}, TypeError, "strengths"),
        ({"strengths": ["high", "low"]}, ValueError, "strengths"),
        ({"strengths": (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1) * 2}, ValueError, "strengths"),
        ({"vocab_size": 13}, ValueError, "vocab_size"),
        ({"seq_len": 9}, ValueError, "seq_len"),
        ({"num_train": 1}, ValueError, "num_train"),
        ({"num_validation": 2.5}, ValueError, "num_validation"),
        ({"seed": -1}, ValueError, "seed"),
    ],
)
def test_spectral_task_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        build_spectral_task(**kwargs)


def test_task_spec_round_trips_and_rejects_plain_datasets():
    task = build_spectral_task(**SMALL_SPECTRAL)
    assert task_spec(task["validation"]) == json.loads(task["train"].info.description)
    assert task_spec(task.map(lambda row: row))["task"] == "spectral_relations"
    with pytest.raises(ValueError, match="task spec"):
        task_spec(Dataset.from_dict({"x": [1]}))


# ------------------------------------------------------------------------------------ majority relations task


def majority_labels(input_ids: np.ndarray, relations: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Per row and relation, how many of its tokens there are, and the label sum_i [a_i wins] 2^i, counted
    from the token rows (an independent reading of the data)."""
    a_counts = np.stack([(input_ids == r["a_token"]).sum(axis=1) for r in relations], axis=1)
    b_counts = np.stack([(input_ids == r["b_token"]).sum(axis=1) for r in relations], axis=1)
    bits = (a_counts > b_counts).astype(int)
    return a_counts + b_counts, bits @ (2 ** np.arange(len(relations)))


@pytest.mark.parametrize("num_relations", [1, 2, 4])
def test_majority_task_labels_are_the_majority_bits(num_relations):
    task = build_majority_relations_task(num_relations, num_train=480, num_validation=33, seed=1)
    spec = task_spec(task)
    assert spec["num_classes"] == 2**num_relations and spec["counts"] == [1, 3, 5]
    assert [(r["a_token"], r["b_token"]) for r in spec["relations"]] == [
        (5 + 2 * i, 6 + 2 * i) for i in range(num_relations)
    ]
    for split, size in (("train", 480), ("validation", 33)):
        ids = np.array(task[split]["input_ids"])
        labels = np.array(task[split]["labels"])
        assert ids.shape == (size, 24) and (ids[:, 0] == 2).all() and (ids[:, -1] == 3).all()
        assert ids[:, 1:-1].min() >= 5 and ids.max() < 48
        totals, recomputed = majority_labels(ids, spec["relations"])
        np.testing.assert_array_equal(recomputed, labels)
        assert set(np.unique(totals)) == {1, 3, 5}  # every count of `counts` occurs (480 rows)
        class_counts = np.bincount(labels, minlength=2**num_relations)
        assert class_counts.max() - class_counts.min() <= 1 and class_counts.sum() == size
        assert task[split].features["labels"].num_classes == 2**num_relations
    # the bits are independent: each pair of relations shows all four patterns equally often (480 / 4)
    _, labels = majority_labels(np.array(task["train"]["input_ids"]), spec["relations"])
    for first, second in itertools.combinations(range(num_relations), 2):
        pairs = ((labels >> first) & 1) * 2 + ((labels >> second) & 1)
        assert np.bincount(pairs, minlength=4).tolist() == [120] * 4


def test_majority_task_margins_cover_every_share():
    # counts (3,): the winner holds 2 or 3 of the 3 tokens, both about equally often
    task = build_majority_relations_task(1, counts=(3,), num_train=2000, num_validation=2, seed=0)
    ids = np.array(task["train"]["input_ids"])
    winner = np.maximum((ids == 5).sum(axis=1), (ids == 6).sum(axis=1))
    assert set(winner.tolist()) == {2, 3} and abs((winner == 3).mean() - 0.5) < 0.05  # std ~ 0.011


def test_majority_task_is_deterministic_from_the_seed():
    first = build_majority_relations_task(3, num_train=64, num_validation=8, seed=5)
    again = build_majority_relations_task(3, num_train=64, num_validation=8, seed=5)
    other = build_majority_relations_task(3, num_train=64, num_validation=8, seed=6)
    assert first["train"]["input_ids"] == again["train"]["input_ids"]
    assert first["train"]["input_ids"] != other["train"]["input_ids"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_relations": 0}, "num_relations"),
        ({"num_relations": 9, "seq_len": 64}, "num_relations"),
        ({"num_relations": 2.0}, "num_relations"),
        ({"num_relations": True}, "num_relations"),
        ({"counts": (2, 3)}, "counts"),
        ({"counts": (3, 1)}, "counts"),
        ({"counts": ()}, "counts"),
        ({"counts": "135"}, "counts"),
        ({"counts": (1, 0)}, "counts"),
        ({"num_relations": 4, "seq_len": 21}, "seq_len"),  # 4 relations x 5 tokens + [CLS] [SEP] = 22
        ({"vocab_size": 9}, "vocab_size"),
        ({"num_train": 1}, "num_train"),
        ({"num_validation": 2.5}, "num_validation"),
        ({"seed": -1}, "seed"),
    ],
)
def test_majority_task_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_majority_relations_task(**kwargs)


# ------------------------------------------------------------------------------------ non-stationary stream


def test_nonstationary_stream_switches_relations_at_the_step():
    stream = build_nonstationary_stream(num_steps=40, batch_size=16, switch_step=25)
    spec = task_spec(stream)
    ids, labels = np.array(stream["input_ids"]), np.array(stream["labels"])
    steps, phases = np.array(stream["step"]), np.array(stream["phase"])
    assert ids.shape == (40 * 16, 24)
    assert steps.tolist() == np.repeat(np.arange(40), 16).tolist()
    assert phases.tolist() == (steps >= 25).astype(int).tolist()
    assert (np.bincount(steps, weights=labels) == 8).all()  # every batch balanced
    before, after = spec["phases"][0]["relations"], spec["phases"][1]["relations"]
    before_tokens = [relation[key] for relation in before for key in ("key_token", "query_token")]
    after_tokens = [relation[key] for relation in after for key in ("key_token", "query_token")]
    assert not set(before_tokens) & set(after_tokens)
    assert np.isin(ids[phases == 0], after_tokens).sum() == 0
    assert np.isin(ids[phases == 1], before_tokens).sum() == 0
    for phase, relations in ((0, before), (1, after)):
        rows = phases == phase
        assert ((np.isin(ids[rows], [relations[0]["key_token"]])).sum(axis=1) == 1).all()
        correlation = (order_signs(ids[rows], relations)[:, 0] * (2 * labels[rows] - 1)).mean()
        assert correlation > 0.75  # planted 0.9


def test_nonstationary_stream_is_deterministic():
    first = build_nonstationary_stream(num_steps=10, batch_size=4, switch_step=5, seed=1)
    again = build_nonstationary_stream(num_steps=10, batch_size=4, switch_step=5, seed=1)
    assert first["input_ids"] == again["input_ids"] and first["labels"] == again["labels"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 7}, "batch_size"),
        ({"switch_step": 400}, "switch_step"),
        ({"switch_step": 0}, "switch_step"),
        ({"num_steps": 1}, "num_steps"),
        ({"strengths_after": (0.5, 0.9)}, "strengths_after"),
        ({"vocab_size": 21}, "vocab_size"),
    ],
)
def test_nonstationary_stream_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_nonstationary_stream(**kwargs)


# ---------------------------------------------------------------------------------- SARS-CoV-2 variant task

SMALL_COV2 = {"num_train_per_lineage": 20, "num_validation_per_lineage": 6, "genome_length": 600}


def lineage_genomes(spec: dict) -> dict[str, str]:
    """Reference + signature per lineage, rebuilt from the spec alone."""
    genomes = {}
    for lineage in spec["lineages"]:
        bases = list(spec["reference"])
        for site in spec["sites"]:
            if lineage in site["carriers"]:
                bases[site["position"]] = site["carriers"][lineage]
        genomes[lineage] = "".join(bases)
    return genomes


def test_cov2_noise_free_samples_are_reference_plus_signature():
    task = build_cov2_variant_task(**SMALL_COV2, background_rate=0, error_rate=0, n_rate=0)
    spec = task_spec(task)
    expected = lineage_genomes(spec)
    names = task["train"].features["labels"].names
    assert names == ["Alpha", "Beta", "Gamma", "Delta", "Omicron"]
    for row in task["train"]:
        assert row["sequence"] == expected[names[row["labels"]]]
    sites = {site["name"]: site for site in spec["sites"]}
    assert sites["P681H/R"]["carriers"]["Alpha"] == sites["P681H/R"]["carriers"]["Omicron"]
    assert sites["P681H/R"]["carriers"]["Delta"] != sites["P681H/R"]["carriers"]["Alpha"]
    assert set(sites["D614G"]["carriers"]) == set(names)
    private = [site for site in spec["sites"] if "-" in site["name"]]
    assert sum(site["carriers"].keys() == {"Omicron"} for site in private) == 3 * 6
    assert len({site["position"] for site in spec["sites"]}) == len(spec["sites"])


@pytest.mark.parametrize(("kmer_size", "kmer_stride"), [(6, None), (3, 1)])
def test_cov2_ids_equal_the_kmer_tokenizer(kmer_size, kmer_stride):
    task = build_cov2_variant_task(**SMALL_COV2, kmer_size=kmer_size, kmer_stride=kmer_stride, n_rate=0.02)
    tokenizer = build_kmer_tokenizer(kmer_size)
    stride = kmer_size if kmer_stride is None else kmer_stride
    for row in task["validation"].select(range(5)):
        assert row["input_ids"] == tokenizer(kmerize(row["sequence"], kmer_size, stride))["input_ids"]
    assert len(task["train"][0]["input_ids"]) == 2 + (600 - kmer_size) // stride + 1


def test_cov2_noise_rates_balance_and_learnability():
    rates = {"background_rate": 0.002, "error_rate": 0.003, "n_rate": 0.01}
    task = build_cov2_variant_task(
        num_train_per_lineage=40, num_validation_per_lineage=40, genome_length=2000, **rates
    )
    spec = task_spec(task)
    expected = lineage_genomes(spec)
    names = task["validation"].features["labels"].names
    assert np.bincount(task["train"]["labels"]).tolist() == [40] * 5
    sequences = np.array([list(sequence) for sequence in task["validation"]["sequence"]])
    truth = np.array([list(expected[names[label]]) for label in task["validation"]["labels"]])
    n_fraction = (sequences == "N").mean()
    substituted = ((sequences != truth) & (sequences != "N")).mean()
    assert abs(n_fraction - 0.01) < 0.002
    assert abs(substituted - 0.99 * (0.002 + 0.003)) < 0.0015
    # a nearest-signature classifier (matches at lineage-defining sites) recovers the lineage
    scores = np.stack([(sequences == np.array(list(expected[name]))).sum(axis=1) for name in names], axis=1)
    assert (scores.argmax(axis=1) == np.array(task["validation"]["labels"])).mean() > 0.98


def test_cov2_fragments_and_determinism():
    task = build_cov2_variant_task(**SMALL_COV2, fragment_length=120, seed=5)
    again = build_cov2_variant_task(**SMALL_COV2, fragment_length=120, seed=5)
    assert all(len(sequence) == 120 for sequence in task["train"]["sequence"])
    assert task["train"]["input_ids"] == again["train"]["input_ids"]
    assert task["train"]["sequence"] != build_cov2_variant_task(**SMALL_COV2, seed=6)["train"]["sequence"]
    reference = task_spec(task)["reference"]
    assert any(sequence[:60] in reference for sequence in task["train"]["sequence"])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kmer_size": 0}, "kmer_size"),
        ({"kmer_size": 9}, "kmer_size"),
        ({"kmer_stride": 0}, "kmer_stride"),
        ({"background_rate": 1.0}, "background_rate"),
        ({"n_rate": -0.1}, "n_rate"),
        ({"error_rate": 1e400}, "error_rate"),
        ({"fragment_length": 4000}, "fragment_length"),
        ({"fragment_length": 3}, "fragment_length"),
        ({"genome_length": 40}, "genome_length"),
        ({"num_train_per_lineage": 0}, "num_train_per_lineage"),
        ({"private_mutations": 0}, "private_mutations"),
    ],
)
def test_cov2_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_cov2_variant_task(**kwargs)


def test_cov2_rejects_a_rate_that_is_not_a_number():
    with pytest.raises(TypeError, match="error_rate"):
        build_cov2_variant_task(error_rate="0.1")


def test_module_constants_match_the_tokenizers():
    tokenizer = build_kmer_tokenizer(2)
    tasks = synthetic_tasks
    assert (tasks.PAD_ID, tasks.UNK_ID, tasks.CLS_ID, tasks.SEP_ID) == (
        tokenizer.pad_token_id,
        tokenizer.unk_token_id,
        tokenizer.cls_token_id,
        tokenizer.sep_token_id,
    )


def test_builders_are_importable_from_the_training_package():
    from geoformers import training

    assert (
        training.build_spectral_task,
        training.build_majority_relations_task,
        training.build_nonstationary_stream,
        training.build_cov2_variant_task,
        training.task_spec,
    ) == (
        build_spectral_task,
        build_majority_relations_task,
        build_nonstationary_stream,
        build_cov2_variant_task,
        task_spec,
    )
