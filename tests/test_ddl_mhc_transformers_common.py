"""transformers' own common model tests (`ModelTesterMixin` of the installed version) against the DDL-mHC
causal LM, with a `ModelTester` shaped like transformers' Llama tester (tiny decoder, 4 streams, default
chart). The mixin comes from transformers' sdist (`transformers_common.py`), which has no
`tests/generation`: `GenerationTesterMixin` is an empty stand-in, and generation is tested in
test_ddl_mhc.py. Slow (a download and ~170 tests).
"""

import contextlib
import functools
import unittest
from unittest import mock

import pytest
from transformers_common import import_modeling_common

import geoformers  # noqa: F401  (registers the Auto classes)
from geoformers.configuration.ddl_mhc import DDLmHCConfig
from geoformers.modeling.ddl_mhc import DDLmHCForCausalLM, DDLmHCModel

pytestmark = pytest.mark.slow
common = import_modeling_common()


class DDLmHCModelTester:
    """Tiny DDL-mHC configs and inputs for the common tests (as LlamaModelTester is for Llama)."""

    def __init__(self, parent, batch_size=13, seq_length=7, vocab_size=99, hidden_size=32,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=37,
                 hc_streams=4, is_training=True):
        self.parent = parent
        self.batch_size, self.seq_length, self.vocab_size = batch_size, seq_length, vocab_size
        self.hidden_size, self.num_hidden_layers = hidden_size, num_hidden_layers
        self.num_attention_heads, self.num_key_value_heads = num_attention_heads, num_key_value_heads
        self.intermediate_size, self.hc_streams, self.is_training = intermediate_size, hc_streams, is_training

    def get_config(self) -> DDLmHCConfig:
        return DDLmHCConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, intermediate_size=self.intermediate_size,
            hidden_act="gelu", max_position_embeddings=512, hc_streams=self.hc_streams,
            pad_token_id=0, bos_token_id=1, eos_token_id=2,
        )

    def prepare_config_and_inputs_for_common(self):
        """Random token ids and a random padding mask (first token always attended), as Llama's tester;
        the mixin adds the labels of a causal LM itself."""
        input_ids = common.ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        attention_mask = common.random_attention_mask([self.batch_size, self.seq_length])
        return self.get_config(), {"input_ids": input_ids, "attention_mask": attention_mask}


class DDLmHCModelTest(common.ModelTesterMixin, unittest.TestCase):
    all_model_classes = (DDLmHCModel, DDLmHCForCausalLM)
    test_torch_exportable = False  # the exporters mixin is not in the sdist; see test_ddl_mhc_inputs.py

    def setUp(self):
        """The mixin finds base models and causal LM heads by their names in transformers' auto mappings
        (to train only heads, add token labels, pick the model whose RoPE to scale): list ours there, as an
        in-tree model is, for the duration of each test."""
        self.model_tester = DDLmHCModelTester(self)
        for mapping, name in ((common.MODEL_MAPPING_NAMES, "DDLmHCModel"),
                              (common.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "DDLmHCForCausalLM")):
            listed = mock.patch.dict(mapping, {DDLmHCConfig.model_type: name})
            listed.start()
            self.addCleanup(listed.stop)

    def test_model_weights_reload_no_missing_tied_weights(self):
        """The mixin loads a checkpoint with every weight replaced by one stray tensor, which the strict
        `from_pretrained` refuses by design (ValueError, `strict_loading.py`): check on the lenient load
        (`strict=False`, transformers' own behaviour) that exactly the model's weights are reported
        missing."""
        with contextlib.ExitStack() as lenient:
            for model_class in self.all_model_classes:
                load = functools.partial(model_class.from_pretrained, strict=False)
                lenient.enter_context(mock.patch.object(model_class, "from_pretrained", load))
            super().test_model_weights_reload_no_missing_tied_weights()

    @unittest.skip("the sdist has no tests/generation, so GenerationTesterMixin is an empty stand-in that "
                   "would run no generate tests; generate is tested in test_ddl_mhc.py")
    def test_generation_tester_mixin_inheritance(self):
        pass

    @unittest.skip("hidden_states are read-outs of the n streams (a side branch: the next layer reads the "
                   "streams, not the read-out), so the output has no gradient to hidden_states[0]")
    def test_retain_grad_hidden_states_attentions(self):
        pass
