"""Synthetic classification tasks with a planted, exactly known structure: k directional relations
(`build_spectral_task`), k majority bits whose head need is k (`build_majority_relations_task`), a stream
whose relations switch at a step (`build_nonstationary_stream`) and SARS-CoV-2-like variant genomes
(`build_cov2_variant_task`).

Every builder returns `datasets` objects with `input_ids`, `attention_mask` and integer `labels` columns,
ready for a `Trainer`, is deterministic from `seed`, shares BERT's special-token ids (`[PAD]`=0 `[UNK]`=1
`[CLS]`=2 `[SEP]`=3 `[MASK]`=4), wraps every sequence as `[CLS] ... [SEP]` and stores its planted structure as
JSON in `dataset.info.description` (read it back with `task_spec`).
"""

import itertools
import json
from collections.abc import Callable, Sequence

import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, DatasetInfo, Features, List, Value

from geoformers.models.config_validation import check_number
from geoformers.tokenization.arguments import require_int
from geoformers.tokenization.kmer_tokenizer import AMBIGUOUS_BASE, MAX_KMER_SIZE, NUCLEOTIDES
from geoformers.tokenization.wordpiece_tokenizer import BERT_SPECIAL_TOKENS

PAD_ID, UNK_ID, CLS_ID, SEP_ID = (
    BERT_SPECIAL_TOKENS.index(name) for name in ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
)
NUM_SPECIAL_TOKENS = len(BERT_SPECIAL_TOKENS)


def task_spec(dataset: Dataset | DatasetDict) -> dict:
    """The planted structure a synthetic builder stored in `info.description` (JSON)."""
    if not isinstance(dataset, (Dataset, DatasetDict)):
        raise TypeError(f"dataset must be a datasets.Dataset or DatasetDict, got {type(dataset).__name__}")
    split = next(iter(dataset.values())) if isinstance(dataset, DatasetDict) else dataset
    try:
        spec = json.loads(split.info.description)
    except json.JSONDecodeError:
        spec = None
    if not isinstance(spec, dict) or "task" not in spec:
        raise ValueError("dataset has no task spec in info.description (not a geoformers synthetic task)")
    return spec


def _to_dataset(columns: dict[str, np.ndarray], label_names: Sequence[str], spec: dict) -> Dataset:
    """A `Dataset` with int64 token columns, `ClassLabel` labels and the task spec in its info."""
    features = {
        "input_ids": List(Value("int64")),
        "attention_mask": List(Value("int64")),
        "labels": ClassLabel(names=list(label_names)),
    }
    for name, values in columns.items():
        if name not in features:
            features[name] = Value("string") if values.dtype.kind in "UO" else Value("int64")
    features = Features(features)
    info = DatasetInfo(description=json.dumps(spec), features=features)
    return Dataset.from_dict({name: values.tolist() for name, values in columns.items()}, features, info)


def _wrap_special(content: np.ndarray) -> np.ndarray:
    """`[CLS] content [SEP]` for every row."""
    rows = content.shape[0]
    cls = np.full((rows, 1), CLS_ID, dtype=np.int64)
    sep = np.full((rows, 1), SEP_ID, dtype=np.int64)
    return np.concatenate([cls, content.astype(np.int64), sep], axis=1)


# ----------------------------------------------------------------------------------------------------------
# Synthetic spectral task: k planted directional relations
# ----------------------------------------------------------------------------------------------------------

DEFAULT_STRENGTHS = (0.9, 0.8, 0.7, 0.6)
MAX_RELATIONS = 16


def _sign_patterns(num_relations: int) -> np.ndarray:
    """All 2**k order patterns z in {-1, +1}^k, one per row."""
    return np.array(list(itertools.product((1.0, -1.0), repeat=num_relations)))


def _bayes_accuracy(strengths: np.ndarray) -> float:
    """Exact Bayes accuracy of the relation task: sum over z of max_y P(z, y), y balanced."""
    patterns = _sign_patterns(len(strengths))
    agree, disagree = (1 + strengths) / 2, (1 - strengths) / 2
    likelihood_positive = np.prod(np.where(patterns > 0, agree, disagree), axis=1)
    likelihood_negative = np.prod(np.where(patterns < 0, agree, disagree), axis=1)
    return float(0.5 * np.maximum(likelihood_positive, likelihood_negative).sum())


def _planted_relations(strengths: Sequence[float] | np.ndarray, name: str, first_token: int) -> list[dict]:
    """Validate `strengths` and describe relation i: tokens (a_i, b_i), strength s_i, Bayes weight, its value.

    Each relation must change the Bayes decision sign(sum_i w_i z_i), w_i = log((1 + s_i) / (1 - s_i)), for
    some order pattern (else the optimal classifier would not need it): a ValueError names `name` otherwise.
    """
    if isinstance(strengths, (str, bytes)) or not isinstance(strengths, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of floats, got {type(strengths).__name__}")
    try:
        values = np.asarray(strengths, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must hold floats, got {list(strengths)}") from error
    if values.ndim != 1 or not 1 <= len(values) <= MAX_RELATIONS:
        raise ValueError(f"{name} must hold 1 to {MAX_RELATIONS} strengths, got {list(strengths)}")
    if not np.all((values > 0) & (values < 1)):
        raise ValueError(f"{name} must lie in the open interval (0, 1), got {list(strengths)}")
    if np.any(np.diff(values) >= 0):
        raise ValueError(f"{name} must be strictly decreasing, got {list(strengths)}")
    weights = np.log((1 + values) / (1 - values))
    for index, weight in enumerate(weights):
        others = np.delete(weights, index)
        if others.size and np.all(np.abs(_sign_patterns(others.size) @ others) >= weight):
            raise ValueError(
                f"{name}[{index}]={values[index]} never changes the optimal decision (the other relations "
                "outweigh it); use closer strengths"
            )
    return [
        {
            "key_token": first_token + 2 * index,
            "query_token": first_token + 2 * index + 1,
            "strength": float(values[index]),
            "bayes_weight": float(weights[index]),
            "bayes_accuracy_without": _bayes_accuracy(np.delete(values, index)) if len(values) > 1 else 0.5,
        }
        for index in range(len(values))
    ]


def _relation_sequences(
    rng: np.random.Generator, labels: np.ndarray, relations: list[dict], fillers: np.ndarray, seq_len: int
) -> np.ndarray:
    """Rows for given labels: relation i puts a_i before b_i w.p. (1 + s_i y') / 2, with y' = 2y - 1."""
    num_rows, content_length = len(labels), seq_len - 2
    content = fillers[rng.integers(0, len(fillers), size=(num_rows, content_length))]
    positions = np.argsort(rng.random((num_rows, content_length)), axis=1)
    rows = np.arange(num_rows)
    signed_labels = 2 * labels - 1
    for index, relation in enumerate(relations):
        agrees = rng.random(num_rows) < (1 + relation["strength"]) / 2
        key_first = np.where(agrees, signed_labels, -signed_labels) > 0
        first = np.minimum(positions[:, 2 * index], positions[:, 2 * index + 1])
        second = np.maximum(positions[:, 2 * index], positions[:, 2 * index + 1])
        content[rows, first] = np.where(key_first, relation["key_token"], relation["query_token"])
        content[rows, second] = np.where(key_first, relation["query_token"], relation["key_token"])
    return _wrap_special(content)


def _check_relation_geometry(vocab_size: int, seq_len: int, relation_tokens: int, max_relations: int) -> None:
    """vocab_size leaves at least one filler token; seq_len fits [CLS], [SEP] and every relation pair."""
    require_int("vocab_size", vocab_size, NUM_SPECIAL_TOKENS + relation_tokens + 1)
    require_int("seq_len", seq_len, 2 * max_relations + 2)


def _token_splits(
    sizes: dict[str, int],
    rows: Callable[[int], tuple[np.ndarray, np.ndarray]],
    label_names: Sequence[str],
    spec: dict,
) -> DatasetDict:
    """One split per `sizes` entry, each from `rows(size)` = (input_ids, labels), drawn in order."""
    splits = {}
    for split, size in sizes.items():
        input_ids, labels = rows(size)
        columns = {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids), "labels": labels}
        splits[split] = _to_dataset(columns, label_names, spec)
    return DatasetDict(splits)


def _balanced_labels(rng: np.random.Generator, num_rows: int) -> np.ndarray:
    """num_rows // 2 zeros and the rest ones, in random order."""
    return rng.permutation(np.arange(num_rows) >= num_rows // 2).astype(np.int64)


def build_spectral_task(
    strengths: Sequence[float] = DEFAULT_STRENGTHS,
    *,
    num_train: int = 4000,
    num_validation: int = 1000,
    vocab_size: int = 48,
    seq_len: int = 24,
    seed: int = 0,
) -> DatasetDict:
    """Binary classification whose label depends on k = len(strengths) directional token relations.

    Construction. Relation i owns two tokens, a_i = 5 + 2i and b_i = 6 + 2i; the other
    non-special ids are fillers. A row is `[CLS]`, seq_len - 2 content tokens, `[SEP]`: fillers drawn
    uniformly, with each a_i and b_i placed exactly once at random positions. The label y is balanced; given
    y, relation i puts a_i BEFORE b_i with probability (1 + s_i)/2 if y = 1, (1 - s_i)/2 if y = 0,
    independently. So z_i = +-1 (a_i first or not) has correlation exactly s_i with y' = 2y - 1, token counts
    carry no information (only order does), and the Bayes classifier is sign(sum_i w_i z_i) with
    w_i = log((1 + s_i)/(1 - s_i)). Strengths must decrease and each relation must be able to change that
    decision, so the optimal classifier needs all k directions (docs/experiments.md, 'exp_synthetic.py').

    Planted (exact, in `task_spec(ds)["relations"]`): the tokens, s_i, w_i, the Bayes accuracy with all
    relations and without each one. Not planted: the model's spectrum. The gate's lambda_max values come
    from learned W_Q, W_K and embeddings; the task only fixes that k ordered relations of decreasing
    usefulness exist, so the grown head count and order are the measurements to compare with k and s.
    """
    relations = _planted_relations(strengths, "strengths", NUM_SPECIAL_TOKENS)
    _check_relation_geometry(vocab_size, seq_len, 2 * len(relations), len(relations))
    require_int("num_train", num_train, 2)
    require_int("num_validation", num_validation, 2)
    require_int("seed", seed, 0)
    rng = np.random.default_rng(seed)
    fillers = np.arange(NUM_SPECIAL_TOKENS + 2 * len(relations), vocab_size)
    spec = {
        "task": "spectral_relations",
        "seed": seed,
        "vocab_size": vocab_size,
        "seq_len": seq_len,
        "special_tokens": list(BERT_SPECIAL_TOKENS),
        "relations": relations,
        "bayes_accuracy": _bayes_accuracy(np.asarray(strengths, dtype=np.float64)),
    }

    def rows(size: int) -> tuple[np.ndarray, np.ndarray]:
        labels = _balanced_labels(rng, size)
        return _relation_sequences(rng, labels, relations, fillers, seq_len), labels

    return _token_splits({"train": num_train, "validation": num_validation}, rows, ["0", "1"], spec)


MAX_MAJORITY_RELATIONS = 8
DEFAULT_MAJORITY_COUNTS = (1, 3, 5)


def _check_counts(counts: Sequence[int]) -> tuple[int, ...]:
    """Odd positive ints, distinct and increasing: the possible numbers of tokens of one relation in a row."""
    if isinstance(counts, (str, bytes)) or not isinstance(counts, Sequence) or not counts:
        raise ValueError(f"counts must be a non-empty sequence of odd ints, got {counts!r}")
    for count in counts:
        require_int("counts", count, 1)
        if count % 2 == 0:
            raise ValueError(f"counts must be odd (a majority always exists), got {list(counts)}")
    if any(second <= first for first, second in itertools.pairwise(counts)):
        raise ValueError(f"counts must be strictly increasing, got {list(counts)}")
    return tuple(counts)


def build_majority_relations_task(
    num_relations: int = 2,
    *,
    counts: Sequence[int] = DEFAULT_MAJORITY_COUNTS,
    num_train: int = 4000,
    num_validation: int = 1000,
    vocab_size: int = 48,
    seq_len: int = 24,
    seed: int = 0,
) -> DatasetDict:
    """Classify k = `num_relations` majority bits at once: 2^k classes, a task whose head need is k.

    Construction. Relation i owns the tokens a_i = 5 + 2i and b_i = 6 + 2i. In every row it places n_i
    tokens drawn from {a_i, b_i} at random positions among uniform fillers, n_i uniform over `counts` (odd,
    so there is no tie), and the majority's share m_i uniform over (n_i + 1) / 2 .. n_i. The bit z_i is 1
    when a_i is the majority; the bits are independent and uniform (classes balanced to within one row) and
    the label is sum_i z_i 2^i, so every relation decides it (Bayes accuracy 1).

    Why k heads (docs/growth_gate.md, 'A task that needs k heads'): read at one query position
    (`pooling="cls"`; the [CLS] residual carries nothing about the row) by heads of `head_dim=1`, a head
    returns one number, a softmax average of its values. Attending to a_i, b_i with values +1, -1 it returns
    (count a_i - count b_i) / (its weight sum), whose sign gives z_i whatever n_i. One head attending to two
    relations returns a weighted sum of their margins, divided by a weight sum that varies with n_i: the
    signs are no longer separable in general, so each relation wants a head of its own.
    """
    require_int("num_relations", num_relations, 1)
    if num_relations > MAX_MAJORITY_RELATIONS:
        raise ValueError(f"num_relations must be <= {MAX_MAJORITY_RELATIONS}, got {num_relations}")
    counts = _check_counts(counts)
    require_int("vocab_size", vocab_size, NUM_SPECIAL_TOKENS + 2 * num_relations + 1)
    slots = max(counts)
    require_int("seq_len", seq_len, num_relations * slots + 2)
    require_int("num_train", num_train, 2)
    require_int("num_validation", num_validation, 2)
    require_int("seed", seed, 0)
    relations = [
        {"a_token": NUM_SPECIAL_TOKENS + 2 * index, "b_token": NUM_SPECIAL_TOKENS + 2 * index + 1}
        for index in range(num_relations)
    ]
    num_classes = 2**num_relations
    rng = np.random.default_rng(seed)
    fillers = np.arange(NUM_SPECIAL_TOKENS + 2 * num_relations, vocab_size)
    spec = {
        "task": "majority_relations",
        "seed": seed,
        "vocab_size": vocab_size,
        "seq_len": seq_len,
        "special_tokens": list(BERT_SPECIAL_TOKENS),
        "counts": list(counts),
        "relations": relations,
        "num_classes": num_classes,
        "bayes_accuracy": 1.0,
    }

    def rows(size: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.permutation(np.arange(size) % num_classes).astype(np.int64)
        content = fillers[rng.integers(0, len(fillers), size=(size, seq_len - 2))]
        positions = np.argsort(rng.random((size, seq_len - 2)), axis=1)
        row_index = np.arange(size)[:, None]
        slot = np.arange(slots)[None, :]
        for index, relation in enumerate(relations):
            total = rng.choice(counts, size=size)[:, None]
            majority = rng.integers((total + 1) // 2, total + 1)
            a_first = ((labels >> index) & 1)[:, None] == 1
            tokens = np.where((slot < majority) == a_first, relation["a_token"], relation["b_token"])
            placed = slot < total
            where = positions[:, index * slots : (index + 1) * slots]
            content[np.broadcast_to(row_index, where.shape)[placed], where[placed]] = tokens[placed]
        return _wrap_special(content), labels

    sizes = {"train": num_train, "validation": num_validation}
    return _token_splits(sizes, rows, [str(c) for c in range(num_classes)], spec)


def build_nonstationary_stream(
    strengths_before: Sequence[float] = DEFAULT_STRENGTHS,
    strengths_after: Sequence[float] = DEFAULT_STRENGTHS,
    *,
    num_steps: int = 400,
    batch_size: int = 32,
    switch_step: int = 200,
    vocab_size: int = 48,
    seq_len: int = 24,
    seed: int = 0,
) -> Dataset:
    """A time-ordered stream of the spectral task whose relation set switches at `switch_step`.

    Rows r = step * batch_size + j (columns `step`, `phase` = 0 before the switch, 1 from it on). Phase 0
    uses relations on tokens 5, 6, ...; phase 1 uses a disjoint set on the next tokens, and the phase-0
    relation tokens no longer occur (both phases draw fillers from the same remaining ids), so heads tuned
    to phase-0 relations lose their directional energy after the switch. Each batch holds exactly
    batch_size / 2 rows of each label. Train with `TrainingArguments(train_sampling_strategy="sequential",
    per_device_train_batch_size=batch_size)` so Trainer step t sees batch t.
    """
    relations_before = _planted_relations(strengths_before, "strengths_before", NUM_SPECIAL_TOKENS)
    first_after = NUM_SPECIAL_TOKENS + 2 * len(relations_before)
    relations_after = _planted_relations(strengths_after, "strengths_after", first_after)
    num_relation_tokens = 2 * (len(relations_before) + len(relations_after))
    _check_relation_geometry(
        vocab_size, seq_len, num_relation_tokens, max(len(relations_before), len(relations_after))
    )
    require_int("num_steps", num_steps, 2)
    require_int("batch_size", batch_size, 2)
    if batch_size % 2:
        raise ValueError(f"batch_size must be even (balanced batches), got {batch_size}")
    require_int("switch_step", switch_step, 1)
    if switch_step >= num_steps:
        raise ValueError(f"switch_step must be < num_steps={num_steps}, got {switch_step}")
    require_int("seed", seed, 0)
    rng = np.random.default_rng(seed)
    fillers = np.arange(NUM_SPECIAL_TOKENS + num_relation_tokens, vocab_size)
    steps = np.repeat(np.arange(num_steps), batch_size)
    phases = (steps >= switch_step).astype(np.int64)
    labels = np.concatenate([_balanced_labels(rng, batch_size) for _ in range(num_steps)])
    input_ids = np.empty((len(labels), seq_len), dtype=np.int64)
    for phase, relations in enumerate((relations_before, relations_after)):
        rows = phases == phase
        input_ids[rows] = _relation_sequences(rng, labels[rows], relations, fillers, seq_len)
    spec = {
        "task": "nonstationary_relations",
        "seed": seed,
        "vocab_size": vocab_size,
        "seq_len": seq_len,
        "special_tokens": list(BERT_SPECIAL_TOKENS),
        "num_steps": num_steps,
        "batch_size": batch_size,
        "switch_step": switch_step,
        "phases": [
            {"relations": relations_before, "bayes_accuracy": _bayes_accuracy(np.asarray(strengths_before))},
            {"relations": relations_after, "bayes_accuracy": _bayes_accuracy(np.asarray(strengths_after))},
        ],
    }
    columns = {
        "input_ids": input_ids,
        "attention_mask": np.ones_like(input_ids),
        "labels": labels,
        "step": steps,
        "phase": phases,
    }
    return _to_dataset(columns, ["0", "1"], spec)


# ----------------------------------------------------------------------------------------------------------
# Synthetic SARS-CoV-2 variant task
# ----------------------------------------------------------------------------------------------------------

LINEAGES = ("Alpha", "Beta", "Gamma", "Delta", "Omicron")
# Sites shared between lineages, named after the real spike mutations they imitate; the value is the index of
# the lineage's alternative allele at that site (two lineages with different indices carry different bases).
SHARED_SITES = (
    ("D614G", {"Alpha": 0, "Beta": 0, "Gamma": 0, "Delta": 0, "Omicron": 0}),
    ("N501Y", {"Alpha": 0, "Beta": 0, "Gamma": 0, "Omicron": 0}),
    ("E484K/A", {"Beta": 0, "Gamma": 0, "Omicron": 1}),
    ("K417N/T", {"Beta": 0, "Omicron": 0, "Gamma": 1}),
    ("P681H/R", {"Alpha": 0, "Omicron": 0, "Delta": 1}),
)
# Omicron carries many more lineage-defining mutations than the others.
PRIVATE_SITE_MULTIPLIER = {"Alpha": 1, "Beta": 1, "Gamma": 1, "Delta": 1, "Omicron": 3}
BASE_CODES = NUCLEOTIDES + AMBIGUOUS_BASE
N_CODE = BASE_CODES.index(AMBIGUOUS_BASE)


def _mutate(rng: np.random.Generator, genomes: np.ndarray, rate: float) -> None:
    """Substitute each base, with probability `rate`, by one of the three other bases (in place)."""
    hits = (rng.random(genomes.shape) < rate) & (genomes != N_CODE)
    genomes[hits] = (genomes[hits] + rng.integers(1, 4, size=int(hits.sum()))) % 4


def _kmer_ids(genomes: np.ndarray, kmer_size: int, stride: int) -> np.ndarray:
    """`[CLS] k-mer ids [SEP]` per row of base codes (A C G T N = 0..4), as `build_kmer_tokenizer` ids."""
    windows = np.lib.stride_tricks.sliding_window_view(genomes, kmer_size, axis=1)[:, ::stride]
    codes = (windows.astype(np.int64) * 4 ** np.arange(kmer_size - 1, -1, -1)).sum(axis=-1)
    return _wrap_special(np.where((windows == N_CODE).any(axis=-1), UNK_ID, NUM_SPECIAL_TOKENS + codes))


def build_cov2_variant_task(
    *,
    num_train_per_lineage: int = 200,
    num_validation_per_lineage: int = 50,
    genome_length: int = 3000,
    private_mutations: int = 6,
    background_rate: float = 1e-3,
    error_rate: float = 2e-3,
    n_rate: float = 5e-3,
    fragment_length: int | None = None,
    kmer_size: int = 6,
    kmer_stride: int | None = None,
    seed: int = 0,
) -> DatasetDict:
    """Classify synthetic SARS-CoV-2-like genomes by lineage (Alpha, Beta, Gamma, Delta, Omicron) from k-mers.

    Construction (all from `seed`): a random ACGT reference of `genome_length`; lineage-defining point
    mutations at random sites: five sites shared as in `SHARED_SITES` (D614G in all, N501Y in four, E484K in
    Beta/Gamma vs E484A in Omicron, ...) plus `private_mutations` sites per lineage (3x for Omicron). The
    sites and bases imitate, not copy, real lineages. Each sample = reference + its lineage's signature, then
    per-base background mutations (`background_rate`), sequencing substitutions (`error_rate`) and N calls
    (`n_rate`), optionally cut to a random window of `fragment_length` (a window may miss every informative
    site, so accuracy below 100 % is then expected). Tokens: k-mers at stride `kmer_stride` (default
    `kmer_size`), ids of `build_kmer_tokenizer(kmer_size)` (k-mers with N -> `[UNK]`), wrapped in
    `[CLS] ... [SEP]`; `tokenizer(kmerize(row["sequence"], k, stride))` reproduces `input_ids`. Labels are
    balanced (exact counts per lineage) and named by `ClassLabel`; the sites are in `task_spec(ds)`.
    """
    for name, value in (
        ("num_train_per_lineage", num_train_per_lineage),
        ("num_validation_per_lineage", num_validation_per_lineage),
        ("private_mutations", private_mutations),
        ("kmer_size", kmer_size),
    ):
        require_int(name, value, 1)
    if kmer_size > MAX_KMER_SIZE:
        raise ValueError(f"kmer_size must be <= {MAX_KMER_SIZE}, got {kmer_size}")
    kmer_stride = kmer_size if kmer_stride is None else require_int("kmer_stride", kmer_stride, 1)
    for name, rate in (("background_rate", background_rate), ("error_rate", error_rate), ("n_rate", n_rate)):
        check_number(name, rate, 0.0, 1.0, high_open=True)  # a probability
    rates = {
        "background_rate": float(background_rate),
        "error_rate": float(error_rate),
        "n_rate": float(n_rate),
    }
    num_sites = len(SHARED_SITES) + private_mutations * sum(PRIVATE_SITE_MULTIPLIER.values())
    require_int("genome_length", genome_length, max(num_sites, kmer_size))
    window = genome_length
    if fragment_length is not None:
        window = require_int("fragment_length", fragment_length, kmer_size)
    if window > genome_length:
        raise ValueError(f"fragment_length must be <= genome_length={genome_length}, got {fragment_length}")
    require_int("seed", seed, 0)

    rng = np.random.default_rng(seed)
    reference = rng.integers(0, 4, size=genome_length).astype(np.int8)
    positions = iter(rng.choice(genome_length, size=num_sites, replace=False).tolist())
    sites = []
    for site_name, alleles in SHARED_SITES:
        position = next(positions)
        alternatives = rng.permutation([base for base in range(4) if base != reference[position]])
        carriers = {lineage: BASE_CODES[alternatives[allele]] for lineage, allele in alleles.items()}
        sites.append({"name": site_name, "position": position, "carriers": carriers})
    for lineage in LINEAGES:
        for index in range(private_mutations * PRIVATE_SITE_MULTIPLIER[lineage]):
            position = next(positions)
            alternative = (reference[position] + rng.integers(1, 4)) % 4
            carriers = {lineage: BASE_CODES[alternative]}
            sites.append({"name": f"{lineage}-{index}", "position": position, "carriers": carriers})
    lineage_genomes = np.tile(reference, (len(LINEAGES), 1))
    for site in sites:
        for lineage, base in site["carriers"].items():
            lineage_genomes[LINEAGES.index(lineage), site["position"]] = BASE_CODES.index(base)

    spec = {
        "task": "cov2_variants",
        "seed": seed,
        "lineages": list(LINEAGES),
        "genome_length": genome_length,
        "fragment_length": fragment_length,
        "kmer_size": kmer_size,
        "kmer_stride": kmer_stride,
        **rates,
        "reference": "".join(BASE_CODES[base] for base in reference),
        "sites": sites,
    }
    letters = np.frombuffer(BASE_CODES.encode(), dtype=np.uint8)
    splits = {}
    for split, per_lineage in (("train", num_train_per_lineage), ("validation", num_validation_per_lineage)):
        labels = rng.permutation(np.repeat(np.arange(len(LINEAGES)), per_lineage))
        genomes = lineage_genomes[labels]
        _mutate(rng, genomes, rates["background_rate"])
        _mutate(rng, genomes, rates["error_rate"])
        genomes[rng.random(genomes.shape) < rates["n_rate"]] = N_CODE
        starts = rng.integers(0, genome_length - window + 1, size=len(labels))
        genomes = genomes[np.arange(len(labels))[:, None], starts[:, None] + np.arange(window)]
        input_ids = _kmer_ids(genomes, kmer_size, kmer_stride)
        columns = {
            "input_ids": input_ids,
            "attention_mask": np.ones_like(input_ids),
            "labels": labels,
            "sequence": np.array([row.tobytes().decode() for row in letters[genomes]], dtype=object),
        }
        splits[split] = _to_dataset(columns, LINEAGES, spec)
    return DatasetDict(splits)
