"""The benchmark's peer (scripts/harness/peer_mhc.py), transformers' Llama blocks wrapped in the
`hyper-connections` package's mHC. Checked against `LlamaForCausalLM` with the same weights: exactly Llama at
n = 1 (the package disables itself), and at n = 4 the package's init makes it a Llama whose sublayer outputs
are scaled by H_post = 2 sigmoid(1), with the norms' epsilon rescaled for the stream sums they see."""

import math

import pytest
import torch

pytest.importorskip("hyper_connections", reason="the peer needs the `hyper-connections` package (dev extra)")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from harness import peer_mhc  # noqa: E402

SHAPE = dict(vocab_size=65, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)


def llama_and_peer(num_streams: int):
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(**SHAPE)).eval()
    peer = peer_mhc.build_peer_mhc_llama(LlamaConfig(**SHAPE), num_streams=num_streams).eval()
    missing, unexpected = peer.load_state_dict(llama.state_dict(), strict=False)
    assert unexpected == []
    assert all(".attn_hc." in key or ".mlp_hc." in key for key in missing)
    return llama, peer


def batch(size=(3, 20), seed=1):
    return torch.randint(0, SHAPE["vocab_size"], size, generator=torch.Generator().manual_seed(seed))


def test_one_stream_is_llama_exactly():
    llama, peer = llama_and_peer(1)
    assert peer.num_parameters() == llama.num_parameters()
    ids = batch()
    with torch.no_grad():
        expected, got = llama(ids, labels=ids), peer(ids, labels=ids)
    torch.testing.assert_close(got.logits, expected.logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.loss, expected.loss, rtol=0, atol=1e-6)


def test_four_streams_at_init_is_llama_with_scaled_sublayer_outputs():
    n = 4
    llama, peer = llama_and_peer(n)
    h_post = 2 * torch.sigmoid(torch.tensor(1.0)).item()
    branch_scale = torch.sigmoid(torch.tensor(1.0)).item() + (n - 1) * 0.5  # sum of the H_pre row at init
    with torch.no_grad():
        for layer in llama.model.layers:
            layer.self_attn.o_proj.weight.mul_(h_post)
            layer.mlp.down_proj.weight.mul_(h_post)
            layer.input_layernorm.variance_epsilon /= branch_scale**2
            layer.post_attention_layernorm.variance_epsilon /= branch_scale**2
        llama.model.norm.variance_epsilon /= n**2
    # the package's own parameters: 2 sublayers x (static and dynamic H_pre/H_res/H_post, 3 gates, a norm)
    d = SHAPE["hidden_size"]
    per_hc = n * (n + 1) + d * (n + 1) + 1 + 1 + n + d + 1 + d
    assert peer.num_parameters() - llama.num_parameters() == 2 * SHAPE["num_hidden_layers"] * per_hc

    ids = batch()
    with torch.no_grad():
        expected, got = llama(ids, labels=ids), peer(ids, labels=ids)
    assert got.logits.shape == (3, 20, SHAPE["vocab_size"])
    torch.testing.assert_close(got.logits, expected.logits, rtol=0, atol=2e-6)  # 5e-4 without the eps rescale
    # and, like Llama at init (std 0.02 weights), a near-uniform prediction
    assert abs(got.loss.item() - math.log(SHAPE["vocab_size"])) < 0.1


def test_peer_is_causal():
    _, peer = llama_and_peer(4)
    ids = batch()
    changed = ids.clone()
    changed[:, 12:] = (changed[:, 12:] + 1) % SHAPE["vocab_size"]
    with torch.no_grad():
        before, after = peer(ids).logits, peer(changed).logits
    torch.testing.assert_close(after[:, :12], before[:, :12], rtol=0, atol=1e-6)
    assert (after[:, 12:] - before[:, 12:]).abs().max() > 1e-4
    assert peer(ids).loss is None


def test_padding_mask_hides_padded_tokens():
    _, peer = llama_and_peer(4)
    ids = batch()
    mask = torch.ones_like(ids)
    mask[:, :3] = 0  # left padding
    changed = ids.clone()
    changed[:, :3] = (changed[:, :3] + 5) % SHAPE["vocab_size"]
    with torch.no_grad():
        before = peer(ids, attention_mask=mask).logits
        after = peer(changed, attention_mask=mask).logits
        unmasked = peer(changed).logits
    torch.testing.assert_close(after[:, 3:], before[:, 3:], rtol=0, atol=1e-6)
    assert (unmasked[:, 3:] - before[:, 3:]).abs().max() > 1e-4


def test_adamw_steps_reduce_the_loss_and_train_the_hyper_connections():
    _, peer = llama_and_peer(4)
    peer.train()
    ids = batch((4, 24))
    optimizer = torch.optim.AdamW(peer.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = peer(ids, labels=ids).loss
        loss.backward()
        if not losses:
            for name, param in peer.named_parameters():
                assert param.grad is not None and torch.isfinite(param.grad).all(), name
            assert peer.model.layers[0].attn_hc.static_alpha.grad.abs().sum() > 0
            assert peer.model.layers[1].mlp_hc.dynamic_alpha_fn.grad.abs().sum() > 0
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3, losses


@pytest.mark.parametrize(
    "num_streams, error",
    [(0, ValueError), (-2, ValueError), ("4", TypeError), (4.0, TypeError), (True, TypeError)],
)
def test_bad_num_streams(num_streams, error):
    with pytest.raises(error, match="num_streams"):
        peer_mhc.build_peer_mhc_llama(LlamaConfig(**SHAPE), num_streams=num_streams)


def test_bad_config():
    with pytest.raises(TypeError, match="llama_config"):
        peer_mhc.build_peer_mhc_llama(dict(SHAPE), num_streams=4)
