"""transformers' own common tests of the installed version, unmodified, against DDCL-INCRT, set up as
transformers sets up BERT's: a `ModelTester`, the test class with `ModelTesterMixin` and
`PipelineTesterMixin`, the config tests, and the model listed in the auto mappings the mixins consult (base
model, sequence classification). The test files come from `transformers_common.py`; a mixin whose folder
the sdist lacks is not inherited and `test_transformers_mixin` reports it skipped, naming the project tests
that check what it would (`COVERED_BY`). An encoder does not generate: transformers' own
`test_generation_tester_mixin_inheritance` checks that the class does not inherit `GenerationTesterMixin`.
Part of the fast suite (about 170 tests, ~20 s).
"""

import unittest

import torch
from transformers_common import (
    import_modeling_common,
    list_in_auto_mappings,
    mixin_test,
    present_mixins,
    run_config_tests,
)

import geoformers  # noqa: F401  (registers the Auto classes)
from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import (
    DDCLIncrtForSequenceClassification,
    DDCLIncrtModel,
)

CONTRACT = "tests/test_ddcl_incrt_contract.py"
COVERED_BY = {
    "ExportTesterMixin": f"{CONTRACT} (torch.export and full-graph compile give the eager logits)",
    "PipelineTesterMixin": f"{CONTRACT} (text-classification, feature-extraction and zero-shot pipelines, "
    "batched)",
}
common = import_modeling_common()


class DDCLIncrtModelTester:
    """Tiny DDCL-INCRT configs and inputs for the common tests (as BertModelTester is for BERT). Mean pooling:
    transformers' eager-vs-SDPA test pads on the left, which "cls" pooling refuses (it would pool a padding
    token); tests/test_ddcl_incrt.py covers "cls"."""

    def __init__(
        self,
        parent,
        batch_size=3,
        seq_length=7,
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        head_dim=4,
        num_labels=3,
        is_training=True,
    ):
        self.parent = parent
        self.batch_size, self.seq_length, self.vocab_size = batch_size, seq_length, vocab_size
        self.hidden_size, self.num_hidden_layers = hidden_size, num_hidden_layers
        self.num_attention_heads, self.head_dim, self.num_labels = num_attention_heads, head_dim, num_labels
        self.is_training = is_training

    def get_config(self) -> DDCLIncrtConfig:
        return DDCLIncrtConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            head_dim=self.head_dim,
            num_prototypes=3,
            max_position_embeddings=32,
            num_labels=self.num_labels,
            hidden_dropout_prob=0.0,
            classifier_dropout=0.0,
            pad_token_id=0,
            pooling="mean",
        )

    def prepare_config_and_inputs_for_common(self):
        """Token ids, right padding and token types; the mixin adds the labels of a sequence classifier
        itself."""
        input_ids = common.ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        attention_mask = torch.ones(self.batch_size, self.seq_length, dtype=torch.long)
        attention_mask[1:, self.seq_length - 2 :] = 0
        token_type_ids = common.ids_tensor([self.batch_size, self.seq_length], 2)
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        return self.get_config(), inputs


class DDCLIncrtModelTest(common.ModelTesterMixin, *present_mixins("PipelineTesterMixin"), unittest.TestCase):
    all_model_classes = (DDCLIncrtModel, DDCLIncrtForSequenceClassification)
    pipeline_model_mapping = {
        "feature-extraction": DDCLIncrtModel,
        "text-classification": DDCLIncrtForSequenceClassification,
        "zero-shot": DDCLIncrtForSequenceClassification,
    }
    test_resize_embeddings = True
    # the mixin runs this test only for models whose config file has a copyright year >= 2023 (ours has no
    # such header) or that opt in, as transformers' priority models do
    test_can_init_all_missing_weights_before_2023 = True

    def setUp(self):
        """The mixin skips base models (no loss) in its training and activation-checkpointing tests by their
        names in transformers' MODEL_MAPPING: list ours there, as an in-tree model is, for each test."""
        self.model_tester = DDCLIncrtModelTester(self)
        list_in_auto_mappings(
            self,
            DDCLIncrtConfig.model_type,
            (common.MODEL_MAPPING_NAMES, "DDCLIncrtModel"),
            (common.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES, "DDCLIncrtForSequenceClassification"),
        )

    def test_config(self):
        run_config_tests(self, config_class=DDCLIncrtConfig, hidden_size=37)

    def test_reverse_loading_mapping(self):
        """The model's one checkpoint conversion (`one_element_parameters`: a legacy 0-d `rho` loads as shape
        (1,)) reshapes in place and renames no key, so only the key-renaming assertion is left out."""
        super().test_reverse_loading_mapping(check_keys_were_modified=False)


test_transformers_mixin = mixin_test(DDCLIncrtModelTest, COVERED_BY)
