"""Parameter groups (two timescales, no decay on norms/biases/prototypes/temperatures) and the optimizer sync
after growth and pruning: Adam moments kept, removed state dropped, new parameters stepped like fresh Adam,
canonical order so that optimizer.pt reloads into a fresh optimizer of the grown model."""

import copy

import pytest
import torch
from growth_worker import tiny_model, training_args

from geoformers.training.optim import make_optimizer, parameter_groups, sync_optimizer_with_model

LR = 1e-2


pytestmark = pytest.mark.usefixtures("single_thread")


def named_groups(optimizer, model) -> dict[str, list[str]]:
    names = {id(p): name for name, p in model.named_parameters()}
    return {group["group_name"]: [names[id(p)] for p in group["params"]] for group in optimizer.param_groups}


def train_steps(model, optimizer, steps: int, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        input_ids = torch.randint(5, 48, (8, 12), generator=generator)
        labels = torch.randint(0, 2, (8,), generator=generator)
        optimizer.zero_grad()
        model(input_ids, labels=labels).loss.backward()
        optimizer.step()


def test_parameter_groups_follow_the_documented_rules():
    model = tiny_model(num_heads=2)
    model.model.embeddings.position_embeddings.weight.requires_grad_(False)
    groups = parameter_groups(model, LR, 0.01, prototype_lr_multiplier=5.0)
    names = {id(p): name for name, p in model.named_parameters()}
    by_name = {group["group_name"]: [names[id(p)] for p in group["params"]] for group in groups}
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    expected_prototypes = [n for n in trainable if n.endswith("prototype_bank.prototypes")]
    no_decay_suffixes = (".bias", "LayerNorm.weight", "prototype_bank.rho")
    expected_no_decay = [n for n in trainable if n.endswith(no_decay_suffixes)]
    assert by_name["prototypes"] == expected_prototypes and len(expected_prototypes) == 2
    assert by_name["no_decay"] == expected_no_decay
    assert by_name["decay"] == [n for n in trainable if n not in expected_prototypes + expected_no_decay]
    assert "model.embeddings.position_embeddings.weight" not in sum(by_name.values(), [])
    settings = {g["group_name"]: (g["lr"], g["weight_decay"]) for g in groups}
    expected = {
        "decay": (LR, 0.01),
        "no_decay": (LR, 0.0),
        "prototypes": (5 * LR, 0.0),
        "hc_chart": (LR / 6, 0.0),
        "hc_gates": (LR, 0.0),
        "hc_mix": (LR, 0.0),
    }
    assert settings.keys() == expected.keys()
    for group, (lr, weight_decay) in expected.items():
        assert settings[group] == pytest.approx((lr, weight_decay), rel=1e-15), group
    assert not any(by_name[group] for group in ("hc_chart", "hc_gates", "hc_mix"))  # DDL-mHC's, kept empty


@pytest.mark.parametrize(
    ("kwargs", "message", "error"),
    [
        ({"learning_rate": -1.0}, "learning_rate", ValueError),
        ({"weight_decay": float("nan")}, "weight_decay", ValueError),
        ({"prototype_lr_multiplier": 0.0}, "prototype_lr_multiplier", ValueError),
        ({"learning_rate": "1e-3"}, "learning_rate", TypeError),
    ],
)
def test_bad_group_arguments_name_the_argument(kwargs, message, error):
    arguments = {"learning_rate": LR, "weight_decay": 0.0, **kwargs}
    with pytest.raises(error, match=message):
        parameter_groups(tiny_model(), **arguments)


def test_bad_model_optimizer_and_args_are_refused(tmp_path):
    with pytest.raises(TypeError, match="model"):
        parameter_groups("model", learning_rate=LR, weight_decay=0.0)
    with pytest.raises(TypeError, match="args"):
        make_optimizer(tiny_model(), {"learning_rate": LR})
    with pytest.raises(TypeError, match="optimizer"):
        sync_optimizer_with_model(object(), tiny_model())


def test_make_optimizer_uses_the_training_arguments(tmp_path):
    args = training_args(tmp_path, learning_rate=2e-3, weight_decay=0.1, adam_beta2=0.95, adam_epsilon=1e-6)
    optimizer = make_optimizer(tiny_model(), args, prototype_lr_multiplier=4.0)
    assert isinstance(optimizer, torch.optim.AdamW)
    settings = {
        g["group_name"]: (g["lr"], g["weight_decay"], g["betas"], g["eps"]) for g in optimizer.param_groups
    }
    assert settings["decay"] == (2e-3, 0.1, (0.9, 0.95), 1e-6)
    assert settings["no_decay"] == (2e-3, 0.0, (0.9, 0.95), 1e-6)
    assert settings["prototypes"] == (8e-3, 0.0, (0.9, 0.95), 1e-6)


def test_sync_keeps_moments_drops_pruned_state_and_places_new_parameters(tmp_path):
    model = tiny_model(num_heads=2)
    optimizer = make_optimizer(model, training_args(tmp_path, learning_rate=LR))
    train_steps(model, optimizer, 3)
    survivor = model.model.layers[0].attention.heads[1]
    moments = {
        name: {key: value.clone() for key, value in optimizer.state[p].items()}
        for name, p in survivor.named_parameters()
    }
    pruned = model.prune_head(0, 0)
    grown = model.grow_head(0, torch.randn(32))
    added, removed = sync_optimizer_with_model(optimizer, model)
    assert removed == len(list(pruned.parameters()))
    assert all(p not in optimizer.state for p in pruned.parameters())
    assert added == [f"model.layers.0.attention.heads.1.{name}" for name, _ in grown.named_parameters()]
    for name, parameter in survivor.named_parameters():  # survivor is now head 0, with its Adam moments
        for key, value in moments[name].items():
            assert torch.equal(optimizer.state[parameter][key], value)
    fresh = make_optimizer(model, training_args(tmp_path, learning_rate=LR))
    assert named_groups(optimizer, model) == named_groups(fresh, model)  # canonical order and grouping


def test_new_parameters_take_a_first_adam_step_at_their_group_rate(tmp_path):
    """First AdamW step of a new parameter, by hand: m_hat = g, v_hat = g^2, so
    p' = p (1 - lr wd) - lr g / (|g| + eps); prototypes use lr x multiplier and no decay."""
    model = tiny_model()
    optimizer = make_optimizer(
        model, training_args(tmp_path, learning_rate=LR, weight_decay=0.1), prototype_lr_multiplier=3.0
    )
    train_steps(model, optimizer, 2)
    head = model.grow_head(0, torch.randn(32))
    sync_optimizer_with_model(optimizer, model)
    with torch.no_grad():
        head.o_proj.weight.normal_(std=0.1)  # growth starts o_proj at 0; give q/k/v and prototypes gradients
    before = {name: p.detach().clone() for name, p in head.named_parameters()}
    generator = torch.Generator().manual_seed(7)
    input_ids, labels = torch.randint(5, 48, (8, 12), generator=generator), torch.randint(0, 2, (8,))
    optimizer.zero_grad()
    model(input_ids, labels=labels).loss.backward()
    gradients = {name: p.grad.clone() for name, p in head.named_parameters()}
    optimizer.step()
    for name, parameter in head.named_parameters():
        is_prototype = name.endswith("prototypes")
        no_decay = is_prototype or name.endswith((".bias", ".rho"))
        lr, decay = (3 * LR if is_prototype else LR), (0.0 if no_decay else 0.1)
        g = gradients[name].double()
        expected = before[name].double() * (1 - lr * decay) - lr * g / (g.abs() + 1e-8)
        torch.testing.assert_close(parameter.detach().double(), expected, rtol=1e-5, atol=1e-6, msg=name)
        assert g.abs().sum() > 0, name


def test_saved_optimizer_state_reloads_into_a_fresh_optimizer_of_the_grown_model(tmp_path):
    """What resume does: optimizer.pt (index-based) into an optimizer built from the reloaded grown model;
    both must then take bit-identical steps."""
    model = tiny_model()
    args = training_args(tmp_path, learning_rate=LR)
    optimizer = make_optimizer(model, args)
    train_steps(model, optimizer, 2)
    model.grow_head(0, torch.randn(32))
    model.grow_head(0)
    sync_optimizer_with_model(optimizer, model)
    train_steps(model, optimizer, 2, seed=1)
    model.prune_head(0, 1)
    sync_optimizer_with_model(optimizer, model)
    train_steps(model, optimizer, 1, seed=2)
    state = copy.deepcopy(optimizer.state_dict())

    reloaded = tiny_model(seed=5)
    reloaded.resize_heads(model.config.num_heads)
    reloaded.load_state_dict(model.state_dict())
    fresh = make_optimizer(reloaded, args)
    fresh.load_state_dict(state)
    train_steps(model, optimizer, 2, seed=3)
    train_steps(reloaded, fresh, 2, seed=3)
    for (name, p), q in zip(model.named_parameters(), reloaded.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_sync_also_serves_the_trainers_own_two_group_optimizer():
    """Trainer.create_optimizer makes groups (decay, no decay) without names: a new parameter joins the group
    of the same parameter in another head."""
    model = tiny_model()
    decay = [p for n, p in model.named_parameters() if not n.endswith(("bias", "LayerNorm.weight"))]
    no_decay = [p for n, p in model.named_parameters() if n.endswith(("bias", "LayerNorm.weight"))]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    )
    head = model.grow_head(0)
    sync_optimizer_with_model(optimizer, model)
    in_group = [{id(p) for p in group["params"]} for group in optimizer.param_groups]
    for name, parameter in head.named_parameters():
        assert (id(parameter) in in_group[1]) == name.endswith("bias"), name
    assert sum(len(group["params"]) for group in optimizer.param_groups) == len(list(model.parameters()))


def test_heads_the_optimizer_leaves_out_stay_out_when_new_ones_grow():
    model = tiny_model()
    held = [p for n, p in model.named_parameters() if ".heads." not in n]
    optimizer = torch.optim.AdamW(held)
    model.grow_head(0)
    assert sync_optimizer_with_model(optimizer, model) == ([], 0)
    assert [id(p) for p in optimizer.param_groups[0]["params"]] == [id(p) for p in held]
