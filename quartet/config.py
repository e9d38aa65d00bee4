"""Typed run configuration: Hydra structured configs, composition and the one resolve step.

``compose(overrides)`` builds a :class:`omegaconf.DictConfig` from ``conf/train.yaml`` and its groups
(``model/ precision/ budget/ data/ optim/ logging/``) on top of the dataclasses below, so a typo'd key
or a wrongly typed value fails at compose time. ``resolve(cfg)`` then derives everything that must
never be typed by hand (non-embedding N, tokens D, steps, warm-up, LR, micro-batches, token dtype)
and validates it. Both raise :class:`quartet.errors.ConfigError` with a one-line message that names
the key and what is allowed, so the CLI can print it as is.

Derived values follow the paper's code (IST-DASLab/Quartet ``main_setup.sh``):
``steps = tokens // (batch_size * seq_len)`` and ``warmup = steps // 10``; with ``tokens`` either
``budget.tokens`` or ``budget.tokens_per_param * model.nominal_params`` (the paper's D/N uses the
nominal size, e.g. 30e6 for the 30M model). ``D`` actually trained is ``steps * batch * seq_len``.
"""
from __future__ import annotations

import copy
import math
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from quartet.errors import ConfigError
from quartet.memory import PARALLEL_CHOICES
from quartet.shapes import block_linear_names, ffn_hidden
from quartet.paths import CONF_DIR, CONFIG, check_folder_name
from quartet.quant.config import UNQUANTIZED_LABEL, PrecisionConfig, half_variants, keep_bf16_matches

# --------------------------------------------------------------------------------------------
# Schemas (one dataclass per config group)
# --------------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    """A Llama-2 style decoder (see ``quartet.model.Llama``); sizes follow the paper's Table 4."""

    name: str = MISSING
    n_layer: int = MISSING
    d_model: int = MISSING
    n_head: int = MISSING
    #: context length of the model and the training windows (the paper: 512)
    seq_len: int = 512
    #: the size used for D/N budgets (the paper counts 30M, 50M, ... not the exact N)
    nominal_params: float = MISSING
    #: peak learning rate for this size (the paper scales it ~1/N from a tuned small model)
    lr: float = MISSING
    #: sequences per optimizer step recommended for this size (the paper: 512); optim.batch_size overrides
    batch_size: int = 512
    #: SwiGLU hidden = multiple_of * ceil(int(8d/3) / multiple_of); the paper uses 256
    ffn_multiple_of: int = 256
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    init_std: float = 0.02


@dataclass
class BudgetConfig:
    """Training tokens: exactly one of ``tokens_per_param`` (D / nominal N) or ``tokens`` (absolute)."""

    name: str = "custom"
    tokens_per_param: Optional[float] = None
    tokens: Optional[int] = None


@dataclass
class DataConfig:
    """Where the token shards come from; prepared once by ``quartet data prepare`` (or on first use)."""

    name: str = MISSING
    #: shakespeare (bundled corpus) | files (local text files/folders) | code (source files of local folders,
    #: by default this interpreter's installed libraries) | hf (Hugging Face datasets, e.g. C4)
    source: str = "shakespeare"
    #: for source=files: files or folders of *.txt; for source=code: files or folders to walk ([] = this
    #: interpreter's stdlib + site-packages); for source=hf: ignored
    paths: list[str] = field(default_factory=list)
    #: for source=code: file name endings that make a document (e.g. [".py", ".pyi"])
    extensions: list[str] = field(default_factory=lambda: [".py"])
    #: for source=code: skip files larger than this many bytes (generated tables, vendored blobs)
    max_file_bytes: int = 1_000_000
    #: for source=hf: dataset path / config / split (C4: allenai/c4, en, train)
    hf_path: str = "allenai/c4"
    hf_name: Optional[str] = "en"
    hf_split: str = "train"
    hf_text_field: str = "text"
    #: bpe (byte-level BPE trained offline on the train documents) | hf (a pretrained tokenizer by name)
    tokenizer: str = "bpe"
    #: for tokenizer=hf: the Hugging Face tokenizer (the paper: meta-llama/Llama-2-7b-hf)
    tokenizer_name: Optional[str] = None
    vocab_size: int = 2048
    #: for tokenizer=bpe: train the BPE on the train documents in corpus order up to this many characters
    #: (whole documents; null = all train documents); bounds BPE time on large corpora, encoding covers all
    tokenizer_train_chars: Optional[int] = None
    #: auto (uint16 when vocab <= 65536, else uint32) | uint16 | uint32
    token_dtype: str = "auto"
    #: held-out fraction of documents (document-level split; the paper holds out 0.0005 of C4)
    val_fraction: float = 0.02
    #: stop reading the source after this many documents / characters (null = all)
    max_documents: Optional[int] = None
    max_chars: Optional[int] = None
    #: seed of the document split and the tokenizer training
    split_seed: int = 2357
    #: tokens per shard file
    shard_tokens: int = 100_000_000
    #: prepared-data folder; null = <cache>/data/<name>-<key>/ (keyed by source + tokenizer settings)
    dir: Optional[str] = None
    #: full (sizes + sha256 of every shard at load) | size (sizes only; for very large shards)
    verify: str = "full"


@dataclass
class OptimConfig:
    """The paper's recipe: AdamW, wd on block linear weights only, clip, OneCycle-cosine schedule."""

    name: str = "paper"
    #: peak LR; null = the model size's LR (model.lr)
    lr: Optional[float] = None
    #: sequences per optimizer step; null = model.batch_size
    batch_size: Optional[int] = None
    #: sequences per forward/backward (gradient accumulation = batch / (micro * world)); null = no accumulation
    micro_batch_size: Optional[int] = None
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    #: fraction of steps used for warm-up (warmup = int(steps * fraction); the paper: steps // 10)
    warmup_fraction: float = 0.1
    #: warm-up starts at lr / div_factor (the paper: OneCycleLR div_factor=100)
    div_factor: float = 100.0
    #: the end LR is lr / end_div (the paper: lr / 10)
    end_div: float = 10.0
    #: cosine (the paper's OneCycle-cosine) | wsd (warm-up, constant LR, then a 1-sqrt decay to lr / end_div over the
    #: last decay_fraction of the updates; docs/training.md)
    schedule: str = "cosine"
    #: schedule=wsd: the last floor(decay_fraction * steps + 1/2) updates decay (0 = no decay: a budget-branch trunk)
    decay_fraction: float = 0.2
    #: warm-up updates; null = the warmup_fraction rule (budget branches set it: every budget shares its trunk's)
    warmup_steps: Optional[int] = None


@dataclass
class WandbConfig:
    #: offline (default, sync later with `wandb sync`) | online | disabled
    mode: str = "offline"
    project: str = "quartet"
    entity: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    #: seconds wandb.init may take before the run continues without wandb
    init_timeout: float = 60.0


@dataclass
class LoggingConfig:
    name: str = "default"
    #: write a metrics row every N steps
    log_every: int = 10
    #: validation loss every N steps (0 = only the final full pass) on val_batches micro-batches
    val_every: int = 200
    val_batches: int = 32
    #: checkpoint every N steps (0 = only on stop / completion)
    ckpt_every: int = 500
    #: terminal progress bar
    progress: bool = True
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class RunConfig:
    #: group folder under out_dir (e.g. the sweep name)
    name: str = "default"
    seed: int = 0
    data_seed: int = 1337
    #: runs root; null = quartet.paths.runs_root() ($QUARTET_RUNS, else <checkout>/runs); docs/training.md
    out_dir: Optional[str] = None
    #: auto | cpu | cuda
    device: str = "auto"
    #: bf16 autocast on CUDA (fp32 on CPU regardless)
    amp: bool = True
    #: torch.compile the training forward/backward (the operand-by-operand QuantLinear of the seam stays eager)
    compile: bool = False
    #: torch.compile mode when compile is on: default | reduce-overhead (CUDA graphs) | max-autotune-no-cudagraphs
    compile_mode: str = "default"
    #: with compile: trace the fused Quartet layers into the graph as registered operators, their random draws
    #: fed from the device (false: they run eagerly between compiled regions, draws made on the host). The
    #: numbers are the same either way; only the speed differs.
    compile_fused: bool = True
    #: CPU threads for torch; 0 = min(4, usable cores / processes per node), or torch's default when OMP_NUM_THREADS
    #: is set (quartet.train.cpu_threads); 1 is fastest when several runs share few cores
    threads: int = 0
    #: data parallelism: ddp (whole model per rank) | fsdp (FSDP2: parameters, grads and Adam states sharded per
    #: transformer block) | auto (ddp when its per-GPU memory estimate fits the GPU, else fsdp; a cluster plan
    #: decides per size from its profile and writes ddp or fsdp here)
    parallel: str = "auto"
    #: recompute each block's activations in the backward (less memory, ~1/3 more compute)
    activation_checkpointing: bool = False


@dataclass
class BranchConfig:
    """Budget branches (docs/branches.md): written by a sweep with ``branches: true``, never by hand."""

    #: a trunk: the steps after which ``ckpt/branch_<step>.pt`` is kept (each budget's decay start)
    save_steps: list[int] = field(default_factory=list)
    #: a branch: its trunk's run id (a folder beside this run's) and the step its decay starts from
    trunk: Optional[str] = None
    step: Optional[int] = None


@dataclass
class DerivedConfig:
    """Filled by :func:`resolve`; never set by hand (a mismatching value is an error)."""

    n_params: Optional[int] = None
    n_params_total: Optional[int] = None
    nominal_params: Optional[float] = None
    vocab_size: Optional[int] = None
    ffn_hidden: Optional[int] = None
    lr: Optional[float] = None
    batch_size: Optional[int] = None
    micro_batch_size: Optional[int] = None
    seq_len: Optional[int] = None
    tokens_per_step: Optional[int] = None
    budget_tokens: Optional[int] = None
    tokens: Optional[int] = None
    steps: Optional[int] = None
    warmup_steps: Optional[int] = None
    #: schedule=wsd: index of the first decaying update (null for cosine)
    decay_start: Optional[int] = None
    token_dtype: Optional[str] = None


@dataclass
class TrainConfig:
    model: ModelConfig = MISSING
    precision: PrecisionConfig = MISSING
    budget: BudgetConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    logging: LoggingConfig = MISSING
    run: RunConfig = field(default_factory=RunConfig)
    branch: BranchConfig = field(default_factory=BranchConfig)
    derived: DerivedConfig = field(default_factory=DerivedConfig)
    #: cluster-side settings (owned by cluster/); free-form here so train runs without them
    cluster: Optional[Any] = None


_GROUPS = ("model", "precision", "budget", "data", "optim", "logging")
#: torch.compile modes a run may ask for (run.compile_mode)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
_registered = False


def register_configs() -> None:
    """Register the schemas in Hydra's ConfigStore (idempotent)."""
    global _registered
    if _registered:
        return
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    # The half-recipe variants are options of the precision group without YAMLs of their own: each extends its
    # recipe's YAML (Hydra's defaults list: knobs such as hadamard_block and keep_bf16 stay the recipe's) and
    # changes the scheme name and the unquantized half's label, so the registry stays the one list of names.
    for variant, (recipe, half) in half_variants().items():
        unquantized = "backward" if half == "forward" else "forward"
        cs.store(group="precision", name=variant,
                 node={"defaults": [recipe, "_self_"], "name": variant, unquantized: UNQUANTIZED_LABEL})
    _registered = True


# --------------------------------------------------------------------------------------------
# Compose
# --------------------------------------------------------------------------------------------


def group_options(group: str, conf_dir: Path | None = None) -> list[str]:
    """The options of a config group, sorted: its YAMLs (``conf/<group>/*.yaml``) and, for ``precision``, the
    half-recipe variants of the recipes that have one (:func:`register_configs`)."""
    d = Path(conf_dir or CONF_DIR) / group
    options = {p.stem for p in d.glob("*.yaml")} if d.is_dir() else set()
    if group == "precision":
        options |= {variant for variant, (recipe, _half) in half_variants().items() if recipe in options}
    return sorted(options)


def _keys_of(dotted_parent: str) -> list[str]:
    schemas = {"": TrainConfig, "model": ModelConfig, "precision": PrecisionConfig, "budget": BudgetConfig,
               "data": DataConfig, "optim": OptimConfig, "logging": LoggingConfig, "logging.wandb": WandbConfig,
               "run": RunConfig, "branch": BranchConfig, "derived": DerivedConfig}
    schema = schemas.get(dotted_parent)
    return list(OmegaConf.structured(schema).keys()) if schema is not None else []


def _rephrase(exc: BaseException, overrides: list[str], conf_dir: Path) -> ConfigError:
    """Turn a Hydra / OmegaConf composition error into a one-line ConfigError naming key + allowed values."""
    text = " ".join(str(exc).split())
    chain = []
    e: BaseException | None = exc
    while e is not None and len(chain) < 6:
        chain.append(e)
        e = e.__cause__ or e.__context__
    # 1) unknown option of a group: "Could not find 'model/foo'" / "In 'train': Could not find 'model/foo'"
    m = re.search(r"Could not (?:find|load) '([\w/]+)/([^'/]+)'", text)
    if m:
        group, option = m.group(1), m.group(2)
        opts = group_options(group, conf_dir)
        return ConfigError(f"{group}={option}: unknown {group}; allowed: {', '.join(opts) or '(none)'}")
    # 2) unknown key / bad type: OmegaConf errors carry full_key
    for e in chain:
        if isinstance(e, OmegaConfBaseException) and getattr(e, "full_key", None):
            key = e.full_key
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            msg = " ".join(str(getattr(e, "msg", "") or str(e)).split("\n")[0].split())
            if "not in" in msg or "Key '" in msg and "not" in msg:
                allowed = _keys_of(parent)
                return ConfigError(f"{key}: unknown key; allowed keys{' of ' + parent if parent else ''}: "
                                   f"{', '.join(allowed)}")
            value = getattr(e, "value", None)
            conv = re.search(r"could not be converted to (\w+)", msg)
            expected = conv.group(1).lower() if conv else "a value of the schema's type"
            vtxt = f" {value!r}" if value is not None else ""
            return ConfigError(f"{key}: bad value{vtxt}; expected {expected}")
    m = re.search(r"Could not override '([^']+)'", text)
    if m:
        key = m.group(1)
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        return ConfigError(f"{key}: cannot be overridden ({text.split('.')[-2].strip() if '.' in text else text}); "
                           f"allowed keys{' of ' + parent if parent else ''}: {', '.join(_keys_of(parent))}")
    m = re.search(r"Key '([^']+)' (?:is )?not in", text)
    if m:
        return ConfigError(f"{m.group(1)}: unknown key; {text[:200]}")
    return ConfigError(f"bad overrides {' '.join(overrides)}: {text[:300]}")


def compose(overrides: list[str] | None = None, conf_dir: str | Path | None = None,
            config_name: str = "train") -> DictConfig:
    """Compose the run config from ``conf/<config_name>.yaml`` + groups + Hydra ``overrides``.

    Typed: unknown group options, unknown keys and bad types raise ConfigError (one line).

    Fast path (same result as Hydra's full compose): each group choice (``model=...``, ``precision=...``) is
    composed by Hydra once per process (:func:`_from_group_nodes`, keyed by the conf folder's files), and each
    call applies its value overrides (``run.seed=1``, ``budget.tokens=...``) to a copy of the assembled config
    with the very step Hydra takes after composing its defaults list. Overrides the fast path does not
    model (``+key``, ``++key``, ``~key``, ``hydra.*``, packages, dict values) and any failure take the full
    compose, so errors read as before.
    """
    # Every group is in train.yaml's defaults (cluster as null), so `+group=x` means `group=x`.
    overrides = [o[1:] if re.match(r"\+(\w+)=", o) and o[1:].split("=")[0] in _GROUPS + ("cluster",) else o
                 for o in (overrides or [])]
    conf_dir = Path(conf_dir or CONF_DIR).resolve()
    if not (conf_dir / f"{config_name}.yaml").is_file():
        raise ConfigError(f"config: {conf_dir / (config_name + '.yaml')} does not exist; set QUARTET_CONF to the conf/ folder")
    # Fail early and clearly on a group option that has no YAML (Hydra's own message is multi-line).
    for ov in overrides:
        m = re.fullmatch(r"\+?(\w+)=([\w.\-]+)", ov)
        if m and m.group(1) in _GROUPS + ("cluster",) and (conf_dir / m.group(1)).is_dir():
            group, option = m.groups()
            opts = group_options(group, conf_dir)
            if option not in opts:
                raise ConfigError(f"{group}={option}: unknown {group}; allowed: {', '.join(opts)}")
    split = _split_overrides(overrides, conf_dir)
    if split is not None:
        choices, values = split
        cfg = _from_group_nodes(choices, conf_dir, config_name)
        if cfg is not None:
            try:
                from hydra._internal.config_loader_impl import ConfigLoaderImpl

                ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
                return cfg
            except Exception:  # noqa: BLE001 - the full compose below raises the error as it always read
                pass
    return _hydra_compose(overrides, conf_dir, config_name)


#: Hydra composes of the fast path, keyed by (conf folder, config name, group choices, files' signature)
_COMPOSED: dict[tuple, DictConfig] = {}
_COMPOSED_SIZE = 512
#: (conf folder, config name, group choices, signature) -> the config assembled from them (None: not assembled)
_ASSEMBLED: dict[tuple, DictConfig | None] = {}
#: (conf folder, config name, choice, signature) -> whether the choice's compose differs from the defaults' only in
#: its own group's node
_OWN_NODE_ONLY: dict[tuple, bool] = {}
_OVERRIDES_PARSER: list = []
#: override text -> Hydra's parsed Override (read only by the fast path)
_PARSED: dict = {}


def _composed(choices: tuple[str, ...], conf_dir: Path, config_name: str, signature: tuple) -> DictConfig:
    """Hydra's compose of the group ``choices`` alone, once per process (and per state of the conf folder)."""
    key = (str(conf_dir), config_name, choices, signature)
    cfg = _COMPOSED.get(key)
    if cfg is None:
        cfg = _hydra_compose(list(choices), conf_dir, config_name)
        if len(_COMPOSED) >= _COMPOSED_SIZE:
            _COMPOSED.pop(next(iter(_COMPOSED)))
        _COMPOSED[key] = cfg
    return cfg


def _from_group_nodes(choices: list[str], conf_dir: Path, config_name: str) -> DictConfig | None:
    """The compose of ``choices`` built from one Hydra compose per choice: the defaults' config with each chosen
    group's node taken from the compose of that choice alone. Hydra composes each group option into its own node
    (``model=x`` fills ``model``), so this is the full compose whenever every option writes only its own node;
    an option that writes elsewhere (``@package _global_``, a defaults list reaching another group) is detected
    (its compose differs from the defaults' outside its node) and None sends the caller to the full compose."""
    groups = [c.split("=", 1)[0] for c in choices]
    if len(set(groups)) != len(groups):
        return None
    signature = _conf_signature(conf_dir)
    key = (str(conf_dir), config_name, tuple(choices), signature)
    if key not in _ASSEMBLED:
        if len(_ASSEMBLED) >= _COMPOSED_SIZE:
            _ASSEMBLED.pop(next(iter(_ASSEMBLED)))
        _ASSEMBLED[key] = _assemble(groups, choices, conf_dir, config_name, signature)
    cfg = _ASSEMBLED[key]
    return None if cfg is None else copy.deepcopy(cfg)


def _assemble(groups: list[str], choices: list[str], conf_dir: Path, config_name: str, signature: tuple):
    base = _composed((), conf_dir, config_name, signature)
    cfg = copy.deepcopy(base)
    for group, choice in zip(groups, choices):
        one = _composed((choice,), conf_dir, config_name, signature)
        key = (str(conf_dir), config_name, choice, signature)
        if key not in _OWN_NODE_ONLY:
            _OWN_NODE_ONLY[key] = all(k == group or _same_node(one.get(k), base.get(k)) for k in set(one) | set(base))
        if not _OWN_NODE_ONLY[key]:
            return None
        with open_dict(cfg):
            cfg[group] = one[group]  # (OmegaConf assigns a copy)
    return cfg


def _same_node(a, b) -> bool:
    if isinstance(a, DictConfig) and isinstance(b, DictConfig):
        return OmegaConf.to_container(a) == OmegaConf.to_container(b)
    return a == b


def _conf_signature(conf_dir: Path) -> tuple:
    """(name, size, mtime) of every YAML of the conf folder: a cached base is reused only while they are unchanged."""
    out = []
    for folder in [conf_dir, *sorted(p for p in conf_dir.iterdir() if p.is_dir())]:
        with os.scandir(folder) as it:
            for e in it:
                if e.name.endswith((".yaml", ".yml")):
                    st = e.stat()
                    out.append((folder.name, e.name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


def _split_overrides(overrides: list[str], conf_dir: Path):
    """(group choices as strings, value overrides as Hydra ``Override`` objects), or None when an override is one
    the fast path does not model (then the caller composes everything with Hydra)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    if not _OVERRIDES_PARSER:
        _OVERRIDES_PARSER.append(OverridesParser.create())
    parsed = []
    for text in overrides:  # Hydra's grammar is slow to run: each distinct override is parsed once
        if text not in _PARSED:
            try:
                _PARSED[text] = _OVERRIDES_PARSER[0].parse_overrides(overrides=[text])[0]
            except Exception:  # noqa: BLE001 - a grammar error: the full compose words it
                return None
            if len(_PARSED) > 100_000:
                _PARSED.clear()
        parsed.append(_PARSED[text])
    choices, values = [], []
    for text, ov in zip(overrides, parsed):
        key = ov.key_or_group
        if ov.is_sweep_override() or ov.package is not None or key.split(".")[0] == "hydra":
            return None
        value = ov.value()
        if (conf_dir / key.replace(".", "/")).is_dir():  # a config group (Hydra: repo.group_exists)
            if ov.type != OverrideType.CHANGE or not isinstance(value, str):
                return None
            choices.append(text)
        elif ov.type != OverrideType.CHANGE or isinstance(value, dict):
            return None
        else:
            values.append(ov)
    return choices, values


def _hydra_compose(overrides: list[str], conf_dir: Path, config_name: str) -> DictConfig:
    """Hydra's full compose of ``overrides``; errors rephrased to one line."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    # Inside a running Hydra app (e.g. a hydra-submitit job) GlobalHydra is taken: set it aside and
    # put it back afterwards, so composing a run config never disturbs the caller's Hydra.
    outer = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=overrides)
    except ConfigError:
        raise
    except Exception as exc:  # hydra.errors.*, omegaconf.errors.*: rephrase to one line
        raise _rephrase(exc, overrides, conf_dir) from exc
    finally:
        if outer is not None:
            GlobalHydra.instance().clear()
            GlobalHydra.instance().initialize(outer)
    return cfg


#: what to do about a broken saved config (a run directory's config.yaml is rewritten by its launch)
_CONFIG_FILE_FIX = ("restore it from a copy, or relaunch the run's `quartet sweep NAME` / `quartet train ...` "
                    "command, which rewrites a run directory's config.yaml")


def _read_config_yaml(path: Path) -> DictConfig:
    """The mapping in a saved config YAML; ConfigError (one line naming the file) when it is not one."""
    import yaml
    from omegaconf._utils import get_yaml_loader  # the loader OmegaConf.load uses (floats like 1e-3)

    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (bad byte at offset {exc.start}), the file is corrupt; "
                          f"{_CONFIG_FILE_FIX}") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc}); {_CONFIG_FILE_FIX}") from exc
    try:
        data = yaml.load(text, Loader=get_yaml_loader())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where} ({problem}), the file is corrupt or truncated; "
                          f"{_CONFIG_FILE_FIX}") from exc
    if not isinstance(data, dict) or not data:
        what = "empty" if data is None or data == {} else f"a {type(data).__name__}, not a mapping of config groups"
        raise ConfigError(f"{path}: {what}, the file is corrupt or truncated; {_CONFIG_FILE_FIX}")
    try:
        return OmegaConf.create(data)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: {' '.join(str(exc).split())[:200]}; {_CONFIG_FILE_FIX}") from exc


def load_config_file(path: str | Path, overrides: list[str] | None = None) -> DictConfig:
    """Load a run's saved ``config.yaml`` (replay), validated against the schema; dotlist overrides allowed.

    A file that is not UTF-8, not YAML, not a mapping, or lacks whole sections (truncated) raises a
    one-line ConfigError naming the file and what to do.
    """
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG
    if not path.is_file():
        raise ConfigError(f"--config-file: {path} does not exist; expected a run directory's config.yaml")
    loaded = _read_config_yaml(path)
    schema = OmegaConf.structured(TrainConfig)
    try:
        cfg = OmegaConf.merge(schema, loaded)
    except OmegaConfBaseException as exc:
        msg = str(_rephrase(exc, [], CONF_DIR))
        if msg.startswith("bad overrides"):
            msg = " ".join(str(exc).split())[:200]
        raise ConfigError(f"{path}: {msg}; {_CONFIG_FILE_FIX}") from exc
    try:
        if overrides:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([o.lstrip("+") for o in overrides]))
    except OmegaConfBaseException as exc:
        raise _rephrase(exc, list(overrides or []), CONF_DIR) from exc
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        raise ConfigError(f"{path}: lacks {', '.join(missing[:6])}{more}, the file is truncated or not a run's "
                          f"config.yaml; {_CONFIG_FILE_FIX}")
    return cfg


# --------------------------------------------------------------------------------------------
# Resolve
# --------------------------------------------------------------------------------------------


def count_non_embedding_params(n_layer: int, d_model: int, multiple_of: int = 256) -> int:
    """Exact non-embedding N: per layer 4d² (qkv + out) + 3·d·hidden (SwiGLU) + 2d (norms), + final norm d."""
    h = ffn_hidden(d_model, multiple_of)
    return n_layer * (4 * d_model * d_model + 3 * d_model * h + 2 * d_model) + d_model


def _dtype_for(vocab: int, requested: str) -> str:
    allowed = ("auto", "uint16", "uint32")
    if requested not in allowed:
        raise ConfigError(f"data.token_dtype={requested!r}: allowed: {', '.join(allowed)}")
    limits = {"uint16": 2**16, "uint32": 2**32}
    if requested == "auto":
        return "uint16" if vocab <= limits["uint16"] else "uint32"
    if vocab > limits[requested]:
        raise ConfigError(f"data.vocab_size={vocab} does not fit data.token_dtype={requested} "
                          f"(max {limits[requested]}); allowed: uint32 or auto")
    return requested


@dataclass
class ResolvedRun:
    """The composed config plus every derived number; ``cfg.derived`` holds the same values."""

    cfg: DictConfig
    n_params: int
    n_params_total: int
    nominal_params: float
    vocab_size: int
    ffn_hidden: int
    lr: float
    batch_size: int
    micro_batch_size: int
    seq_len: int
    tokens_per_step: int
    budget_tokens: int
    tokens: int
    steps: int
    warmup_steps: int
    token_dtype: str
    decay_start: Optional[int] = None

    def derived(self) -> dict:
        """The derived values as a plain dict (what ``cfg.derived`` holds)."""
        # not dataclasses.asdict: it would deep-copy the whole config only to drop it
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "cfg"}

    def check_world_size(self, world_size: int) -> int:
        """What ``resolve(cfg, world_size)`` checks beyond ``resolve(cfg)``: the batch splits over ``world_size``
        data-parallel ranks (ConfigError, the same message, when not); returns the per-rank micro-batch. Nothing
        else a resolve derives depends on the world size."""
        return _micro_batch(self.batch_size, self.cfg.optim.micro_batch_size, world_size)

    def accum_steps(self, world_size: int = 1) -> int:
        """Micro-batches per rank per optimizer step."""
        return self.batch_size // (self.micro_batch_size * world_size)


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _micro_batch(batch: int, micro_batch_size, world_size: int) -> int:
    """The per-rank micro-batch of a ``batch`` over ``world_size`` ranks; ConfigError when it does not split evenly."""
    micro = int(micro_batch_size if micro_batch_size is not None else batch // max(world_size, 1))
    _require(micro > 0, f"optim.micro_batch_size={micro}: must be a positive integer")
    _require(batch % micro == 0,
             f"optim.batch_size={batch} is not divisible by optim.micro_batch_size={micro}; allowed micro-batch sizes: "
             f"{', '.join(str(k) for k in range(1, batch + 1) if batch % k == 0 and k <= 4096)}")
    _require(batch % (micro * world_size) == 0,
             f"optim.batch_size={batch} is not divisible by optim.micro_batch_size={micro} x world size {world_size}")
    return micro


#: LR schedules a run may ask for (optim.schedule)
SCHEDULES = ("cosine", "wsd")


def wsd_decay_start(steps: int, decay_fraction: float) -> int:
    """Index of the first decaying update of a WSD run of ``steps`` updates: ``steps - floor(f * steps + 1/2)``."""
    return steps - int(math.floor(float(decay_fraction) * steps + 0.5))


def _decay_start(o, steps: int, warmup: int) -> Optional[int]:
    """optim.schedule / decay_fraction checked; the first decaying update of a WSD run (None for cosine)."""
    schedule = str(o.get("schedule", "cosine"))
    _require(schedule in SCHEDULES, f"optim.schedule={schedule!r}: allowed: {', '.join(SCHEDULES)}")
    if schedule != "wsd":
        return None
    f = float(o.decay_fraction)
    _require(0 <= f < 1, f"optim.decay_fraction={f}: allowed 0 <= f < 1")
    start = wsd_decay_start(steps, f)
    _require(warmup <= start, f"optim.decay_fraction={f}: the decay (from update {start}) would start inside the "
             f"warm-up ({warmup} updates); lower it or the warm-up")
    return start


def _check_branch(b, o, steps: int, warmup: int, decay_start: Optional[int]) -> None:
    """branch.*: a trunk's save steps lie on its constant-LR plateau; a branch decays from its branch step."""
    if b is None:
        return
    save = [int(s) for s in (b.get("save_steps") or [])]
    is_branch = b.get("trunk") is not None or b.get("step") is not None
    if not save and not is_branch:
        return
    _require(str(o.get("schedule")) == "wsd", "branch.*: budget branches need optim.schedule=wsd")
    _require(not (save and is_branch), "branch: a run is a trunk (branch.save_steps) or a branch (branch.trunk), "
             "not both")
    if save:
        _require(all(warmup <= s <= decay_start for s in save), f"branch.save_steps={save}: each must lie between "
                 f"the warm-up ({warmup}) and the decay start ({decay_start})")
    else:
        _require(b.get("trunk") is not None and b.get("step") is not None,
                 "branch: a branch needs both branch.trunk (the trunk's run id) and branch.step")
        _require(int(b.step) == decay_start, f"branch.step={b.step}: must be this run's decay start ({decay_start})")


def resolve(cfg: DictConfig, world_size: int = 1) -> ResolvedRun:
    """Derive N, D, steps, warm-up, LR, micro-batches and the token dtype; validate; fill ``cfg.derived``.

    ``world_size`` is the number of data-parallel ranks (batch must split evenly over them).
    Raises ConfigError with a one-line message naming the key and what is allowed.
    """
    m, b, d, o, r = cfg.model, cfg.budget, cfg.data, cfg.optim, cfg.run
    for key, value in (("model.n_layer", m.n_layer), ("model.d_model", m.d_model), ("model.n_head", m.n_head),
                       ("model.seq_len", m.seq_len), ("model.ffn_multiple_of", m.ffn_multiple_of),
                       ("data.vocab_size", d.vocab_size)):
        _require(int(value) > 0, f"{key}={value}: must be a positive integer")
    _require(m.d_model % m.n_head == 0, f"model.n_head={m.n_head}: must divide model.d_model={m.d_model}")
    _require((m.d_model // m.n_head) % 2 == 0, f"model.n_head={m.n_head}: head dim d_model/n_head must be even (RoPE)")
    _require(float(m.nominal_params) > 0, f"model.nominal_params={m.nominal_params}: must be > 0")
    check_folder_name("run.name", r.name)
    # keep_bf16 patterns must name block linears of this model: checked here so a sweep fails before it submits
    keep_bf16_matches(block_linear_names(int(m.n_layer)), cfg.precision.get("keep_bf16") or (),
                      lambda prefix: int(m.n_layer) if prefix == "blocks" else None)

    n_params = count_non_embedding_params(m.n_layer, m.d_model, m.ffn_multiple_of)
    vocab = int(d.vocab_size)
    n_total = n_params + 2 * vocab * m.d_model  # + untied embedding and lm_head
    token_dtype = _dtype_for(vocab, d.token_dtype)

    lr = float(o.lr if o.lr is not None else m.lr)
    _require(lr > 0, f"optim.lr={lr}: must be > 0 (null = model.lr)")
    batch = int(o.batch_size if o.batch_size is not None else m.batch_size)
    _require(batch > 0, f"optim.batch_size={batch}: must be a positive integer")
    micro = _micro_batch(batch, o.micro_batch_size, world_size)
    seq = int(m.seq_len)
    per_step = batch * seq

    has_tpp, has_tok = b.tokens_per_param is not None, b.tokens is not None
    _require(has_tpp != has_tok, "budget: set exactly one of budget.tokens_per_param and budget.tokens "
             f"(got tokens_per_param={b.tokens_per_param}, tokens={b.tokens})")
    if has_tpp:
        _require(float(b.tokens_per_param) > 0, f"budget.tokens_per_param={b.tokens_per_param}: must be > 0 (e.g. 25 ... 1600)")
        budget_tokens = int(round(float(b.tokens_per_param) * float(m.nominal_params)))
    else:
        _require(int(b.tokens) > 0, f"budget.tokens={b.tokens}: must be > 0")
        budget_tokens = int(b.tokens)
    steps = budget_tokens // per_step
    _require(steps >= 1, f"budget: {budget_tokens} tokens is less than one step of optim.batch_size x model.seq_len "
             f"= {per_step} tokens; raise the budget or lower the batch")
    _require(0 <= float(o.warmup_fraction) < 1, f"optim.warmup_fraction={o.warmup_fraction}: allowed 0 <= f < 1")
    # The paper's code: WARMUP = ITERATIONS / 10 with integer division.
    warmup = steps // 10 if float(o.warmup_fraction) == 0.1 else int(steps * float(o.warmup_fraction))
    if o.get("warmup_steps") is not None:
        warmup = int(o.warmup_steps)
        _require(0 <= warmup <= steps, f"optim.warmup_steps={warmup}: allowed 0 ... steps ({steps}), or null")
    decay_start = _decay_start(o, steps, warmup)
    _check_branch(cfg.get("branch"), o, steps, warmup, decay_start)
    for key, value, allowed in (("run.device", r.device, ("auto", "cpu", "cuda")),
                                ("logging.wandb.mode", cfg.logging.wandb.mode, ("offline", "online", "disabled")),
                                ("data.source", d.source, ("shakespeare", "files", "code", "hf")),
                                ("data.tokenizer", d.tokenizer, ("bpe", "hf")),
                                ("data.verify", d.verify, ("full", "size")),
                                ("run.compile_mode", r.compile_mode, COMPILE_MODES),
                                ("run.parallel", r.get("parallel", "auto"), PARALLEL_CHOICES)):
        _require(value in allowed, f"{key}={value!r}: allowed: {', '.join(allowed)}")
    _require(0 < float(d.val_fraction) < 1, f"data.val_fraction={d.val_fraction}: allowed 0 < f < 1")
    _require(int(r.threads) >= 0, f"run.threads={r.threads}: allowed 0 (the default number of torch threads) or a "
             f"positive number of threads")
    _require(d.source != "files" or len(d.paths) > 0, "data.paths: source=files needs at least one file or folder")
    # source=code accepts empty paths (= this interpreter's libraries), but needs something to match.
    _require(d.source != "code" or (len(d.extensions) > 0 and all(str(e) for e in d.extensions)),
             f"data.extensions={list(d.extensions)}: source=code needs at least one non-empty file ending, e.g. [.py]")
    _require(int(d.max_file_bytes) > 0, f"data.max_file_bytes={d.max_file_bytes}: must be a positive integer")
    _require(d.tokenizer_train_chars is None or int(d.tokenizer_train_chars) > 0,
             f"data.tokenizer_train_chars={d.tokenizer_train_chars}: must be a positive integer or null (= all)")
    _require(d.tokenizer != "hf" or bool(d.tokenizer_name), "data.tokenizer_name: tokenizer=hf needs a name "
             "(e.g. meta-llama/Llama-2-7b-hf)")

    res = ResolvedRun(cfg=cfg, n_params=n_params, n_params_total=n_total, nominal_params=float(m.nominal_params),
                      vocab_size=vocab, ffn_hidden=ffn_hidden(m.d_model, m.ffn_multiple_of), lr=lr, batch_size=batch,
                      micro_batch_size=micro, seq_len=seq, tokens_per_step=per_step, budget_tokens=budget_tokens,
                      tokens=steps * per_step, steps=steps, warmup_steps=warmup, token_dtype=token_dtype,
                      decay_start=decay_start)
    derived = res.derived()
    # micro_batch_size depends on the world size and is no part of the run's meaning: not checked on replay.
    for key, value in derived.items():
        given = cfg.derived.get(key) if "derived" in cfg else None
        if given is not None and key != "micro_batch_size" and given != value and not (
                isinstance(value, float) and math.isclose(float(given), value, rel_tol=1e-12)):
            raise ConfigError(f"derived.{key}={given}: derived values are computed, never set (expected {value}); "
                              f"change model/budget/optim instead")
    OmegaConf.set_readonly(cfg, False)
    node = cfg.get("derived") if "derived" in cfg else None
    if isinstance(node, DictConfig) and OmegaConf.get_type(node) is DerivedConfig and set(node.keys()) == set(derived):
        for key, value in derived.items():  # in place: what the merge below yields, without building a new node
            node[key] = value
    else:
        cfg.derived = OmegaConf.merge(OmegaConf.structured(DerivedConfig), derived)
    return res


def to_yaml(cfg: DictConfig) -> str:
    """The config as YAML (resolved interpolations)."""
    return OmegaConf.to_yaml(cfg, resolve=True)


def to_container(cfg: DictConfig) -> dict:
    """The config as plain python (resolved interpolations)."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
