"""transformers' own common tests of the installed version, unmodified, against the DDL-mHC causal LM, set up
as transformers sets up Llama's: a `ModelTester` (tiny decoder, 4 streams, default chart), the test class
with `ModelTesterMixin`, `GenerationTesterMixin` and `PipelineTesterMixin`, the config tests, and the model
listed in the auto mappings the mixins consult. The test files come from `transformers_common.py`; a mixin
whose folder the sdist lacks is not inherited and `test_transformers_mixin` reports it skipped, naming the
project tests that check what it would (`COVERED_BY`). Part of the fast suite (about 170 tests, ~20 s).
"""

import unittest

from transformers_common import (
    import_modeling_common,
    list_in_auto_mappings,
    mixin_test,
    present_mixins,
    run_config_tests,
    skip_if_absent,
)

import geoformers  # noqa: F401  (registers the Auto classes)
from geoformers.models.ddl_mhc.configuration_ddl_mhc import DDLmHCConfig
from geoformers.models.ddl_mhc.modeling_ddl_mhc import DDLmHCForCausalLM, DDLmHCModel

CONTRACT = "tests/test_ddl_mhc_contract.py"
COVERED_BY = {
    "GenerationTesterMixin": f"{CONTRACT} (generate from inputs_embeds with a static cache and "
    "eos_token_id=-1) and tests/test_ddl_mhc.py, tests/test_fused_streams.py (greedy, sampled, cached and "
    "compiled decoding)",
    "ExportTesterMixin": f"{CONTRACT} (torch.export of the causal LM gives the eager logits)",
    "PipelineTesterMixin": f"{CONTRACT} (text-generation and feature-extraction pipelines past 512 "
    "positions)",
}
common = import_modeling_common()


class DDLmHCModelTester:
    """Tiny DDL-mHC configs and inputs for the common tests (as LlamaModelTester is for Llama)."""

    def __init__(
        self,
        parent,
        batch_size=13,
        seq_length=7,
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=37,
        hc_streams=4,
        is_training=True,
    ):
        self.parent = parent
        self.batch_size, self.seq_length, self.vocab_size = batch_size, seq_length, vocab_size
        self.hidden_size, self.num_hidden_layers = hidden_size, num_hidden_layers
        self.num_attention_heads, self.num_key_value_heads = num_attention_heads, num_key_value_heads
        self.intermediate_size, self.hc_streams, self.is_training = intermediate_size, hc_streams, is_training

    def get_config(self) -> DDLmHCConfig:
        return DDLmHCConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            intermediate_size=self.intermediate_size,
            hidden_act="gelu",
            max_position_embeddings=512,
            hc_streams=self.hc_streams,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )

    def prepare_config_and_inputs_for_common(self):
        """Random token ids and a random padding mask (first token always attended), as Llama's tester;
        the mixin adds the labels of a causal LM itself."""
        input_ids = common.ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        attention_mask = common.random_attention_mask([self.batch_size, self.seq_length])
        return self.get_config(), {"input_ids": input_ids, "attention_mask": attention_mask}


class DDLmHCModelTest(
    common.ModelTesterMixin,
    *present_mixins("GenerationTesterMixin", "PipelineTesterMixin"),
    unittest.TestCase,
):
    all_model_classes = (DDLmHCModel, DDLmHCForCausalLM)
    pipeline_model_mapping = {"feature-extraction": DDLmHCModel, "text-generation": DDLmHCForCausalLM}
    # the mixin runs this test only for models whose config file has a copyright year >= 2023 (ours has no
    # such header) or that opt in, as transformers' priority models do
    test_can_init_all_missing_weights_before_2023 = True

    def setUp(self):
        self.model_tester = DDLmHCModelTester(self)
        list_in_auto_mappings(
            self,
            DDLmHCConfig.model_type,
            (common.MODEL_MAPPING_NAMES, "DDLmHCModel"),
            (common.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "DDLmHCForCausalLM"),
        )

    def test_config(self):
        """A width other than the default that the 4 default heads divide into even rotary halves."""
        run_config_tests(self, config_class=DDLmHCConfig, hidden_size=40)

    def test_generation_tester_mixin_inheritance(self):
        """transformers' check that a model able to generate runs `GenerationTesterMixin`: it needs the real
        mixin, so it is skipped with the mixin's reason when the mixin is absent."""
        skip_if_absent(self, "GenerationTesterMixin", COVERED_BY["GenerationTesterMixin"])
        super().test_generation_tester_mixin_inheritance()

    def test_reverse_loading_mapping(self):
        """The model's one checkpoint conversion (`one_element_parameters`: legacy 0-d gates and chart weight
        load as shape (1,)) reshapes in place and renames no key, so only the key-renaming assertion is left
        out."""
        super().test_reverse_loading_mapping(check_keys_were_modified=False)


test_transformers_mixin = mixin_test(DDLmHCModelTest, COVERED_BY)
