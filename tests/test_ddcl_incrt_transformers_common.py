"""transformers' own common model tests (`ModelTesterMixin` of the installed version) against DDCL-INCRT,
with a `ModelTester` as every in-tree model has one. The mixin comes from transformers' sdist
(`transformers_common.py`); its generation and export mixins are empty stand-ins (an encoder does not
generate; `torch.export` is tested in test_ddcl_incrt_contract.py). Slow (a download and ~120 tests).
"""

import unittest
from unittest import mock

import pytest
import torch
from transformers_common import import_modeling_common

import geoformers  # noqa: F401  (registers the Auto classes)
from geoformers.configuration.ddcl_incrt import DDCLIncrtConfig
from geoformers.modeling.ddcl_incrt import DDCLIncrtForSequenceClassification, DDCLIncrtModel

pytestmark = pytest.mark.slow
common = import_modeling_common()


class DDCLIncrtModelTester:
    """Tiny DDCL-INCRT configs and inputs for the common tests (as BertModelTester is for BERT)."""

    def __init__(self, parent, batch_size=3, seq_length=7, vocab_size=50, hidden_size=16, num_hidden_layers=2,
                 num_attention_heads=2, head_dim=4, num_labels=3, is_training=True):
        self.parent = parent
        self.batch_size, self.seq_length, self.vocab_size = batch_size, seq_length, vocab_size
        self.hidden_size, self.num_hidden_layers = hidden_size, num_hidden_layers
        self.num_attention_heads, self.head_dim, self.num_labels = num_attention_heads, head_dim, num_labels
        self.is_training = is_training

    def get_config(self) -> DDCLIncrtConfig:
        return DDCLIncrtConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers, num_heads=self.num_attention_heads,
            head_dim=self.head_dim, num_prototypes=3,
            max_position_embeddings=32, num_labels=self.num_labels, hidden_dropout_prob=0.0,
            classifier_dropout=0.0, pad_token_id=0,
        )

    def prepare_config_and_inputs(self):
        input_ids = common.ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        attention_mask = torch.ones(self.batch_size, self.seq_length, dtype=torch.long)
        attention_mask[1:, self.seq_length - 2:] = 0  # right padding (pooling reads position 0)
        token_type_ids = common.ids_tensor([self.batch_size, self.seq_length], 2)
        labels = common.ids_tensor([self.batch_size], self.num_labels)
        return self.get_config(), input_ids, attention_mask, token_type_ids, labels

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, attention_mask, token_type_ids, _ = self.prepare_config_and_inputs()
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        return config, inputs


class DDCLIncrtModelTest(common.ModelTesterMixin, unittest.TestCase):
    all_model_classes = (DDCLIncrtModel, DDCLIncrtForSequenceClassification)
    test_resize_embeddings = True
    test_torch_exportable = False  # the exporters mixin is not in the sdist; see test_ddcl_incrt_contract.py

    def setUp(self):
        """The mixin skips base models (no loss) in its training and activation-checkpointing tests by their
        names in transformers' MODEL_MAPPING: list ours there, as an in-tree model is, for each test."""
        self.model_tester = DDCLIncrtModelTester(self)
        listed = mock.patch.dict(common.MODEL_MAPPING_NAMES, {DDCLIncrtConfig.model_type: "DDCLIncrtModel"})
        listed.start()
        self.addCleanup(listed.stop)

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        inputs_dict = super()._prepare_for_class(inputs_dict, model_class, return_labels=return_labels)
        if return_labels and model_class is DDCLIncrtForSequenceClassification:
            inputs_dict["labels"] = torch.zeros(self.model_tester.batch_size, dtype=torch.long)
        return inputs_dict

    def test_reverse_loading_mapping(self):
        """The model's one checkpoint conversion (`one_element_parameters`: a legacy 0-d `rho` loads as shape
        (1,)) reshapes in place and renames no key, so only the key-renaming assertion is left out."""
        super().test_reverse_loading_mapping(check_keys_were_modified=False)

    @unittest.skip("nukes every weight of a checkpoint; DDCL-INCRT refuses checkpoints lacking whole heads "
                   "(from_pretrained raises ValueError by design)")
    def test_model_weights_reload_no_missing_tied_weights(self):
        pass

    @unittest.skip("transformers 5.24's check_equal calls state_dict() on a dict for bool tensors (the "
                   "INCRT gate's `calibrated` buffer); reloads are checked in test_ddcl_incrt.py")
    def test_torch_save_load(self):
        pass
